"""`bench.py frontier`: every decoder of the library on one speed-quality chart, measured in one process.

Given trained runs of one corpus (an AR run, the baseline; any of a SEDD run, block runs, a spec run, an AR
run with a draft head, distilled students) and a judge (an AR run of that corpus trained longer than any
of them, not itself measured), each decoder setting writes texts of L tokens (the runs' length):

  speed    tokens/s at each batch, interleaved round by round with the AR run's KV-cached loop in the same
           process (the ratio is the median of the per-round ratios: ``experiments.timing``), and the
           network calls a text and the tokens a call of the quality samples;
  quality  of `quality_samples` texts drawn the same way: their NLL under the judge (nats a token), the
           unigram entropy of their tokens (bits), and on code the share that parses (``sedd.code_measures``).

The AR run's own texts are scored the same way: a setting is at AR's quality when its judged NLL is within
3% of theirs and its unigram entropy within 2% (the frontier issue's bar). Settings are chosen by what each
run's kind does (``experiments.writing``), never by its name. Out: a JSON, a Markdown table naming the
machine (``frontier_markdown``) and a figure (``frontier_picture``): tokens/s over AR's at batch 1 against
the judged NLL, one mark a setting.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from experiments.timing import format_table, interleaved, median, paired_ratio, tokens_per_call
from experiments.writing import by_blocks, writer
from sedd import code_measures, figures, sampling
from sedd.kinds import capabilities

SEDD_STEPS = (8, 16, 32, 64, 128)
# A block run's adaptive samplers, each at b steps a block (at most one token a step when it is unsure): left to
# right with the sure positions after the first (one a step at threshold 1), the EB-sampler's entropy budgets
# (nats) and Fast-dLLM's confidence thresholds.
BLOCK_SETTINGS = (
    ("left_to_right", {"threshold": 1.0}),
    ("left_to_right", {"threshold": 0.9}),
    ("left_to_right", {"threshold": 0.7}),
    ("left_to_right", {"threshold": 0.5}),
    ("entropy_bound", {"max_entropy": 0.1}),
    ("entropy_bound", {"max_entropy": 0.5}),
    ("entropy_bound", {"max_entropy": 2.0}),
    ("confidence", {"threshold": 0.9}),
    ("confidence", {"threshold": 0.7}),
)
NLL_BAR, ENTROPY_BAR, SPEED_BAR = 0.03, 0.02, 1.5  # at AR's quality: NLL within 3%, entropy within 2%; 1.5x AR


@dataclasses.dataclass(frozen=True)
class Decoder:
    """One decoder setting of one run: how `writer` is asked to write."""

    run: str  # the run's name (its folder)
    family: str  # its kind's label ("ar", "block b=4", ...), with "+ layout" for a tuned causal run
    setting: str  # the sampler and its options, for the table
    sampler: str | None = None
    steps: int | None = None
    options: tuple = ()  # sorted (key, value) pairs of the sampler's (or Run.sample's) options

    @property
    def kwargs(self) -> dict:
        return dict(self.options)


def decoders_of(
    name: str, run, sedd_steps=SEDD_STEPS, sedd_samplers=None, block_settings=BLOCK_SETTINGS, layouts: tuple = ("auto",)
) -> list[Decoder]:
    """The settings a run is measured at, by what its kind does.

    A causal LM writes one token a call on its KV cache; one that tunes a round's layout (a spec run, an
    AR run with a draft head) writes each of `layouts` too. A block run: each of `block_settings` at b
    steps a block. A whole-sequence denoiser (SEDD, a distilled student): each sampler (default: every
    registered one that runs on its graph) at each step count.
    """
    kind = run.kind
    label = kind.label
    if not isinstance(kind, capabilities.Diffuses):
        out = [Decoder(name, label, "KV cache, a token a call")]
        if _tunes(kind):
            out += [Decoder(name, f"{label} rounds", f"layout {lay}", options=(("layout", lay),)) for lay in layouts]
        return out
    if by_blocks(kind, run.seq_len):
        b = kind.one_token_steps(run.seq_len)
        return [Decoder(name, label, _describe(s, o), s, b, tuple(sorted(o.items()))) for s, o in block_settings]
    samplers = sedd_samplers or [s for s in sampling.SAMPLERS if _runs_on(s, kind.graph)]  # every one, by default
    return [Decoder(name, label, s, s, n) for s in samplers for n in sedd_steps]


def _runs_on(sampler: str, graph) -> bool:
    try:
        sampling.check_graph(sampler, graph)
    except ValueError:
        return False
    return True


def _tunes(kind) -> bool:
    """Whether a causal run has a round's layout to time (a spec run, an AR run with a draft head)."""
    return isinstance(kind, capabilities.Tunes) and kind.layout is not None


