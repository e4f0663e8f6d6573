"""`bench.py speculative`: the cost of one AR call on n positions, and drafters against AR with its KV cache."""

from __future__ import annotations

import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import nets
from experiments.quality import sample_quality
from experiments.timing import format_table, interleaved, median, paired_ratio, tokens_per_call
from sedd.kinds import capabilities, causal
from sedd import config as config_lib
from sedd.kinds.capabilities import Diffuses
from sedd.kinds.spec import Layout


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


def speculative_runs(quick: bool, args) -> tuple:
    """(target AR run, {name: draft ("ngram" or a Run)}, {name: spec run}): given by path, or tiny random ones."""
    from sedd import runs as runs_lib  # noqa: PLC0415

    if args.target:
        target = runs_lib.load(args.target)
        drafts = {}
        for d in (args.drafts or "ngram").split(","):
            if d == "none":  # the spec run alone
                continue
            if d == "ngram":
                drafts["ngram"] = "ngram"
            else:
                run = runs_lib.load(d)
                drafts[f"{Path(d).name} ({run.kind.label})"] = run
        specs = {Path(s).name: runs_lib.load(s) for s in (args.spec or "").split(",") if s}
        return target, drafts, specs
    # Random weights (every parameter nonzero) on the Markov chain's tiny config: the smoke run of --quick.
    config = config_lib.load_config("markov")
    config.vocab_size = int(config.data.markov.vocab_size)
    config.model.n_layers = 1

    def random_run(kind, **model):
        c = config.copy_and_resolve_references()
        c.model.update(model, kind=kind)
        _, net = nets.random_net(c, kind)
        return runs_lib.from_parts(c, None, net.graphdef, net.params, net.rest)

    return (
        random_run("ar"),
        {
            "ngram": "ngram",
            "block8 (block)": random_run("block", block_size=8),
            "small AR (ar)": random_run("ar", hidden_size=16, n_heads=1),
        },
        {},
    )


