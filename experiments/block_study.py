r"""The block-diffusion study: bound, samples' quality and speed of AR, SEDD and block runs of one corpus.

    python experiments/block_study.py --ar RUN --runs RUN [RUN ...] [--out DIR]

For each run: its bound (or the AR run's exact NLL) on the validation split
(``sedd.figures.evaluate_run``, the figure of `sedd eval`); num_samples texts
of L characters with each of its samplers, judged by the AR run
(``sedd.evaluate.generative_perplexity``: nats per character of the judge,
and the samples' unigram entropy); and the seconds to write `length`
characters at batch 1 and 16, timed interleaved with the AR run in one
process (``experiments.timing.interleaved``). Writes
block_study.{json,md,png} into --out: the table, and the plot of quality
(judge nats/char) against speed relative to AR at batch 1.

Runs of a Markov corpus of ``experiments/default_run_study.py`` (text of a
known law) take ``--markov-seed S``, the seed of its chain: each sampler's
samples are then also scored exactly under the chain (nats/char with 2
standard errors, ``experiments.quality.texts_nll``), the figure the issue's
targets name, and the plot shows that instead of the judge's:

    python experiments/block_study.py --markov-seed 2 --num_samples 64 --out STUDY/markov_seed2/speed \
        --ar STUDY/markov_seed2/ar --runs STUDY/markov_seed2/{default,block16,block4,block1}
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import numpy as np

if not __package__:  # run as a file: import experiments/ by its location (experiments/__init__.py says why)
    import importlib.util

    _spec = importlib.util.spec_from_file_location("experiments", Path(__file__).resolve().parent / "__init__.py")
    if "experiments" not in sys.modules:
        sys.modules["experiments"] = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(sys.modules["experiments"])

from experiments.quality import markov_chain, texts_nll  # noqa: E402
from experiments.timing import format_table, interleaved, machine, median, paired_ratio  # noqa: E402
from experiments.writing import by_blocks, writer  # noqa: E402
from sedd import evaluate, figures, runs  # noqa: E402
from sedd.kinds.capabilities import Diffuses  # noqa: E402

# (label, sampler, options, steps): a block model's steps are per block (None: one token a step), SEDD's in all
WHOLE = [("EB 128", "entropy_bound", {}, 128), ("analytic 128", "analytic", {}, 128)]
BLOCKS = [("EB", "entropy_bound", {}, None), ("threshold 0.9", "confidence", {"threshold": 0.9}, None)]
ANCESTRAL = [("ancestral", None, {}, None)]


def samplers(run: runs.Run) -> list[tuple]:
    """The samplers of the study for a run: by what its kind does (ancestral, whole sequence, block by block)."""
    if not isinstance(run.kind, Diffuses):
        return ANCESTRAL
    return BLOCKS if by_blocks(run.kind, run.seq_len) else WHOLE


def study(
    ar_dir: str,
    run_dirs: list[str],
    num_samples: int,
    length: int,
    repeats: int,
    eval_batches: int,
    markov_seed: int | None = None,
) -> dict:
    """The rows of the study (one per run and sampler) and the machine; with markov_seed, the samples' exact NLL."""
    judge = figures.load_judge(ar_dir)
    chain = None if markov_seed is None else markov_chain(markov_seed)
    key = jax.random.key(0)
    rows = []
    for workdir in [ar_dir, *run_dirs]:
        run = runs.load(workdir)
        bound = figures.evaluate_run(workdir, num_t=64, batch_size=32, max_batches=eval_batches)
        for label, sampler, options, steps in samplers(run):
            samples = np.asarray(writer(run, sampler, options, steps, num_samples, run.seq_len, key)().tokens)
            quality = evaluate.generative_perplexity(figures.judge_nll(judge), samples)
            row = {
                "model": run.kind.label,
                "workdir": str(workdir),
                "sampler": label,
                "bits_per_char": bound["bits_per_char"],
                "exact": bound["exact"],
                "judge_nats_per_char": quality["judge_nats_per_token"],
                "entropy_bits": float(evaluate.sample_entropy_bits(samples).mean()),
            }
            if chain is not None:
                nll, se, scored = texts_nll([run.decode(s) for s in samples], chain)
                row.update(exact_nats_per_char=nll, exact_2se=2 * se, scored_share=scored)
            for batch in (1, 16):
                fns = {
                    "ar": writer(judge, None, {}, None, batch, length, key),
                    "this": writer(run, sampler, options, steps, batch, length, key),
                }
                out = fns["this"]()
                nfe = int(out.stats["nfe"]) if out.stats else length  # the AR loop: one call a token
                times = interleaved(fns, repeats)
                row[f"tokens_per_s_b{batch}"] = batch * length / median(times["this"])
                row[f"vs_ar_b{batch}"] = paired_ratio(times["ar"], times["this"])
                row[f"nfe_b{batch}"] = nfe
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"rows": rows, "machine": machine(), "length": length, "num_samples": num_samples}
    if chain is not None:
        result.update(markov_seed=markov_seed, rate_nats_per_char=chain.entropy_rate())
    return result


