r"""Benchmarks: training MFU, sampler overhead, diffusion vs AR latency, memory.

Each benchmark is a function returning a dict, printed as a table and
written as JSON (default: experiments/benchmarks/results/NAME_PLATFORM.json):

  python experiments/benchmarks/bench.py train    [--quick] [--json PATH] [--config NAME --batch_sizes B] ...
                                                   tokens/s, FLOPs/token, MFU, peak memory (a GPU's)
  python experiments/benchmarks/bench.py sampler  [--quick] ...   predictor step / forward pass
  python experiments/benchmarks/bench.py ar       [--quick] ...   diffusion vs AR time to L tokens
  python experiments/benchmarks/bench.py block    [--quick] [--workdirs RUN ...] ...   AR, SEDD, block models: N tokens
  python experiments/benchmarks/bench.py bound    [--quick] [--block_sizes B ...] ...  the likelihood bound of a batch:
                                                   the default (ddit) vs block models, seconds and XLA's FLOPs
  python experiments/benchmarks/bench.py memory   [--quick] [--config NAME] [--mesh data=8,fsdp=1] [--device_gib 80]
                                                   [--config.KEY=VALUE ...]   compiled train-step bytes a device, a plan
  python experiments/benchmarks/bench.py rng      [--quick] ...   dropout masks and race words, JAX's and sedd.rng's
  python experiments/benchmarks/bench.py optimizer [--quick] ...  the default's step: AdamW, Muon, with and without ZeRO-1
  python experiments/benchmarks/bench.py profile  [--quick] [--dtype D] ...  the default's step: op time by kind (jax.profiler)
  python experiments/benchmarks/bench.py decode   [--quick] [--trace] ...  batch-1 decode: ms a network call (AR with
                                                   KV cache and its variants, block models), a GPU trace's kernels a call
  python experiments/benchmarks/bench.py speculative [--quick] [--target AR_RUN --drafts ngram,RUN,... --spec RUN]
                                                   [--picture PNG]   the cost of one AR call on n positions (n = 1..32),
                                                   drafters' tokens a call, acceptance, tokens/s vs AR, quality
  python experiments/benchmarks/bench.py gpu_summary --json DIR   the table of experiments/benchmarks/gpu.sh's JSON files
  python experiments/benchmarks/bench.py all      [--quick] ...

Timing rules, because the machines these run on are shared and noisy:
  * every figure that is compared is measured in the same process, with the
    candidates interleaved round by round (order reversed every other round),
    and the ratio is the median of the per-round ratios;
  * the first call of each function (tracing + compilation) is never timed;
  * every result carries ``machine()``: devices, CPU count, the CPU's model and
    whether it has AVX512-BF16, load average, jax version and XLA_FLAGS.

FLOPs: model FLOPs per token of ``sedd.model.flops_per_token`` (6 N + 12 n L H
for training, N the matmul weights a token meets).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sedd import ar, block, evaluate, kernels, kinds, sampling, sharding
from sedd import config as config_lib
from sedd import model as model_lib
from sedd.train import Trainer

RESULTS_DIR = Path(__file__).resolve().parent / "results"

# --------------------------------------------------------------------------- machine and timing


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or the platform's processor string where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """What the figures were measured on."""
    dev = jax.devices()
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "cpu_model": cpu_model(),
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


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - t0


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Wall-clock seconds of each fn, interleaved: round r runs every fn once.

    The order is reversed every other round so that no fn always follows the
    same neighbour (caches, turbo, another user's burst).
    """
    for fn in fns.values():
        for _ in range(warmup):
            _timed(fn)
    names = list(fns)
    times = {k: [] for k in names}
    for r in range(repeats):
        for k in names if r % 2 == 0 else names[::-1]:
            times[k].append(_timed(fns[k]))
    return times


def tokens_per_call(length: int, calls) -> tuple[float, float]:
    """(L / mean(calls), its s.e. by the delta method from the calls' over the texts; nan for one text)."""
    calls = np.asarray(calls, np.float64)
    se = length * calls.std(ddof=1) / np.sqrt(len(calls)) / calls.mean() ** 2 if len(calls) > 1 else float("nan")
    return float(length / calls.mean()), float(se)


def paired_ratio(num: list[float], den: list[float]) -> float:
    """Median over rounds of num[r] / den[r]: robust to load that drifts between rounds."""
    return statistics.median(a / b for a, b in zip(num, den))


def median(xs: list[float]) -> float:
    """The median of a list of timings (robust to the outliers of a shared machine)."""
    return statistics.median(xs)


def matmul_fn(n: int = 2048, dtype=jnp.float32) -> tuple[Callable[[], Any], float]:
    """A jitted n x n x n matmul and its FLOPs (2 n^3): the device's practical peak.

    Accumulated and returned in float32 whatever ``dtype``, as the model's
    products are (``sedd.kernels.mixed_einsum``).
    """
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    f = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
    return (lambda: f(a, b)), 2.0 * n**3


def matmul_loop_fn(n: int = 2048, iters: int = 8, dtype=jnp.float32) -> tuple[Callable[[], Any], float]:
    """`iters` back-to-back n x n x n products in one jitted call, and their FLOPs (2 n^3 iters).

    The chip's matmul rate without the dispatch of a call in it (one product a
    call reads 365-444 TFLOP/s on an H200 whose cuBLAS runs ~790): a
    ``fori_loop`` whose each product multiplies the last one's output (in
    `dtype`, accumulated in float32 inside the product, as torch's bf16 matmul
    does) by b, scaled by 1 / sqrt(n) so that the values stay of order one; the
    chain keeps XLA from hoisting or dropping any product.
    """
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    b = (jax.random.normal(jax.random.key(1), (n, n), jnp.float32) / np.sqrt(n)).astype(dtype)
    f = jax.jit(lambda a, b: jax.lax.fori_loop(0, iters, lambda i, x: jnp.matmul(x, b, preferred_element_type=dtype), a))
    return (lambda: f(a, b)), 2.0 * n**3 * iters


# Dense (no sparsity) bfloat16 tensor rates of the vendors' datasheets, FLOP/s, by a word of device_kind.
DATASHEET_BF16_FLOPS = {"H200": (989e12, "H200 SXM datasheet, dense bf16 989 TFLOP/s"),
                        "H100": (989e12, "H100 SXM datasheet, dense bf16 989 TFLOP/s"),
                        "A100": (312e12, "A100 datasheet, dense bf16 312 TFLOP/s")}


def datasheet_bf16(device_kind: str) -> tuple[float | None, str]:
    """(the datasheet's dense bf16 FLOP/s, its name) of a device kind, (None, "") where not known (CPUs)."""
    for word, (rate, name) in DATASHEET_BF16_FLOPS.items():
        if word in device_kind:
            return rate, name
    return None, ""


# --------------------------------------------------------------------------- configs and FLOPs


def bench_config(base: str = "shakespeare_char", vocab_size: int = 85, **model_overrides):
    """A shipped config with vocab_size set (normally set from the tokenizer) and model overrides.

    Keys: hidden_size, n_blocks, n_heads, cond_dim, seq_len, batch_size, kind, dtype.
    """
    c = config_lib.load_config(base)
    c.vocab_size = vocab_size
    for k, v in model_overrides.items():
        if k == "seq_len":
            c.data.seq_len = v
        elif k == "batch_size":
            c.training.batch_size = v
        else:
            c.model[k] = v
    return c


def matmul_params(config) -> int:
    """N of ``sedd.model.matmul_params`` for a config's network."""
    return model_lib.matmul_params(nnx.eval_shape(lambda: kinds.build_model(config)))


def flops_per_token(config, training: bool = True) -> float:
    """``sedd.model.flops_per_token`` of a config's network at its sequence length."""
    return model_lib.flops_per_token(nnx.eval_shape(lambda: kinds.build_model(config)), config.data.seq_len, training)


# --------------------------------------------------------------------------- training


def bench_train(config, repeats: int = 5, matmul_n: int = 2048, profile: bool = True, peak_iters: int = 0) -> dict:
    """Tokens/s and MFU of ``Trainer.train_step`` against a matmul timed in the same rounds.

    With ``profile`` the loss forward and forward+backward are timed in the
    same rounds too, which splits a step into forward, backward and
    optimizer/EMA time (the non-matmul share shows up as the gap to the peak).
    With ``peak_iters`` the peak is `matmul_loop_fn`'s (that many products a
    call) and the single product is timed beside it; MFU is also given
    against the datasheet's rate where the device is known (``mfu_datasheet``).
    """
    trainer = Trainer(config)
    b, l = config.training.batch_size, config.data.seq_len
    batch = trainer.shard_batch(
        np.asarray(jax.random.randint(jax.random.key(1), (b, l), 0, config.vocab_size), np.int32))
    holder = {"state": trainer.init_state()}

    def step():
        holder["state"], metrics = trainer.train_step(holder["state"], batch)
        return metrics

    # The peak of the model's compute dtype: bfloat16 models against a bfloat16 matmul.
    dtype = kernels.compute_dtype(config.model.dtype)
    if peak_iters:
        mm, mm_flops = matmul_loop_fn(matmul_n, peak_iters, dtype)
        one, one_flops = matmul_fn(matmul_n, dtype)
        fns = {"train_step": step, "matmul": mm, "matmul_one_call": one}
    else:
        mm, mm_flops = matmul_fn(matmul_n, dtype)
        fns = {"train_step": step, "matmul": mm}
    if profile:
        key = jax.random.key(2)
        fwd = jax.jit(lambda p: trainer._loss(p, key, batch, True)[0])
        fwd_bwd = jax.jit(jax.grad(lambda p: trainer._loss(p, key, batch, True)[0]))
        fns["forward"] = lambda: fwd(holder["state"]["params"])
        fns["forward_backward"] = lambda: fwd_bwd(holder["state"]["params"])
    t_compile = _timed(step)
    times = interleaved(fns, repeats)
    stats = jax.local_devices()[0].memory_stats() or {}  # None on a CPU
    fpt = flops_per_token(config, training=True)
    tokens = b * l
    step_s = median(times["train_step"])
    peak = [mm_flops / t for t in times["matmul"]]
    achieved = [tokens * fpt / t for t in times["train_step"]]
    sheet, sheet_name = datasheet_bf16(jax.devices()[0].device_kind)
    out = {
        "attention": kernels.attention_implementation(),
        "model": dict(config.model.to_dict(), vocab_size=config.vocab_size, seq_len=l, batch_size=b,
                      loss_chunk=config.training.loss_chunk),
        "n_params": trainer.n_params,
        "matmul_params_N": matmul_params(config),
        "flops_per_token": fpt,
        "flops_formula": "6N + 12 n_blocks L H",
        "compile_s": t_compile,
        "step_s": step_s,
        "tokens_per_s": tokens / step_s,
        "achieved_flops_per_s": median(achieved),
        "peak_matmul_flops_per_s": median(peak),
        "matmul_n": matmul_n,
        "peak_iters": peak_iters,
        "peak_how": (f"{peak_iters} chained {matmul_n}^3 products in one jitted call" if peak_iters
                     else f"one {matmul_n}^3 product a jitted call"),
        "mfu": statistics.median(a / p for a, p in zip(achieved, peak)),
        "datasheet_flops_per_s": sheet,
        "datasheet": sheet_name,
        "mfu_datasheet": median(achieved) / sheet if sheet else None,
        "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
        "times_s": times,
    }
    if peak_iters:
        out["peak_one_call_flops_per_s"] = median([one_flops / t for t in times["matmul_one_call"]])
    if profile:
        out["forward_share_of_step"] = paired_ratio(times["forward"], times["train_step"])
        out["forward_backward_share_of_step"] = paired_ratio(times["forward_backward"], times["train_step"])
        fwd_flops = tokens * flops_per_token(config, training=False)
        out["forward_mfu"] = statistics.median(
            fwd_flops / t / p for t, p in zip(times["forward"], peak))
        out["forward_backward_mfu"] = statistics.median(
            3 * fwd_flops / t / p for t, p in zip(times["forward_backward"], peak))
    return out