def bench_speculative(
    target,
    drafts: dict,
    specs: dict,
    ks: list[int],
    batches: list[int],
    repeats: int,
    quality_samples: int,
    target_name: str = "random",
    verifications: tuple[str, ...] = ("joint",),
    layouts: tuple[str | None, ...] = (None,),
    temperatures: tuple[float, ...] = (1.0,),
) -> dict:
    """Speculative sampling of the AR run `target` with each drafter and k, against its own KV-cached sampling.

    Per (drafter, k): the calls (the target's and the drafter's network calls, counted alike) and tokens a
    call, the acceptance by draft position, the seconds at each batch interleaved with ``causal.ancestral``'s (the
    ratio the median of per-round ratios), and the quality of quality_samples texts drawn the same way; each
    cell once per verification ("joint" or "token", ``sedd.speculative.round_law``); the spec run once per
    layout ("K,GROUPS", None its trained one, "auto" the fastest at each batch: ``Tunes.tune``), each
    spec run of `specs` ({name: run}) in turn, against the same AR run in the same process; each cell at
    each of `temperatures` against AR at the same one (at 0 every text is the greedy one: a spec row's
    "greedy_exact" says whether its texts are its causal half's greedy text, token for token).
    """
    from sedd.data.markov import chain_from_config  # noqa: PLC0415

    chain = chain_from_config(target.config.data) if target.config.data.name == "markov" else None
    length = target.seq_len
    key = jax.random.key(0)
    ar_quality = {
        t: sample_quality(target.sample(jax.random.key(1), quality_samples, temperature=t).tokens, target, chain)
        for t in temperatures
    }
    cells = []  # (name, k or the spec run's layout, draft or None, spec run or None, verification, temperature)
    for t, how in [(t, how) for t in temperatures for how in verifications]:
        tag = ("" if len(verifications) == 1 else f", {how}") + ("" if len(temperatures) == 1 else f", T {t:g}")
        for name, draft in drafts.items():
            # A diffusion drafter drafts within one of its blocks: k up to its block's b positions.
            cap = (
                draft.kind.one_token_steps(draft.seq_len)
                if not isinstance(draft, str) and isinstance(draft.kind, Diffuses)
                else None
            )
            cells += [(name + tag, k, draft, None, how, t) for k in ks if cap is None or k <= cap]
        for spec_name, spec in specs.items():
            cells += [
                (f"{spec_name} (spec {layout or 'trained'}{tag})", layout, None, spec, how, t) for layout in layouts
            ]
    rows = []
    for name, k, draft, spec, how, temp in cells:

        def sample(batch, key=key, draft=draft, k=k, how=how, spec=spec, temp=temp, timed=True):
            if spec is not None:  # k: the spec run's layout; "auto": the one chosen at the batch timed
                layout = chosen.get(batch if timed else min(batches), k)  # the quality samples: the first batch's
                return spec.sample(key, batch, return_stats=True, verification=how, layout=layout, temperature=temp)
            return target.sample(
                key, batch, draft=draft, draft_k=k, return_stats=True, verification=how, temperature=temp
            )

        chosen = {}  # "auto": the layout the rule picks at each batch (timed here, nothing saved)
        if spec is not None and k == "auto":
            for batch in batches:
                line = capabilities.tune(spec.kind, spec.net, {}, None, batch)  # the fastest here, nothing kept
                chosen[batch] = spec.kind.layout
                print(f"  batch {batch}: {line}", flush=True)

        out = sample(quality_samples, jax.random.key(1), timed=False)
        st = out.stats
        rounds = np.asarray(st["nfe_per_sample"], np.float64)
        drafter_calls = np.asarray(st.get("draft_calls", np.zeros_like(rounds)), np.float64)
        calls = rounds + drafter_calls  # (B,) a text's network calls
        per_call, per_call_se = tokens_per_call(length, calls)
        row = {
            "drafter": name,
            "k": k,
            "verification": how,
            "temperature": temp,
            "target_calls": float(rounds.mean()),
            "drafter_calls": float(drafter_calls.mean()),
            "tokens_per_call": per_call,
            "tokens_per_call_se": per_call_se,
            "tokens_per_target_call": float(length / rounds.mean()),
            "acceptance_by_position": (np.asarray(st["accepted_at"], np.float64) / rounds.sum()).tolist(),
            **sample_quality(out.tokens, target, chain),
        }
        if spec is not None:  # lossless in practice: the spec run's causal half drawn one token at a time, no drafts
            direct = np.asarray(causal.ancestral_model(jax.random.key(2), spec.model, quality_samples, length, temp))
            row["own"] = sample_quality(direct, target, chain)
            if temp == 0:
                row["greedy_exact"] = bool(np.array_equal(np.asarray(out.tokens), direct))
        for batch in batches:
            times = interleaved(
                {
                    "ar": lambda b=batch: target.sample(key, b, temperature=temp).tokens,
                    "spec": lambda b=batch: sample(b).tokens,
                },
                repeats,
                warmup=2,
            )  # AR traces twice
            row[f"tokens_per_s_b{batch}"] = batch * length / median(times["spec"])
            row[f"ar_tokens_per_s_b{batch}"] = batch * length / median(times["ar"])
            row[f"vs_ar_b{batch}"] = paired_ratio(times["ar"], times["spec"])
        if chosen:
            row["chosen"] = {str(b): str(lay) for b, lay in chosen.items()}
        rows.append(row)
        print(
            f"  {name} k={k}: {row['tokens_per_call']:.2f} tokens a call, "
            + ", ".join(f"{row[f'vs_ar_b{b}']:.2f}x AR at batch {b}" for b in batches),
            flush=True,
        )
    return {
        "target": target_name,
        "length": length,
        "ar": ar_quality[temperatures[0]],
        "ar_by_temperature": {f"{t:g}": q for t, q in ar_quality.items()},
        "quality_samples": quality_samples,
        "rows": rows,
    }


