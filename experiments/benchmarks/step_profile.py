"""`bench.py profile`: where a training step's time goes, op time by kind per device thread (jax.profiler)."""

from __future__ import annotations

import re
import resource
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from experiments.benchmarks import nets
from experiments.timing import format_table
from sedd import sharding
from sedd.train import Trainer


KEPT_MEMORY = False
"""Whether this process kept freed memory (`kernels.keep_freed_memory`: bench.py sets it when run as a script)."""


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

    c = config or nets.bench_config("tiny" if quick else "shakespeare_char", dtype=args.dtype or "auto")
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
    flops = (cost[0] if isinstance(cost, list) else cost or {}).get(
        "flops", float("nan")
    )  # one device's program (SPMD)
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
                    kind = (
                        "waiting for the other device"
                        if ev.name.startswith(("Rendezvous", "Wait"))
                        else "collectives"
                        if ev.name.split(".")[0] in ("all-reduce", "all-gather")
                        else "other"
                    )
                row[kind] = row.get(kind, 0.0) + ev.duration_ns / 1e6 / steps
    names = sorted({k for row in per_thread.values() for k in row})
    totals = {k: statistics.mean(row.get(k, 0.0) for row in per_thread.values()) for k in names}
    busy = sum(totals.values())
    rows = [[k, f"{v:.1f}", f"{100 * v / busy:.0f}%"] for k, v in sorted(totals.items(), key=lambda kv: -kv[1])]
    table = format_table(["op kind", "ms a step, a thread", "share"], rows)
    table += (
        f"\n{jax.device_count()} device(s), {len(per_thread)} compute threads; "
        f"a step took {step_ms:.0f} ms while traced; XLA counts {flops / 1e9:.1f} GFLOP a step a device"
        f"\nuntraced: {plain_ms:.0f} ms a step, {kernel_ms:.0f} ms of it in the kernel, {faults:,.0f} page faults "
        f"a step (freed memory {'kept' if KEPT_MEMORY else 'returned'}: kernels.keep_freed_memory)"
    )
    return {
        "benchmark": "profile",
        "config": c.model.to_dict(),
        "table": table,
        "results": [
            {
                "step_ms_traced": step_ms,
                "ms_per_step_per_thread": totals,
                "threads": len(per_thread),
                "flops_per_step": flops,
                "step_ms": plain_ms,
                "kernel_ms_per_step": kernel_ms,
                "page_faults_per_step": faults,
                "freed_memory_kept": KEPT_MEMORY,
            }
        ],
    }
