"""Compare samplers of trained runs at matched NFE: quality, entropy, exact distances.

  python experiments/compare_samplers.py --workdir /tmp/markov_run \\
      --samplers analytic,analytic:cache=True,first_hitting,confidence \\
      --steps 8,32,128 --num_samples 256

  python experiments/compare_samplers.py --workdirs checkpoints/sedd-small checkpoints/mdlm-owt \\
      checkpoints/duo --judge checkpoints/gpt2-judge --out /tmp/peers --steps 64,256

--workdirs puts several runs (a converted MDLM, BD3-LM or DUO beside SEDD, or
runs of one model family) in one table and plot, each row named "RUN:
SAMPLER"; each run gets the samplers its kind and graph support (the others
are skipped, with a line saying so: the uniform graph has no masks to order,
so no first_hitting or confidence there), all with the same judge and seed.

A sampler is NAME[:KEY=VALUE[:KEY=VALUE...]] (a name in
``sedd.sampling.SAMPLERS`` and keyword options of ``sedd.sampling.sample``:
temperature, top_p, corrector_steps, cache, order, max_entropy, schedule,
eta, ...). Each entry of --steps is an NFE budget: the sampler runs
(budget - 1) // (1 + corrector_steps) steps (one call each, plus the
corrector's, plus the final denoise), and the NFE it really made is reported
(``sample(..., return_stats=True)``: calls per sequence; fewer with cache, or
when an adaptive sampler finishes early).

A block run (model.kind = "block", n_b = seq_len / block_size blocks) takes
each budget for the whole sequence: budget // n_b - 2 steps a block (at least
one), its calls on one block's positions each.

Per cell, on synthetic Markov data (data.name = "markov", exact law): the
exact NLL of the samples in nats/token (and its standard error) beside the
true entropy of the data, the exact KL of the samples' n-gram law
(n = order + 1) to the chain's, the entropy of that n-gram law beside the
chain's, and the unigram entropy of the samples; a "data" row does the same
for exact draws of the chain (the floor of the KL at this sample size). On
text: the judge's generative perplexity (an AR run: --judge, default
WORKDIR/ar) and the unigram entropy; an "ar (kv cache)" row samples from the
judge itself. Writes compare_samplers.csv, .md and .png into the run
directory (or --out). The figures come from sedd.evaluate and
sedd.data.markov; this file runs the grid and writes the report.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import sys
import time
from pathlib import Path
from typing import Sequence

import jax
import matplotlib
import numpy as np
from tqdm.auto import tqdm

if not __package__:  # run as a file: import experiments/ by its location (experiments/__init__.py says why)
    import importlib.util

    _spec = importlib.util.spec_from_file_location("experiments", Path(__file__).resolve().parent / "__init__.py")
    if "experiments" not in sys.modules:
        sys.modules["experiments"] = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(sys.modules["experiments"])

from experiments.quality import chain_figures  # noqa: E402
from sedd import evaluate, figures, runs, sampling  # noqa: E402
from sedd.kinds import causal
from sedd.data.markov import chain_from_config  # noqa: E402
from sedd.kinds.capabilities import Diffuses  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file backend)

DEFAULT_STEPS = (16, 64, 128)
DEFAULT_SAMPLERS = (
    "analytic",
    "analytic:top_p=0.9",
    "analytic:corrector_steps=1",
    "first_hitting",
    "confidence",
    "confidence:order=random",
    "entropy_bound:max_entropy=1.0",
    "remdm:eta=0.02",
    "remdm:schedule=loop:eta=0.02",
)


def check_steps(steps: Sequence) -> list[int]:
    """A list of positive step counts (NFE budgets), or a ValueError naming the bad entries."""
    try:
        steps = list(steps)
    except TypeError:
        raise ValueError(f"steps must be a list of positive integers, got {steps!r}") from None
    bad = [s for s in steps if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1]
    if bad or not steps:
        raise ValueError(f"steps must be a non-empty list of positive integers; bad entries: {bad or steps}")
    return [int(s) for s in steps]


def _value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"True": True, "False": False}.get(text, text)


def parse_sampler(spec: str) -> tuple[str, dict]:
    """ "remdm:schedule=loop:eta=0.02" -> ("remdm", {"schedule": "loop", "eta": 0.02})."""
    name, *opts = spec.strip().split(":")
    if name not in sampling.SAMPLERS:
        raise ValueError(f"unknown sampler {name!r} in {spec!r}; expected one of {sorted(sampling.SAMPLERS)}")
    options = {}
    for o in opts:
        if "=" not in o:
            raise ValueError(f"sampler options are KEY=VALUE, got {o!r} in {spec!r}")
        k, v = o.split("=", 1)
        options[k] = _value(v)
    return name, options


def supported(run: runs.Run, specs: list[tuple], workdir: Path) -> list[tuple]:
    """The (spec, name, options) whose sampler the run's kind takes (``Kind.check_sampler``); a line for each other."""
    kept = []
    for spec in specs:
        try:
            run.kind.check_sampler(spec[1])
            kept.append(spec)
        except ValueError as e:
            print(f"{workdir}: skipping {spec[0]}: {e}")
    return kept