def best_overlap(w: np.ndarray, cond: np.ndarray) -> float:
    """max over laws q of sum_v w_v sum_u min(cond[v, u], q_u): how often the best q is kept against cond[v].

    The objective is concave and separable in q: coordinate u gains sum_v w_v [cond[v, u] > q_u] per unit
    of mass, a step function falling as q_u grows, so pouring the one unit of mass into the steepest
    pieces first is exact: the pieces of every u sorted by gain, filled until their lengths reach 1.
    """
    order = np.argsort(cond, axis=0)  # (V, U): each u's breakpoints cond[v, u], ascending
    levels = np.take_along_axis(cond, order, axis=0)
    lengths = np.diff(np.concatenate([np.zeros((1, cond.shape[1])), levels]), axis=0)  # piece i: levels i-1 .. i
    gains = np.cumsum(w[order][::-1], axis=0)[::-1]  # piece i gains the weight of the v with cond[v, u] >= level i
    by_gain = np.argsort(-gains, axis=None)
    lengths, gains = lengths.ravel()[by_gain], gains.ravel()[by_gain]
    filled = np.minimum(lengths, np.maximum(0.0, 1.0 - (np.cumsum(lengths) - lengths)))
    return float(np.sum(filled * gains))


def draft_overlap(run, sequences: int = 16, tau: float | None = None) -> dict:
    """How often a spec run's first draft of a group is kept, and the most any such draft could be, on validation.

    A group's first draft y of position s + 1 is drawn before the verifier writes the token at s, from a
    law q(. | x_<s) that cannot see it. Against the causal half's laws p(. | x_<s, v) for each v, with v
    drawn from p(. | x_<s), one draft is kept with probability sum_v p(v | x_<s) sum_u min(p(u | x_<s, v),
    q(u)), computed here exactly (every v, one forward each) at each group's first position of `sequences`
    validation texts (the prefix x_<s from the text). For q: the run's group law, as trained and sharpened
    (tau, the sampler's ``DRAFT_TEMPERATURE``); the mixture sum_v p(v) p(. | x_<s, v) (what (4) of
    ``sedd.kinds.spec.loss`` aims at); and the best q of all (``best_overlap``), a ceiling for any draft law that
    skips the verifier's token.
    """
    from flax import nnx  # noqa: PLC0415

    from sedd import speculative  # noqa: PLC0415
    from sedd.kinds import spec  # noqa: PLC0415
    from sedd.data import load_dataset  # noqa: PLC0415

    tau = spec.DRAFT_TEMPERATURE if tau is None else tau
    model, k, length = run.model, run.config.model.draft_k, run.seq_len
    dataset = load_dataset(run.config.data, tokenizer=run.tokenizer)
    split = "validation" if "validation" in dataset.splits else [s for s in dataset.splits if s != "train"][0]
    x = jnp.asarray(next(iter(dataset.eval_batches(sequences, split=split)))[:sequences], jnp.int32)
    causal_mask = np.tril(np.ones((length, length), bool))

    @nnx.jit
    def laws(model, x):  # the causal laws p(. | x_<l) and the draft half's q, (B, L, V) each
        causal, drafts = spec.halves(model, x, k)
        return jax.nn.softmax(causal.astype(jnp.float32), -1), jax.nn.softmax(drafts.astype(jnp.float32), -1)

    @nnx.jit
    def after_each(model, row, s):  # p(. | x_<s, x_s = v) for every v: (V, V)
        v = model.out_dim
        rows = jnp.tile(row[None], (v, 1)).at[:, s].set(jnp.arange(v))
        out = model.network_output(causal.inputs(model, rows), None, mask=causal_mask, deterministic=True)
        return jax.nn.softmax(jax.lax.dynamic_index_in_dim(out, s + 1, 1, False).astype(jnp.float32), -1)

    p, q = (np.asarray(a, np.float64) for a in laws(model, x))
    kept = {"q": [], f"q sharpened (tau {tau})": [], "the mixture": [], "the best q": []}
    for b in range(sequences):
        for s in range(k - 1, length - 1, k):  # s + 1 = gk: group g's first draft skips the token at s
            w = p[b, s]  # p(v | x_<s)
            cond = np.asarray(after_each(model, x[b], s), np.float64)  # (V, V)
            draft = q[b, s + 1]
            sharp = np.asarray(speculative.sharpened(draft, tau), np.float64)
            for name, law in (("q", draft), (f"q sharpened (tau {tau})", sharp), ("the mixture", w @ cond)):
                kept[name].append(float(w @ np.minimum(cond, law[None]).sum(-1)))
            kept["the best q"].append(best_overlap(w, cond))
    return {
        name: {"mean": float(np.mean(v)), "se": float(np.std(v) / np.sqrt(len(v))), "positions": len(v)}
        for name, v in kept.items()
    }