def write(result: dict, out: Path) -> None:
    """block_study.json, .md (the table) and .png (quality against speed x AR at batch 1)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "block_study.json").write_text(json.dumps(result, indent=1, default=float))
    header = [
        "model",
        "sampler",
        "bound bits/char",
        "judge nats/char",
        "entropy bits",
        "tok/s B=1",
        "x AR B=1",
        "NFE B=1",
        "tok/s B=16",
        "x AR B=16",
    ]
    rows = [
        [
            r["model"],
            r["sampler"],
            f"{r['bits_per_char']:.3f}" + (" (exact)" if r["exact"] else ""),
            f"{r['judge_nats_per_char']:.3f}",
            f"{r['entropy_bits']:.2f}",
            f"{r['tokens_per_s_b1']:.0f}",
            f"{r['vs_ar_b1']:.2f}",
            r["nfe_b1"],
            f"{r['tokens_per_s_b16']:.0f}",
            f"{r['vs_ar_b16']:.2f}",
        ]
        for r in result["rows"]
    ]
    if "markov_seed" in result:  # the exact NLL beside the judge's
        header.insert(4, "exact NLL nats/char")
        for row, r in zip(rows, result["rows"]):
            row.insert(4, f"{r['exact_nats_per_char']:.3f} +- {r['exact_2se']:.3f}")
    table = format_table(header, rows)
    (out / "block_study.md").write_text(table + "\n")
    print(table)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    quality = "exact_nats_per_char" if "markov_seed" in result else "judge_nats_per_char"
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in result["rows"]:
        ax.scatter(r["vs_ar_b1"], r[quality])
        ax.annotate(f"{r['model']}, {r['sampler']}", (r["vs_ar_b1"], r[quality]), fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel(f"speed writing {result['length']} characters at batch 1, x the AR run's (log; timed interleaved)")
    if "markov_seed" in result:
        ax.axhline(result["rate_nats_per_char"], color="gray", lw=0.8, ls=":", label="the chain's entropy rate")
        ax.legend(fontsize=7)
        ax.set_ylabel(f"samples' exact NLL under chain {result['markov_seed']} (nats/char)")
    else:
        ax.set_ylabel("AR judge's NLL of the samples (nats/char)")
    ax.set_title("block diffusion: quality against speed")
    fig.tight_layout()
    fig.savefig(out / "block_study.png", dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ar", required=True, help="the AR run (the judge and the speed baseline)")
    p.add_argument("--runs", nargs="+", required=True, help="SEDD and block runs of the same data")
    p.add_argument("--num_samples", type=int, default=16)
    p.add_argument("--length", type=int, default=1024, help="characters written for the speed columns")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--eval_batches", type=int, default=8)
    p.add_argument("--out", default="block_study")
    p.add_argument(
        "--markov-seed",
        type=int,
        default=None,
        help="runs of default_run_study.py's markov corpus of this chain seed: score samples exactly",
    )
    args = p.parse_args(argv)
    write(
        study(args.ar, args.runs, args.num_samples, args.length, args.repeats, args.eval_batches, args.markov_seed),
        Path(args.out),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
