"""`bench.py gpu_summary`: the table of experiments/benchmarks/gpu.sh's JSON files."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.timing import format_table


def gpu_summary(folder: str) -> str:
    """The table of experiments/benchmarks/gpu.sh: decode ms a call (each XLA_FLAGS variant), the training step's
    tokens/s and MFU against the measured matmul rate and the datasheet's, from the JSON files in `folder`;
    then the trained spec run against AR (spec_runs.md)."""
    rows = []
    for path in sorted(Path(folder).glob("decode*.json")):
        r = json.loads(path.read_text())
        flags = r["machine"]["xla_flags"] or "(none)"
        for row in r["results"]:
            rows.append(
                [
                    path.stem,
                    flags[:60],
                    row["what"],
                    f"{row['ms_per_call']:.3f}",
                    f"{row['tokens_per_s']:.0f}",
                    "" if row.get("same_tokens_as_ar_sample") is None else row["same_tokens_as_ar_sample"],
                ]
            )
    out = [
        "decode, batch 1 (ms a network call)",
        format_table(["file", "XLA_FLAGS", "what", "ms a call", "tok/s", "same tokens"], rows) if rows else "(none)",
    ]
    rows = []
    for path in sorted(Path(folder).glob("train*.json")):
        for r in json.loads(path.read_text())["results"]:
            rows.append(
                [
                    path.stem,
                    r.get("attention_setting", r["attention"])
                    + ("" if r["attention"] == r.get("attention_setting", r["attention"]) else f" ({r['attention']})"),
                    r["model"]["batch_size"],
                    f"{r['step_s'] * 1e3:.1f}",
                    f"{r['tokens_per_s']:.0f}",
                    f"{r['achieved_flops_per_s'] / 1e12:.1f}",
                    f"{r['peak_matmul_flops_per_s'] / 1e12:.1f}",
                    "-"
                    if r.get("peak_one_call_flops_per_s") is None
                    else f"{r['peak_one_call_flops_per_s'] / 1e12:.1f}",
                    f"{r['mfu']:.3f}",
                    "-" if r.get("mfu_datasheet") is None else f"{r['mfu_datasheet']:.3f}",
                    "-" if r["peak_bytes_in_use"] is None else f"{r['peak_bytes_in_use'] / 2**30:.1f}",
                ]
            )
    out += [
        "",
        "training step (MFU: model FLOPs 6N + 12 n L H a token)",
        format_table(
            [
                "file",
                "attention",
                "B",
                "ms a step",
                "tok/s",
                "TFLOP/s",
                "matmul loop TFLOP/s",
                "one-call matmul TFLOP/s",
                "MFU vs loop",
                "MFU vs datasheet",
                "peak GiB",
            ],
            rows,
        )
        if rows
        else "(none)",
    ]
    rows = []
    for path in sorted(Path(folder).glob("speculative*.json")):
        for size, curve in json.loads(path.read_text())["call_cost"].items():
            rows += [
                [path.stem, size, r["n"], f"{r['ms_per_call']:.3f}", f"{r['ratio_to_n1']:.2f}"] for r in curve["rows"]
            ]
    out += [
        "",
        "one AR call on n new positions, batch 1 (when a draft of n - 1 tokens pays)",
        format_table(["file", "size", "n", "ms a call", "vs n=1"], rows) if rows else "(none)",
    ]
    for path in sorted(Path(folder).glob("spec_runs*.md")):  # bench.py speculative's own tables of the trained runs
        out += ["", path.read_text().rstrip()]
    return "\n".join(out)
