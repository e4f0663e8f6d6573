"""`bench.py optimizer`: the default's training step under AdamW and Muon, with and without ZeRO-1."""

from __future__ import annotations

import jax
import numpy as np

from experiments.benchmarks import nets
from experiments.timing import format_table, interleaved, median, paired_ratio
from sedd import sharding
from sedd.train import Trainer


def run_optimizer(quick: bool, args) -> dict:
    """The default config's training step under each optimizer, with the optimizer state split along
    "data" (ZeRO-1) and replicated (the Trainer's default: split for Muon, replicated for AdamW); the
    CPU split as `sedd train` splits it.

    Run alone (`python experiments/benchmarks/bench.py optimizer`): the CPU can only be split before
    anything touches a device, so after another benchmark of `all` it runs on the devices it finds.
    """

    base, batch_size = ("tiny", 8) if quick else ("shakespeare_char", 32)
    config = nets.bench_config(base, batch_size=batch_size)
    sharding.split_cpu(config)
    cases = {
        "adamw": ("adamw", False),
        "adamw, ZeRO-1": ("adamw", True),
        "muon, ZeRO-1": ("muon", True),
        "muon, replicated state": ("muon", False),
    }
    fns, steps = {}, 2 if quick else 10  # steps a timing: a step is tens of ms
    for name, (optimizer, zero1) in cases.items():
        c = nets.bench_config(base, batch_size=batch_size)
        c.optim.optimizer = optimizer
        trainer = Trainer(c, zero1=zero1)
        batch = trainer.shard_batch(
            np.asarray(
                jax.random.randint(jax.random.key(1), (c.training.batch_size, c.data.seq_len), 0, c.vocab_size),
                np.int32,
            )
        )
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
    table += (
        f"\n({jax.device_count()} device(s) along data; batch {config.training.batch_size} x {config.data.seq_len})"
    )
    return {"benchmark": "optimizer", "devices": jax.device_count(), "results": results, "table": table}