def dtype_pair(
    target: str,
    spec_run: str,
    layout: str,
    batches: list[int],
    repeats: int,
    quality_samples: int,
    dtypes: tuple[str, ...] = ("float32", "bfloat16"),
) -> dict:
    """AR's text and a spec run's (at `layout`) in each compute dtype, every batch, interleaved in one run.

    Each run directory is loaded once per dtype (``kernels.DTYPE_ENV`` set while it is built), so the
    cells differ by the dtype of their products only: which dtype is AR at its best here, and the spec
    run's ratio to AR in each; beside each, the quality of quality_samples texts it drew (judged by the
    AR run of the first dtype).
    """
    import os  # noqa: PLC0415

    from sedd import kernels  # noqa: PLC0415
    from sedd import runs as runs_lib  # noqa: PLC0415

    loaded, before = {}, os.environ.get(kernels.DTYPE_ENV)
    try:
        for d in dtypes:
            os.environ[kernels.DTYPE_ENV] = d
            loaded[d] = runs_lib.load(target), runs_lib.load(spec_run)
    finally:
        if before is None:
            os.environ.pop(kernels.DTYPE_ENV, None)
        else:
            os.environ[kernels.DTYPE_ENV] = before
    key, fns = jax.random.key(0), {}
    for d, (ar_run, sp) in loaded.items():
        for b in batches:
            fns[("ar", d, b)] = lambda b=b, ar_run=ar_run: ar_run.sample(key, b).tokens
            fns[("spec", d, b)] = lambda b=b, sp=sp: sp.sample(key, b, layout=layout).tokens
    times = interleaved(fns, repeats, warmup=2)
    judge = loaded[dtypes[0]][0]
    quality = {
        d: {
            "ar": sample_quality(ar_run.sample(jax.random.key(1), quality_samples).tokens, judge, None),
            "spec": sample_quality(sp.sample(jax.random.key(1), quality_samples, layout=layout).tokens, judge, None),
        }
        for d, (ar_run, sp) in loaded.items()
    }
    rows = [
        {
            "dtype": d,
            "batch": b,
            "ar_quality": quality[d]["ar"],
            "spec_quality": quality[d]["spec"],
            "ar_ms": median(times[("ar", d, b)]) * 1e3,
            "spec_ms": median(times[("spec", d, b)]) * 1e3,
            "spec_vs_ar": paired_ratio(times[("ar", d, b)], times[("spec", d, b)]),
            "ar_vs_ar_in_first": paired_ratio(times[("ar", dtypes[0], b)], times[("ar", d, b)]),
        }
        for b in batches
        for d in dtypes
    ]
    return {"layout": layout, "rows": rows}


def dtype_lines(dtypes: dict, spec_name: str) -> list[str]:
    """``dtype_pair``'s result as a title and a table."""
    first = dtypes["rows"][0]["dtype"]
    return [
        f"a text of L tokens in each compute dtype, AR and {spec_name} at layout {dtypes['layout']}, interleaved",
        format_table(
            [
                "batch",
                "dtype",
                "AR ms a text",
                f"AR vs AR in {first}",
                "AR's NLL",
                "spec ms a text",
                "spec vs AR (same dtype)",
                "spec's NLL",
            ],
            [
                [
                    r["batch"],
                    r["dtype"],
                    f"{r['ar_ms']:.1f}",
                    f"{r['ar_vs_ar_in_first']:.2f}",
                    f"{r['ar_quality']['nll']:.4f} +- {r['ar_quality']['nll_se']:.4f}",
                    f"{r['spec_ms']:.1f}",
                    f"{r['spec_vs_ar']:.2f}",
                    f"{r['spec_quality']['nll']:.4f} +- {r['spec_quality']['nll_se']:.4f}",
                ]
                for r in dtypes["rows"]
            ],
        ),
    ]