def _describe(sampler: str, options: dict) -> str:
    return sampler + "".join(f" {k}={v:g}" for k, v in options.items())


def _layout_chosen(run, layout, batch: int) -> Any:
    """A tuned run's layout at this batch: the fastest here for "auto" (timed, nothing saved), else as given."""
    if layout != "auto":
        return layout
    capabilities.tune(run.kind, run.net, {}, None, batch)
    return run.kind.layout.name  # its command-line spelling (str() is a description)


def _write_fn(run, d: Decoder, batch: int, length: int, key) -> Any:
    """() -> Samples with stats: `batch` texts of `length` tokens by the setting d."""
    options = d.kwargs
    if "layout" in options:
        options["layout"] = _layout_chosen(run, options["layout"], batch)
    return writer(run, d.sampler, options, d.steps, batch, length, key)


def _quality(tokens: np.ndarray, judge_nll, decode=None) -> dict:
    """The judged NLL (nats a token) of texts int[B, L], its standard error, their unigram entropy (bits); on
    code (`decode` given) the share of texts with a complete statement that parses."""
    tokens = np.asarray(tokens)
    nll = np.asarray(judge_nll(tokens), np.float64) / tokens.shape[1]  # (B,) nats a token
    counts = np.bincount(tokens.ravel()) / tokens.size
    seen = counts[counts > 0]
    out = {
        "nll": float(nll.mean()),
        "nll_se": float(nll.std(ddof=1) / math.sqrt(len(nll))) if len(nll) > 1 else float("nan"),
        "unigram_entropy_bits": float(-(seen * np.log2(seen)).sum()),
    }
    if decode is not None:
        out["parse_rate"] = code_measures.parse_figures(decode(row) for row in tokens)["parse_rate"]
    return out


def _calls(stats, batch: int, length: int) -> np.ndarray:
    """float[B]: each text's network calls (a drafter's counted with its target's); L for the plain AR loop."""
    if stats is None:
        return np.full(batch, float(length))
    calls = np.asarray(stats["nfe_per_sample"], np.float64)
    return calls + np.asarray(stats.get("draft_calls", np.zeros_like(calls)), np.float64)


