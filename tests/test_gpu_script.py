"""The GPU's prepared script and what it measures, checked on a CPU.

- the `[gpu]` extra pins a jax / flax pair known to import together;
- the attention switch (`sedd.kernels.ATTENTION`, cuDNN's flash attention on a
  GPU) changes nothing on a CPU: the same numbers, the same tokens;
- the decode variants that experiments/benchmarks/bench.py times (the AR loop
  unrolled, its weights stored in bfloat16) give `sedd.kinds.causal.ancestral`'s tokens;
- the chained-matmul peak computes the chain it claims;
- experiments/benchmarks/gpu.sh --toy runs every part end to end (slow: a few
  minutes on two shared cores).
"""

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from packaging.requirements import Requirement
from packaging.version import Version

import reference
from sedd import kernels, kinds
from sedd.kinds import causal
from sedd import config as config_lib

ROOT = Path(__file__).resolve().parent.parent


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench", ROOT / "experiments/benchmarks/bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load_bench()

# --------------------------------------------------------------------------- the [gpu] pins

# (jax, flax) pairs seen to import and run together, and pairs seen to fail.
KNOWN_GOOD = {
    ("0.10.2", "0.12.8"),  # these machines' CPU install, the whole test suite
    ("0.11.2", "0.12.10"),
}  # an H200 image (CUDA 13), docs/benchmarks.md's GPU runs
KNOWN_BAD = {("0.11.2", "0.12.8")}  # flax: `jax.experimental.hijax` has no `HiPrimitive`
# Releases the pins could admit (every jax 0.9-0.12 and flax 0.11-0.13 patch release up to these).
CANDIDATES_JAX = [f"0.{m}.{p}" for m in range(9, 13) for p in range(0, 6)]
CANDIDATES_FLAX = [f"0.{m}.{p}" for m in range(11, 14) for p in range(0, 16)]


def _setup_requirements() -> tuple[list[str], dict[str, list[str]]]:
    """(install_requires, extras_require) read off setup.py's setup(...) call without running it."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    kw = {k.arg: k.value for k in call.keywords}
    return ast.literal_eval(kw["install_requires"]), ast.literal_eval(kw["extras_require"])


def _admitted(requirements: list[str], name: str, candidates: list[str]) -> list[str]:
    reqs = [Requirement(r) for r in requirements if Requirement(r).name == name]
    assert reqs, f"no requirement names {name}"
    return [v for v in candidates if all(Version(v) in r.specifier for r in reqs)]


def test_gpu_extra_pins_a_pair_that_imports():
    base, extras = _setup_requirements()
    gpu = base + extras["gpu"]
    assert any(Requirement(r).name == "jax" and "cuda12" in Requirement(r).extras for r in extras["gpu"])
    pairs = {(j, f) for j in _admitted(gpu, "jax", CANDIDATES_JAX) for f in _admitted(gpu, "flax", CANDIDATES_FLAX)}
    assert pairs, "the [gpu] extra and install_requires admit no jax / flax pair together"
    assert pairs <= KNOWN_GOOD, f"[gpu] admits pairs not known to import: {sorted(pairs - KNOWN_GOOD)}"
    assert not pairs & KNOWN_BAD
    # The plain install still admits the CPU's tested pair.
    assert ("0.10.2", "0.12.8") in {
        (j, f) for j in _admitted(base, "jax", CANDIDATES_JAX) for f in _admitted(base, "flax", CANDIDATES_FLAX)
    }


def test_installed_pair_is_known_good():
    from importlib.metadata import version

    pair = (version("jax"), version("flax"))
    assert pair not in KNOWN_BAD


# --------------------------------------------------------------------------- attention switch


def _tiny(kind="ddit", dtype="float32", **model):
    c = config_lib.load_config("tiny")
    c.vocab_size = 29
    c.model.kind = kind
    c.model.dtype = dtype
    for k, v in model.items():
        c.model[k] = v
    return c


@pytest.mark.parametrize("setting", ["cudnn", "auto", "mixed"])
def test_attention_setting_changes_nothing_on_a_cpu(setting, monkeypatch):
    assert jax.default_backend() == "cpu"
    c = _tiny(dtype="bfloat16")
    model = kinds.build_model(c, 0)
    x = jax.random.randint(jax.random.key(0), (2, c.data.seq_len), 0, c.vocab_size)
    sigma = jnp.array([0.5, 1.5])
    monkeypatch.setattr(kernels, "ATTENTION", "mixed")
    ref = np.asarray(jax.jit(lambda x, s: model(x, s))(x, sigma))
    monkeypatch.setattr(kernels, "ATTENTION", setting)
    assert kernels.attention_implementation() == "mixed"  # cuDNN is a GPU's only
    out = np.asarray(jax.jit(lambda x, s: model(x, s))(x, sigma))
    np.testing.assert_array_equal(out, ref)


def test_attention_setting_is_checked(monkeypatch):
    monkeypatch.setattr(kernels, "ATTENTION", "flash")
    with pytest.raises(ValueError, match="SEDD_ATTENTION"):
        kernels.attention_implementation()


def test_cudnn_takes_only_its_shapes():
    q = jnp.zeros((1, 8, 2, 16))
    assert kernels._cudnn_ok(q, jnp.bfloat16, None)
    assert not kernels._cudnn_ok(q, jnp.float32, None)  # cuDNN's flash kernels are 16-bit
    assert not kernels._cudnn_ok(q, jnp.bfloat16, jnp.ones((8, 8), bool))  # block diffusion's mask stays mixed
    assert not kernels._cudnn_ok(jnp.zeros((1, 8, 2, 12)), jnp.bfloat16, None)


def test_cudnn_path_is_the_same_function_where_a_gpu_would_take_it(monkeypatch):
    """On a CPU, the "cudnn" branch with XLA's implementation standing in: mixed_attention's numbers up to
    bfloat16 rounding, causal and not (what the GPU path computes, less cuDNN's own kernel)."""
    real = jax.nn.dot_product_attention
    monkeypatch.setattr(kernels, "_on_gpu", lambda: True)
    monkeypatch.setattr(kernels, "ATTENTION", "cudnn")
    monkeypatch.setattr(
        jax.nn, "dot_product_attention", lambda *a, implementation=None, **k: real(*a, implementation="xla", **k)
    )
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 16, 2, 16)) for i in range(3))
    for is_causal in (False, True):
        got = kernels.mixed_attention(q, k, v, is_causal, jnp.bfloat16)
        monkeypatch.setattr(kernels, "ATTENTION", "mixed")
        ref = kernels.mixed_attention(q, k, v, is_causal, jnp.bfloat16)
        monkeypatch.setattr(kernels, "ATTENTION", "cudnn")
        assert got.dtype == jnp.float32
        assert float(jnp.linalg.norm(got - ref) / jnp.linalg.norm(ref)) < 1e-2


