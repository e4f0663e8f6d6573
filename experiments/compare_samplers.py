"""Compare samplers of a trained run: quality, entropy, cost per predictor x steps.

  python experiments/compare_samplers.py --workdir checkpoints/markov \
      --predictors euler,analytic --steps 8,16,32,64,128,256,1024 --num_samples 16

For each predictor and step count: the judge's generative perplexity (an AR
baseline run: --judge, default WORKDIR/ar), the unigram entropy of the samples,
the exact NLL of the samples when the data is synthetic (data.name = "markov"),
network evaluations and wall time. Writes compare_samplers.csv, .md and .png
into the run directory (or --out). The figures come from sedd.evaluate; this
file runs the grid and writes the report.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Sequence

import jax
import matplotlib
import numpy as np
from tqdm.auto import tqdm

from sedd import ar, evaluate, runs, sampling
from sedd.data.markov import chain_from_config

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file backend)

DEFAULT_STEPS = (8, 16, 32, 64, 128, 256, 1024)


def check_steps(steps: Sequence) -> list[int]:
    """A list of positive step counts, or a ValueError naming the bad entries."""
    try:
        steps = list(steps)
    except TypeError:
        raise ValueError(f"steps must be a list of positive integers, got {steps!r}") from None
    bad = [s for s in steps if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1]
    if bad or not steps:
        raise ValueError(f"steps must be a non-empty list of positive integers; bad entries: {bad or steps}")
    return [int(s) for s in steps]


def compare_samplers(
    workdir: str | Path,
    predictors: Sequence[str] = ("euler", "analytic"),
    steps: Sequence[int] = DEFAULT_STEPS,
    num_samples: int = 16,
    judge: str | Path | None = None,
    seed: int = 0,
    categorical: str | None = None,
    warmup: bool = True,
    out_dir: str | Path | None = None,
    progress: bool = True,
    include_ar: bool = True,
) -> list[dict]:
    """Sample with each predictor x step count; score and time the samples.

    Per row: predictor, steps, network evaluations (steps + 1 with the final
    denoise), wall time of the sampling call in seconds (after a compiling
    warm-up call when ``warmup``), samples per second, the judge's gen-PPL and
    per-token NLL, the mean unigram entropy of the samples in bits, and on
    synthetic data the exact NLL of the samples in nats per token with the true
    entropy of the data beside it. When the judge is an AR run, a last row
    samples from the judge itself with its KV cache (L network calls of one
    token each), the speed and quality baseline.

    Writes into out_dir (default: the run directory) compare_samplers.csv,
    compare_samplers.md and compare_samplers.png.

    Args:
      workdir: a trained diffusion run.
      predictors: names in ``sedd.sampling.PREDICTORS``.
      steps: positive step counts.
      num_samples: samples per row.
      judge: an AR run directory; None = workdir/ar when it exists. Required
        unless the data is synthetic.
      seed: sampling seed (the same for every row).
      categorical: the categorical method (default: the run's config).
      warmup: time a second call, so compilation is not counted.
      out_dir: where the files go.
      progress: show a progress bar.
      include_ar: add the AR baseline row when the judge is an AR run.
    Returns:
      the rows, as dicts.
    Raises:
      FileNotFoundError: untrained workdir or judge; no judge for text data.
      ValueError: bad steps, unknown predictor, a judge of another vocabulary,
        a workdir that holds an AR run.
    """
    steps = check_steps(steps)
    unknown = [p for p in predictors if p not in sampling.PREDICTORS]
    if unknown or not predictors:
        raise ValueError(f"unknown predictors {unknown or predictors}; expected some of {sorted(sampling.PREDICTORS)}")
    workdir = Path(workdir)
    run = runs.load(workdir)
    config, tokenizer = run.config, run.tokenizer
    if run.is_ar:
        raise ValueError(f"{workdir} holds an AR run; compare_samplers needs a diffusion run "
                         "(pass the AR run as --judge)")
    chain = None
    if config.data.name == "markov":
        chain = chain_from_config(config.data)
    if judge is None and (workdir / "ar" / "config.json").exists():
        judge = workdir / "ar"
    judge_model = None
    if judge is not None:
        judge_model = evaluate.load_judge(judge, tokenizer).model
    elif chain is None:
        raise FileNotFoundError(
            f"no judge for {workdir}: pass --judge AR_RUN_DIR, or train the AR baseline into {workdir / 'ar'}:\n"
            f"  sedd train --config CONFIG --config.model.kind=ar --workdir {workdir / 'ar'}")
    categorical = categorical or config.sampling.categorical
    length = config.data.seq_len
    true_nats = chain.sequence_entropy(length) / length if chain is not None else None

    def score(samples: np.ndarray) -> dict:
        row = {"entropy_bits": float(evaluate.sample_entropy_bits(samples).mean())}
        if judge_model is not None:
            g = evaluate.generative_perplexity(judge_model, samples)
            row.update(gen_ppl=g["gen_ppl"], judge_nats_per_token=g["judge_nats_per_token"])
        if chain is not None:
            row.update(exact_nats_per_token=float(-chain.log_prob(samples).mean() / length),
                       true_nats_per_token=true_nats)
        return row

    def timed(fn) -> tuple[np.ndarray, float]:
        if warmup:
            jax.block_until_ready(fn())
        start = time.perf_counter()
        out = np.asarray(jax.block_until_ready(fn()))
        return out, time.perf_counter() - start

    rows = []
    jobs = [(p, s) for p in predictors for s in steps]
    key = jax.random.key(seed)
    for p, s in tqdm(jobs, desc="compare", disable=not progress, dynamic_ncols=True):
        samples, wall = timed(lambda: run.sample(key, num_samples, steps=s, predictor=p, categorical=categorical))
        rows.append({"predictor": p, "steps": s, "network_evals": s + 1, "wall_s": wall,
                     "samples_per_s": num_samples / wall, **score(samples)})
    if include_ar and judge_model is not None:
        samples, wall = timed(lambda: ar.sample(key, judge_model, num_samples, length, categorical=categorical))
        rows.append({"predictor": "ar (kv cache)", "steps": length, "network_evals": length, "wall_s": wall,
                     "samples_per_s": num_samples / wall, **score(samples)})
    out_dir = Path(out_dir) if out_dir is not None else workdir
    write_report(rows, out_dir, meta={"workdir": str(workdir), "judge": str(judge) if judge else None,
                                      "num_samples": num_samples, "seed": seed, "categorical": categorical,
                                      "seq_len": length})
    return rows


COLUMNS = ("predictor", "steps", "network_evals", "wall_s", "samples_per_s", "gen_ppl",
           "judge_nats_per_token", "entropy_bits", "exact_nats_per_token", "true_nats_per_token")


def write_report(rows: list[dict], out_dir: str | Path, meta: dict | None = None) -> dict[str, Path]:
    """compare_samplers.{csv,md,png} in out_dir; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cols = [c for c in COLUMNS if any(c in r for r in rows)]
    paths = {"csv": out_dir / "compare_samplers.csv", "md": out_dir / "compare_samplers.md",
             "png": out_dir / "compare_samplers.png"}
    with open(paths["csv"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)

    def fmt(v):
        return "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))

    lines = []
    if meta:
        lines.append("<!-- " + json.dumps(meta) + " -->")
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    paths["md"].write_text("\n".join(lines) + "\n")
    plot(rows, paths["png"])
    return paths


def plot(rows: list[dict], path: Path) -> None:
    """Quality against steps and against sample entropy, one line per predictor."""
    quality = "exact_nats_per_token" if any("exact_nats_per_token" in r for r in rows) else "gen_ppl"
    label = {"exact_nats_per_token": "exact NLL of samples (nats/token)", "gen_ppl": "judge gen-PPL"}[quality]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name in dict.fromkeys(r["predictor"] for r in rows):
        rs = [r for r in rows if r["predictor"] == name and quality in r]
        if not rs:
            continue
        if name.startswith("ar"):
            for ax, x in ((a, rs[0]["network_evals"]), (b, rs[0]["entropy_bits"])):
                ax.scatter([x], [rs[0][quality]], marker="*", s=120, color="k", label=name, zorder=3)
            continue
        a.plot([r["steps"] for r in rs], [r[quality] for r in rs], "o-", label=name)
        b.plot([r["entropy_bits"] for r in rs], [r[quality] for r in rs], "o-", label=name)
    if quality == "exact_nats_per_token" and rows and rows[0].get("true_nats_per_token") is not None:
        for ax in (a, b):
            ax.axhline(rows[0]["true_nats_per_token"], ls="--", color="gray", label="data entropy")
    a.set_xscale("log", base=2)
    a.set_xlabel("sampling steps (network evaluations - 1)")
    b.set_xlabel("unigram entropy of samples (bits)")
    for ax in (a, b):
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    a.set_title("quality vs steps")
    b.set_title("quality vs entropy")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def int_list(text: str) -> list[int]:
    """"8,16,32" -> [8, 16, 32], or a ValueError naming the text."""
    try:
        return check_steps([int(s) for s in text.split(",") if s.strip()])
    except ValueError:
        raise ValueError(f"--steps must be comma-separated positive integers, got {text!r}") from None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", required=True, help="a trained diffusion run directory")
    p.add_argument("--predictors", default="euler,analytic", help="comma-separated predictor names")
    p.add_argument("--steps", default=",".join(map(str, DEFAULT_STEPS)), help="comma-separated positive step counts")
    p.add_argument("--num_samples", type=int, default=16, help="samples per row")
    p.add_argument("--judge", default=None, help="an AR run directory (default: WORKDIR/ar if it exists)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--categorical", default=None, help="precise | gumbel32 (default: the run's config)")
    p.add_argument("--no_warmup", action="store_true", help="time the first (compiling) call")
    p.add_argument("--out", default=None, help="output folder (default: the run directory)")
    args = p.parse_args(argv)
    try:
        rows = compare_samplers(
            args.workdir, predictors=[s.strip() for s in args.predictors.split(",") if s.strip()],
            steps=int_list(args.steps), num_samples=args.num_samples, judge=args.judge, seed=args.seed,
            categorical=args.categorical, warmup=not args.no_warmup, out_dir=args.out)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out or args.workdir)
    print((out / "compare_samplers.md").read_text())
    print(f"wrote {out}/compare_samplers.csv, .md, .png ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
