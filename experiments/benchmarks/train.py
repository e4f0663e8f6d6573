"""`bench.py train`: tokens/s, FLOPs/token and MFU of the training step against a matmul timed in the same rounds."""

from __future__ import annotations

import statistics
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import nets
from experiments.benchmarks.memory import memory_config
from experiments.timing import format_table, interleaved, median, paired_ratio, timed
from sedd import kernels
from sedd.train import Trainer


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
    f = jax.jit(
        lambda a, b: jax.lax.fori_loop(0, iters, lambda i, x: jnp.matmul(x, b, preferred_element_type=dtype), a)
    )
    return (lambda: f(a, b)), 2.0 * n**3 * iters


# Dense (no sparsity) bfloat16 tensor rates of the vendors' datasheets, FLOP/s, by a word of device_kind.
DATASHEET_BF16_FLOPS = {
    "H200": (989e12, "H200 SXM datasheet, dense bf16 989 TFLOP/s"),
    "H100": (989e12, "H100 SXM datasheet, dense bf16 989 TFLOP/s"),
    "A100": (312e12, "A100 datasheet, dense bf16 312 TFLOP/s"),
}


def datasheet_bf16(device_kind: str) -> tuple[float | None, str]:
    """(the datasheet's dense bf16 FLOP/s, its name) of a device kind, (None, "") where not known (CPUs)."""
    for word, (rate, name) in DATASHEET_BF16_FLOPS.items():
        if word in device_kind:
            return rate, name
    return None, ""


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
        np.asarray(jax.random.randint(jax.random.key(1), (b, l), 0, config.vocab_size), np.int32)
    )
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
    t_compile = timed(step)
    times = interleaved(fns, repeats)
    stats = jax.local_devices()[0].memory_stats() or {}  # None on a CPU
    fpt = nets.flops_per_token(config, training=True)
    tokens = b * l
    step_s = median(times["train_step"])
    peak = [mm_flops / t for t in times["matmul"]]
    achieved = [tokens * fpt / t for t in times["train_step"]]
    sheet, sheet_name = datasheet_bf16(jax.devices()[0].device_kind)
    out = {
        "attention": kernels.attention_implementation(),
        "model": dict(
            config.model.to_dict(),
            vocab_size=config.vocab_size,
            seq_len=l,
            batch_size=b,
            loss_chunk=config.training.loss_chunk,
        ),
        "n_params": trainer.n_params,
        "matmul_params_N": nets.matmul_params(config),
        "flops_per_token": fpt,
        "flops_formula": "6N + 12 n_layers L H",
        "compile_s": t_compile,
        "step_s": step_s,
        "tokens_per_s": tokens / step_s,
        "achieved_flops_per_s": median(achieved),
        "peak_matmul_flops_per_s": median(peak),
        "matmul_n": matmul_n,
        "peak_iters": peak_iters,
        "peak_how": (
            f"{peak_iters} chained {matmul_n}^3 products in one jitted call"
            if peak_iters
            else f"one {matmul_n}^3 product a jitted call"
        ),
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
        fwd_flops = tokens * nets.flops_per_token(config, training=False)
        out["forward_mfu"] = statistics.median(fwd_flops / t / p for t, p in zip(times["forward"], peak))
        out["forward_backward_mfu"] = statistics.median(
            3 * fwd_flops / t / p for t, p in zip(times["forward_backward"], peak)
        )
    return out


def train_table(results: list[dict]) -> str:
    """``bench_train``'s results as one table, and the peak the MFU is against."""
    rows = [
        [
            r["attention_setting"] + ("" if r["attention"] == r["attention_setting"] else f" ({r['attention']})"),
            r["model"]["hidden_size"],
            r["model"]["n_layers"],
            r["model"]["seq_len"],
            r["model"]["batch_size"],
            f"{r['n_params'] / 1e6:.2f}M",
            f"{r['flops_per_token'] / 1e6:.1f}",
            f"{r['tokens_per_s']:.0f}",
            f"{r['achieved_flops_per_s'] / 1e9:.1f}",
            f"{r['peak_matmul_flops_per_s'] / 1e9:.1f}",
            f"{r['mfu']:.2f}",
            "-" if r["mfu_datasheet"] is None else f"{r['mfu_datasheet']:.2f}",
            f"{r.get('forward_mfu', float('nan')):.2f}",
            f"{r.get('forward_backward_mfu', float('nan')):.2f}",
            f"{r.get('forward_backward_share_of_step', float('nan')):.2f}",
            r["model"]["remat"],
            r["model"]["loss_chunk"],
            "-" if r["peak_bytes_in_use"] is None else f"{r['peak_bytes_in_use'] / 2**30:.1f}",
        ]
        for r in results
    ]
    table = format_table(
        [
            "attention",
            "H",
            "blocks",
            "L",
            "B",
            "params",
            "MFLOP/tok",
            "tok/s",
            "GFLOP/s",
            "peak GFLOP/s",
            "MFU",
            "MFU datasheet",
            "fwd MFU",
            "fwd+bwd MFU",
            "fwd+bwd/step",
            "remat",
            "loss_chunk",
            "peak GiB",
        ],
        rows,
    )
    r0 = results[0]
    table += (
        f"\npeak: {r0['peak_how']}"
        + (
            f" ({r0['peak_one_call_flops_per_s'] / 1e9:.1f} GFLOP/s with one product a call)"
            if r0["peak_iters"]
            else ""
        )
        + (f"; datasheet: {r0['datasheet']}" if r0["datasheet"] else "")
    )
    return table


def run_train(quick: bool, args) -> dict:
    """The training benchmark: tokens/s, FLOPs/token and MFU per batch size; dict with a table."""
    if quick:
        cases = [nets.bench_config("tiny", batch_size=8)]
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
            nets.bench_config(
                hidden_size=args.width,
                n_heads=args.width // 64,
                n_layers=args.blocks,
                seq_len=args.seq_len,
                batch_size=b,
            )
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
                results.append(
                    bench_train(
                        c,
                        repeats=repeats,
                        matmul_n=mm_n,
                        profile=not (quick or args.no_profile),
                        peak_iters=args.peak_iters,
                    )
                )
                results[-1]["attention_setting"] = attention
    finally:
        kernels.ATTENTION = saved
    return {"benchmark": "train", "results": results, "table": train_table(results)}