def bench_frontier(
    runs: dict,
    judge,
    batches: list[int],
    repeats: int,
    quality_samples: int,
    settings: list[Decoder] | None = None,
    log=print,
) -> dict:
    """Every setting of every run against the first plain causal run (the AR baseline), in one process.

    Args:
      runs: {name: loaded ``sedd.runs.Run``}, one corpus and one length; the first causal run is the baseline,
        one token a call on its KV cache (its draft head's rounds, if it has one, are settings of their own).
      judge: a run with an exact likelihood of the same vocabulary (``figures.load_judge``), not in `runs`.
      batches: the batch sizes timed; repeats: interleaved rounds a batch.
      quality_samples: texts each setting's quality is of (drawn at that batch, in one call).
      settings: the decoder settings (default: ``decoders_of`` each run).
    Returns:
      {"length", "baseline", "ar": AR's own texts' quality, "rows": a dict a setting, "wall_s"}.
    """
    t0 = time.perf_counter()
    plain = [n for n, r in runs.items() if not isinstance(r.kind, capabilities.Diffuses)]
    if not plain:
        raise ValueError("the frontier measures every decoder against an AR run: give one (model.kind=ar)")
    base_name = plain[0]
    base = runs[base_name]
    length = base.seq_len
    if any(r.seq_len != length for r in runs.values()):
        raise ValueError(f"runs of different lengths: { ({n: r.seq_len for n, r in runs.items()}) }; give one L")
    for n, r in runs.items():  # (the --quick runs have no tokenizer, only ids)
        if r.tokenizer is not None and judge.tokenizer is not None:
            figures.check_same_vocabulary(r.tokenizer, judge.tokenizer, what=f"the judge (against {n})")
    judge_nll = figures.judge_nll(judge)
    on_code = base.config.data.name == "code"
    settings = settings if settings is not None else [d for n, r in runs.items() for d in decoders_of(n, r)]
    ar_plain = Decoder(base_name, base.kind.label, "KV cache, a token a call")
    settings = [d for d in settings if d != ar_plain]  # the baseline is the reference row, not a setting
    key, quality_key = jax.random.key(0), jax.random.key(1)

    def quality_of(run, d):
        fn = _write_fn(run, d, quality_samples, length, quality_key)
        out = fn()
        q = _quality(out.tokens, judge_nll, run.decode if on_code else None)
        calls = _calls(out.stats, quality_samples, length)
        per_call, per_call_se = tokens_per_call(length, calls)
        return dict(q, calls_per_text=float(calls.mean()), tokens_per_call=per_call, tokens_per_call_se=per_call_se)

    ar = quality_of(base, ar_plain)
    log(f"  AR ({base_name}): judged NLL {ar['nll']:.3f} +- {ar['nll_se']:.3f} nats a token")
    ar_fns = {b: _write_fn(base, ar_plain, b, length, key) for b in batches}
    rows = []
    for d in settings:
        run = runs[d.run]
        row = dict(dataclasses.asdict(d), options=d.kwargs, **quality_of(run, d))
        for b in batches:
            x = _write_fn(run, d, b, length, key)
            times = interleaved({"ar": lambda f=ar_fns[b]: f().tokens, "x": lambda f=x: f().tokens}, repeats)
            row[f"tokens_per_s_b{b}"] = b * length / median(times["x"])
            row[f"ar_tokens_per_s_b{b}"] = b * length / median(times["ar"])
            row[f"vs_ar_b{b}"] = paired_ratio(times["ar"], times["x"])
        row["nll_vs_ar"] = row["nll"] / ar["nll"] - 1
        row["entropy_vs_ar"] = row["unigram_entropy_bits"] / ar["unigram_entropy_bits"] - 1
        row["at_ar_quality"] = bool(row["nll_vs_ar"] <= NLL_BAR and abs(row["entropy_vs_ar"]) <= ENTROPY_BAR)
        rows.append(row)
        log(
            f"  {d.family} {d.setting}{'' if d.steps is None else f', {d.steps} steps'}: "
            f"{row['tokens_per_call']:.2f} tokens a call, judged NLL {row['nll']:.3f} ({row['nll_vs_ar']:+.1%}), "
            + ", ".join(f"{row[f'vs_ar_b{b}']:.2f}x AR at batch {b}" for b in batches)
        )
    return {
        "length": length,
        "baseline": base_name,
        "judge_step": judge.step,
        "on_code": on_code,
        "batches": batches,
        "ar": ar,
        "runs": {n: {"kind": r.kind.label, "step": r.step, "config": _size(r.config)} for n, r in runs.items()},
        "rows": rows,
        "wall_s": time.perf_counter() - t0,
    }


def _size(config) -> dict:
    m = config.model
    return {
        "hidden_size": m.hidden_size,
        "n_layers": m.n_layers,
        "n_iters": config.training.n_iters,
        "batch_size": config.training.batch_size,
    }