def find_judge(workdir: Path, judge, tokenizer, chain) -> tuple:
    """(the judge's directory, its network) or (None, None): --judge, else WORKDIR/ar where it exists.

    Raises:
      FileNotFoundError: no judge and no chain to score the samples exactly.
    """
    if judge is None and (workdir / "ar" / "config.json").exists():
        judge = workdir / "ar"
    judge_model = figures.load_judge(judge, tokenizer).model if judge is not None else None
    if judge_model is None and chain is None:
        raise FileNotFoundError(
            f"no judge for {workdir}: pass --judge AR_RUN_DIR, or train the AR baseline into {workdir / 'ar'}:\n"
            f"  sedd train --config CONFIG --config.model.kind=ar --workdir {workdir / 'ar'}"
        )
    return judge, judge_model


def sample_figures(samples: np.ndarray, judge_nll=None, chain=None) -> dict:
    """The figures of a cell's samples: their unigram entropy, the judge's generative perplexity (with a judge),
    the chain's exact figures (on Markov data)."""
    row = {"entropy_bits": float(evaluate.sample_entropy_bits(samples).mean())}
    if judge_nll is not None:
        g = evaluate.generative_perplexity(judge_nll, samples)
        row.update(gen_ppl=g["gen_ppl"], judge_nats_per_token=g["judge_nats_per_token"])
    if chain is not None:
        row.update(chain_figures(chain, samples))
    return row


def reference_rows(chain, judge_model, key, num_samples: int, length: int, seed: int, categorical: str, score) -> list:
    """The rows beside the samplers': the chain's own texts (Markov data), the AR judge's own samples (with one)."""
    rows = []
    if chain is not None:
        rows.append({"sampler": "data", **score(chain.sample(num_samples, length, seed=seed + 1))})
    if judge_model is not None:
        samples = np.asarray(causal.ancestral_model(key, judge_model, num_samples, length, categorical=categorical))
        rows.append({"sampler": "ar (kv cache)", "nfe": float(length), **score(samples)})
    return rows


def timed_sample(run, key, num_samples: int, options: dict, again: bool) -> tuple:
    """(``run.sample``'s output, its seconds when `again`: a second call after the one that compiles; else None)."""
    out = run.sample(key, num_samples, **options)
    if not again:
        return out, None
    start = time.perf_counter()
    out = run.sample(key, num_samples, **options)
    return out, time.perf_counter() - start


