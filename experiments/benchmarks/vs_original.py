r"""The original SEDD beside ours: training tokens/s and sampler seconds, same CPU, same sizes.

The original (PyTorch, louaaron/Score-Entropy-Discrete-Diffusion) is timed by
``../shared/bench-original/bench_original.py`` in a subprocess of its own
venv; ``sedd`` by the same measurement in this process, through the
library's own ``Trainer.train_step`` and ``sampling.sample``:

  train   one step = loss, backward, clip 1.0, AdamW, EMA (ours also the NaN
          guard); absorbing graph, log-linear noise, the original's optimizer
          settings (lr 3e-4, warmup 2500, EMA 0.9999). tokens/s = B L / the
          median step time over --steps steps after --warmup steps, each on a
          fresh random batch.
  sample  --sample-steps analytic steps + the final denoise, batch B, length
          L, the library's defaults otherwise (categorical "precise"); the
          median of --sample-repeats calls after one compiling call.

Rounds are interleaved (original then ours, reversed every other round), and
each ratio is the median of the per-round ratios. The fastest single step of
each side is reported too: on a shared machine the original's steps slow
down far more under load than ours (0.39 s to 5.4 s within one run), so the
medians alone flatter us; the fastest steps show the quiet-machine order.
With --threads N below the CPU count this process is pinned to the first N
CPUs before jax starts (the original's subprocess inherits the pinning); the
original also gets ``torch.set_num_threads(N)``.

Set-up once per machine: ../shared/bench-original/README.md. Then

    python experiments/benchmarks/vs_original.py --orig /tmp/sedd_orig \
        --python /tmp/sedd-orig-venv/bin/python [--dropout 0.1] [--rounds 3] [--json PATH] \
        [--dtype auto|float32|bfloat16] [--orig-autocast]

``--profile`` runs only ours: where its step's time goes at the same sizes
(``bench.py profile``'s table), the original not run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: import experiments/ by its location (experiments/__init__.py says why)
    import importlib.util

    _spec = importlib.util.spec_from_file_location("experiments", Path(__file__).resolve().parents[1] / "__init__.py")
    if "experiments" not in sys.modules:
        sys.modules["experiments"] = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(sys.modules["experiments"])

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BENCH_ORIGINAL = ROOT.parent / "shared" / "bench-original" / "bench_original.py"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--orig", default="/tmp/sedd_orig", help="checkout of the original SEDD code")
    p.add_argument("--python", default="/tmp/sedd-orig-venv/bin/python", help="python of the venv with torch")
    p.add_argument("--bench", default=str(BENCH_ORIGINAL), help="the original's bench script")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (each runs both sides once)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dropout", type=float, default=0.1, help="the original's configs and owt_small use 0.1")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--cond-dim", type=int, default=128)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--length", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--sample-steps", type=int, default=64)
    p.add_argument("--sample-repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cpu-devices",
        type=int,
        default=0,
        help="sedd's mesh.cpu_devices: 0 = auto, as `sedd train` (one device a core); 1 = one device",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16"),
        help="sedd's model.dtype: auto (as shipped: bfloat16 on a CPU with bfloat16 dot instructions)",
    )
    p.add_argument(
        "--orig-autocast",
        action="store_true",
        help="run the original under CPU bfloat16 autocast (its own autocast is CUDA-only, so on a "
        "CPU it computes in float32 as shipped)",
    )
    p.add_argument("--json", default="", help="also write the figures here")
    p.add_argument(
        "--profile",
        action="store_true",
        help="only ours: where its training step's time goes at these sizes (bench.py profile), "
        "then exit; the original is not run",
    )
    return p


# --------------------------------------------------------------------------- the original


def run_original(args) -> dict:
    """One run of bench_original.py: {train_tokens_per_s, sample_s, step_ms}."""
    wrapper = [str(HERE / "original_autocast.py")] if args.orig_autocast else []
    cmd = [
        args.python,
        *wrapper,
        args.bench,
        "--orig",
        args.orig,
        "--threads",
        str(args.threads),
        "--hidden",
        str(args.hidden),
        "--cond-dim",
        str(args.cond_dim),
        "--blocks",
        str(args.blocks),
        "--heads",
        str(args.heads),
        "--vocab",
        str(args.vocab),
        "--length",
        str(args.length),
        "--batch",
        str(args.batch),
        "--warmup",
        str(args.warmup),
        "--steps",
        str(args.steps),
        "--sample-steps",
        str(args.sample_steps),
        "--sample-repeats",
        str(args.sample_repeats),
        "--seed",
        str(args.seed),
        "--dropout",
        str(args.dropout),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True)
    last = re.search(r"^bench_original: (.*)$", out.stdout, re.M)
    if out.returncode or not last:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    figures = {k: float(v) for k, v in (kv.split("=") for kv in last.group(1).split())}
    best = re.search(r"^train step: .*\(min ([0-9.]+),", out.stdout, re.M)
    if best:  # the fastest step: what a quiet machine would give
        figures["best_step_ms"] = float(best.group(1))
    return figures


# --------------------------------------------------------------------------- ours


class Ours:
    """sedd at the original's sizes: the Trainer's step and sampling.sample, compiled once."""

    def __init__(self, args):
        import jax
        import numpy as np

        from sedd import kernels, kinds, sampling, sharding
        from sedd.train import Trainer

        self.jax, self.np, self.sampling, self.args = jax, np, sampling, args
        self.config = config = ours_config(args)
        kernels.keep_freed_memory()  # as `sedd train` does, before anything touches a device
        sharding.split_cpu(config)
        self.devices = jax.device_count()
        self.dtype = kernels.compute_dtype(config.model.dtype).name
        self.trainer = Trainer(config)
        self.rows = sharding.rows_sharding(args.batch, self.trainer.mesh)
        self.state = self.trainer.init_state()
        self.rng = np.random.default_rng(args.seed)
        # One object, so sample compiles once; the rows stay split over the devices at every network call.
        self.score_fn = kinds.params_score_fn(self.trainer.graphdef, self.rows)
        self.nfe = None

    def _batch(self):
        b, l = self.args.batch, self.args.length
        return self.trainer.shard_batch(self.rng.integers(0, self.args.vocab, (b, l)).astype(self.np.int32))

    def train(self) -> dict:
        """Median step time over --steps steps after --warmup (the first call also compiles)."""
        times = []
        for k in range(self.args.warmup + self.args.steps):
            batch = self._batch()
            t0 = time.perf_counter()
            self.state, metrics = self.trainer.train_step(self.state, batch)
            self.jax.block_until_ready((self.state, metrics))
            if k >= self.args.warmup:
                times.append(time.perf_counter() - t0)
        step = statistics.median(times)
        return {
            "train_tokens_per_s": self.args.batch * self.args.length / step,
            "step_ms": step * 1e3,
            "best_step_ms": min(times) * 1e3,
        }

    def sample(self) -> dict:
        """Median seconds of a whole --sample-steps analytic sampler + denoise."""
        args, jax = self.args, self.jax
        c = self.config

        def once(key):
            return self.sampling.sample(
                key,
                self.score_fn,
                self.trainer.kind.graph,
                self.trainer.kind.noise,
                (args.batch, args.length),
                args.sample_steps,
                sampler="analytic",
                denoise=True,
                eps=c.sampling.eps,
                score_params=(self.state["params"], self.trainer.rest),
                return_stats=True,
            )

        if self.nfe is None:  # compile
            jax.block_until_ready(once(jax.random.key(args.seed)))
        times = []
        for r in range(args.sample_repeats):
            t0 = time.perf_counter()
            out = jax.block_until_ready(once(jax.random.key(args.seed + 1 + r)))
            x, stats = out.tokens, out.stats
            times.append(time.perf_counter() - t0)
        assert int(x.max()) < args.vocab, "denoised samples must hold no mask"
        self.nfe = int(stats["nfe"])
        return {"sample_s": statistics.median(times)}


def ours_config(args):
    """The shakespeare_char config at the original's sizes and optimizer settings."""
    from sedd import config as config_lib

    c = config_lib.load_config("shakespeare_char")
    c.vocab_size = args.vocab
    c.seed = args.seed
    c.model.update(
        hidden_size=args.hidden,
        n_layers=args.blocks,
        n_heads=args.heads,
        cond_dim=args.cond_dim,
        dropout=args.dropout,
        dtype=args.dtype,
        scale_by_sigma=True,
        normalize=False,
    )
    c.graph.type, c.noise.type = "absorbing", "loglinear"
    c.data.seq_len = args.length
    c.training.batch_size = args.batch
    c.training.ema = 0.9999
    # configs/config.yaml of the original
    c.optim.update(
        optimizer="adamw",
        lr=3e-4,
        beta1=0.9,
        beta2=0.999,
        eps=1e-8,
        weight_decay=0.0,
        warmup=2500,
        schedule="constant",
        grad_clip=1.0,
    )
    c.sampling.update(sampler="analytic", steps=args.sample_steps, eps=1e-5)
    c.mesh.cpu_devices = args.cpu_devices
    return c


