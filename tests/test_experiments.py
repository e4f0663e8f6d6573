"""Smoke test of the benchmark scripts: each runs with --quick and writes its JSON.

Benchmarks are scripts, not timed tests: nothing here checks a speed, only
that each script runs end to end on a tiny config and reports the fields the
docs quote. They run in this process (``runpy``), so jax is imported once.
"""

import json
import runpy
import sys
from pathlib import Path

import pytest

from sedd import bench

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {
    "train_mfu": ("train", ["mfu", "tokens_per_s", "flops_per_token", "peak_matmul_flops_per_s"]),
    "sampler_overhead": ("sampler", ["ratio_to_forward", "forward_s"]),
    "diffusion_vs_ar": ("diffusion_vs_ar", ["crossover_steps", "ar_seconds", "rows"]),
    "memory": ("memory", None),
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_script_quick(script, tmp_path, monkeypatch, capsys):
    out = tmp_path / f"{script}.json"
    monkeypatch.setattr(sys, "argv", [script, "--quick", "--json", str(out)])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / "experiments" / "benchmarks" / f"{script}.py"), run_name="__main__")
    assert exit_info.value.code == 0
    name, keys = SCRIPTS[script]
    result = json.loads(out.read_text())
    assert result["benchmark"] == name and result["quick"]
    assert result["machine"]["cpu_count"] >= 1 and result["machine"]["devices"]
    assert "-----" in capsys.readouterr().out  # the table was printed
    if name == "memory":
        tiny = result["results"]["tiny"]
        assert tiny["peak_bytes_estimate"] > 0 and tiny["state_bytes"] > 0
    else:
        for key in keys:
            assert key in result["results"][0]


def test_flops_formula():
    c = bench.bench_config("tiny", vocab_size=65)  # H 32, 2 blocks, L 32, mlp_ratio 4, D 66
    n = 2 * (4 * 32 * 32 + 8 * 32 * 32) + 32 * 66
    assert bench.matmul_params(c) == n
    assert bench.flops_per_token(c) == 6 * n + 12 * 2 * 32 * 32
    assert bench.flops_per_token(c, training=False) == 2 * n + 4 * 2 * 32 * 32


def test_paired_ratio_is_robust_to_drift():
    # A machine that slows down 3x half way: per-round ratios stay 2.
    assert bench.paired_ratio([2, 2, 6, 6, 6], [1, 1, 3, 3, 3]) == 2