def compare_samplers(
    workdir: str | Path,
    samplers: Sequence[str] = DEFAULT_SAMPLERS,
    steps: Sequence[int] = DEFAULT_STEPS,
    num_samples: int = 16,
    judge: str | Path | None = None,
    seed: int = 0,
    categorical: str | None = None,
    out_dir: str | Path | None = None,
    progress: bool = True,
    include_ar: bool = True,
    time_calls: bool = False,
    skip_unsupported: bool = False,
    write: bool = True,
) -> list[dict]:
    """Sample with each sampler x NFE budget; score the samples.

    Args:
      workdir: a trained diffusion run.
      samplers: specs NAME[:KEY=VALUE...] (see the module docstring).
      steps: NFE budgets (positive).
      num_samples: samples per cell.
      judge: an AR run directory; None = workdir/ar when it exists. Required
        unless the data is synthetic.
      seed: sampling seed (the same for every cell).
      categorical: the categorical method (default: the run's config).
      out_dir: where the files go (default: the run directory).
      progress: show a progress bar.
      include_ar: add the AR judge's own samples when the judge is an AR run.
      time_calls: also time each cell (a second call after a compiling one).
      skip_unsupported: drop (with a printed line) the samplers the run's kind
        refuses (``Kind.check_sampler``) instead of failing on them.
      write: write the report files (``compare_runs`` writes one for all runs).
    Returns:
      the rows, as dicts.
    Raises:
      FileNotFoundError: untrained workdir or judge; no judge for text data.
      ValueError: bad budgets, an unknown sampler or option, a judge of
        another vocabulary, a workdir whose run does not diffuse (an AR run).
    """
    steps = check_steps(steps)
    specs = [(s, *parse_sampler(s)) for s in samplers]
    workdir = Path(workdir)
    run = runs.load(workdir)
    config, tokenizer = run.config, run.tokenizer
    if not isinstance(run.kind, Diffuses):
        raise ValueError(
            f"{workdir} holds a run that does not diffuse ({run.kind.label}); compare_samplers needs a "
            "diffusion run (pass an AR run as --judge)"
        )
    if skip_unsupported:
        specs = supported(run, specs, workdir)
    chain = chain_from_config(config.data) if config.data.name == "markov" else None
    judge, judge_model = find_judge(workdir, judge, tokenizer, chain)
    judge_nll = figures.judge_nll(judge) if judge_model is not None else None
    categorical = categorical or config.sampling.categorical
    length = config.data.seq_len

    score = functools.partial(sample_figures, judge_nll=judge_nll, chain=chain)
    rows = []
    key = jax.random.key(seed)
    jobs = [(spec, name, opts, budget) for spec, name, opts in specs for budget in steps]
    blocks = length // run.kind.one_token_steps(length)  # a block model's blocks (b positions, b steps); SEDD: 1
    for spec, name, opts, budget in tqdm(jobs, desc="compare", disable=not progress, dynamic_ncols=True):
        # A block run's steps are per block, each block closed by a denoise and a commit (two calls).
        per_block = budget // blocks - (2 if blocks > 1 else 1)
        n_steps = max(1, per_block // (1 + int(opts.get("corrector_steps", 0))))
        options = dict(steps=n_steps, sampler=name, categorical=categorical, return_stats=True, **opts)
        out, wall = timed_sample(run, key, num_samples, options, time_calls)
        stats = out.stats
        rows.append(
            {
                "sampler": spec,
                "budget": budget,
                "steps": n_steps,
                "nfe": float(np.mean(stats["nfe_per_sample"])),
                "nfe_batch": int(stats["nfe"]),
                "wall_s": wall,
                **score(out.tokens),
            }
        )
    rows += reference_rows(
        chain, judge_model if include_ar else None, key, num_samples, length, seed, categorical, score
    )
    if write:
        out_dir = Path(out_dir) if out_dir is not None else workdir
        write_report(
            rows,
            out_dir,
            meta={
                "workdir": str(workdir),
                "judge": str(judge) if judge else None,
                "num_samples": num_samples,
                "seed": seed,
                "categorical": categorical,
                "seq_len": length,
                "step": run.step,
            },
        )
    return rows


def compare_runs(
    workdirs: Sequence[str | Path], out_dir: str | Path, samplers: Sequence[str] = DEFAULT_SAMPLERS, **options
) -> list[dict]:
    """`compare_samplers` on each run (the samplers its kind supports), in one report in out_dir.

    Rows are named "RUN: SAMPLER" (RUN the directory's name) and carry a "run"
    column; the judge's own samples ("ar (kv cache)") and a Markov chain's
    exact draws ("data") appear once. options: those of `compare_samplers`.
    Raises:
      ValueError: fewer than one run, or two runs of one directory name.
    """
    names = [Path(w).name for w in workdirs]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"--workdirs needs one or more runs of distinct directory names, got {names}")
    rows, include_ar = [], options.pop("include_ar", True)
    for i, (workdir, name) in enumerate(zip(workdirs, names)):
        got = compare_samplers(
            workdir, samplers, skip_unsupported=True, write=False, include_ar=include_ar and i == 0, **options
        )
        for row in got:
            if row["sampler"] in ("data", "ar (kv cache)"):
                if i:
                    continue
            else:
                row["sampler"] = f"{name}: {row['sampler']}"
            rows.append({"run": name, **row})
    write_report(
        rows,
        out_dir,
        meta={
            "workdirs": [str(w) for w in workdirs],
            "samplers": list(samplers),
            **{k: str(v) for k, v in options.items() if k in ("judge", "seed")},
        },
    )
    return rows


COLUMNS = (
    "run",
    "sampler",
    "budget",
    "steps",
    "nfe",
    "nfe_batch",
    "wall_s",
    "gen_ppl",
    "judge_nats_per_token",
    "entropy_bits",
    "exact_nats_per_token",
    "exact_nats_per_token_se",
    "true_nats_per_token",
    "ngram_kl_nats",
    "ngram_entropy_nats",
    "true_ngram_entropy_nats",
)