def best_at_ar_quality(result: dict, batch: int = 1) -> dict | None:
    """The fastest row at AR's quality at `batch` that is not the AR baseline itself, or None."""
    rows = [
        r
        for r in result["rows"]
        if r["at_ar_quality"] and not (r["run"] == result["baseline"] and r["sampler"] is None and not r["options"])
    ]
    return max(rows, key=lambda r: r[f"vs_ar_b{batch}"], default=None)


def _cells(result: dict) -> tuple[list[str], list[list[str]]]:
    """The table's header and rows of cells: AR's own texts first, then the settings fastest first."""
    batches, code = result["batches"], result["on_code"]
    header = ["decoder", "run", "setting", "steps", "calls", "tok/call"]
    header += [f"x AR b{b}" for b in batches] + ["judged NLL", "vs AR", "entropy", "vs AR"] + ["parses"] * code
    ar = result["ar"]
    rows = [
        ["AR's own texts", result["baseline"], "KV cache", "", f"{ar['calls_per_text']:.0f}"]
        + [f"{ar['tokens_per_call']:.2f}"]
        + ["1.00"] * len(batches)
        + [f"{ar['nll']:.3f} +- {ar['nll_se']:.3f}", "", f"{ar['unigram_entropy_bits']:.3f}", ""]
        + ([f"{ar['parse_rate']:.2f}"] if code else [])
    ]
    for r in sorted(result["rows"], key=lambda r: -r[f"vs_ar_b{batches[0]}"]):
        rows.append(
            [r["family"], r["run"], r["setting"], "" if r["steps"] is None else str(r["steps"])]
            + [f"{r['calls_per_text']:.1f}", f"{r['tokens_per_call']:.2f}"]
            + [f"{r[f'vs_ar_b{b}']:.2f}" for b in batches]
            + [f"{r['nll']:.3f} +- {r['nll_se']:.3f}", f"{r['nll_vs_ar']:+.1%}"]
            + [f"{r['unigram_entropy_bits']:.3f}", f"{r['entropy_vs_ar']:+.1%}"]
            + ([f"{r['parse_rate']:.2f}"] if code else [])
        )
    return header, rows


def frontier_table(result: dict) -> str:
    """The rows as a plain-text table: AR's own texts, then the settings fastest first at the first batch."""
    return format_table(*_cells(result))


def frontier_markdown(result: dict, title: str) -> str:
    """The table as Markdown under a line naming the machine, the runs and the bar."""
    m = result["machine"]
    bf16 = "with" if m["cpu_has_bfloat16_dots"] else "without"
    ar = result["ar"]
    best = best_at_ar_quality(result)
    verdict = (
        f"the fastest setting at AR's quality: {best['family']} {best['setting']} at {best['vs_ar_b1']:.2f}x AR"
        if best and 1 in result["batches"]
        else "no setting is at AR's quality"
    )
    head = (
        f"# {title}\n\n{m['cpu_count']} CPUs of an {m['cpu_model']} ({bf16} AVX512-BF16), {m['platform']}, "
        f"jax {m['jax']}, load (1, 5, 15 min) {m['load_average_1_5_15min']}; texts of {result['length']} tokens, "
        f"temperature 1; {result['quality_samples']} texts a setting judged; AR's own judged NLL "
        f"{ar['nll']:.3f} +- {ar['nll_se']:.3f} nats a token. At AR's quality: NLL within {NLL_BAR:.0%} and "
        f"unigram entropy within {ENTROPY_BAR:.0%} of AR's; {verdict}.\n\n"
    )
    header, rows = _cells(result)
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(row) + " |" for row in rows]
    return head + "\n".join(md) + "\n"