def run_train(quick: bool, args) -> dict:
    """The training benchmark: tokens/s, FLOPs/token and MFU per batch size; dict with a table."""
    if quick:
        cases = [bench_config("tiny", batch_size=8)]
        repeats, mm_n = 1, 512
    elif args.configs:  # a shipped config's own step (its remat, loss chunks, padding), per batch size
        cases = []
        for name in args.configs:
            for b in args.batch_sizes:
                c = memory_config(name, args.overrides)
                c.training.batch_size = b
                cases.append(c)
        repeats, mm_n = args.repeats, args.matmul_n
    else:
        cases = [
            bench_config(hidden_size=args.width, n_heads=args.width // 64, n_blocks=args.blocks,
                         seq_len=args.seq_len, batch_size=b)
            for b in args.batch_sizes
        ]
        repeats, mm_n = args.repeats, args.matmul_n
    results = []
    saved = kernels.ATTENTION
    try:
        for c in cases:
            if args.dtype:
                c.model.dtype = args.dtype
            for attention in args.attention or [saved]:  # chosen when the step is traced
                kernels.ATTENTION = attention
                results.append(bench_train(c, repeats=repeats, matmul_n=mm_n,
                                           profile=not (quick or args.no_profile), peak_iters=args.peak_iters))
                results[-1]["attention_setting"] = attention
    finally:
        kernels.ATTENTION = saved
    rows = [[r["attention_setting"] + ("" if r["attention"] == r["attention_setting"] else f" ({r['attention']})"),
             r["model"]["hidden_size"], r["model"]["n_blocks"], r["model"]["seq_len"], r["model"]["batch_size"],
             f"{r['n_params'] / 1e6:.2f}M", f"{r['flops_per_token'] / 1e6:.1f}", f"{r['tokens_per_s']:.0f}",
             f"{r['achieved_flops_per_s'] / 1e9:.1f}", f"{r['peak_matmul_flops_per_s'] / 1e9:.1f}",
             f"{r['mfu']:.2f}", "-" if r["mfu_datasheet"] is None else f"{r['mfu_datasheet']:.2f}",
             f"{r.get('forward_mfu', float('nan')):.2f}",
             f"{r.get('forward_backward_mfu', float('nan')):.2f}",
             f"{r.get('forward_backward_share_of_step', float('nan')):.2f}",
             r["model"]["remat"], r["model"]["loss_chunk"],
             "-" if r["peak_bytes_in_use"] is None else f"{r['peak_bytes_in_use'] / 2**30:.1f}"]
            for r in results]
    table = format_table(
        ["attention", "H", "blocks", "L", "B", "params", "MFLOP/tok", "tok/s", "GFLOP/s", "peak GFLOP/s", "MFU",
         "MFU datasheet",
         "fwd MFU", "fwd+bwd MFU", "fwd+bwd/step", "remat", "loss_chunk", "peak GiB"], rows)
    r0 = results[0]
    table += (f"\npeak: {r0['peak_how']}" + (f" ({r0['peak_one_call_flops_per_s'] / 1e9:.1f} GFLOP/s with one product"
                                             " a call)" if r0["peak_iters"] else "")
              + (f"; datasheet: {r0['datasheet']}" if r0["datasheet"] else ""))
    return {"benchmark": "train", "results": results, "table": table}


# --------------------------------------------------------------------------- sampler overhead


def _diffusion_parts(config, seed: int = 0):
    """(graph, noise, score_params, score_fn(score_params, x, sigma)) of an untrained diffusion model."""
    graphdef, params, rest = nnx.split(kinds.build_model(config, seed), nnx.Param, ...)
    return kinds.build_graph(config), kinds.build_noise(config), (params, rest), kinds.params_score_fn(graphdef)


def bench_sampler(config, batch: int, repeats: int = 5, t: float = 0.5, steps: int = 128,
                  loop_steps: int = 16, predictors: list[str] | None = None,
                  key_impls: tuple[str, ...] = ("rbg",)) -> dict:
    """One sampler step divided by one plain forward pass, per sampler and categorical method.

    A step is ``sedd.sampling.one_step`` (the network call included), jitted
    alone. The state is a draw of x_t at time t (about half the positions
    masked for the absorbing graph), the step size that of a ``steps``-step
    grid. A whole ``sample`` call of ``loop_steps`` steps is timed too and
    divided by (loop_steps + 1) forward passes: the loop's own cost (no host
    round trips). ``key_impls`` adds rows for euler / analytic's precise path
    fed a key of another PRNG implementation (``jax.random.key(0, impl=...)``).
    """
    graph, noise, params, score_fn = _diffusion_parts(config)
    l = config.data.seq_len
    key = jax.random.key(0)
    x0 = jax.random.randint(key, (batch, l), 0, config.vocab_size)
    sigma_t = noise(jnp.float32(t))[0]
    x = graph.sample_transition(jax.random.key(1), x0, jnp.full((batch, 1), sigma_t)).astype(jnp.int32)
    sigma = jnp.full((batch,), sigma_t)
    fwd = jax.jit(score_fn)
    fns = {"forward": lambda: fwd(params, x, sigma)}
    t_, dt = jnp.float32(t), jnp.float32(1.0 / steps)
    names = predictors or [p for p in sorted(sampling.PREDICTORS)
                           if graph.absorb or "uniform" in sampling.PREDICTORS[p].graphs]
    for name in names:

        @jax.jit
        def step(params, key, x, name=name, cat="precise"):
            return sampling.one_step(key, functools.partial(score_fn, params), graph, noise, x, t_, dt,
                                     predictor=name, categorical=cat)

        for cat in sampling.CATEGORICAL_METHODS:
            step_c = jax.jit(functools.partial(step.__wrapped__, cat=cat))
            fns[f"{name}/{cat}"] = functools.partial(step_c, params, key, x)
        if key_impls and name in ("analytic", "euler"):
            # The key's implementation is the caller's choice: threefry (default)
            # spends most of the precise path's time making random bits on CPU.
            for impl in key_impls:
                fns[f"{name}/precise, {impl} key"] = functools.partial(
                    jax.jit(functools.partial(step.__wrapped__, cat="precise")), params,
                    jax.random.key(0, impl=impl), x)
    loop = functools.partial(sampling.sample, key, score_fn, graph, noise, (batch, l), loop_steps,
                             score_params=params)
    fns[f"sample({loop_steps} steps, default)"] = loop
    times = interleaved(fns, repeats)
    ratios = {k: paired_ratio(v, times["forward"]) for k, v in times.items() if k != "forward"}
    loop_key = f"sample({loop_steps} steps, default)"
    ratios[loop_key] = ratios[loop_key] / (loop_steps + 1)
    return {
        "model": dict(config.model.to_dict(), vocab_size=config.vocab_size, seq_len=l, batch_size=batch),
        "graph_dim": graph.dim,
        "forward_s": median(times["forward"]),
        "ratio_to_forward": ratios,
        "default_path": f"{config.sampling.predictor}/{config.sampling.categorical}",
        "times_s": times,
    }


def run_sampler(quick: bool, args) -> dict:
    """The sampler benchmark: time of a predictor step relative to a forward pass; dict with a table."""
    if quick:
        cases = [(bench_config("tiny", vocab_size=1000), 4)]
        repeats, loop_steps, predictors, key_impls = 2, 4, ["analytic"], ()
    else:
        cases = [
            (bench_config(), args.batch),  # the default char model (sedd/configs/shakespeare_char.py), V 85
            (bench_config(vocab_size=50257, hidden_size=128, n_blocks=2, n_heads=2, cond_dim=64,
                          seq_len=128), args.batch_gpt2),
        ]
        repeats, loop_steps, predictors, key_impls = args.repeats, 16, None, ("rbg",)
    for c, _ in cases:
        if args.dtype:
            c.model.dtype = args.dtype
    results = [bench_sampler(c, b, repeats=repeats, loop_steps=loop_steps, predictors=predictors,
                             key_impls=key_impls) for c, b in cases]
    rows = []
    for r in results:
        m = r["model"]
        for k, v in r["ratio_to_forward"].items():
            rows.append([m["hidden_size"], m["n_blocks"], m["seq_len"], m["batch_size"], m["vocab_size"],
                         k, f"{r['forward_s'] * 1e3:.1f}", f"{v:.3f}"])
    table = format_table(["H", "blocks", "L", "B", "V", "step (predictor/categorical)", "forward ms",
                          "step / forward"], rows)
    return {"benchmark": "sampler", "results": results, "table": table}


# --------------------------------------------------------------------------- diffusion vs AR


def ar_decode_fn(config, batch: int) -> tuple[Callable[[], Any], str]:
    """A () -> tokens function generating L tokens with the AR baseline (KV cache), and its method."""
    c = config.copy_and_resolve_references()
    c.model.kind = "ar"
    model = kinds.build_model(c, 0)
    key = jax.random.key(0)
    return (lambda: ar.sample(key, model, batch, config.data.seq_len)), "KV cache (sedd.ar.sample)"


def bench_diffusion_vs_ar(config, batch: int, steps_list: list[int], max_direct_steps: int,
                          repeats: int = 3, max_seconds: float = 20.0) -> dict:
    """Seconds to generate B x L tokens: diffusion for each step count vs the AR baseline.

    Step counts up to ``max_direct_steps`` are timed (median of up to
    ``repeats`` calls, fewer when one call exceeds max_seconds / repeats); the
    rest are predicted as (steps + 1) x the median seconds per network call of
    the timed ones and flagged ``"fit"``. AR is timed before and after the sweep and the
    median taken, so drift in load shows up in both. Crossover: the step count
    at which diffusion takes as long as AR, from that per-call time.
    """
    graph, noise, params, score_fn = _diffusion_parts(config)
    l = config.data.seq_len
    key = jax.random.key(0)
    ar_fn, ar_method = ar_decode_fn(config, batch)
    ar_times = interleaved({"ar": ar_fn}, repeats)["ar"]
    rows, measured = [], []
    for s in steps_list:
        if s > max_direct_steps:
            continue
        fn = functools.partial(sampling.sample, key, score_fn, graph, noise, (batch, l), s, score_params=params)
        compile_s = _timed(fn)
        ts = []
        while len(ts) < repeats and (not ts or sum(ts) < max_seconds):
            ts.append(_timed(fn))
        measured.append((s, median(ts)))
        rows.append({"steps": s, "seconds": median(ts), "source": "timed", "runs": len(ts),
                     "first_call_s": compile_s})
    ar_times += interleaved({"ar": ar_fn}, repeats, warmup=0)["ar"]
    ar_s = median(ar_times)
    xs = np.array([s + 1 for s, _ in measured], float)  # network calls: steps + the denoise
    ys = np.array([y for _, y in measured])
    # Seconds per network call: the median over timed step counts, which a
    # burst of load on a shared machine cannot drag below zero as a line fit can.
    per_call, fixed = float(np.median(ys / xs)), 0.0
    for s in steps_list:
        if s > max_direct_steps:
            rows.append({"steps": s, "seconds": float(fixed + per_call * (s + 1)), "source": "fit"})
    rows.sort(key=lambda r: r["steps"])
    crossover = (ar_s - fixed) / per_call - 1 if per_call > 0 else float("inf")
    for r in rows:
        r["tokens_per_s"] = batch * l / r["seconds"]
        r["speedup_vs_ar"] = ar_s / r["seconds"]
    return {
        "model": dict(config.model.to_dict(), vocab_size=config.vocab_size, seq_len=l, batch_size=batch),
        "ar_method": ar_method,
        "ar_seconds": ar_s,
        "ar_times_s": ar_times,
        "ar_tokens_per_s": batch * l / ar_s,
        "diffusion_seconds_per_network_call": float(per_call),
        "diffusion_fixed_seconds": float(fixed),
        "crossover_steps": float(crossover),
        "forward_flops_per_token": flops_per_token(config, training=False),
        "rows": rows,
    }


