"""Run the original's bench script with its CUDA autocast turned into CPU bfloat16 autocast.

The original SEDD computes its transformer blocks under
``torch.cuda.amp.autocast(dtype=torch.bfloat16)`` (and its LayerNorms and
rotary embedding under ``autocast(enabled=False)``). On a CPU that context
does nothing, so the original as shipped computes in float32 there. This
wrapper maps each of those contexts to ``torch.autocast("cpu", ...)`` with the
same arguments, which gives the original the bfloat16 matmuls it has on a
GPU: the like-for-like comparison with sedd's ``model.dtype = "bfloat16"``.

Runs in the original's venv (torch, no sedd):

    python original_autocast.py BENCH_ORIGINAL_SCRIPT [its arguments]
"""

import runpy
import sys

import torch


def cpu_autocast(enabled: bool = True, dtype=torch.bfloat16, cache_enabled: bool = True):
    """``torch.cuda.amp.autocast``'s signature, on the CPU."""
    return torch.autocast("cpu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


if __name__ == "__main__":
    torch.cuda.amp.autocast = cpu_autocast
    script, sys.argv = sys.argv[1], sys.argv[1:]
    print("original_autocast: torch.cuda.amp.autocast -> torch.autocast('cpu', bfloat16)")
    runpy.run_path(script, run_name="__main__")
