"""Timing on a shared, noisy machine: what a figure was measured on, interleaved rounds, paired ratios, tables.

The rules every study and benchmark follows:
  * every figure that is compared is measured in the same process, with the
    candidates interleaved round by round (order reversed every other round),
    and the ratio is the median of the per-round ratios (``paired_ratio``);
  * the first call of each function (tracing + compilation) is never timed;
  * every result carries ``machine()``: devices, CPU count, the CPU's model and
    whether it has AVX512-BF16, load average, jax version and XLA_FLAGS.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Any, Callable

import jax
import numpy as np

from sedd import kernels


def machine() -> dict:
    """What the figures were measured on."""
    dev = jax.devices()
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "cpu_model": kernels.cpu_model(),
        "cpu_has_bfloat16_dots": kernels.cpu_has_bfloat16_dots(),  # AVX512-BF16 / AMX-BF16: "auto" is bfloat16
        "platform": dev[0].platform,
        "device_kind": dev[0].device_kind,
        "devices": [str(d) for d in dev],
        "device_count": len(dev),
        "cpu_count": os.cpu_count(),
        "load_average_1_5_15min": load,
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "matmul_precision": str(jax.config.jax_default_matmul_precision),
    }


def timed(fn: Callable[[], Any]) -> float:
    """Wall-clock seconds of one call of fn, its result waited for (``jax.block_until_ready``)."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Wall-clock seconds of each fn, interleaved: round r runs every fn once.

    The order is reversed every other round so that no fn always follows the
    same neighbour (caches, turbo, another user's burst).

    Args:
      fns: name -> a function of no arguments (its result is waited for).
      repeats: rounds timed.
      warmup: untimed calls of each fn first (1: the compiling call).
    Returns:
      name -> the seconds of its call in each round, a list of `repeats` floats.
    """
    for fn in fns.values():
        for _ in range(warmup):
            timed(fn)
    names = list(fns)
    times = {k: [] for k in names}
    for r in range(repeats):
        for k in names if r % 2 == 0 else names[::-1]:
            times[k].append(timed(fns[k]))
    return times


def paired_ratio(num: list[float], den: list[float]) -> float:
    """Median over rounds of num[r] / den[r]: robust to load that drifts between rounds."""
    return statistics.median(a / b for a, b in zip(num, den))


def median(xs: list[float]) -> float:
    """The median of a list of timings (robust to the outliers of a shared machine)."""
    return statistics.median(xs)


def tokens_per_call(length: int, calls) -> tuple[float, float]:
    """Tokens a network call of texts of `length` tokens that took `calls` calls each.

    Args:
      length: L, the tokens of each text.
      calls: float[B] or int[B], the network calls each text needed.
    Returns:
      (L / mean(calls), its standard error by the delta method over the texts; nan for one text).
    """
    calls = np.asarray(calls, np.float64)
    se = length * calls.std(ddof=1) / np.sqrt(len(calls)) / calls.mean() ** 2 if len(calls) > 1 else float("nan")
    return float(length / calls.mean()), float(se)


def format_table(header: list, rows: list[list]) -> str:
    """Right-aligned plain-text table of header and rows, a rule of dashes under the header."""
    cells = [[str(h) for h in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