def run_ar(quick: bool, args) -> dict:
    """Diffusion vs autoregressive time to generate L tokens; dict with a table."""
    if quick:
        config = bench_config("tiny")
        batches, steps_list, max_direct, repeats = [2], [2, 4, 8], 4, 1
    else:
        config = bench_config(hidden_size=args.width, n_heads=max(args.width // 64, 1), n_blocks=args.blocks,
                              cond_dim=64, seq_len=args.seq_len)
        batches, steps_list, max_direct, repeats = args.batch_sizes, args.steps, args.max_direct_steps, 3
    if args.dtype:
        config.model.dtype = args.dtype
    results = [bench_diffusion_vs_ar(config, b, steps_list, max_direct, repeats=repeats) for b in batches]
    rows = []
    for r in results:
        b = r["model"]["batch_size"]
        for row in r["rows"]:
            rows.append([b, row["steps"], f"{row['seconds']:.3f}", row["source"], f"{row['tokens_per_s']:.0f}",
                         f"{r['ar_seconds']:.3f}", f"{r['ar_tokens_per_s']:.0f}", f"{row['speedup_vs_ar']:.2f}"])
        rows.append([b, "crossover", f"{r['crossover_steps']:.0f} steps", "", "", "", "", r["ar_method"]])
    table = format_table(["B", "steps", "diffusion s", "", "diff tok/s", "AR s", "AR tok/s", "AR s / diff s"], rows)
    return {"benchmark": "diffusion_vs_ar", "results": results, "table": table}


# --------------------------------------------------------------------------- block diffusion


def _writers(config, length: int, batch: int, block_sizes: list[int], sedd_steps: list[int], runs_given: dict,
             per_step: int) -> dict:
    """name -> (() -> Samples with stats, positions a network call runs on, sampler described).

    With runs_given (kind -> a loaded ``sedd.runs.Run``) the trained weights
    and the threshold sampler; without, random weights and the confidence
    sampler at b / per_step steps a block (per_step tokens a step).
    """
    key = jax.random.key(0)
    out = {}
    if "ar" in runs_given:
        ar_model = runs_given["ar"].net.model
    else:
        c = config.copy_and_resolve_references()
        c.model.kind = "ar"
        ar_model = kinds.build_model(c, 0)

    def ar_fn():
        tokens = ar.sample(key, ar_model, batch, length)
        return sampling.Samples(tokens, None, {"nfe": jnp.int32(length)})

    out["AR, KV cache"] = (ar_fn, 1, "ancestral")
    if "ddit" in runs_given or not runs_given:
        run = runs_given.get("ddit")
        kind, net = (run.kind, run.net) if run else _random_net(config, "ddit")
        for steps in sedd_steps:
            fn = functools.partial(kind.sample, key, net, batch, steps, "analytic", max_length=length,
                                   return_stats=True)
            out[f"SEDD b=L, {steps} steps"] = (fn, config.data.seq_len, f"analytic, windows of L, {steps} steps")
    for b in block_sizes:
        run = runs_given.get(f"block{b}")
        if runs_given and run is None:
            continue
        kind, net = (run.kind, run.net) if run else _random_net(config, "block", b)
        if run:
            options, what = dict(predictor="confidence", threshold=0.9), "confidence, threshold 0.9, <= b steps"
            steps = b
        else:
            options, what = dict(predictor="confidence"), f"confidence, {per_step} tokens a step"
            steps = max(b // per_step, 1)
        fn = functools.partial(kind.sample, key, net, batch, steps, max_length=length, return_stats=True, **options)
        out[f"block b={b}"] = (fn, b, what)
    return out


def _random_net(config, kind_name: str, block_size: int | None = None):
    """(kind, Net) of random weights, every parameter nonzero (the zero-initialised layers too)."""
    c = config.copy_and_resolve_references()
    c.model.kind = kind_name
    if block_size:
        c.model.block_size = block_size
    kind = kinds.get(c)
    model = kind.network(0)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    leaves = jax.tree.leaves(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    params = jax.tree.unflatten(jax.tree.structure(params),
                                [p + 0.02 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys)])
    return kind, kinds.Net(graphdef, params, rest)


def bench_block(config, length: int, batch: int, block_sizes: list[int], sedd_steps: list[int], repeats: int,
                runs_given: dict, per_step: int = 4) -> dict:
    """Seconds to write `length` tokens at `batch` for AR, SEDD and block models, interleaved, with NFE and FLOPs."""
    writers = _writers(config, length, batch, block_sizes, sedd_steps, runs_given, per_step)
    nfe = {name: int(fn().stats["nfe"]) for name, (fn, _, _) in writers.items()}  # also compiles
    times = interleaved({name: fn for name, (fn, _, _) in writers.items()}, repeats, warmup=0)
    window = config.data.seq_len
    forward = flops_per_token(config, training=False)  # one position against a context of L
    ar_s = median(times["AR, KV cache"])
    rows = []
    for name, (_, positions, what) in writers.items():
        sec = median(times[name])
        rows.append({"model": name, "sampler": what, "seconds": sec, "times_s": times[name],
                     "tokens_per_s": batch * length / sec, "nfe": nfe[name], "nfe_per_token": nfe[name] / length,
                     "flops_per_token": nfe[name] * positions * forward / length,
                     "speedup_vs_ar": paired_ratio(times["AR, KV cache"], times[name])})
    return {"model": dict(config.model.to_dict(), vocab_size=config.vocab_size, window=window),
            "length": length, "batch": batch, "trained": bool(runs_given), "ar_seconds": ar_s, "rows": rows}


def run_block(quick: bool, args) -> dict:
    """Block diffusion vs AR vs SEDD: time to write N tokens at batch 1 and 16; dict with a table."""
    runs_given = {}
    for path in args.workdirs or []:
        from sedd import runs as runs_lib  # a run directory per model: its kind names it
        run = runs_lib.load(path)
        name = run.kind.name if run.kind.name != "block" else f"block{run.kind.block_size}"
        runs_given[name] = run
    if quick:
        config = bench_config("tiny")
        lengths, batches, block_sizes, sedd_steps, repeats = [64], [1], [4, 8], [8], 1
    elif runs_given:
        config = next(iter(runs_given.values())).config
        lengths, batches, block_sizes, sedd_steps = [args.length], args.batch_sizes, [4, 8, 16], args.steps
        repeats = args.repeats
    else:
        config = bench_config(hidden_size=args.width, n_heads=max(args.width // 64, 1), n_blocks=args.blocks,
                              cond_dim=64, seq_len=args.seq_len)
        if args.width >= 768:  # GPT-2 small's vocabulary too
            config.vocab_size = 50257
        lengths, batches, block_sizes, sedd_steps = [args.length], args.batch_sizes, [4, 8, 16], args.steps
        repeats = args.repeats
    if args.dtype:
        config.model.dtype = args.dtype
    results = [bench_block(config, n, b, block_sizes, sedd_steps, repeats, runs_given)
               for n in lengths for b in batches]
    rows = [[r["batch"], row["model"], row["sampler"], f"{row['seconds']:.2f}", f"{row['tokens_per_s']:.0f}",
             f"{row['nfe']}", f"{row['nfe_per_token']:.3f}", f"{row['flops_per_token'] / 1e6:.2f}",
             f"{row['speedup_vs_ar']:.2f}"] for r in results for row in r["rows"]]
    table = format_table(["B", "model", "sampler", "s", "tok/s", "NFE", "NFE/tok", "MFLOP/tok", "vs AR"], rows)
    return {"benchmark": "block" + ("_trained" if runs_given else ""), "results": results, "table": table}


# --------------------------------------------------------------------------- speculative sampling


def call_cost(config, ns: list[int], repeats: int, calls: int = 8) -> dict:
    """Seconds of one KV-cached AR call on n new positions (``ar.speculative_target``), batch 1, random weights.

    The call scores positions start .. start + n - 1 against a cache of start = L / 2 positions; `calls`
    calls run inside one jitted loop (each rolled back to start, the same work), so no dispatch is timed.
    The ratio to n = 1 says when a draft pays: a round of k drafts costs one call on k + 1 positions.
    """
    c = config.copy_and_resolve_references()
    _, net = _random_net(c, "ar")
    prefill, target = ar.speculative_target(net.graphdef)
    length = c.data.seq_len
    rows, start = length + max(ns) + 1, length // 2
    text = jax.random.randint(jax.random.key(0), (1, rows), 0, c.vocab_size)
    state = prefill(net.state, text[:, :start])
    begin = jnp.full((1,), start, jnp.int32)

    def looped(n):
        @jax.jit
        def fn(state, text):
            def body(i, acc):
                p, _ = target(state, text, begin, n - 1)  # (1, n, V): the cache is rolled back to start each time
                return acc + p[0, -1, 0]
            return jax.lax.fori_loop(0, calls, body, jnp.float32(0))
        return lambda: fn(state, text)

    times = interleaved({n: looped(n) for n in ns}, repeats)
    rows_out = [{"n": n, "ms_per_call": median(times[n]) / calls * 1e3,
                 "ratio_to_n1": paired_ratio(times[n], times[ns[0]])} for n in ns]
    return {"model": dict(width=c.model.hidden_size, blocks=c.model.n_blocks, vocab_size=c.vocab_size,
                          cache=rows, start=start, dtype=c.model.dtype), "rows": rows_out}


def _sample_quality(x: np.ndarray, target_run, chain) -> dict:
    """Quality of samples x int[B, L]: the exact NLL under the Markov chain, or the target AR's own NLL; unigram entropy."""
    x = np.asarray(x)
    length = x.shape[1]
    if chain is not None:
        nll = -chain.log_prob(x) / length  # (B,) nats a token
        what = "exact_nats_per_token"
    else:
        nll = np.asarray(ar.nll(target_run.net.model, jnp.asarray(x, jnp.int32))) / length  # (B,) nats a token
        what = "target_nats_per_token"
    counts = np.bincount(x.ravel(), minlength=int(x.max()) + 1) / x.size
    seen = counts[counts > 0]
    return {"quality": what, "nll": float(nll.mean()),
            "nll_se": float(nll.std(ddof=1) / np.sqrt(len(nll))) if len(nll) > 1 else float("nan"),
            "unigram_entropy_bits": float(-(seen * np.log2(seen)).sum())}


def _speculative_runs(quick: bool, args) -> tuple:
    """(target AR run, {name: draft ("ngram" or a Run)}, spec run or None): given by path, or tiny random ones."""
    from sedd import runs as runs_lib  # noqa: PLC0415

    if args.target:
        target = runs_lib.load(args.target)
        drafts = {}
        for d in (args.drafts or "ngram").split(","):
            if d == "none":  # the spec run alone
                continue
            if d == "ngram":
                drafts["ngram"] = "ngram"
            else:
                run = runs_lib.load(d)
                drafts[f"{Path(d).name} ({run.kind.name})"] = run
        spec = runs_lib.load(args.spec) if args.spec else None
        return target, drafts, spec
    # Random weights (every parameter nonzero) on the Markov chain's tiny config: the smoke run of --quick.
    config = config_lib.load_config("markov")
    config.vocab_size = int(config.data.markov.vocab_size)
    config.model.n_blocks = 1

    def random_run(kind, **model):
        c = config.copy_and_resolve_references()
        c.model.update(model, kind=kind)
        _, net = _random_net(c, kind)
        return runs_lib.from_parts(c, None, net.graphdef, net.params, net.rest)

    return random_run("ar"), {"ngram": "ngram", "block8 (block)": random_run("block", block_size=8),
                              "small AR (ar)": random_run("ar", hidden_size=16, n_heads=1)}, None


def bench_speculative(target, drafts: dict, spec, ks: list[int], batches: list[int], repeats: int,
                      quality_samples: int, names: tuple[str, str] = ("random", "spec"),
                      verifications: tuple[str, ...] = ("block",)) -> dict:
    """Speculative sampling of the AR run `target` with each drafter and k, against its own KV-cached sampling.

    Per (drafter, k): the calls (the target's and the drafter's network calls, counted alike) and tokens a
    call, the acceptance by draft position, the seconds at each batch interleaved with ``ar.sample``'s (the
    ratio the median of per-round ratios), and the quality of quality_samples texts drawn the same way; each
    cell once per verification ("block" or "token", ``sedd.speculative.round_law``).
    """
    from sedd.data.markov import chain_from_config  # noqa: PLC0415

    chain = chain_from_config(target.config.data) if target.config.data.name == "markov" else None
    length = target.seq_len
    key = jax.random.key(0)
    own = target.sample(jax.random.key(1), quality_samples).tokens
    ar_quality = _sample_quality(own, target, chain)
    cells = []  # (name, k, draft or None for the spec run, verification)
    for how in verifications:
        tag = "" if len(verifications) == 1 else f", {how}"
        for name, draft in drafts.items():
            cap = draft.config.model.block_size if not isinstance(draft, str) and draft.kind.name == "block" else None
            cells += [(name + tag, k, draft, how) for k in ks if cap is None or k <= cap]
        if spec is not None:
            cells.append((f"{names[1]} (spec{tag})", int(spec.config.model.block_size), None, how))
    rows = []
    for name, k, draft, how in cells:
        def sample(batch, key=key, draft=draft, k=k, how=how):
            if draft is None:
                return spec.sample(key, batch, return_stats=True, verification=how)
            return target.sample(key, batch, draft=draft, draft_k=k, return_stats=True, verification=how)

        out = sample(quality_samples, jax.random.key(1))
        st = out.stats
        rounds = np.asarray(st["nfe_per_sample"], np.float64)
        drafter_calls = np.asarray(st.get("draft_calls", np.zeros_like(rounds)), np.float64)
        calls = rounds + drafter_calls  # (B,) a text's network calls
        per_call, per_call_se = tokens_per_call(length, calls)
        row = {"drafter": name, "k": k, "verification": how, "target_calls": float(rounds.mean()),
               "drafter_calls": float(drafter_calls.mean()), "tokens_per_call": per_call,
               "tokens_per_call_se": per_call_se,
               "tokens_per_target_call": float(length / rounds.mean()),
               "acceptance_by_position": (np.asarray(st["accepted_at"], np.float64) / rounds.sum()).tolist(),
               **_sample_quality(out.tokens, target, chain)}
        if draft is None:  # lossless in practice: the spec run's causal half drawn one token at a time, no drafts
            from sedd import spec as spec_lib  # noqa: PLC0415
            direct = np.asarray(spec_lib.ancestral(spec.model, jax.random.key(2), quality_samples, length))
            row["own"] = _sample_quality(direct, target, chain)
        for batch in batches:
            times = interleaved({"ar": lambda b=batch: target.sample(key, b).tokens,
                                 "spec": lambda b=batch: sample(b).tokens}, repeats, warmup=2)  # AR traces twice
            row[f"tokens_per_s_b{batch}"] = batch * length / median(times["spec"])
            row[f"ar_tokens_per_s_b{batch}"] = batch * length / median(times["ar"])
            row[f"vs_ar_b{batch}"] = paired_ratio(times["ar"], times["spec"])
        rows.append(row)
        print(f"  {name} k={k}: {row['tokens_per_call']:.2f} tokens a call, "
              + ", ".join(f"{row[f'vs_ar_b{b}']:.2f}x AR at batch {b}" for b in batches), flush=True)
    return {"target": names[0], "length": length, "ar": ar_quality,
            "quality_samples": quality_samples, "rows": rows}


def speculative_picture(result: dict, path: Path) -> None:
    """Tokens a call and tokens/s against AR (batch 1) against the samples' quality, a point per drafter and k."""
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    study = result["study"]
    batch = min(int(k.rsplit("b", 1)[1]) for k in study["rows"][0] if k.startswith("vs_ar_b")) if study["rows"] else 1
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    markers = dict(zip(sorted({r["drafter"] for r in study["rows"]}), "osD^v<>p*h"))
    what = study["ar"]["quality"].replace("_", " ")
    for ax, key, label in ((axes[0], "tokens_per_call", "tokens a network call (target's and drafter's)"),
                           (axes[1], f"vs_ar_b{batch}", f"tokens/s vs AR with KV cache, batch {batch}")):
        for name, marker in markers.items():
            rs = [r for r in study["rows"] if r["drafter"] == name]
            ax.errorbar([r["nll"] for r in rs], [r[key] for r in rs], xerr=[2 * r["nll_se"] for r in rs],
                        fmt=marker, label=name, capsize=2)
            for r in rs:
                ax.annotate(f"k={r['k']}", (r["nll"], r[key]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        a = study["ar"]
        ax.axvspan(a["nll"] - 2 * a["nll_se"], a["nll"] + 2 * a["nll_se"], color="grey", alpha=0.2,
                   label="AR's own samples (+-2 s.e.)")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel(f"{what} of the samples")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"speculative sampling of {Path(study['target']).name}, L = {study['length']}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_speculative(quick: bool, args) -> dict:
    """Speculative sampling: the call-cost curve at two sizes, and drafters against AR with its KV cache."""
    if quick:
        sizes = {"tiny": bench_config("tiny")}
        ns, ks, batches, quality_samples, repeats = [1, 2, 4, 8], [2, 4], [1], 8, 1
    else:
        sizes = {"shakespeare_char": bench_config(vocab_size=65),
                 "gpt2_small": bench_config(hidden_size=768, n_blocks=12, n_heads=12, seq_len=256)}
        sizes["gpt2_small"].vocab_size = 50257
        ns = list(range(1, 33))
        ks, batches, quality_samples, repeats = [2, 4, 8, 16], args.batch_sizes, args.quality_samples, args.repeats
    curves = {}
    for name, config in ({} if args.target and not args.cost_only else sizes).items():  # a study: the curve apart
        config.model.kind = "ar"
        if args.dtype:
            config.model.dtype = args.dtype
        curves[name] = call_cost(config, ns, max(repeats, 3))
        print(f"  call cost at {name}'s size done", flush=True)
    lines = []
    for name, curve in curves.items():
        lines.append(f"one AR call on n new positions, batch 1, {name}'s size {curve['model']}")
        lines.append(format_table(["n", "ms a call", "vs n=1"], [[r["n"], f"{r['ms_per_call']:.3f}",
                                                                   f"{r['ratio_to_n1']:.2f}"] for r in curve["rows"]]))
    study = None
    if (args.target or quick) and not args.cost_only:
        target, drafts, spec = _speculative_runs(quick, args)
        study = bench_speculative(target, drafts, spec, ks, batches, repeats, quality_samples,
                                  (args.target or "random weights", Path(args.spec).name if args.spec else "spec"),
                                  tuple(args.verifications.split(",")))
        a = study["ar"]
        rows = [["AR, KV cache", "-", "1.00", "-", f"{a['nll']:.4f} +- {a['nll_se']:.4f}",
                 f"{a['unigram_entropy_bits']:.3f}"] + ["1.00"] * len(batches)]
        for r in study["rows"]:
            rows.append([r["drafter"], r["k"], f"{r['tokens_per_call']:.3f} +- {r['tokens_per_call_se']:.3f}",
                         " ".join(f"{p:.2f}" for p in r["acceptance_by_position"]),
                         f"{r['nll']:.4f} +- {r['nll_se']:.4f}", f"{r['unigram_entropy_bits']:.3f}"]
                        + [f"{r[f'vs_ar_b{b}']:.2f}" for b in batches])
            if "own" in r:  # the spec run's causal half drawn without drafts: the law its row must match
                o = r["own"]
                rows.append(["  its causal half, no drafts", "-", "1.00", "-", f"{o['nll']:.4f} +- {o['nll_se']:.4f}",
                             f"{o['unigram_entropy_bits']:.3f}"] + ["-"] * len(batches))
        lines.append(f"speculative sampling of {study['target']} (L {study['length']}); quality: {a['quality']} "
                     f"of {quality_samples} samples")
        lines.append(format_table(["drafter", "k", "tok/call", "acceptance by position", "NLL", "unigram H (bits)"]
                                  + [f"vs AR b={b}" for b in batches], rows))
    result = {"benchmark": "speculative", "call_cost": curves, "study": study, "table": "\n\n".join(lines)}
    if args.picture and study is not None:
        path = Path(args.picture)
        speculative_picture(result, path)
        print(f"wrote {path}")
    return result


# --------------------------------------------------------------------------- the likelihood bound of a batch


def _cost(fn: Callable, *args) -> dict:
    """XLA's count for one jitted call of fn(*args): {"gflop": ..., "gb": bytes accessed / 1e9}."""
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return {"gflop": float(cost.get("flops", 0.0)) / 1e9, "gb": float(cost.get("bytes accessed", 0.0)) / 1e9}


def _bound_candidates(config, batch: int, block_sizes: list[int], num_t: int) -> dict:
    """name -> (a batch's bound, XLA's count of one t point, of the once-a-batch context or None)."""
    x0 = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab_size, (batch, config.data.seq_len)),
                     jnp.int32)
    sigma = jnp.full((batch,), 1.0, jnp.float32)
    kind, net = _random_net(config, "ddit")
    out = {"ddit": (functools.partial(kind.likelihood, jax.random.key(0), net, [x0], num_t),
                    _cost(kinds.params_score_fn(net.graphdef), net.state, x0, sigma), None)}
    for b in block_sizes:
        kind, net = _random_net(config, "block", b)
        fns = block.bound_fns(net.graphdef, b)
        context = jax.jit(fns.prepare)(net.state, x0)
        out[f"block b={b}"] = (functools.partial(kind.likelihood, jax.random.key(0), net, [x0], num_t),
                               _cost(fns.block_fn, context, x0, x0, sigma), _cost(fns.prepare, net.state, x0))
        full = block.params_block_fn(net.graphdef, b)  # the [x_t ; x0] forward at every t, as before issue 54
        before = functools.partial(evaluate.dataset_bound, jax.random.key(0), full, kind.graph, kind.noise, [x0],
                                   num_t, score_params=net.state, per_position=block.per_position_fn(b))
        out[f"block b={b}, full forward"] = (before, _cost(full, net.state, x0, x0, sigma), None)
    return out


def bench_bound(config, batch: int, block_sizes: list[int], num_t: int, repeats: int) -> dict:
    """Wall and process-CPU seconds of a batch's bound (``Kind.likelihood``, num_t points), the candidates
    interleaved round by round, each after a first (compiling) call; ratios paired per round against ddit's."""
    candidates = _bound_candidates(config, batch, block_sizes, num_t)
    names = list(candidates)
    first = {}
    for name in names:
        t0 = time.perf_counter()
        candidates[name][0]()
        first[name] = time.perf_counter() - t0
    wall, cpu = {k: [] for k in names}, {k: [] for k in names}
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            w0, c0 = time.perf_counter(), time.process_time()
            candidates[name][0]()  # returns floats: the bound is computed on return
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
    rows = []
    for name in names:
        _, per_t, context = candidates[name]
        rows.append({"model": name, "first_s": first[name], "wall_s": median(wall[name]), "cpu_s": median(cpu[name]),
                     "wall_times_s": wall[name], "cpu_times_s": cpu[name],
                     "ratio_to_ddit_wall": paired_ratio(wall[name], wall["ddit"]),
                     "ratio_to_ddit_cpu": paired_ratio(cpu[name], cpu["ddit"]),
                     "per_t": per_t, "context": context})
    return {"model": dict(config.model.to_dict(), vocab_size=config.vocab_size), "batch": batch,
            "seq_len": config.data.seq_len, "num_t": num_t, "rows": rows}


def run_bound(quick: bool, args) -> dict:
    """The bound of one batch: the default (ddit) against block models, with the context and the full forward."""
    if quick:
        config, batch, block_sizes, num_t, repeats = bench_config("tiny"), 4, [4], 8, 1
    else:
        config = bench_config(seq_len=args.seq_len)
        batch, block_sizes, num_t, repeats = args.batch_sizes[0], args.block_sizes, 64, args.repeats
    if args.dtype:
        config.model.dtype = args.dtype
    result = bench_bound(config, batch, block_sizes, num_t, repeats)
    rows = [[row["model"], f"{row['first_s']:.1f}", f"{row['wall_s']:.1f}", f"{row['cpu_s']:.1f}",
             f"{row['ratio_to_ddit_wall']:.2f}", f"{row['ratio_to_ddit_cpu']:.2f}", f"{row['per_t']['gflop']:.2f}",
             f"{row['per_t']['gb']:.2f}",
             "" if row["context"] is None else f"{row['context']['gflop']:.2f}"] for row in result["rows"]]
    table = format_table(["model", "1st s", "wall s", "CPU s", "wall/ddit", "CPU/ddit", "GFLOP/t", "GB/t",
                          "ctx GFLOP"], rows)
    return {"benchmark": "bound", "results": [result], "table": table}


# --------------------------------------------------------------------------- batch-1 decode: ms a network call


def stored_in_compute_dtype(model):
    """A copy of `model` whose product weights (the Linear kernels of `kernels.mixed_einsum`) are stored in
    their compute dtype.

    `mixed_einsum` casts each float32 weight to bfloat16 at every call; a decode
    step is a pass over the weights, so stored cast it reads half the bytes
    (unless XLA hoists the casts out of the loop). The products see the same
    values, so the tokens are the same.
    """
    model = nnx.clone(model)
    linears = [node for _, node in nnx.iter_graph(model)
               if isinstance(node, nnx.Linear) and isinstance(node.dot_general, kernels._MixedDot)]
    for node in linears:
        node.kernel = nnx.Param(node.kernel[...].astype(node.dot_general.dtype))
    return model


def _ar_decode(model, key, temperature, *, num_samples: int, length: int, unroll: int = 1):
    """``sedd.ar.sample`` (no prompt, the precise categorical) with its loop unrolled `unroll` times: the same
    tokens, a loop iteration of `unroll` network calls."""
    from sedd.categorical import sample_categorical  # noqa: PLC0415

    model = nnx.clone(model)
    model.init_cache(num_samples, min(length, model.max_len))

    def step(pos, carry):
        model, prev, toks = carry
        logits = ar.decode_step(model, prev)  # (B, V)
        probs = jax.nn.softmax(logits.astype(jnp.float32) / temperature, axis=-1)
        tok = sample_categorical(jax.random.fold_in(key, pos), probs, "precise").astype(jnp.int32)
        return model, tok, toks.at[:, pos].set(tok)

    bos = jnp.full((num_samples,), ar.bos_id(model), jnp.int32)
    toks = jnp.zeros((num_samples, length), jnp.int32)
    return nnx.fori_loop(0, length, step, (model, bos, toks), unroll=unroll)[2]  # (B, L)


ar_decode = nnx.jit(_ar_decode, static_argnames=("num_samples", "length", "unroll"))


def _union_ns(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of (start, end) intervals."""
    total, end = 0.0, -float("inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def trace_calls(fn: Callable[[], Any], calls: int, top: int = 20, keep: str | None = None) -> dict:
    """One traced run of fn (compiled first) under jax.profiler, summarised per network call.

    Device planes (a GPU's streams): per line, events (kernels, copies) a call,
    their summed and their union time a call, the span, and the `top` names by
    time. Host threads: per line the `top` event names by time and count (the
    launches, the thunks of XLA's runtime, the while loop's). `keep`: a path to
    copy the .xplane.pb to (gzip), for TensorBoard / xprof.
    """
    from jax._src.profiler import ProfileData  # noqa: PLC0415

    jax.block_until_ready(fn())
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        try:  # no Python tracer: its events would be most of the trace
            options = jax.profiler.ProfileOptions()
            options.python_tracer_level = 0
        except Exception:  # noqa: BLE001  (an older or newer jax)
            options = None
        with jax.profiler.trace(d, profiler_options=options):
            jax.block_until_ready(fn())
        wall = time.perf_counter() - t0
        pb = next(Path(d).rglob("*.xplane.pb"))
        if keep:
            import gzip  # noqa: PLC0415
            Path(keep).parent.mkdir(parents=True, exist_ok=True)
            Path(keep).write_bytes(gzip.compress(pb.read_bytes()))
        data = ProfileData.from_file(str(pb))
    out = {"calls": calls, "wall_ms_per_call_traced": wall / calls * 1e3, "device": [], "host": []}
    for plane in data.planes:
        is_device = plane.name.startswith("/device:")
        if not (is_device or plane.name.startswith("/host:CPU")):
            continue
        for line in plane.lines:
            evs = [(ev.name, ev.start_ns, ev.duration_ns) for ev in line.events]
            if not evs:
                continue
            by_name: dict[str, list[float]] = {}
            for name, _, dur in evs:
                by_name.setdefault(name, []).append(dur)
            names = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
            row = {"plane": plane.name, "line": line.name, "events_per_call": len(evs) / calls,
                   "sum_ms_per_call": sum(e[2] for e in evs) / calls / 1e6,
                   "top": [{"name": n[:120], "count_per_call": len(v) / calls, "ms_per_call": sum(v) / calls / 1e6,
                            "mean_us": sum(v) / len(v) / 1e3} for n, v in names]}
            if is_device:
                row["busy_ms_per_call"] = _union_ns([(a, a + d) for _, a, d in evs]) / calls / 1e6
                row["span_ms"] = (max(a + d for _, a, d in evs) - min(a for _, a, _ in evs)) / 1e6
            (out["device"] if is_device else out["host"]).append(row)
    out["host"] = sorted(out["host"], key=lambda r: -r["sum_ms_per_call"])[:6]
    return out


def _hlo_loop_ops(hlo_text: str) -> dict:
    """Opcode counts of the largest while-loop body of a compiled module's text (what a loop iteration runs)."""
    bodies = {m.group(1): m.group(2) for m in re.finditer(r"\n%?([\w.\-]+) [^\n]*\{\n(.*?)\n\}", hlo_text, re.S)}
    loops = re.findall(r"while\(.*?body=%?([\w.\-]+)", hlo_text)
    best: dict[str, int] = {}
    for name in loops:
        ops: dict[str, int] = {}
        for m in re.finditer(r"= \S+ ([\w\-]+)\(", bodies.get(name, "")):
            ops[m.group(1)] = ops.get(m.group(1), 0) + 1
        if sum(ops.values()) > sum(best.values()):
            best = ops
    return dict(sorted(best.items(), key=lambda kv: -kv[1]))


def _ar_hlo(model, length: int, unroll: int = 1) -> str:
    """The compiled text of `ar_decode` (as jax.jit of the split model)."""
    graphdef, state = nnx.split(model)
    f = jax.jit(lambda state, key, t: _ar_decode(nnx.merge(graphdef, state), key, t, num_samples=1, length=length,
                                                 unroll=unroll))
    return f.lower(state, jax.random.key(0), jnp.float32(1.0)).compile().as_text()


def run_decode(quick: bool, args) -> dict:
    """Batch-1 decode, ms a network call: AR with KV cache (as shipped, its loop unrolled, its weights stored in
    bfloat16) and block models (b = 4 and 16 at 4 tokens a call), interleaved; with --trace a jax.profiler trace
    of the AR and block-4 calls (kernels a call, their time, the host's)."""
    if quick:
        config = bench_config("tiny")
        length, repeats, unrolls = 32, 1, args.unroll
    else:
        config = bench_config(hidden_size=args.width, n_heads=max(args.width // 64, 1), n_blocks=args.blocks,
                              cond_dim=128, seq_len=args.seq_len)
        config.vocab_size = args.vocab or (50257 if args.width >= 768 else config.vocab_size)
        length, repeats, unrolls = args.length, args.repeats, args.unroll
    if args.dtype:
        config.model.dtype = args.dtype
    batch, key, one = 1, jax.random.key(0), jnp.float32(1.0)
    c = config.copy_and_resolve_references()
    c.model.kind = "ar"
    ar_model = kinds.build_model(c, 0)
    # Random nonzero weights (the zero-initialised output layer would make every draw uniform).
    graphdef, params, rest = nnx.split(ar_model, nnx.Param, ...)
    leaves = jax.tree.leaves(params)
    ks = jax.random.split(jax.random.key(1), len(leaves))
    params = jax.tree.unflatten(jax.tree.structure(params),
                                [p + 0.02 * jax.random.normal(k, p.shape) for p, k in zip(leaves, ks)])
    ar_model = nnx.merge(graphdef, params, rest)
    ar_model.eval()
    ar_low = stored_in_compute_dtype(ar_model)
    fns: dict[str, tuple[Callable[[], Any], int]] = {
        "AR, KV cache (sedd.ar.sample)": (lambda: ar.sample(key, ar_model, batch, length), length)}
    for u in unrolls:
        fns[f"AR, loop unrolled x{u}"] = (
            functools.partial(ar_decode, ar_model, key, one, num_samples=batch, length=length, unroll=u), length)
    fns["AR, weights stored bf16"] = (
        functools.partial(ar_decode, ar_low, key, one, num_samples=batch, length=length, unroll=1), length)
    if unrolls:
        u = max(unrolls)
        fns[f"AR, weights stored bf16, unrolled x{u}"] = (
            functools.partial(ar_decode, ar_low, key, one, num_samples=batch, length=length, unroll=u), length)
    base = "AR, KV cache (sedd.ar.sample)"
    ref = np.asarray(fns[base][0]())
    results = []

    def measure(group: dict) -> None:
        """Times a group of writers, interleaved; each result is printed as it comes (a timeout keeps them)."""
        same = {}
        for name, (fn, _) in group.items():
            out = np.asarray(fn() if not name.startswith("block") else fn().tokens)  # also compiles
            if name.startswith("AR"):
                same[name] = bool(np.array_equal(out, ref))
        times = interleaved({name: fn for name, (fn, _) in group.items()}, repeats, warmup=0)
        for name, (_, calls) in group.items():
            sec = median(times[name])
            results.append({"what": name, "calls": calls, "seconds": sec, "ms_per_call": sec / calls * 1e3,
                            "tokens_per_s": batch * length / sec, "same_tokens_as_ar_sample": same.get(name),
                            "ratio_to_ar_sample": paired_ratio(times[name], times[base]) if base in group else None,
                            "times_s": times[name]})
            print(f"decode: {name}: {sec / calls * 1e3:.4f} ms a call ({calls} calls, {sec:.3f} s; "
                  f"same tokens: {same.get(name)})", flush=True)

    measure(fns)
    per_step, blocks = 4, {}
    for b in ([] if args.no_block else args.block_sizes):
        kind, net = _random_net(config, "block", b)
        steps = max(b // per_step, 1)
        fn = functools.partial(kind.sample, key, net, batch, steps, predictor="confidence", max_length=length,
                               return_stats=True)
        nfe = int(fn().stats["nfe"])  # also compiles
        blocks[f"block b={b}, {min(per_step, b)} tokens a call"] = (fn, nfe)
    if blocks:
        measure(blocks)
    fns.update(blocks)
    out = {"benchmark": "decode", "results": results,
           "model": dict(config.model.to_dict(), vocab_size=config.vocab_size, seq_len=config.data.seq_len),
           "length": length, "batch": batch}
    # The weights a call reads: the floor of a call at the device's copy rate.
    n = model_lib.matmul_params(ar_model)
    out["weight_bytes_float32"], out["weight_bytes_bfloat16"] = 4 * n, 2 * n
    try:
        if not (args.trace and args.dump):
            raise RuntimeError("the loop body's HLO is read with --trace --dump only")
        text = _ar_hlo(ar_model, length)
        out["hlo_loop_body_ops"] = _hlo_loop_ops(text)
        out["hlo_loop_body_ops_total"] = sum(out["hlo_loop_body_ops"].values())
        out["hlo_converts_in_loop"] = out["hlo_loop_body_ops"].get("convert", 0)
        if args.dump:
            Path(args.dump).mkdir(parents=True, exist_ok=True)
            (Path(args.dump) / "ar_decode_hlo.txt").write_text(text)
    except Exception as e:  # a summary, not a result: never fail the timings for it
        out["hlo_error"] = repr(e)[:400]
    if args.trace:
        out["trace"] = {}
        for name, (fn, calls) in fns.items():
            if name in (base, "AR, weights stored bf16") or name.startswith("block b=4"):
                try:
                    keep = str(Path(args.dump) / f"{name.split(',')[0].replace(' ', '_').replace('=', '')}.xplane.pb.gz") \
                        if args.dump else None
                    out["trace"][name] = trace_calls(fn, calls, keep=keep)
                except Exception as e:
                    out["trace"][name] = {"error": repr(e)[:400]}
    rows = [[r["what"], r["calls"], f"{r['seconds']:.3f}", f"{r['ms_per_call']:.3f}", f"{r['tokens_per_s']:.0f}",
             "" if r["ratio_to_ar_sample"] is None else f"{r['ratio_to_ar_sample']:.2f}",
             "" if r["same_tokens_as_ar_sample"] is None else str(r["same_tokens_as_ar_sample"])] for r in results]
    table = format_table(["batch 1", "calls", "s", "ms a call", "tok/s", "time / ar.sample", "same tokens"], rows)
    table += (f"\nweights a call: {out['weight_bytes_float32'] / 1e9:.3f} GB float32, "
              f"{out['weight_bytes_bfloat16'] / 1e9:.3f} GB bfloat16; the AR loop body: "
              f"{out.get('hlo_loop_body_ops_total', '?')} HLO ops, {out.get('hlo_converts_in_loop', '?')} converts")
    for name, tr in out.get("trace", {}).items():
        if "error" in tr:
            table += f"\ntrace of {name}: {tr['error']}"
            continue
        for row in tr["device"]:
            table += (f"\ntrace of {name}, {row['line']}: {row['events_per_call']:.0f} events a call, "
                      f"{row['sum_ms_per_call']:.3f} ms summed, {row['busy_ms_per_call']:.3f} ms busy a call "
                      f"(traced wall {tr['wall_ms_per_call_traced']:.3f} ms a call)")
    out["table"] = table
    return out


# --------------------------------------------------------------------------- memory


def train_step_memory(config, mesh: jax.sharding.Mesh | None = None) -> dict:
    """XLA's memory analysis of the compiled train step, one device's bytes, from abstract inputs (nothing allocated).

    On a mesh of several devices the compiled program is one device's part of
    the SPMD step, so every figure is per device.
    """
    t0 = time.perf_counter()
    trainer = Trainer(config, mesh)
    state = trainer.abstract_state
    batch = jax.ShapeDtypeStruct((config.training.batch_size, config.data.seq_len), jnp.int32,
                                 sharding=trainer.batch_sharding)
    compiled = trainer.train_step.lower(state, batch).compile()
    ma = compiled.memory_analysis()
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
              "temp_size_in_bytes", "generated_code_size_in_bytes")
    out = {f: int(getattr(ma, f, 0) or 0) for f in fields} if ma is not None else {}
    if out:
        # Donated state buffers are reused for the outputs (alias), so they count once.
        out["peak_bytes_estimate"] = (out["argument_size_in_bytes"] + out["output_size_in_bytes"]
                                      - out["alias_size_in_bytes"] + out["temp_size_in_bytes"])
    state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
    out.update({
        "n_params": trainer.n_params,
        "state_bytes": int(state_bytes),
        "devices": len(trainer.mesh.devices.flat),
        "mesh": dict(trainer.mesh.shape),
        "compile_s": time.perf_counter() - t0,
    })
    return out


# The vocabulary each config trains with (set from the tokenizer in a real run): the plays give 85 ids.
SHIPPED_VOCAB = {"shakespeare_char": 85, "tiny": 85, "text8": 28, "owt_small": 50257, "owt_1b3": 50257, "markov": 8}

# What the memory plan varies, cheapest first: accumulation (fewer sequences a call) costs
# nothing in compute; remat costs a forward pass of what it recomputes ("dots" less than "blocks").
REMAT_ORDER = ("none", "dots", "blocks")


def parse_mesh(text: str) -> dict[str, int]:
    """"data=8,fsdp=1" -> {"data": 8, "fsdp": 1, "tensor": 1} (axes not named are 1).

    Raises:
      ValueError: an axis that is not data, fsdp or tensor, or a size that is not a positive integer.
    """
    sizes = {a: 1 for a in sharding.MESH_AXES}
    for part in filter(None, text.split(",")):
        name, _, value = part.partition("=")
        if name not in sizes or not value.isdigit() or int(value) < 1:
            raise ValueError(f"--mesh {text!r}: {part!r} is not AXIS=SIZE with AXIS one of "
                             f"{', '.join(sharding.MESH_AXES)} and SIZE a positive integer")
        sizes[name] = int(value)
    return sizes


def memory_config(name: str, overrides=(), mesh: dict | None = None):
    """Config `name` with `overrides` (``--config.KEY=VALUE``), its shipped vocabulary, and the mesh sizes.

    Without `mesh` the config runs on the local devices along ``data``, whatever mesh it names.
    """
    c = config_lib.load_config(name, list(overrides))
    c.unlock()
    c.vocab_size = c.data.markov.vocab_size if c.data.name == "markov" else SHIPPED_VOCAB.get(name, 65)
    # Without a mesh, all local devices on the data axis (a config's own mesh may need more devices).
    for axis, size in (mesh or {"data": -1, "fsdp": 1, "tensor": 1}).items():
        c.mesh[axis] = size
    return c


def memory_plan(config, device_gib: float | None) -> dict:
    """The config's step on its mesh, and with a device size the cheapest (accum_steps, remat) that fits.

    Settings are tried in the order of their cost, accum_steps 1, 2, 4, ... (the
    per-call batch divided by it, so the update sees the same sequences) and
    within each remat none, dots, blocks, and the first whose peak fits is the
    plan; none fits when one sequence a device with remat = blocks does not.
    """
    rows = [dict(train_step_memory(config), accum_steps=config.training.accum_steps, remat=config.model.remat,
                 batch_size=config.training.batch_size, loss_chunk=config.training.loss_chunk, shipped=True)]
    fit = None
    if device_gib:
        limit = device_gib * 2**30
        shards = int(np.prod([config.mesh[a] for a in sharding.BATCH_AXES]))
        accum, batch = config.training.accum_steps, config.training.batch_size
        while fit is None and batch % shards == 0 and batch >= shards:
            for remat in REMAT_ORDER:
                c = config_lib.from_json(config_lib.to_json(config))  # a copy
                c.training.accum_steps, c.training.batch_size, c.model.remat = accum, batch, remat
                if (accum, batch, remat) == (config.training.accum_steps, config.training.batch_size,
                                             config.model.remat):
                    row = rows[0]
                else:
                    row = dict(train_step_memory(c), accum_steps=accum, remat=remat, batch_size=batch,
                               loss_chunk=c.training.loss_chunk, shipped=False)
                    rows.append(row)
                print(f"  accum_steps={accum} batch_size={batch} remat={remat}: "
                      f"{row['peak_bytes_estimate'] / 2**30:.2f} GiB a device", flush=True)
                if row["peak_bytes_estimate"] <= limit:
                    fit = row
                    break
            if batch % 2:
                break
            accum, batch = accum * 2, batch // 2
    return {"rows": rows, "fit": fit, "device_gib": device_gib}


def run_memory(quick: bool, args) -> dict:
    """Compiled train-step memory (argument, temporary, peak bytes) per config and mesh; dict with a table.

    With --mesh the step is compiled for that mesh on as many CPU devices
    (``main`` makes them before JAX starts), and with --device_gib the plan
    searches the cheapest setting that fits (``memory_plan``).
    """
    names = ["tiny"] if quick else (args.configs or config_lib.shipped_configs())
    mesh = parse_mesh(args.mesh) if args.mesh else None
    results, rows = {}, []
    gib = lambda x: f"{x / 2**30:.3f}"  # noqa: E731
    for name in names:
        c = memory_config(name, args.overrides, mesh)
        plan = memory_plan(c, args.device_gib)
        for r in plan["rows"]:
            r.update(seq_len=c.data.seq_len, dtype=c.model.dtype, vocab_size=c.vocab_size)
        results[name] = plan
        for r in plan["rows"]:
            per_device = r["batch_size"] // int(np.prod([r["mesh"][a] for a in sharding.BATCH_AXES]))
            mark = ("fits" if r is plan["fit"] else "") if args.device_gib else ""
            rows.append([name, ",".join(f"{a}={n}" for a, n in r["mesh"].items() if n > 1) or "1 device",
                         f"{r['n_params'] / 1e6:.2f}M", r["batch_size"], per_device, r["seq_len"], r["dtype"],
                         r["remat"], r["loss_chunk"], r["accum_steps"], gib(r.get("argument_size_in_bytes", 0)),
                         gib(r.get("temp_size_in_bytes", 0)), gib(r.get("peak_bytes_estimate", 0)),
                         f"{r['compile_s']:.0f}", mark])
        if args.device_gib and plan["fit"] is None:
            print(f"{name}: no setting fits {args.device_gib} GiB a device, even one sequence a device with "
                  "remat=blocks: add devices (fsdp splits the weights and optimizer state) or shorten L")
        elif args.device_gib:
            f, shipped = plan["fit"], plan["rows"][0]
            fits = shipped["peak_bytes_estimate"] <= args.device_gib * 2**30
            print(f"{name}: as configured (remat={shipped['remat']}, accum_steps={shipped['accum_steps']}) "
                  f"{shipped['peak_bytes_estimate'] / 2**30:.1f} GiB a device, "
                  f"{'within' if fits else 'over'} {args.device_gib} GiB; the cheapest setting that fits: "
                  f"--config.training.batch_size={f['batch_size']} --config.training.accum_steps={f['accum_steps']} "
                  f"--config.model.remat={f['remat']} ({f['peak_bytes_estimate'] / 2**30:.1f} GiB)")
    table = format_table(["config", "mesh", "params", "B", "B/device", "L", "dtype", "remat", "loss_chunk",
                          "accum", "args GiB", "temp GiB", "peak GiB/device", "compile s", ""], rows)
    return {"benchmark": "memory", "results": results, "table": table}


# --------------------------------------------------------------------------- random bits


def run_rng(quick: bool, args) -> dict:
    """Dropout masks and race words: JAX's random bits against ``sedd.rng``'s (every word of a block used).

    A dropout mask with its select, (8, 256, 256) as at the original SEDD's
    sizes, from ``jax.random.bernoulli``, ``jax.random.bits(..., uint16)`` and
    ``sedd.rng.uint16``; the two uint32 words per entry of an exponential race,
    (64, 32, 87) as in the load test of ``sedd serve``, from ``jax.random.bits``
    and ``sedd.rng.words``. Run under ``taskset -c 0`` for the cost on one core.
    """
    from sedd import rng  # noqa: PLC0415

    mask_shape, race_shape = ((2, 16, 32), (4, 8, 9)) if quick else ((8, 256, 256), (64, 32, 87))
    key, x, drop = jax.random.key(0), jnp.ones(mask_shape, jnp.float32), round(0.1 * 2**16)
    masks = {
        "bernoulli": lambda k, x: jnp.where(jax.random.bernoulli(k, 0.9, x.shape), x / 0.9, 0.0),
        "bits uint16": lambda k, x: jnp.where(jax.random.bits(k, x.shape, jnp.uint16) >= drop, x / 0.9, 0.0),
        "sedd.rng.uint16": lambda k, x: jnp.where(rng.uint16(k, x.shape) >= drop, x / 0.9, 0.0),
    }
    races = {
        "bits (2, ...) uint32": lambda k: jax.random.bits(k, (2, *race_shape), jnp.uint32),
        "sedd.rng.words": lambda k: rng.words(k, race_shape),
    }
    fns = {name: functools.partial(jax.jit(f), key, x) for name, f in masks.items()}
    fns |= {name: functools.partial(jax.jit(f), key) for name, f in races.items()}
    calls = 3 if quick else 30  # calls per timing: a mask is ~1 ms
    batched = {name: (lambda f=f: [f() for _ in range(calls)][-1]) for name, f in fns.items()}
    times = interleaved(batched, args.repeats)
    rows, results = [], []
    for name in fns:
        what = f"mask {mask_shape}" if name in masks else f"race words {race_shape}"
        ms = median(times[name]) / calls * 1e3
        base = "bits uint16" if name in masks else "bits (2, ...) uint32"
        speedup = paired_ratio(times[base], times[name])
        results.append({"what": what, "method": name, "ms": ms, "speedup_over_jax": speedup})
        rows.append([what, name, f"{ms:.3f}", f"{speedup:.2f}x"])
    table = format_table(["draw", "method", "ms a call", "vs jax.random.bits"], rows)
    return {"benchmark": "rng", "results": results, "table": table}


# --------------------------------------------------------------------------- optimizers


def run_optimizer(quick: bool, args) -> dict:
    """The default config's training step under each optimizer, with the optimizer state split along
    "data" (ZeRO-1) and replicated (the Trainer's default: split for Muon, replicated for AdamW); the
    CPU split as `sedd train` splits it.

    Run alone (`python experiments/benchmarks/bench.py optimizer`): the CPU can only be split before
    anything touches a device, so after another benchmark of `all` it runs on the devices it finds.
    """

    base, batch_size = ("tiny", 8) if quick else ("shakespeare_char", 32)
    config = bench_config(base, batch_size=batch_size)
    sharding.split_cpu(config)
    cases = {"adamw": ("adamw", False), "adamw, ZeRO-1": ("adamw", True),
             "muon, ZeRO-1": ("muon", True), "muon, replicated state": ("muon", False)}
    fns, steps = {}, 2 if quick else 10  # steps a timing: a step is tens of ms
    for name, (optimizer, zero1) in cases.items():
        c = bench_config(base, batch_size=batch_size)
        c.optim.optimizer = optimizer
        trainer = Trainer(c, zero1=zero1)
        batch = trainer.shard_batch(np.asarray(
            jax.random.randint(jax.random.key(1), (c.training.batch_size, c.data.seq_len), 0, c.vocab_size), np.int32))
        holder = {"state": trainer.init_state()}

        def step(trainer=trainer, holder=holder, batch=batch):
            for _ in range(steps):
                holder["state"], metrics = trainer.train_step(holder["state"], batch)
            return metrics

        fns[name] = step
    times = interleaved(fns, 1 if quick else args.repeats)
    results, rows = [], []
    for name in fns:
        ms = median(times[name]) / steps * 1e3
        ratio = paired_ratio(times[name], times["adamw"])
        results.append({"optimizer": name, "step_ms": ms, "ratio_to_adamw": ratio})
        rows.append([name, f"{ms:.1f}", f"{ratio:.3f}"])
    table = format_table(["optimizer", "ms a step", "vs adamw"], rows)
    table += f"\n({jax.device_count()} device(s) along data; batch {config.training.batch_size} x {config.data.seq_len})"
    return {"benchmark": "optimizer", "devices": jax.device_count(), "results": results, "table": table}


# --------------------------------------------------------------------------- entry point


# --------------------------------------------------------------------------- where a training step's time goes


def _op_kinds(hlo_text: str) -> dict[str, str]:
    """Each instruction of a compiled module's text -> its kind: "products" (a dot, alone or fused)
    or "elementwise", prefixed "attention LxL " where the output ends in two equal dimensions (L, L)."""
    kinds_of = {}
    bodies = {m.group(1): m.group(2) for m in re.finditer(r"\n%?([\w.\-]+) [^\n]*\{\n(.*?)\n\}", hlo_text, re.S)}
    for m in re.finditer(r"%([\w.\-]+) = (\S+) (\w+)\(.*?\), (.*)", hlo_text):
        name, shape, op, rest = m.groups()
        calls = re.search(r"calls=%([\w.\-]+)", rest)
        body = bodies.get(calls.group(1), "") if calls else ""
        product = op in ("dot", "dot_general") or " dot(" in body
        square = re.search(r"\[(?:\d+,)+(\d+),(\d+)\]", shape)
        lxl = square is not None and square.group(1) == square.group(2) and shape.count(",") >= 2
        kinds_of[name] = ("attention LxL " if lxl else "") + ("products" if product else "elementwise")
    return kinds_of


def run_profile(quick: bool, args, config=None) -> dict:
    """Op time of the default's compiled train step (or `config`'s) by kind, per device thread (jax.profiler)."""
    from jax._src.profiler import ProfileData  # the trace reader jax ships; no TensorBoard needed

    c = config or bench_config("tiny" if quick else "shakespeare_char", dtype=args.dtype or "auto")
    sharding.split_cpu(c)  # one device a core, as `sedd train` runs a CPU (a no-op once a device was used)
    trainer = Trainer(c)
    b, l = c.training.batch_size, c.data.seq_len
    batch = trainer.shard_batch(np.asarray(jax.random.randint(jax.random.key(1), (b, l), 0, c.vocab_size), np.int32))
    state = trainer.init_state()
    steps = 2 if quick else args.repeats
    for _ in range(3):
        state, m = trainer.train_step(state, batch)
    jax.block_until_ready(m)
    compiled = trainer.train_step.lower(state, batch).compile()
    kinds_of = _op_kinds(compiled.as_text())
    cost = compiled.cost_analysis()
    flops = (cost[0] if isinstance(cost, list) else cost or {}).get("flops", float("nan"))  # one device's program (SPMD)
    usage, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(steps):  # untraced: the step's own time, and what the kernel took of it
        state, m = trainer.train_step(state, batch)
    jax.block_until_ready(m)
    plain_ms, after = (time.perf_counter() - t0) / steps * 1e3, resource.getrusage(resource.RUSAGE_SELF)
    kernel_ms = (after.ru_stime - usage.ru_stime) / steps * 1e3
    faults = (after.ru_minflt - usage.ru_minflt) / steps
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        with jax.profiler.trace(d):
            for _ in range(steps):
                state, m = trainer.train_step(state, batch)
            jax.block_until_ready(m)
        step_ms = (time.perf_counter() - t0) / steps * 1e3
        trace = ProfileData.from_file(str(next(Path(d).rglob("*.xplane.pb"))))
    per_thread: dict[str, dict[str, float]] = {}
    for plane in trace.planes:
        for line in plane.lines:
            if not line.name.startswith("tf_XLAEigen"):  # XLA's compute threads
                continue
            row = per_thread.setdefault(line.name, {})
            for ev in line.events:
                if ev.name.startswith(("ThunkExecutor", "end: ", "Threadpool")):
                    continue  # the enclosing program, and markers of no duration
                kind = kinds_of.get(ev.name)
                if kind is None:
                    kind = "waiting for the other device" if ev.name.startswith(("Rendezvous", "Wait")) else \
                        "collectives" if ev.name.split(".")[0] in ("all-reduce", "all-gather") else "other"
                row[kind] = row.get(kind, 0.0) + ev.duration_ns / 1e6 / steps
    names = sorted({k for row in per_thread.values() for k in row})
    totals = {k: statistics.mean(row.get(k, 0.0) for row in per_thread.values()) for k in names}
    busy = sum(totals.values())
    rows = [[k, f"{v:.1f}", f"{100 * v / busy:.0f}%"] for k, v in sorted(totals.items(), key=lambda kv: -kv[1])]
    table = format_table(["op kind", "ms a step, a thread", "share"], rows)
    table += (f"\n{jax.device_count()} device(s), {len(per_thread)} compute threads; "
              f"a step took {step_ms:.0f} ms while traced; XLA counts {flops / 1e9:.1f} GFLOP a step a device"
              f"\nuntraced: {plain_ms:.0f} ms a step, {kernel_ms:.0f} ms of it in the kernel, {faults:,.0f} page faults "
              f"a step (freed memory {'kept' if KEPT_MEMORY else 'returned'}: kernels.keep_freed_memory)")
    return {"benchmark": "profile", "config": c.model.to_dict(), "table": table,
            "results": [{"step_ms_traced": step_ms, "ms_per_step_per_thread": totals, "threads": len(per_thread),
                         "flops_per_step": flops, "step_ms": plain_ms, "kernel_ms_per_step": kernel_ms,
                         "page_faults_per_step": faults, "freed_memory_kept": KEPT_MEMORY}]}


def gpu_summary(folder: str) -> str:
    """The table of experiments/benchmarks/gpu.sh: decode ms a call (each XLA_FLAGS variant), the training step's
    tokens/s and MFU against the measured matmul rate and the datasheet's, from the JSON files in `folder`."""
    rows = []
    for path in sorted(Path(folder).glob("decode*.json")):
        r = json.loads(path.read_text())
        flags = r["machine"]["xla_flags"] or "(none)"
        for row in r["results"]:
            rows.append([path.stem, flags[:60], row["what"], f"{row['ms_per_call']:.3f}", f"{row['tokens_per_s']:.0f}",
                         "" if row.get("same_tokens_as_ar_sample") is None else row["same_tokens_as_ar_sample"]])
    out = ["decode, batch 1 (ms a network call)",
           format_table(["file", "XLA_FLAGS", "what", "ms a call", "tok/s", "same tokens"], rows) if rows else "(none)"]
    rows = []
    for path in sorted(Path(folder).glob("train*.json")):
        for r in json.loads(path.read_text())["results"]:
            rows.append([path.stem, r.get("attention_setting", r["attention"]) + (
                "" if r["attention"] == r.get("attention_setting", r["attention"]) else f" ({r['attention']})"),
                r["model"]["batch_size"], f"{r['step_s'] * 1e3:.1f}",
                         f"{r['tokens_per_s']:.0f}", f"{r['achieved_flops_per_s'] / 1e12:.1f}",
                         f"{r['peak_matmul_flops_per_s'] / 1e12:.1f}",
                         "-" if r.get("peak_one_call_flops_per_s") is None else
                         f"{r['peak_one_call_flops_per_s'] / 1e12:.1f}", f"{r['mfu']:.3f}",
                         "-" if r.get("mfu_datasheet") is None else f"{r['mfu_datasheet']:.3f}",
                         "-" if r["peak_bytes_in_use"] is None else f"{r['peak_bytes_in_use'] / 2**30:.1f}"])
    out += ["", "training step (MFU: model FLOPs 6N + 12 n L H a token)",
            format_table(["file", "attention", "B", "ms a step", "tok/s", "TFLOP/s", "matmul loop TFLOP/s",
                          "one-call matmul TFLOP/s", "MFU vs loop", "MFU vs datasheet", "peak GiB"], rows)
            if rows else "(none)"]
    rows = []
    for path in sorted(Path(folder).glob("speculative*.json")):
        for size, curve in json.loads(path.read_text())["call_cost"].items():
            rows += [[path.stem, size, r["n"], f"{r['ms_per_call']:.3f}", f"{r['ratio_to_n1']:.2f}"]
                     for r in curve["rows"]]
    out += ["", "one AR call on n new positions, batch 1 (when a draft of n - 1 tokens pays)",
            format_table(["file", "size", "n", "ms a call", "vs n=1"], rows) if rows else "(none)"]
    return "\n".join(out)


def format_table(header: list, rows: list[list]) -> str:
    """Right-aligned plain-text table of header and rows."""
    cells = [[str(h) for h in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


KEPT_MEMORY = False
"""Whether this process kept freed memory (`kernels.keep_freed_memory`, run as a script)."""

RUNNERS = {"train": run_train, "sampler": run_sampler, "ar": run_ar, "block": run_block, "bound": run_bound,
           "memory": run_memory, "rng": run_rng, "optimizer": run_optimizer, "profile": run_profile,
           "decode": run_decode, "speculative": run_speculative}


def parser() -> argparse.ArgumentParser:
    """The argument parser of this script."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("which", choices=sorted(RUNNERS) + ["all", "gpu_summary"])
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of a few seconds")
    p.add_argument("--json", default="", help="output file, a folder with `all` "
                   "(default: experiments/benchmarks/results/NAME_PLATFORM.json)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds")
    p.add_argument("--width", type=int, default=None, help="H (train default 512, ar default 128)")
    p.add_argument("--blocks", type=int, default=None, help="n_blocks (train default 2, ar default 2)")
    p.add_argument("--seq_len", type=int, default=None, help="L (default 128)")
    p.add_argument("--batch_sizes", type=int, nargs="+", default=None,
                   help="train default: 32; ar default: 1 64")
    p.add_argument("--dtype", default="", help="model.dtype override (float32, bfloat16) for train, sampler, ar")
    p.add_argument("--matmul_n", type=int, default=2048, help="train: size of the peak-rate matmul")
    p.add_argument("--batch", type=int, default=16, help="sampler: batch of the char model")
    p.add_argument("--batch_gpt2", type=int, default=4, help="sampler: batch of the V=50257 model")
    p.add_argument("--steps", type=int, nargs="+", default=None,
                   help="ar: step counts (default 16 .. 1024); block: SEDD's (default 64 128)")
    p.add_argument("--max_direct_steps", type=int, default=128,
                   help="ar: step counts above this are predicted from a linear fit, not timed")
    p.add_argument("--configs", nargs="*", default=None, help="memory: config names (default: all shipped)")
    p.add_argument("--config", dest="configs", action="append",
                   help="memory, train: a shipped config's own step (repeatable)")
    p.add_argument("--mesh", default="", help="memory: mesh sizes, e.g. data=8,fsdp=1 (on as many fake CPU devices)")
    p.add_argument("--device_gib", type=float, default=None,
                   help="memory: a device's memory; find the cheapest accum_steps / remat that fits")
    p.add_argument("--length", type=int, default=1024, help="block: tokens to write")
    p.add_argument("--workdirs", nargs="*", default=None,
                   help="block: trained run directories (an AR, a SEDD and block runs) instead of random weights")
    p.add_argument("--attention", nargs="+", default=None, choices=kernels.ATTENTION_IMPLEMENTATIONS,
                   help="train: attention paths to time, one result each (sedd.kernels.ATTENTION; cudnn: a GPU's)")
    p.add_argument("--peak_iters", type=int, default=0,
                   help="train: the peak from this many chained matmul_n^3 products a jitted call (0: one a call)")
    p.add_argument("--no_profile", action="store_true", help="train: time the step and the peak only")
    p.add_argument("--vocab", type=int, default=None, help="decode: V (default 50257 at width >= 768)")
    p.add_argument("--unroll", type=int, nargs="*", default=None, help="decode: unroll factors of the AR loop")
    p.add_argument("--block_sizes", type=int, nargs="*", default=None,
                   help="decode: block models' b (default 4 16); bound: (default 16)")
    p.add_argument("--no_block", action="store_true", help="decode: AR only")
    p.add_argument("--trace", action="store_true", help="decode: a jax.profiler trace of the AR and block calls")
    p.add_argument("--target", default="", help="speculative: the AR run sampled (default with --quick: tiny random runs)")
    p.add_argument("--drafts", default="", help="speculative: comma-separated drafters, 'ngram' or run directories "
                   "(a smaller AR run, a block run; default ngram; none: the --spec run alone)")
    p.add_argument("--spec", default="", help="speculative: a model.kind='spec' run, sampled with its own drafts")
    p.add_argument("--quality_samples", type=int, default=64, help="speculative: texts each cell's quality is of")
    p.add_argument("--cost_only", action="store_true", help="speculative: the call-cost curve only")
    p.add_argument("--verifications", default="block", help="speculative: comma-separated, each cell verified by "
                   "each: 'block' (Sun et al.) and/or 'token' (Leviathan et al.); the same law")
    p.add_argument("--picture", default="", help="speculative: a PNG of tokens a call and tokens/s against quality")
    p.add_argument("--dump", default="", help="decode: a folder for the AR loop's HLO and the traces (.xplane.pb.gz)")
    return p


_DEFAULTS = {
    "train": {"width": 512, "blocks": 2, "seq_len": 128, "batch_sizes": [32]},
    "ar": {"width": 128, "blocks": 2, "seq_len": 128, "batch_sizes": [1, 64], "steps": [16, 32, 64, 128, 256, 1024]},
    "block": {"width": 128, "blocks": 4, "seq_len": 128, "batch_sizes": [1, 16], "steps": [64, 128]},
    "decode": {"width": 128, "blocks": 2, "seq_len": 128, "unroll": [2, 4], "block_sizes": [4, 16]},
    "bound": {"seq_len": 128, "batch_sizes": [32], "block_sizes": [16]},
    "speculative": {"batch_sizes": [1, 16]},
}


def run(which: str, args) -> dict:
    """Runs one benchmark, prints its table and writes its JSON; returns the result."""
    ns = argparse.Namespace(**vars(args))
    for k, v in _DEFAULTS.get(which, {}).items():
        if getattr(ns, k) is None:
            setattr(ns, k, v)
    t0 = time.perf_counter()
    result = RUNNERS[which](args.quick, ns)
    result["machine"] = machine()
    result["quick"] = bool(args.quick)
    result["wall_s"] = time.perf_counter() - t0
    m = result["machine"]
    bf16 = "with" if m["cpu_has_bfloat16_dots"] else "without"
    print(f"== {result['benchmark']} on {m['platform']} ({m['device_kind']}; {m['device_count']} device(s); "
          f"{m['cpu_count']} CPUs, {m['cpu_model']}, {bf16} AVX512-BF16; load {m['load_average_1_5_15min']}; jax {m['jax']}; "
          f"XLA_FLAGS={m['xla_flags']!r}); {result['wall_s']:.0f} s")
    print(result["table"])
    name = f"{result['benchmark']}_{m['platform']}{'_quick' if args.quick else ''}.json"
    if not args.json:
        path = RESULTS_DIR / name
    elif args.which == "all":  # --json names a folder for the files
        path = Path(args.json) / name
    else:
        path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=float))
    print(f"wrote {path}")
    if which == "speculative":  # its tables as markdown beside the JSON
        path.with_suffix(".md").write_text(f"# bench.py speculative ({m['platform']}, {m['cpu_model']}, "
                                           f"jax {m['jax']})\n\n```\n{result['table']}\n```\n")
    return result


def main(argv: list[str] | None = None) -> int:
    """`python experiments/benchmarks/bench.py WHICH [options]`."""
    args, rest = parser().parse_known_args(argv)
    args.overrides = [a for a in rest if a.startswith("--config.")]
    if len(args.overrides) != len(rest):
        parser().error(f"unrecognized arguments: {' '.join(a for a in rest if not a.startswith('--config.'))}")
    if args.overrides and args.which not in ("memory", "train"):
        parser().error("--config.KEY=VALUE overrides are for `memory` and `train --config NAME`")
    if args.mesh:  # fake CPU devices for the mesh, before JAX starts a backend
        try:
            sizes = parse_mesh(args.mesh)
        except ValueError as e:
            parser().error(str(e))
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", int(np.prod(list(sizes.values()))))
    if args.device_gib is not None and not args.device_gib > 0:
        parser().error(f"--device_gib must be a positive size in GiB, got {args.device_gib}")
    if args.which == "gpu_summary":
        print(gpu_summary(args.json or str(RESULTS_DIR)))
        return 0
    for which in (sorted(RUNNERS) if args.which == "all" else [args.which]):
        run(which, args)
    return 0


if __name__ == "__main__":
    KEPT_MEMORY = kernels.keep_freed_memory()  # as `sedd train` does, before JAX's CPU backend starts
    sys.exit(main())
