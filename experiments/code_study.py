r"""The code study: AR, SEDD and block runs of the standard library, with the measures code needs.

    python experiments/code_study.py --ar RUN --runs RUN [RUN ...] [--plays RUN ...] [--out DIR]

For each run and sampler: its bound (or the AR run's exact NLL) on the
validation files; completions of --num_prompts windows of held-out code
(each from its first --prompt_chars characters, ``sedd.figures.code_figures``):
the share that parses once cut after the last complete top-level statement,
of lines that tokenise, of characters copied verbatim from the training
files (>= 64 characters), the AR judge's NLL, the unigram entropy, and the
tokens each row writes a network call; then the seconds to write --length
tokens at batch 1 and 16, timed interleaved with the AR run (the speed
baseline with its KV cache) in one process. The held-out windows
themselves give the "data" row, the ceiling of the measures. --plays takes
block runs of the default corpus: their tokens a call, written unprompted
with the same samplers, set beside the code runs'. Writes
code_study.{json,md,png}. --tokens_per_call takes diffusion runs of any
corpus and writes only their tokens a call, a row's own and the batch's,
in one table (tokens_per_call.{json,md}).

    python experiments/code_study.py --out experiments/code/results \
        --ar checkpoints/code_ar --runs checkpoints/code checkpoints/code_block16 \
        --plays checkpoints/plays_block16
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

from experiments import writing  # noqa: E402
from experiments.timing import format_table, interleaved, machine, median, paired_ratio  # noqa: E402
from experiments.timing import tokens_per_call as per_call  # noqa: E402
from sedd import code_measures, figures, runs, sampling  # noqa: E402
from sedd.cli import unescape  # noqa: E402
from sedd.data import read_documents  # noqa: E402
from sedd.kinds.capabilities import Diffuses  # noqa: E402

# (label, sampler, options, steps): steps per block for a block run, in all for SEDD (None: one token a step)
ANCESTRAL = [
    ("ancestral", None, {}, None),
    ("speculative, n-gram drafts", None, {"draft": "ngram", "draft_k": 4}, None),
]
WHOLE = [("EB", "entropy_bound", {}, None), ("threshold 0.9", "confidence", {"threshold": 0.9}, None)]
BLOCKS = [*WHOLE, ("first hitting", "first_hitting", {}, None)]


def samplers(run: runs.Run) -> list[tuple]:
    """The samplers of the study for a run: by what its kind does (ancestral, whole sequence, block by block)."""
    if not isinstance(run.kind, Diffuses):
        return ANCESTRAL
    return BLOCKS if writing.by_blocks(run.kind, run.seq_len) else WHOLE


def writer(run: runs.Run, sampler, options, steps, batch: int, length: int, key):
    """A function that writes `batch` unprompted texts of `length` tokens (sampling.Samples with stats).

    A block run writes `length` tokens block by block; a SEDD run writes its own length L.
    """
    return writing.writer(
        run, sampler, options, steps, batch, length, key, max_length=writing.by_blocks(run.kind, run.seq_len)
    )


def speed(run: runs.Run, judge: runs.Run, sampler, options, steps, length: int, repeats: int, key) -> dict:
    """Tokens/s at batch 1 and 16 and the ratio to the AR run's, timed interleaved; tokens a call unprompted."""
    out = {}
    for batch in (1, 16):
        fns = {
            "ar": writer(judge, None, {}, None, batch, length, key),
            "this": writer(run, sampler, options, steps, batch, length, key),
        }
        times = interleaved(fns, repeats)
        stats = fns["this"]().stats
        out[f"tokens_per_s_b{batch}"] = batch * length / median(times["this"])
        out[f"vs_ar_b{batch}"] = paired_ratio(times["ar"], times["this"])
        out[f"unprompted_tokens_per_call_b{batch}"] = length / int(stats["nfe"]) if stats else 1.0
    return out


