"""`bench.py speculative`'s cost of a call: one AR call on n positions against one, each layout's ceiling at those
prices, and where a decode step's time goes (the loop against its network alone)."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import nets
from experiments.timing import format_table, interleaved, median, paired_ratio
from sedd.kinds import causal


def call_cost(config, ns: list[int], repeats: int, calls: int | None = None, batch: int = 1) -> dict:
    """Seconds of one KV-cached AR call on n new positions a row, `batch` rows, random weights.

    The call (``DDiT.output_in_cache``, as ``causal.ancestral`` decodes and the spec kind's rounds run) scores
    positions start .. start + n - 1 causally against a cache of L + n_max + 8 rows, start = L / 2 + (i mod
    8) at call i (each call writes rows the last did not, as decoding does), calls in one jitted loop.
    Loops of `calls` and of 2 `calls` calls are timed in turn and a call is their difference over `calls`:
    what a loop pays once (the dispatch, the cache's allocation: at the default's size as much as eight
    calls) cancels. `calls` (None: enough for 20 ms a loop at n = 1, at least 8). The ratio to n = 1 is
    what a round on n positions costs against an AR step (``layout_ceiling``): the spec kind's round is
    one call on (k + 1) + groups k positions.
    """
    from flax import nnx  # noqa: PLC0415

    c = config.copy_and_resolve_references()
    _, net = nets.random_net(c, "ar")
    length = c.data.seq_len
    rows, start = length + max(ns) + 8, length // 2
    text = jax.random.randint(jax.random.key(0), (batch, rows), 0, c.vocab_size)

    def looped(n, calls):
        @jax.jit
        def fn(state, text):
            model = nnx.merge(net.graphdef, *state)
            cache = model.empty_cache(batch, rows)

            def body(i, carry):
                cache, acc = carry
                at = start + i % 8
                inputs = jax.lax.dynamic_slice(text, (0, at), (batch, n))
                logits, cache, _ = causal.decode_in_cache(model, cache, inputs, at)
                # every output and the cache carried on: nothing of the call is dead code XLA could skip
                return cache, acc + logits.sum()

            return jax.lax.fori_loop(0, calls, body, (cache, jnp.float32(0)))[1]

        return lambda: fn(net.state, text)

    if calls is None:  # enough calls that a loop takes 20 ms at n = 1 (one timed after its compile)
        once = looped(ns[0], 8)
        jax.block_until_ready(once())
        t = time.perf_counter()
        jax.block_until_ready(once())
        calls = int(np.clip(np.ceil(0.02 / ((time.perf_counter() - t) / 8)), 8, 512))
    times = interleaved({(n, c): looped(n, c) for n in ns for c in (calls, 2 * calls)}, repeats)
    call = {n: [(b - a) / calls for a, b in zip(times[n, calls], times[n, 2 * calls])] for n in ns}  # seconds
    rows_out = [
        {"n": n, "ms_per_call": median(call[n]) * 1e3, "ratio_to_n1": paired_ratio(call[n], call[ns[0]])} for n in ns
    ]
    return {
        "model": dict(
            width=c.model.hidden_size,
            blocks=c.model.n_layers,
            vocab_size=c.vocab_size,
            cache=rows,
            start=start,
            dtype=c.model.dtype,
        ),
        "batch": batch,
        "calls": calls,
        "rows": rows_out,
    }


def layout_ceiling(curve: dict, layouts) -> list[dict]:
    """The most each layout could write against AR, whatever its drafts keep: an upper bound from the curve.

    A round of layout (k, groups) is one call on P = (k + 1) + groups k positions a row and writes at most
    k + 1 tokens (every draft kept); an AR step is one call on one position and writes one. So the round's
    tokens/s against AR's are at most (k + 1) / (cost(P) / cost(1)), with the loop's own work in neither
    (a round's is the larger share: ``loop_profile``). Layouts whose P the curve lacks are left out.

    A drafter that costs nothing (no draft positions in the call, as a separate drafter's or a head's drafts)
    still verifies k drafts in a call on k + 1 positions: the rows "k=K, drafts free" bound every such scheme.
    """
    ratio = {r["n"]: r["ratio_to_n1"] for r in curve["rows"]}
    rows = [
        {
            "layout": f"{lay.k},{lay.groups}",
            "positions": lay.positions,
            "call_vs_ar": ratio[lay.positions],
            "at_most_vs_ar": (lay.k + 1) / ratio[lay.positions],
        }
        for lay in layouts
        if lay.positions in ratio
    ]
    return rows + [
        {
            "layout": f"k={k}, drafts free",
            "positions": k + 1,
            "call_vs_ar": ratio[k + 1],
            "at_most_vs_ar": (k + 1) / ratio[k + 1],
        }
        for k in sorted({lay.k for lay in layouts})
        if k + 1 in ratio
    ]


def loop_profile(config, layouts: list[str], repeats: int) -> dict:
    """Where a decode step's time goes, AR and spec (random weights, batch 1): the text, and its network alone.

    AR: a text of L tokens by ``causal.ancestral`` against L KV-cached decode calls in one loop, no sampling. Spec,
    per layout: a text by ``spec.speculate`` (R rounds) against R of its round's calls (``target``: the
    network and the laws it returns) in one loop. The rest is the loop's own work (drafting, verification,
    sampling, the text's updates); every output is carried on, so XLA drops none of the call.
    """
    from flax import nnx  # noqa: PLC0415

    from sedd import runs as runs_lib  # noqa: PLC0415
    from sedd.kinds import spec  # noqa: PLC0415

    def run_of(kind, **model):
        c = config.copy_and_resolve_references()
        c.model.update(model, kind=kind)
        _, net = nets.random_net(c, kind)
        return runs_lib.from_parts(c, None, net.graphdef, net.params, net.rest)

    ar_run, sp = run_of("ar"), run_of("spec", draft_k=4)
    length, key = ar_run.seq_len, jax.random.key(0)

    @jax.jit
    def ar_network(state):  # the calls of causal.ancestral: one position a step on the cache it holds (one dispatch,
        model = nnx.merge(ar_run.net.graphdef, *state)  # no walk over the model's graph a call, as causal.ancestral)

        def step(i, carry):
            cache, acc = carry
            token = jnp.full((1, 1), i % ar_run.config.vocab_size, jnp.int32)
            logits, cache, _ = causal.decode_in_cache(model, cache, token, i)
            return cache, acc + logits.sum()

        return jax.lax.fori_loop(0, length, step, (model.empty_cache(1, length), jnp.float32(0)))[1]

    fns = {"ar": lambda: ar_run.sample(key, 1).tokens, "ar network": lambda: ar_network(ar_run.net.state)}
    rounds = {}
    for name in layouts:
        layout = spec.layout_of(name, 4)
        prefill, target, _ = spec.speculative_parts(sp.net.graphdef, layout)
        r = rounds[name] = int(spec.speculate(key, sp.net.graphdef, sp.net.state, 1, length, layout)[1]["nfe"]) - 1
        state = jax.jit(prefill)(sp.net.state, jnp.zeros((1, 0), jnp.int32))
        text = jnp.zeros((1, length + 2 * layout.k + 2), jnp.int32)

        @jax.jit
        def calls(state, text, r=r, k=layout.k, target=target):
            def body(i, carry):
                state, acc = carry
                p, state = target(state, text, jnp.full((1,), (i * length) // r, jnp.int32), k)
                return state, acc + p.sum()

            return jax.lax.fori_loop(0, r, body, (state, jnp.float32(0)))[1]

        fns[f"spec {name}"] = lambda layout=layout: spec.speculate(
            key, sp.net.graphdef, sp.net.state, 1, length, layout
        )[0]
        fns[f"spec {name} network"] = lambda calls=calls, state=state, text=text: calls(state, text)
    times = {n: median(t) for n, t in interleaved(fns, repeats, warmup=2).items()}
    rows = [
        {
            "loop": "AR with its KV cache",
            "ms_a_step": times["ar"] / length * 1e3,
            "network_ms_a_step": times["ar network"] / length * 1e3,
        }
    ]
    rows += [
        {
            "loop": f"spec, layout {n}",
            "ms_a_step": times[f"spec {n}"] / rounds[n] * 1e3,
            "network_ms_a_step": times[f"spec {n} network"] / rounds[n] * 1e3,
        }
        for n in layouts
    ]
    for row in rows:
        row["outside_network"] = 1 - row["network_ms_a_step"] / row["ms_a_step"]
    return {
        "model": dict(
            width=config.model.hidden_size,
            blocks=config.model.n_layers,
            vocab_size=config.vocab_size,
            dtype=config.model.dtype,
        ),
        "rows": rows,
    }


def cost_curves(sizes: dict, ns: list[int], batches: list[int], repeats: int, args) -> tuple[dict, dict]:
    """The call-cost curve of each size at each batch, and each layout's ceiling there (``layout_ceiling``).

    Past batch 1 only the n of the layouts (``spec.candidates(4)`` and --layouts) and 1: a wide curve there
    takes long. Keyed "SIZE" at batch 1 and "SIZE, batch B" past it.
    """
    from sedd.kinds import spec  # noqa: PLC0415

    layouts = sorted(
        {spec.layout_of(lay, 4) for lay in args.layouts or () if lay != "auto"} | set(spec.candidates(4)),
        key=lambda lay: (-lay.k, -lay.groups),
    )
    curves, ceilings = {}, {}
    for name, config in sizes.items():
        config.model.kind = "ar"
        if args.dtype:
            config.model.dtype = args.dtype
        for batch in batches:
            at = ns if batch == 1 else sorted({1} | {n for lay in layouts for n in (lay.positions, lay.k + 1)})
            key = name if batch == 1 else f"{name}, batch {batch}"
            curves[key] = call_cost(config, at, max(repeats, 3), batch=batch)
            ceilings[key] = layout_ceiling(curves[key], layouts)
            print(f"  call cost at {key}'s size done", flush=True)
    return curves, ceilings


def curve_lines(curves: dict, ceilings: dict) -> list[str]:
    """``cost_curves``' tables: each curve, and the most each layout could write against AR at its prices."""
    lines = []
    for name, curve in curves.items():
        lines.append(
            f"one AR call on n new positions a row, batch {curve['batch']}, {name.split(',')[0]}'s size "
            f"{curve['model']}"
        )
        lines.append(
            format_table(
                ["n", "ms a call", "vs n=1"],
                [[r["n"], f"{r['ms_per_call']:.3f}", f"{r['ratio_to_n1']:.2f}"] for r in curve["rows"]],
            )
        )
        if ceilings[name]:
            lines.append(
                f"the most a spec round of each layout could write against an AR step at these prices "
                f"(k + 1 tokens, every draft kept; the loops' own work in neither), batch {curve['batch']}"
            )
            lines.append(
                format_table(
                    ["layout", "positions a call", "call vs AR's", "at most vs AR"],
                    [
                        [r["layout"], r["positions"], f"{r['call_vs_ar']:.2f}", f"{r['at_most_vs_ar']:.2f}"]
                        for r in ceilings[name]
                    ],
                )
            )
    return lines


def sizes_of(quick: bool, args) -> tuple:
    """(sizes {name: config}, the n of the curve, ks, batches, quality samples, repeats) of the command line."""
    if quick:
        return {"tiny": nets.bench_config("tiny")}, [1, 2, 4, 8], args.draft_ks or [2, 4], [1], 8, 1
    sizes = {
        "shakespeare_char": nets.bench_config(vocab_size=65),
        "gpt2_small": nets.bench_config(hidden_size=768, n_layers=12, n_heads=12, seq_len=256),
    }
    sizes["gpt2_small"].vocab_size = 50257
    if args.widths:  # the plays' network (V = 65) at each width: where a call on more positions starts to pay
        sizes = {
            f"width {w}": nets.bench_config(
                vocab_size=65, hidden_size=w, n_layers=args.blocks or 4, n_heads=max(8, w // 64)
            )
            for w in args.widths
        }
    ks = args.draft_ks or [2, 4, 8, 16]
    return sizes, args.positions or list(range(1, 33)), ks, args.batch_sizes, args.quality_samples, args.repeats


def size_profile(sizes: dict, quick: bool, repeats: int, args) -> dict | None:
    """``loop_profile`` at --profile_size's size (with --cost_only or --quick at the default's), else None."""
    size = "tiny" if quick else args.profile_size or "shakespeare_char"
    if not (args.cost_only or quick or args.profile_size) or size not in sizes:
        return None
    config = sizes[size].copy_and_resolve_references()
    config.data.seq_len = min(config.data.seq_len, 128)
    if args.dtype:
        config.model.dtype = args.dtype
    layouts = [lay for lay in args.layouts or () if lay != "auto"] or ["4,5", "1,2"]
    profile = loop_profile(config, layouts, max(repeats, 3 if size == "gpt2_small" else 5))
    return profile | {"size": size}


def profile_lines(profile: dict) -> list[str]:
    """``loop_profile``'s result as a title and a table."""
    return [
        f"a step (AR: a token; spec: a round) and its network alone, batch 1, random weights, "
        f"{profile['size']}'s size {profile['model']}",
        format_table(
            ["loop", "ms a step", "network ms", "outside the network"],
            [
                [
                    r["loop"],
                    f"{r['ms_a_step']:.3f}",
                    f"{r['network_ms_a_step']:.3f}",
                    f"{100 * r['outside_network']:.0f}%",
                ]
                for r in profile["rows"]
            ],
        ),
    ]


def priced_lines(profile: dict, study: dict) -> list[str]:
    """Each spec run's tokens a call (the study's) at the prices of the profile's size: tokens a call x AR's time
    a token / the round's time, what it would write against AR at that size; kept in profile["projected"]."""
    ar_ms = profile["rows"][0]["ms_a_step"]
    priced = {r["loop"].rsplit(" ", 1)[1]: r["ms_a_step"] for r in profile["rows"][1:]}
    rows = [
        [
            r["drafter"],
            r["k"],
            f"{r['tokens_per_call']:.3f}",
            f"{priced[r['k']]:.3f}",
            f"{r['tokens_per_call'] * ar_ms / priced[r['k']]:.2f}",
        ]
        for r in study["rows"]
        if r["k"] in priced
    ]
    profile["projected"] = [
        dict(zip(["drafter", "layout", "tokens_per_call", "round_ms", "vs_ar_b1"], row)) for row in rows
    ]
    return [
        f"each spec run's tokens a call (above) at the prices of {profile['size']}'s size "
        f"(AR {ar_ms:.3f} ms a token): tokens a call x AR's ms a token / ms a round, batch 1",
        format_table(["spec run", "layout", "tokens a call", "ms a round", "vs AR b=1"], rows),
    ]