def frontier_picture(result: dict, path: Path, title: str = "") -> None:
    """Tokens/s over AR's at the first batch against the judged NLL, a mark a setting, a marker a family."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    batch = result["batches"][0]
    fig, ax = plt.subplots(figsize=(7.5, 5))
    families = sorted({r["family"] for r in result["rows"]})
    for family, marker in zip(families, "osD^v<>p*hX"):
        rs = [r for r in result["rows"] if r["family"] == family]
        ax.errorbar(
            [r["nll"] for r in rs],
            [r[f"vs_ar_b{batch}"] for r in rs],
            xerr=[2 * r["nll_se"] for r in rs],
            fmt=marker,
            label=family,
            capsize=2,
            ms=5,
            alpha=0.8,
        )
    ar = result["ar"]
    ax.axvspan(ar["nll"] * (1 - NLL_BAR), ar["nll"] * (1 + NLL_BAR), color="grey", alpha=0.15, label="AR's NLL +-3%")
    ax.plot([ar["nll"]], [1.0], "k*", ms=12, label="AR, KV cache")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.axhline(SPEED_BAR, color="tab:red", lw=0.8, ls=":", label=f"{SPEED_BAR}x AR")
    ax.set_yscale("log")
    ax.set_xlabel("NLL of the texts under the judge (nats a token; lower is better)")
    ax.set_ylabel(f"tokens/s over AR's with its KV cache, batch {batch}")
    m = result["machine"]
    ax.set_title(title or f"every decoder, {m['cpu_count']} cores of an {m['cpu_model']}", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _tiny_runs() -> tuple[dict, Any]:
    """--quick: random-weight AR, block and SEDD runs of the tiny Markov config, and an AR judge."""
    from experiments.benchmarks import nets  # noqa: PLC0415
    from sedd import config as config_lib  # noqa: PLC0415
    from sedd import runs as runs_lib  # noqa: PLC0415

    config = config_lib.load_config("markov")
    config.vocab_size = int(config.data.markov.vocab_size)
    config.data.seq_len = 32
    config.model.update(n_layers=1, hidden_size=32, n_heads=2)

    def random_run(kind, **model):
        c = config.copy_and_resolve_references()
        c.model.update(model, kind=kind)
        _, net = nets.random_net(c, kind)
        return runs_lib.from_parts(c, None, net.graphdef, net.params, net.rest)

    runs = {"ar": random_run("ar"), "block8": random_run("block", block_size=8), "sedd": random_run("ddit")}
    return runs, random_run("ar", hidden_size=16, n_heads=1)


def add_arguments(p) -> None:
    """bench.py's options of this benchmark alone (--workdirs, --steps, --layouts, --batch_sizes, --repeats,
    --quality_samples and --picture are shared with others)."""
    p.add_argument("--judge", default="", help="frontier: an AR run of the corpus trained longer than any measured")
    p.add_argument("--samplers", nargs="+", default=None, help="frontier: a SEDD run's samplers (default: all)")
    p.add_argument("--markdown", default="", help="frontier: the table as Markdown (default: beside the JSON)")
    p.add_argument("--title", default="", help="frontier: the Markdown table's and the picture's title")


def run_frontier(quick: bool, args) -> dict:
    """`bench.py frontier --workdirs RUN ... --judge RUN`: the table, the JSON; --picture and --markdown too."""
    from sedd import runs as runs_lib  # noqa: PLC0415

    if quick:
        runs, judge = _tiny_runs()
        args.quality_samples, args.repeats, args.steps = 4, 1, [4]
        samplers, block_settings = ("analytic", "entropy_bound"), BLOCK_SETTINGS[:2]
    else:
        if not args.workdirs or not args.judge:
            raise SystemExit("frontier: give --workdirs RUN ... (an AR run among them) and --judge AR_RUN")
        runs = {Path(p).name: runs_lib.load(p) for p in args.workdirs}
        judge = figures.load_judge(args.judge)
        samplers = tuple(args.samplers) if args.samplers else None
        block_settings = BLOCK_SETTINGS
    steps = tuple(args.steps or SEDD_STEPS)
    layouts = tuple(args.layouts or ("auto",))
    settings = [d for n, r in runs.items() for d in decoders_of(n, r, steps, samplers, block_settings, layouts=layouts)]
    result = bench_frontier(runs, judge, args.batch_sizes, args.repeats, args.quality_samples, settings)
    result.update(benchmark="frontier", quality_samples=args.quality_samples, table=frontier_table(result))
    return result
