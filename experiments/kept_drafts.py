"""How many of a self-drafting run's drafts its rounds keep (a spec run's, an AR run's draft head's), by position,
at temperature 1 and 0.

    python experiments/kept_drafts.py RUN [RUN ...] [--layouts 4,1 4,5] [--samples 128] [--json FILE]
    python experiments/kept_drafts.py runs/wide_head --layouts 4 2       # an AR run with a draft head

For each run (``model.kind = "spec"``, or "ar" with ``model.draft_head``) and layout, `--samples` texts are written with ``Run.sample`` after
the first `--prompt` tokens of as many validation texts (the causal half's law exactly, whatever the drafts;
at temperature 0 each row its own greedy text) and the share of rounds that kept the draft at position
i = 1 .. k is printed, with the tokens a call (the tokens written over every call, the prompt's prefill
included) and the causal half's validation NLL (``sedd eval``'s figure): what a training change of the drafts
(``training.draft_target``, ``training.draft_weight``) buys and what it costs the causal half.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import numpy as np

from sedd import figures, runs


def prompts(run, samples: int, length: int) -> np.ndarray:
    """The first `length` tokens of `samples` validation texts, int32[samples, length]: a different prompt a row,
    so that at temperature 0 the rows are different greedy texts, not one."""
    dataset = figures.run_data(run)
    split = "validation" if "validation" in dataset.splits else [s for s in dataset.splits if s != "train"][0]
    return np.asarray(next(iter(dataset.eval_batches(samples, split=split)))[:samples, :length], np.int32)


def kept(run, layout: str, temperature: float, prompt: np.ndarray) -> dict:
    """Kept drafts by position and tokens a call of texts written after `prompt` at this layout and temperature."""
    b, given = prompt.shape
    tokens = np.zeros((b, run.seq_len), np.int32)
    tokens[:, :given] = prompt
    stats = run.sample(
        jax.random.key(0),
        b,
        return_stats=True,
        layout=layout,
        temperature=temperature,
        fixed_mask=np.arange(run.seq_len)[None].repeat(b, 0) < given,
        fixed_tokens=tokens,
    ).stats
    rounds = np.asarray(stats["nfe_per_sample"], np.float64)  # (B,) calls a text
    return {
        "layout": layout,
        "temperature": temperature,
        "kept_by_position": (np.asarray(stats["accepted_at"], np.float64) / rounds.sum()).tolist(),
        "tokens_per_call": (run.seq_len - prompt.shape[1]) / float(rounds.mean()),
    }


def validation_nll(workdir: Path) -> float:
    """The causal half's exact NLL in bits/char on 8 validation batches of 32: the figure `sedd eval` and the end of
    `sedd train` print."""
    return figures.evaluate_run(workdir, progress=False)["bits_per_char"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="run directories: spec runs, AR runs with a draft head")
    p.add_argument(
        "--layouts",
        nargs="+",
        default=["4,1", "4,5"],
        help="round layouts, each 'K,GROUPS' (a spec run) or 'K' (a run with a draft head)",
    )
    p.add_argument("--samples", type=int, default=128, help="texts a cell, each after its own prompt")
    p.add_argument("--prompt", type=int, default=8, help="tokens of a validation text each row starts from")
    p.add_argument("--json", default="", help="write the rows here too")
    args = p.parse_args(argv)
    rows = []
    for workdir in map(Path, args.runs):
        run = runs.load(workdir)
        nll, prompt = validation_nll(workdir), prompts(run, args.samples, args.prompt)
        for layout in args.layouts:
            for temperature in (1.0, 0.0):
                row = {
                    "run": str(workdir),
                    "draft_target": run.config.training.draft_target,
                    "validation_bits_per_char": nll,
                    **kept(run, layout, temperature, prompt),
                }
                rows.append(row)
                print(
                    f"{workdir.name} ({row['draft_target']}, validation "
                    f"{nll:.3f} bits/char) layout {layout} T={temperature:g}: kept by "
                    f"position {' '.join(f'{k:.3f}' for k in row['kept_by_position'])}, "
                    f"{row['tokens_per_call']:.3f} tokens a call",
                    flush=True,
                )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
