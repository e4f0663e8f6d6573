"""`bench.py block`: AR, SEDD and block models writing N tokens at batch 1 and 16, interleaved, with NFE and FLOPs."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from experiments.benchmarks import nets
from experiments.timing import format_table, interleaved, median, paired_ratio
from experiments.writing import by_blocks
from sedd import kinds, sampling
from sedd.kinds import causal
from sedd.kinds.capabilities import Diffuses


def _writers(
    config, length: int, batch: int, block_sizes: list[int], sedd_steps: list[int], given: list, per_step: int
) -> dict:
    """name -> (() -> Samples with stats, positions a network call runs on, sampler described).

    With `given` (loaded ``sedd.runs.Run``s: an AR run, a SEDD run, block runs,
    each asked what its kind does) the trained weights and the threshold
    sampler, a block run's b its steps a block; without, random weights of
    each size in `block_sizes` and the confidence sampler at b / per_step
    steps a block (per_step tokens a step).
    """
    key = jax.random.key(0)
    out = {}
    ar_runs = [r for r in given if not isinstance(r.kind, Diffuses)]  # causal LMs: one token a call, KV cache
    whole = [r for r in given if isinstance(r.kind, Diffuses) and not by_blocks(r.kind, r.seq_len)]
    blocks = {r.kind.one_token_steps(r.seq_len): r for r in given if by_blocks(r.kind, r.seq_len)}  # b -> run
    if ar_runs:
        ar_model = ar_runs[0].net.model
    else:
        c = config.copy_and_resolve_references()
        c.model.kind = "ar"
        ar_model = kinds.build_model(c, 0)

    def ar_fn():
        tokens = causal.ancestral_model(key, ar_model, batch, length)
        return sampling.Samples(tokens, None, {"nfe": jnp.int32(length)})

    out["AR, KV cache"] = (ar_fn, 1, "ancestral")
    if whole or not given:
        kind, net = (whole[0].kind, whole[0].net) if whole else nets.random_net(config, "ddit")
        for steps in sedd_steps:
            fn = functools.partial(
                kind.sample, key, net, batch, steps, "analytic", max_length=length, return_stats=True
            )
            out[f"SEDD b=L, {steps} steps"] = (fn, config.data.seq_len, f"analytic, windows of L, {steps} steps")
    for b in sorted(blocks) if given else block_sizes:
        run = blocks.get(b)
        kind, net = (run.kind, run.net) if run else nets.random_net(config, "block", b)
        if run:
            options, what = dict(sampler="confidence", threshold=0.9), "confidence, threshold 0.9, <= b steps"
            steps = b
        else:
            options, what = dict(sampler="confidence"), f"confidence, {per_step} tokens a step"
            steps = max(b // per_step, 1)
        fn = functools.partial(kind.sample, key, net, batch, steps, max_length=length, return_stats=True, **options)
        out[f"block b={b}"] = (fn, b, what)
    return out


def bench_block(
    config,
    length: int,
    batch: int,
    block_sizes: list[int],
    sedd_steps: list[int],
    repeats: int,
    given: list,
    per_step: int = 4,
) -> dict:
    """Seconds to write `length` tokens at `batch` for AR, SEDD and block models, interleaved, with NFE and FLOPs."""
    writers = _writers(config, length, batch, block_sizes, sedd_steps, given, per_step)
    nfe = {name: int(fn().stats["nfe"]) for name, (fn, _, _) in writers.items()}  # also compiles
    times = interleaved({name: fn for name, (fn, _, _) in writers.items()}, repeats, warmup=0)
    window = config.data.seq_len
    forward = nets.flops_per_token(config, training=False)  # one position against a context of L
    ar_s = median(times["AR, KV cache"])
    rows = []
    for name, (_, positions, what) in writers.items():
        sec = median(times[name])
        rows.append(
            {
                "model": name,
                "sampler": what,
                "seconds": sec,
                "times_s": times[name],
                "tokens_per_s": batch * length / sec,
                "nfe": nfe[name],
                "nfe_per_token": nfe[name] / length,
                "flops_per_token": nfe[name] * positions * forward / length,
                "speedup_vs_ar": paired_ratio(times["AR, KV cache"], times[name]),
            }
        )
    return {
        "model": dict(config.model.to_dict(), vocab_size=config.vocab_size, window=window),
        "length": length,
        "batch": batch,
        "trained": bool(given),
        "ar_seconds": ar_s,
        "rows": rows,
    }


def run_block(quick: bool, args) -> dict:
    """Block diffusion vs AR vs SEDD: time to write N tokens at batch 1 and 16; dict with a table."""
    from sedd import runs  # noqa: PLC0415  (only with --workdirs)

    given = [runs.load(path) for path in args.workdirs or []]  # a run directory per model: its kind says which
    if quick:
        config = nets.bench_config("tiny")
        lengths, batches, block_sizes, sedd_steps, repeats = [64], [1], [4, 8], [8], 1
    elif given:
        config = given[0].config
        lengths, batches, block_sizes, sedd_steps = [args.length], args.batch_sizes, [4, 8, 16], args.steps
        repeats = args.repeats
    else:
        config = nets.bench_config(
            hidden_size=args.width,
            n_heads=max(args.width // 64, 1),
            n_layers=args.blocks,
            cond_dim=64,
            seq_len=args.seq_len,
        )
        if args.width >= 768:  # GPT-2 small's vocabulary too
            config.vocab_size = 50257
        lengths, batches, block_sizes, sedd_steps = [args.length], args.batch_sizes, [4, 8, 16], args.steps
        repeats = args.repeats
    if args.dtype:
        config.model.dtype = args.dtype
    results = [bench_block(config, n, b, block_sizes, sedd_steps, repeats, given) for n in lengths for b in batches]
    rows = [
        [
            r["batch"],
            row["model"],
            row["sampler"],
            f"{row['seconds']:.2f}",
            f"{row['tokens_per_s']:.0f}",
            f"{row['nfe']}",
            f"{row['nfe_per_token']:.3f}",
            f"{row['flops_per_token'] / 1e6:.2f}",
            f"{row['speedup_vs_ar']:.2f}",
        ]
        for r in results
        for row in r["rows"]
    ]
    table = format_table(["B", "model", "sampler", "s", "tok/s", "NFE", "NFE/tok", "MFLOP/tok", "vs AR"], rows)
    return {"benchmark": "block" + ("_trained" if given else ""), "results": results, "table": table}
