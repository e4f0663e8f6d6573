"""`bench.py ar`: seconds to generate B x L tokens, diffusion at each step count against the AR baseline."""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import numpy as np

from experiments.benchmarks import nets
from experiments.timing import format_table, interleaved, median, timed
from sedd import kinds, sampling
from sedd.kinds import causal


def ar_decode_fn(config, batch: int) -> tuple[Callable[[], Any], str]:
    """A () -> tokens function generating L tokens with the AR baseline (KV cache), and its method."""
    c = config.copy_and_resolve_references()
    c.model.kind = "ar"
    model = kinds.build_model(c, 0)
    key = jax.random.key(0)
    return (lambda: causal.ancestral_model(key, model, batch, config.data.seq_len)), "KV cache (causal.ancestral)"


def bench_diffusion_vs_ar(
    config, batch: int, steps_list: list[int], max_direct_steps: int, repeats: int = 3, max_seconds: float = 20.0
) -> dict:
    """Seconds to generate B x L tokens: diffusion for each step count vs the AR baseline.

    Step counts up to ``max_direct_steps`` are timed (median of up to
    ``repeats`` calls, fewer when one call exceeds max_seconds / repeats); the
    rest are predicted as (steps + 1) x the median seconds per network call of
    the timed ones and flagged ``"fit"``. AR is timed before and after the sweep and the
    median taken, so drift in load shows up in both. Crossover: the step count
    at which diffusion takes as long as AR, from that per-call time.
    """
    graph, noise, params, score_fn = nets.diffusion_parts(config)
    l = config.data.seq_len
    key = jax.random.key(0)
    ar_fn, ar_method = ar_decode_fn(config, batch)
    ar_times = interleaved({"ar": ar_fn}, repeats)["ar"]
    rows, measured = [], []
    for s in steps_list:
        if s > max_direct_steps:
            continue
        fn = functools.partial(sampling.sample, key, score_fn, graph, noise, (batch, l), s, score_params=params)
        compile_s = timed(fn)
        ts = []
        while len(ts) < repeats and (not ts or sum(ts) < max_seconds):
            ts.append(timed(fn))
        measured.append((s, median(ts)))
        rows.append({"steps": s, "seconds": median(ts), "source": "timed", "runs": len(ts), "first_call_s": compile_s})
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
        "forward_flops_per_token": nets.flops_per_token(config, training=False),
        "rows": rows,
    }


def run_ar(quick: bool, args) -> dict:
    """Diffusion vs autoregressive time to generate L tokens; dict with a table."""
    if quick:
        config = nets.bench_config("tiny")
        batches, steps_list, max_direct, repeats = [2], [2, 4, 8], 4, 1
    else:
        config = nets.bench_config(
            hidden_size=args.width,
            n_heads=max(args.width // 64, 1),
            n_layers=args.blocks,
            cond_dim=64,
            seq_len=args.seq_len,
        )
        batches, steps_list, max_direct, repeats = args.batch_sizes, args.steps, args.max_direct_steps, 3
    if args.dtype:
        config.model.dtype = args.dtype
    results = [bench_diffusion_vs_ar(config, b, steps_list, max_direct, repeats=repeats) for b in batches]
    rows = []
    for r in results:
        b = r["model"]["batch_size"]
        for row in r["rows"]:
            rows.append(
                [
                    b,
                    row["steps"],
                    f"{row['seconds']:.3f}",
                    row["source"],
                    f"{row['tokens_per_s']:.0f}",
                    f"{r['ar_seconds']:.3f}",
                    f"{r['ar_tokens_per_s']:.0f}",
                    f"{row['speedup_vs_ar']:.2f}",
                ]
            )
        rows.append([b, "crossover", f"{r['crossover_steps']:.0f} steps", "", "", "", "", r["ar_method"]])
    table = format_table(["B", "steps", "diffusion s", "", "diff tok/s", "AR s", "AR tok/s", "AR s / diff s"], rows)
    return {"benchmark": "diffusion_vs_ar", "results": results, "table": table}