def speculative_picture(result: dict, path: Path) -> None:
    """Tokens a call and tokens/s against AR (batch 1) against the samples' quality, a point per drafter and k."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    study = result["study"]
    first = study["rows"][0].get("temperature", 1.0) if study["rows"] else 1.0  # the first temperature's cells
    study = {**study, "rows": [r for r in study["rows"] if r.get("temperature", 1.0) == first]}
    batch = min(int(k.rsplit("b", 1)[1]) for k in study["rows"][0] if k.startswith("vs_ar_b")) if study["rows"] else 1
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    markers = dict(zip(sorted({r["drafter"] for r in study["rows"]}), "osD^v<>p*h"))
    what = study["ar"]["quality"].replace("_", " ")
    for ax, key, label in (
        (axes[0], "tokens_per_call", "tokens a network call (target's and drafter's)"),
        (axes[1], f"vs_ar_b{batch}", f"tokens/s vs AR with KV cache, batch {batch}"),
    ):
        for name, marker in markers.items():
            rs = [r for r in study["rows"] if r["drafter"] == name]
            ax.errorbar(
                [r["nll"] for r in rs],
                [r[key] for r in rs],
                xerr=[2 * r["nll_se"] for r in rs],
                fmt=marker,
                label=name,
                capsize=2,
            )
            for r in rs:
                ax.annotate(f"k={r['k']}", (r["nll"], r[key]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        a = study["ar"]
        ax.axvspan(
            a["nll"] - 2 * a["nll_se"],
            a["nll"] + 2 * a["nll_se"],
            color="grey",
            alpha=0.2,
            label="AR's own samples (+-2 s.e.)",
        )
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel(f"{what} of the samples")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"speculative sampling of {Path(study['target']).name}, L = {study['length']}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


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


def run_speculative(quick: bool, args) -> dict:
    """Speculative sampling: the call-cost curve at two sizes, and drafters against AR with its KV cache."""
    if quick:
        sizes = {"tiny": nets.bench_config("tiny")}
        ns, ks, batches, quality_samples, repeats = [1, 2, 4, 8], args.draft_ks or [2, 4], [1], 8, 1
    else:
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
        ns = args.positions or list(range(1, 33))
        ks, batches, quality_samples, repeats = (
            args.draft_ks or [2, 4, 8, 16],
            args.batch_sizes,
            args.quality_samples,
            args.repeats,
        )
    curves, ceilings = cost_curves({} if args.target and not args.cost_only else sizes, ns, batches, repeats, args)
    profile = None
    size = "tiny" if quick else args.profile_size or "shakespeare_char"
    if (args.cost_only or quick or args.profile_size) and size in sizes:  # where a step's time goes, at that size
        config = sizes[size].copy_and_resolve_references()
        config.data.seq_len = min(config.data.seq_len, 128)
        if args.dtype:
            config.model.dtype = args.dtype
        layouts = [lay for lay in args.layouts or () if lay != "auto"] or ["4,5", "1,2"]
        profile = loop_profile(config, layouts, max(repeats, 3 if size == "gpt2_small" else 5))
        profile["size"] = size
    lines = []
    if profile is not None:
        lines.append(
            f"a step (AR: a token; spec: a round) and its network alone, batch 1, random weights, "
            f"{profile['size']}'s size {profile['model']}"
        )
        lines.append(
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
            )
        )
    lines += curve_lines(curves, ceilings)
    study = None
    if (args.target or quick) and not args.cost_only:
        target, drafts, specs = speculative_runs(quick, args)
        study = bench_speculative(
            target,
            drafts,
            specs,
            ks,
            batches,
            repeats,
            quality_samples,
            args.target or "random weights",
            tuple(args.verifications.split(",")),
            tuple(args.layouts or (None,)),
            tuple(args.temperatures),
        )
        rows = []
        for t, a in study["ar_by_temperature"].items():
            rows.append(
                [
                    "AR, KV cache",
                    "-",
                    t,
                    "1.00",
                    "-",
                    f"{a['nll']:.4f} +- {a['nll_se']:.4f}",
                    f"{a['unigram_entropy_bits']:.3f}",
                ]
                + ["1.00"] * len(batches)
                + ["-", "-"]
            )
            for r in (r for r in study["rows"] if f"{r['temperature']:g}" == t):
                rows.append(
                    [
                        r["drafter"],
                        r["k"],
                        t,
                        f"{r['tokens_per_call']:.3f} +- {r['tokens_per_call_se']:.3f}",
                        " ".join(f"{p:.2f}" for p in r["acceptance_by_position"]),
                        f"{r['nll']:.4f} +- {r['nll_se']:.4f}",
                        f"{r['unigram_entropy_bits']:.3f}",
                    ]
                    + [f"{r[f'vs_ar_b{b}']:.2f}" for b in batches]
                    + [
                        f"{1.5 * r['tokens_per_call'] / r[f'vs_ar_b{batches[0]}']:.2f}",
                        f"{r[f'ar_tokens_per_s_b{batches[0]}']:,.0f}",
                    ]
                )
                if "own" in r:  # the spec run's causal half drawn without drafts: the law its row must match
                    o = r["own"]
                    exact = {True: ", its greedy text", False: ", NOT its greedy text"}.get(r.get("greedy_exact"), "")
                    rows.append(
                        [
                            f"  its causal half, no drafts{exact}",
                            "-",
                            t,
                            "1.00",
                            "-",
                            f"{o['nll']:.4f} +- {o['nll_se']:.4f}",
                            f"{o['unigram_entropy_bits']:.3f}",
                        ]
                        + ["-"] * (len(batches) + 2)
                    )
        lines.append(
            f"speculative sampling of {study['target']} (L {study['length']}); quality: "
            f"{study['ar']['quality']} of {quality_samples} samples at each temperature T "
            f"(T 0: every text the greedy one); 1.5x needs: the tokens a call the row's calls, at the "
            f"price they were timed at, would have to write for 1.5x AR at batch {batches[0]}; AR tok/s: "
            f"AR's own at batch {batches[0]} in the row's cell (each ratio is against the AR of its cell: "
            "where AR ran slower than in the other cells, the ratio overstates)"
        )
        lines.append(
            format_table(
                ["drafter", "k", "T", "tok/call", "acceptance by position", "NLL", "unigram H (bits)"]
                + [f"vs AR b={b}" for b in batches]
                + ["1.5x needs", f"AR tok/s b={batches[0]}"],
                rows,
            )
        )
    if profile is not None and study is not None and specs:  # the runs' tokens a call at that size's prices
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
        lines.append(
            f"each spec run's tokens a call (above) at the prices of {profile['size']}'s size "
            f"(AR {ar_ms:.3f} ms a token): tokens a call x AR's ms a token / ms a round, batch 1"
        )
        lines.append(format_table(["spec run", "layout", "tokens a call", "ms a round", "vs AR b=1"], rows))
    dtypes = None
    if args.dtypes and study is not None and specs:  # AR at its best here: each dtype's text, and the spec run's
        dtypes = dtype_pair(
            args.target,
            args.spec.split(",")[0],
            next((lay for lay in args.layouts or () if lay != "auto"), "1,2"),
            batches,
            repeats,
            quality_samples,
            tuple(args.dtypes.split(",")),
        )
        lines += dtype_lines(dtypes, Path(args.spec.split(",")[0]).name)
    overlaps = {}
    grouped = {} if study is None else {n: run for n, run in specs.items() if isinstance(run.kind.layout, Layout)}
    if grouped:  # each spec run's first group drafts against the most any such draft could keep (a head's see more)
        overlaps = {name: draft_overlap(run) for name, run in grouped.items()}
        names = list(next(iter(overlaps.values())))
        lines.append(
            "a group's first draft kept (one draft, the verifier's token unseen), exactly over that token, "
            "at each group's first position of 16 validation texts; by the draft's law q"
        )
        lines.append(
            format_table(
                ["spec run"] + names,
                [[name] + [f"{o[n]['mean']:.3f} +- {o[n]['se']:.3f}" for n in names] for name, o in overlaps.items()],
            )
        )
    result = {
        "benchmark": "speculative",
        "call_cost": curves,
        "layout_ceiling": ceilings,
        "loop_profile": profile,
        "study": study,
        "draft_overlap": overlaps,
        "dtypes": dtypes,
        "table": "\n\n".join(lines),
    }
    if args.picture and study is not None:
        path = Path(args.picture)
        speculative_picture(result, path)
        print(f"wrote {path}")
    return result