# --------------------------------------------------------------------------- rounds and report


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.threads < (os.cpu_count() or 1) and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, range(args.threads))  # before jax creates its thread pool
    from experiments.benchmarks.step_profile import run_profile  # noqa: PLC0415 (jax after the pinning above)
    from experiments.timing import format_table, machine  # noqa: PLC0415

    if args.profile:
        args.repeats = args.steps
        config = ours_config(args)
        print(run_profile(False, args, config=config)["table"])
        return 0
    ours = Ours(args)
    rounds = []
    for r in range(args.rounds):
        row = {}
        for side in ("original", "ours") if r % 2 == 0 else ("ours", "original"):
            if side == "original":
                row["original"] = run_original(args)
            else:
                row["ours"] = {**ours.train(), **ours.sample()}
        row["load_average_1min"] = os.getloadavg()[0]
        rounds.append(row)
        print(f"round {r + 1}/{args.rounds}: " + json.dumps(row), flush=True)

    med = statistics.median
    o_tok = [r["original"]["train_tokens_per_s"] for r in rounds]
    s_tok = [r["ours"]["train_tokens_per_s"] for r in rounds]
    o_best = [r["original"].get("best_step_ms", float("nan")) for r in rounds]
    s_best = [r["ours"]["best_step_ms"] for r in rounds]
    o_smp = [r["original"]["sample_s"] for r in rounds]
    s_smp = [r["ours"]["sample_s"] for r in rounds]
    # sedd's speed-up, per round, then the median over rounds
    train_ratio = med([s / o for s, o in zip(s_tok, o_tok)])
    best_ratio = med([o / s for s, o in zip(s_best, o_best)])
    sample_ratio = med([o / s for s, o in zip(s_smp, o_smp)])
    table = format_table(
        ["", "original", "sedd", "sedd's speed-up"],
        [
            ["train tokens/s", f"{med(o_tok):.0f}", f"{med(s_tok):.0f}", f"{train_ratio:.2f}x"],
            ["fastest train step ms", f"{med(o_best):.0f}", f"{med(s_best):.0f}", f"{best_ratio:.2f}x"],
            [
                f"sample s ({args.sample_steps} steps + denoise)",
                f"{med(o_smp):.2f}",
                f"{med(s_smp):.2f}",
                f"{sample_ratio:.2f}x",
            ],
        ],
    )
    command = "python " + shlex.join([os.path.relpath(__file__, ROOT), *(argv if argv is not None else sys.argv[1:])])
    m = machine()
    print(
        f"\nH {args.hidden}, {args.blocks} blocks, {args.heads} heads, cond {args.cond_dim}, vocabulary "
        f"{args.vocab}, L {args.length}, B {args.batch}, dropout {args.dropout}, {args.threads} threads "
        f"(sedd on {ours.devices} CPU device(s), model.dtype {args.dtype} = {ours.dtype}; the original in "
        f"{'bfloat16 autocast' if args.orig_autocast else 'float32, as shipped on a CPU'}); "
        f"medians of {args.rounds} interleaved rounds (ratios: median of per-round ratios); sedd's sampler "
        f"made {ours.nfe} network calls; load average {m['load_average_1_5_15min']}; {m['cpu_count']} CPUs, "
        f"{m['cpu_model']}, {'with' if m['cpu_has_bfloat16_dots'] else 'without'} AVX512-BF16"
    )
    print(table)
    print(f"\n{command}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "command": command,
                    "rounds": rounds,
                    "train_speedup": train_ratio,
                    "fastest_step_speedup": best_ratio,
                    "sample_speedup": sample_ratio,
                    "nfe_ours": ours.nfe,
                    "devices_ours": ours.devices,
                    "machine": m,
                    "table": table,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