def write_report(rows: list[dict], out_dir: str | Path, meta: dict | None = None) -> dict[str, Path]:
    """compare_samplers.{csv,md,png} in out_dir; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cols = [c for c in COLUMNS if any(r.get(c) is not None for r in rows)]
    paths = {
        "csv": out_dir / "compare_samplers.csv",
        "md": out_dir / "compare_samplers.md",
        "png": out_dir / "compare_samplers.png",
    }
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
    """Pareto views, one line per sampler: quality vs NFE, and quality vs entropy.

    Markov data: exact NLL vs NFE, n-gram KL vs NFE, exact NLL vs n-gram
    entropy. Text: gen-PPL vs NFE, gen-PPL vs unigram entropy.
    """
    markov = any("exact_nats_per_token" in r for r in rows)
    if markov:
        panels = [
            ("nfe", "exact_nats_per_token", "NFE per sequence", "exact NLL of samples (nats/token)"),
            ("nfe", "ngram_kl_nats", "NFE per sequence", "KL(samples' n-gram law || chain's) (nats)"),
            (
                "ngram_entropy_nats",
                "exact_nats_per_token",
                "entropy of the samples' n-gram law (nats)",
                "exact NLL of samples (nats/token)",
            ),
        ]
    else:
        panels = [
            ("nfe", "gen_ppl", "NFE per sequence", "judge gen-PPL"),
            ("entropy_bits", "gen_ppl", "unigram entropy of samples (bits)", "judge gen-PPL"),
        ]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 5.0))
    names = list(dict.fromkeys(r["sampler"] for r in rows))
    colors = plt.cm.tab20(np.linspace(0, 1, max(len(names), 2)))
    for ax, (xk, yk, xl, yl) in zip(axes, panels):
        for name, color in zip(names, colors):
            rs = [r for r in rows if r["sampler"] == name and r.get(yk) is not None]
            if name == "data" and xk == "nfe" and rs:  # exact draws have no NFE: a reference line
                ax.axhline(rs[0][yk], ls=":", color="k", label="exact draws of the chain")
                continue
            rs = [r for r in rs if r.get(xk) is not None]
            if not rs:
                continue
            if name in ("data", "ar (kv cache)"):
                ax.scatter([rs[0][xk]], [rs[0][yk]], marker="*", s=140, color="k", label=name, zorder=3)
                continue
            ax.plot([r[xk] for r in rs], [r[yk] for r in rs], "o-", color=color, label=name, ms=4)
        if yk == "exact_nats_per_token":
            true = next(r["true_nats_per_token"] for r in rows if "true_nats_per_token" in r)
            ax.axhline(true, ls="--", color="gray", label="true entropy")
        if xk == "ngram_entropy_nats":
            ax.axvline(
                next(r["true_ngram_entropy_nats"] for r in rows if "true_ngram_entropy_nats" in r),
                ls="--",
                color="gray",
            )
        if xk == "nfe":
            ax.set_xscale("log", base=2)
        if yk in ("ngram_kl_nats", "gen_ppl"):
            ax.set_yscale("log")
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), fontsize=7)
    fig.tight_layout(rect=(0, 0.06 + 0.03 * (len(labels) // 5), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def int_list(text: str) -> list[int]:
    """ "8,16,32" -> [8, 16, 32], or a ValueError naming the text."""
    try:
        return check_steps([int(s) for s in text.split(",") if s.strip()])
    except ValueError:
        raise ValueError(f"--steps must be comma-separated positive integers, got {text!r}") from None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    runs_arg = p.add_mutually_exclusive_group(required=True)
    runs_arg.add_argument("--workdir", help="a trained diffusion run directory")
    runs_arg.add_argument("--workdirs", nargs="+", help="several runs in one report (needs --out)")
    p.add_argument(
        "--samplers", default=",".join(DEFAULT_SAMPLERS), help="comma-separated NAME[:KEY=VALUE...] sampler specs"
    )
    p.add_argument(
        "--steps", default=",".join(map(str, DEFAULT_STEPS)), help="comma-separated NFE budgets (positive integers)"
    )
    p.add_argument("--num_samples", type=int, default=16, help="samples per cell")
    p.add_argument("--judge", default=None, help="an AR run directory (default: WORKDIR/ar if it exists)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--categorical", default=None, help="precise | gumbel32 (default: the run's config)")
    p.add_argument("--time", action="store_true", help="time each cell (a second, compiled call)")
    p.add_argument("--out", default=None, help="output folder (default: the run directory)")
    args = p.parse_args(argv)
    if args.workdirs and not args.out:
        p.error("--workdirs writes one report for all runs: give --out DIR")
    try:
        samplers = [s for s in args.samplers.split(",") if s.strip()]
        options = dict(
            steps=int_list(args.steps),
            num_samples=args.num_samples,
            judge=args.judge,
            seed=args.seed,
            categorical=args.categorical,
            time_calls=args.time,
        )
        if args.workdirs:
            rows = compare_runs(args.workdirs, args.out, samplers, **options)
        else:
            rows = compare_samplers(args.workdir, samplers=samplers, out_dir=args.out, **options)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out or args.workdir)
    print((out / "compare_samplers.md").read_text())
    print(f"wrote {out}/compare_samplers.csv, .md, .png ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
