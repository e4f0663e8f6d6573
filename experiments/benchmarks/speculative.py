"""`bench.py speculative`: the cost of one AR call on n positions, and drafters against AR with its KV cache."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import call_cost, nets
from experiments.quality import sample_quality
from experiments.timing import format_table, interleaved, median, paired_ratio, tokens_per_call
from sedd.kinds import capabilities, causal
from sedd import config as config_lib
from sedd.kinds.capabilities import Diffuses
from sedd.kinds.spec import Layout


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
        rows.append(measure_cell(target, name, k, draft, spec, how, temp, batches, repeats, quality_samples, chain))
        row = rows[-1]
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


def measure_cell(target, name, k, draft, spec, how, temp, batches, repeats, quality_samples, chain) -> dict:
    """One cell of ``bench_speculative``: `target` with `draft` at k (or the self-drafting run `spec` at layout k,
    "auto" the one chosen at each batch), verification `how`, temperature `temp`: its calls, acceptance and
    quality on quality_samples texts, and its tokens/s at each batch interleaved with the target's own."""
    length, key = target.seq_len, jax.random.key(0)

    def sample(batch, key=key, draft=draft, k=k, how=how, spec=spec, temp=temp, timed=True):
        if spec is not None:  # k: the spec run's layout; "auto": the one chosen at the batch timed
            layout = chosen.get(batch if timed else min(batches), k)  # the quality samples: the first batch's
            return spec.sample(key, batch, return_stats=True, verification=how, layout=layout, temperature=temp)
        return target.sample(key, batch, draft=draft, draft_k=k, return_stats=True, verification=how, temperature=temp)

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
    return row


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


def study_lines(study: dict, batches: list[int], quality_samples: int) -> list[str]:
    """``bench_speculative``'s result as a title and a table: each writer against AR at each temperature."""
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
    title = (
        f"speculative sampling of {study['target']} (L {study['length']}); quality: "
        f"{study['ar']['quality']} of {quality_samples} samples at each temperature T "
        f"(T 0: every text the greedy one); 1.5x needs: the tokens a call the row's calls, at the "
        f"price they were timed at, would have to write for 1.5x AR at batch {batches[0]}; AR tok/s: "
        f"AR's own at batch {batches[0]} in the row's cell (each ratio is against the AR of its cell: "
        "where AR ran slower than in the other cells, the ratio overstates)"
    )
    return [
        title,
        format_table(
            ["drafter", "k", "T", "tok/call", "acceptance by position", "NLL", "unigram H (bits)"]
            + [f"vs AR b={b}" for b in batches]
            + ["1.5x needs", f"AR tok/s b={batches[0]}"],
            rows,
        ),
    ]


def run_speculative(quick: bool, args) -> dict:
    """Speculative sampling: the call-cost curve at two sizes, and drafters against AR with its KV cache."""
    sizes, ns, ks, batches, quality_samples, repeats = call_cost.sizes_of(quick, args)
    curves, ceilings = call_cost.cost_curves(
        {} if args.target and not args.cost_only else sizes, ns, batches, repeats, args
    )
    profile = call_cost.size_profile(sizes, quick, repeats, args)
    lines = [] if profile is None else call_cost.profile_lines(profile)
    lines += call_cost.curve_lines(curves, ceilings)
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
        lines += study_lines(study, batches, quality_samples)
    if profile is not None and study is not None and specs:  # the runs' tokens a call at that size's prices
        lines += call_cost.priced_lines(profile, study)
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