def study(
    ar_dir: str,
    run_dirs: list[str],
    plays: list[str],
    num_prompts: int,
    prompt_chars: int,
    length: int,
    repeats: int,
    eval_batches: int,
) -> dict:
    judge = figures.load_judge(ar_dir)
    key = jax.random.key(0)
    memo = code_measures.Memorisation("\x00".join(read_documents(figures.run_data(judge).builder, "train")))
    rows = []
    for workdir in [ar_dir, *run_dirs]:
        run = runs.load(workdir)
        dataset = figures.run_data(run)
        bound = figures.evaluate_run(workdir, num_t=64, batch_size=32, max_batches=eval_batches)
        for label, sampler, options, steps in samplers(run):
            code, texts = figures.code_figures(
                run,
                dataset,
                num_prompts,
                prompt_chars,
                judge=judge,
                steps=writing.steps_of(run, steps),
                sampler=sampler,
                memorisation=memo,
                **options,
            )
            if not rows:  # the held-out windows themselves
                rows.append(
                    {
                        "model": "data (held-out windows)",
                        "sampler": "",
                        "parse_rate": code["data_parse_rate"],
                        "complete_share": code["data_complete_share"],
                        "tokenise_rate": code["data_tokenise_rate"],
                        "memorised_share": code["data_memorised_share"],
                    }
                )
            row = {
                "model": run.kind.label,
                "workdir": str(workdir),
                "sampler": label,
                "bits_per_char": bound["bits_per_char"],
                "exact": bound["exact"],
                **{
                    k[len("samples_") :] if k.startswith("samples_") else k: v
                    for k, v in code.items()
                    if not k.startswith("data_")
                },
                "example": texts[0],
                **speed(run, judge, sampler, options, steps, length, repeats, key),
            }
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "example"}, default=float), flush=True)
    plays_rows = []
    for workdir in plays:
        run = runs.load(workdir)
        for label, sampler, options, steps in samplers(run):
            stats = writer(run, sampler, options, steps, 16, length, key)().stats
            plays_rows.append(
                {
                    "model": f"{run.kind.label} (plays)",
                    "sampler": label,
                    "unprompted_tokens_per_call_b16": length / int(stats["nfe"]),
                }
            )
            print(json.dumps(plays_rows[-1]), flush=True)
    return {
        "rows": rows,
        "plays": plays_rows,
        "machine": machine(),
        "length": length,
        "num_prompts": num_prompts,
        "prompt_chars": prompt_chars,
    }


def tokens_per_call(run_dirs: list[str], length: int, rows: int = 16, seed: int = 0) -> list[dict]:
    """Tokens a network call of diffusion runs of any corpus, the same way for each: one table to set them side by side.

    Each run writes `rows` unprompted texts of `length` tokens with each of its kind's samplers (``samplers``);
    a row's own figure is length over the calls that row needed (mean +- s.e. over the rows, by the delta
    method), the batch's is length over the calls the batch made (as many as its slowest row needed).
    """
    out = []
    for workdir in run_dirs:
        run = runs.load(workdir)
        for label, sampler, options, steps in samplers(run):
            stats = writer(run, sampler, options, steps, rows, length, jax.random.key(seed))().stats
            row, row_se = per_call(length, stats["nfe_per_sample"])  # a row's own calls
            out.append(
                {
                    "model": f"{run.kind.label} ({run.config.data.name})",
                    "workdir": str(workdir),
                    "sampler": label,
                    "tokens_per_call_row": row,
                    "tokens_per_call_row_se": row_se,
                    "tokens_per_call_batch": length / int(stats["nfe"]),
                }
            )
            print(json.dumps(out[-1]), flush=True)
    return out