# --------------------------------------------------------------------------- decode variants


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_variants_give_ar_sample_tokens(dtype):
    c = _tiny("ar", dtype)
    model = kinds.build_model(c, 0)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    model = nnx.merge(graphdef, reference.perturbed(params, 0.3, 1), rest)
    key, length = jax.random.key(3), 20
    ref = np.asarray(causal.ancestral_model(key, model, 2, length))
    assert len(np.unique(ref)) > 3  # not a constant draw
    low = bench.stored_in_compute_dtype(model)
    if dtype == "bfloat16":
        assert model.layers[0].attn_qkv.kernel[...].dtype == jnp.float32  # the caller's model is untouched
        assert low.layers[0].attn_qkv.kernel[...].dtype == jnp.bfloat16
        assert low.layers[0].norm1.scale[...].dtype == jnp.float32
    for m, unroll in ((model, 3), (low, 1)) if dtype == "bfloat16" else ((model, 1), (model, 3)):
        out = bench.ar_decode(m, key, jnp.float32(1.0), num_samples=2, length=length, unroll=unroll)
        np.testing.assert_array_equal(np.asarray(out), ref)


def test_matmul_loop_is_the_chain():
    fn, flops = bench.matmul_loop_fn(16, 3, jnp.float32)
    assert flops == 2 * 16**3 * 3
    a = np.asarray(jax.random.normal(jax.random.key(0), (16, 16), jnp.float32))
    b = np.asarray(jax.random.normal(jax.random.key(1), (16, 16), jnp.float32)) / 4
    np.testing.assert_allclose(np.asarray(fn()), a @ b @ b @ b, rtol=1e-4, atol=1e-4)
    assert bench.datasheet_bf16("NVIDIA H200")[0] == 989e12 and bench.datasheet_bf16("cpu") == (None, "")


def test_trace_helpers():
    assert bench._union_ns([(0, 10), (5, 15), (20, 25)]) == 20
    f = jax.jit(lambda x: jax.lax.fori_loop(0, 4, lambda i, y: jnp.sin(y) @ y, x))
    ops = bench._hlo_loop_ops(f.lower(jnp.ones((4, 4))).compile().as_text())
    assert sum(ops.values()) > 0


# --------------------------------------------------------------------------- the script, end to end


@pytest.mark.slow
def test_gpu_script_toy_dry_run(tmp_path):
    """gpu.sh --toy: every part at tiny sizes on this CPU (~3-5 minutes on two shared cores, so slow)."""
    env = dict(os.environ, PYTHON=sys.executable, GPU_SH_BUDGET="900", PYTHONPATH=str(ROOT))
    run = subprocess.run(
        ["bash", "experiments/benchmarks/gpu.sh", "--toy", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    parts = {
        name: name
        for name in ("decode", "train_attention", "decode_flags_default", "decode_flags_while", "speculative")
    } | {"spec_runs": "spec_bench"}  # a JSON file: its part's log
    for name, part in parts.items():
        assert (tmp_path / f"{name}.json").exists(), (name, (tmp_path / f"{part}.log").read_text()[-2000:])
    decode = json.loads((tmp_path / "decode.json").read_text())
    assert all(r["same_tokens_as_ar_sample"] for r in decode["results"] if r["what"].startswith("AR"))
    assert any(r["what"].startswith("block b=4") for r in decode["results"])
    assert decode["hlo_loop_body_ops_total"] > 0 and "trace" in decode
    train = json.loads((tmp_path / "train_attention.json").read_text())["results"]
    assert [r["attention_setting"] for r in train] == ["mixed", "cudnn"]
    assert all(r["attention"] == "mixed" for r in train)  # a CPU takes no cuDNN
    assert all(r["peak_iters"] == 2 and r["peak_one_call_flops_per_s"] > 0 for r in train)
    spec = json.loads((tmp_path / "spec_runs.json").read_text())["study"]  # part 5: runs trained by the script
    assert [(r["temperature"], r["k"]) for r in spec["rows"]] == [(1.0, 4), (1.0, "auto"), (0.0, 4), (0.0, "auto")]
    assert all("small_ar" in r["drafter"] and r["drafter_calls"] > 0 for r in spec["rows"][::2])  # the drafted AR
    assert spec["rows"][3]["greedy_exact"] is True  # at temperature 0 the spec run writes its causal half's text
    summary = (tmp_path / "summary.txt").read_text()
    assert "ms a call" in summary and "MFU vs loop" in summary and "one AR call on n new positions" in summary
    assert "speculative sampling of" in summary
