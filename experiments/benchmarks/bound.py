"""`bench.py bound`: the likelihood bound of one batch, the default (ddit) against block models: seconds, FLOPs."""

from __future__ import annotations

import functools
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import nets
from experiments.timing import format_table, median, paired_ratio
from sedd import evaluate, kinds
from sedd.kinds import block


def _cost(fn: Callable, *args) -> dict:
    """XLA's count for one jitted call of fn(*args): {"gflop": ..., "gb": bytes accessed / 1e9}."""
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return {"gflop": float(cost.get("flops", 0.0)) / 1e9, "gb": float(cost.get("bytes accessed", 0.0)) / 1e9}


def _bound_candidates(config, batch: int, block_sizes: list[int], num_t: int) -> dict:
    """name -> (a batch's bound, XLA's count of one t point, of the once-a-batch context or None)."""
    x0 = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab_size, (batch, config.data.seq_len)), jnp.int32)
    sigma = jnp.full((batch,), 1.0, jnp.float32)
    kind, net = nets.random_net(config, "ddit")
    out = {
        "ddit": (
            functools.partial(kind.likelihood, jax.random.key(0), net, [x0], num_t),
            _cost(kinds.params_score_fn(net.graphdef), net.state, x0, sigma),
            None,
        )
    }
    for b in block_sizes:
        kind, net = nets.random_net(config, "block", b)
        fns = block.bound_fns(net.graphdef, b)
        context = jax.jit(fns.prepare)(net.state, x0)
        out[f"block b={b}"] = (
            functools.partial(kind.likelihood, jax.random.key(0), net, [x0], num_t),
            _cost(fns.block_fn, context, x0, x0, sigma),
            _cost(fns.prepare, net.state, x0),
        )
        full = block.params_block_fn(net.graphdef, b)  # the [x_t ; x0] forward at every t, as before issue 54
        before = functools.partial(
            evaluate.dataset_bound,
            jax.random.key(0),
            full,
            kind.graph,
            kind.noise,
            [x0],
            num_t,
            score_params=net.state,
            per_position=block.per_position_fn(b),
        )
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
        rows.append(
            {
                "model": name,
                "first_s": first[name],
                "wall_s": median(wall[name]),
                "cpu_s": median(cpu[name]),
                "wall_times_s": wall[name],
                "cpu_times_s": cpu[name],
                "ratio_to_ddit_wall": paired_ratio(wall[name], wall["ddit"]),
                "ratio_to_ddit_cpu": paired_ratio(cpu[name], cpu["ddit"]),
                "per_t": per_t,
                "context": context,
            }
        )
    return {
        "model": dict(config.model.to_dict(), vocab_size=config.vocab_size),
        "batch": batch,
        "seq_len": config.data.seq_len,
        "num_t": num_t,
        "rows": rows,
    }


def run_bound(quick: bool, args) -> dict:
    """The bound of one batch: the default (ddit) against block models, with the context and the full forward."""
    if quick:
        config, batch, block_sizes, num_t, repeats = nets.bench_config("tiny"), 4, [4], 8, 1
    else:
        config = nets.bench_config(seq_len=args.seq_len)
        batch, block_sizes, num_t, repeats = args.batch_sizes[0], args.block_sizes, 64, args.repeats
    if args.dtype:
        config.model.dtype = args.dtype
    result = bench_bound(config, batch, block_sizes, num_t, repeats)
    rows = [
        [
            row["model"],
            f"{row['first_s']:.1f}",
            f"{row['wall_s']:.1f}",
            f"{row['cpu_s']:.1f}",
            f"{row['ratio_to_ddit_wall']:.2f}",
            f"{row['ratio_to_ddit_cpu']:.2f}",
            f"{row['per_t']['gflop']:.2f}",
            f"{row['per_t']['gb']:.2f}",
            "" if row["context"] is None else f"{row['context']['gflop']:.2f}",
        ]
        for row in result["rows"]
    ]
    table = format_table(
        ["model", "1st s", "wall s", "CPU s", "wall/ddit", "CPU/ddit", "GFLOP/t", "GB/t", "ctx GFLOP"], rows
    )
    return {"benchmark": "bound", "results": [result], "table": table}