def denoise_picture(workdir: str, prompt: str, sampler: str, frames: int, out: Path) -> None:
    """code_denoise.png: one completion of a diffusion run as it denoises, masks drawn as sampling.MASK_CHAR."""
    run = runs.load(workdir)
    mask, tokens = sampling.text_conditioning(run.tokenizer, run.seq_len, 1, prefix=prompt)
    steps = run.seq_len
    every = max(1, steps // frames)
    result = run.sample(
        jax.random.key(1),
        1,
        steps,
        sampler,
        fixed_mask=mask,
        fixed_tokens=tokens,
        return_trajectory=True,
        trajectory_every=every,
    )
    mask_id = run.graph.dim - 1

    def text(ids) -> str:
        return "".join(sampling.MASK_CHAR if i == mask_id else run.tokenizer.decode([i]) for i in ids)

    frames = [
        (f"after {k * every} of {steps} steps", text(np.asarray(f[0]).tolist()))
        for k, f in enumerate(result.trajectory)
    ]
    picks = [frames[round(k * (len(frames) - 1) / 6)] for k in range(3)] + [
        ("the completion", text(result.tokens[0].tolist()))
    ]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    for ax, (label, body) in zip(axes.flat, picks):
        ax.text(
            0,
            1,
            body.replace("\t", "    "),
            family="monospace",
            fontsize=6.5,
            va="top",
            transform=ax.transAxes,
            clip_on=True,
        )
        ax.set_title(label, fontsize=8)
        ax.axis("off")
    fig.suptitle(f"{run.kind.label}, {sampler}: a completion of {prompt!r} as it denoises", fontsize=9)
    fig.savefig(out / "code_denoise.png", dpi=130, bbox_inches="tight")


def _cell(r: dict, key: str, fmt: str) -> str:
    v = r.get(key)
    return "" if v is None or (isinstance(v, float) and np.isnan(v)) else format(v, fmt)


def write(result: dict, out: Path) -> None:
    """code_study.json, .md (the tables) and .png (parse rate and judge NLL against speed x AR at batch 1)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "code_study.json").write_text(json.dumps(result, indent=1, default=float))
    header = [
        "model",
        "sampler",
        "bound bits/char",
        "judge nats/char",
        "entropy bits",
        "parses",
        "complete",
        "lines tokenise",
        "copied >= 64",
        "tokens/call (prompted)",
        "tokens/call B=16 (unprompted)",
        "tok/s B=1",
        "x AR B=1",
        "tok/s B=16",
        "x AR B=16",
    ]
    rows = [
        [
            r["model"],
            r["sampler"],
            _cell(r, "bits_per_char", ".3f") + (" (exact)" if r.get("exact") else ""),
            _cell(r, "judge_nats_per_char", ".3f"),
            _cell(r, "entropy_bits", ".2f"),
            _cell(r, "parse_rate", ".2f"),
            _cell(r, "complete_share", ".2f"),
            _cell(r, "tokenise_rate", ".2f"),
            _cell(r, "memorised_share", ".2f"),
            _cell(r, "tokens_per_call", ".2f"),
            _cell(r, "unprompted_tokens_per_call_b16", ".2f"),
            _cell(r, "tokens_per_s_b1", ".0f"),
            _cell(r, "vs_ar_b1", ".2f"),
            _cell(r, "tokens_per_s_b16", ".0f"),
            _cell(r, "vs_ar_b16", ".2f"),
        ]
        for r in result["rows"]
    ]
    table = format_table(header, rows)
    plays = (
        format_table(
            ["model", "sampler", "tokens/call B=16 (unprompted)"],
            [[r["model"], r["sampler"], f"{r['unprompted_tokens_per_call_b16']:.2f}"] for r in result["plays"]],
        )
        if result["plays"]
        else ""
    )
    (out / "code_study.md").write_text(table + "\n\n" + plays + "\n")
    print(table, plays, sep="\n\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in (
        (axes[0], "parse_rate", "share of completions that parse"),
        (axes[1], "judge_nats_per_char", "AR judge's NLL of the completions (nats/char)"),
    ):
        for r in result["rows"]:
            if r.get("vs_ar_b1") is None or r.get(key) is None:
                continue
            ax.scatter(r["vs_ar_b1"], r[key])
            ax.annotate(f"{r['model']}, {r['sampler']}", (r["vs_ar_b1"], r[key]), fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel(f"speed writing {result['length']} tokens at batch 1, x the AR run's (log)")
        ax.set_ylabel(label)
    if result["rows"] and result["rows"][0]["model"].startswith("data"):
        axes[0].axhline(result["rows"][0]["parse_rate"], color="gray", lw=0.8, ls=":", label="held-out code")
        axes[0].legend(fontsize=7)
    fig.suptitle("code (the standard library): quality against speed")
    fig.tight_layout()
    fig.savefig(out / "code_study.png", dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ar", help="the AR run (the judge and the speed baseline)")
    p.add_argument("--runs", nargs="*", default=[], help="SEDD and block runs of the same data")
    p.add_argument("--plays", nargs="*", default=[], help="block runs of the plays: their tokens a call")
    p.add_argument("--num_prompts", type=int, default=32)
    p.add_argument("--prompt_chars", type=int, default=48)
    p.add_argument("--length", type=int, default=256, help="tokens written for the speed columns")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--eval_batches", type=int, default=4)
    p.add_argument("--out", default="code_study")
    p.add_argument(
        "--picture",
        default="",
        help="a diffusion run whose completion of --picture_prompt is drawn "
        "as it denoises (code_denoise.png); alone, only the picture is made",
    )
    p.add_argument("--picture_prompt", default="def parse_header(line):\n    ")
    p.add_argument(
        "--tokens_per_call",
        nargs="*",
        default=[],
        help="diffusion runs of any corpus: their tokens a "
        "call, unprompted, 16 rows of --length, one table (tokens_per_call.{json,md}); alone, only that",
    )
    args = p.parse_args(argv)
    if args.tokens_per_call:
        table = tokens_per_call(args.tokens_per_call, args.length)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "tokens_per_call.json").write_text(
            json.dumps({"rows": table, "length": args.length, "machine": machine()}, indent=1, default=float)
        )
        md = format_table(
            ["model", "sampler", "tokens/call, a row's own", "tokens/call, the batch's"],
            [
                [
                    r["model"],
                    r["sampler"],
                    f"{r['tokens_per_call_row']:.3f} +- {r['tokens_per_call_row_se']:.3f}",
                    f"{r['tokens_per_call_batch']:.3f}",
                ]
                for r in table
            ],
        )
        (out / "tokens_per_call.md").write_text(md + "\n")
        print(md)
        if not (args.runs or args.picture):
            return 0
    if args.picture:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        denoise_picture(args.picture, unescape(args.picture_prompt), "entropy_bound", 16, Path(args.out))
        if not args.runs:
            return 0
    write(
        study(
            args.ar,
            args.runs,
            args.plays,
            args.num_prompts,
            args.prompt_chars,
            args.length,
            args.repeats,
            args.eval_batches,
        ),
        Path(args.out),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
