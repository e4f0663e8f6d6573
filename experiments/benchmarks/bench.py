r"""Benchmarks: training MFU, sampler overhead, diffusion vs AR latency, memory.

Each benchmark is a module of this folder whose ``run_NAME(quick, args)``
returns a dict, printed as a table and written as JSON (default:
experiments/benchmarks/results/NAME_PLATFORM.json); this script parses the
command line and dispatches:

  python experiments/benchmarks/bench.py train    [--quick] [--json PATH] [--config NAME --batch_sizes B] ...
                                                   tokens/s, FLOPs/token, MFU, peak memory (a GPU's)
  python experiments/benchmarks/bench.py sampler  [--quick] ...   sampler step / forward pass
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
  python experiments/benchmarks/bench.py frontier --workdirs RUN ... --judge AR_RUN [--markdown MD] [--picture PNG]
                                                   every decoder of the runs (AR, head, spec, block, SEDD at each
                                                   sampler and step count, students): tokens/s vs AR, calls,
                                                   the judge's NLL and entropy of the same texts; a table, a chart
  python experiments/benchmarks/bench.py gpu_summary --json DIR   the table of experiments/benchmarks/gpu.sh's JSON files
  python experiments/benchmarks/bench.py all      [--quick] ...

Timing rules, because the machines these run on are shared and noisy: those of
``experiments.timing`` (candidates interleaved round by round, ratios the
median of per-round ratios, no compiling call timed, ``machine()`` in every
result).

FLOPs: model FLOPs per token of ``nets.network_flops_per_token`` (6 N + 12 n L H
for training, N the matmul weights a token meets).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np

if not __package__:  # run as a file: import experiments/ by its location (experiments/__init__.py says why)
    import importlib.util

    _spec = importlib.util.spec_from_file_location("experiments", Path(__file__).resolve().parents[1] / "__init__.py")
    if "experiments" not in sys.modules:
        sys.modules["experiments"] = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(sys.modules["experiments"])

from experiments.benchmarks import (
    block,
    bound,
    decode,
    diffusion_vs_ar,
    frontier,
    memory,
    optimizer,
    rng,  # noqa: E402
    sampler,
    speculative,
    step_profile,
    train,
)
from experiments.benchmarks.gpu_summary import gpu_summary  # noqa: E402
from experiments.timing import machine  # noqa: E402
from sedd import kernels  # noqa: E402

# Names other tests read from this script (tests/test_gpu_script.py, tests/test_memory.py).
from experiments.benchmarks.decode import ar_decode, stored_in_compute_dtype  # noqa: E402, F401
from experiments.benchmarks.decode import hlo_loop_ops as _hlo_loop_ops  # noqa: E402, F401
from experiments.benchmarks.decode import union_ns as _union_ns  # noqa: E402, F401
from experiments.benchmarks.memory import memory_config, memory_plan, parse_mesh, train_step_memory  # noqa: E402, F401
from experiments.benchmarks.train import datasheet_bf16, matmul_loop_fn  # noqa: E402, F401

RESULTS_DIR = Path(__file__).resolve().parent / "results"

RUNNERS = {
    "train": train.run_train,
    "sampler": sampler.run_sampler,
    "ar": diffusion_vs_ar.run_ar,
    "block": block.run_block,
    "bound": bound.run_bound,
    "memory": memory.run_memory,
    "rng": rng.run_rng,
    "optimizer": optimizer.run_optimizer,
    "profile": step_profile.run_profile,
    "decode": decode.run_decode,
    "speculative": speculative.run_speculative,
    "frontier": frontier.run_frontier,
}


def speculative_options(p: argparse.ArgumentParser) -> None:
    """The options of `bench.py speculative`."""
    p.add_argument(
        "--target", default="", help="speculative: the AR run sampled (default with --quick: tiny random runs)"
    )
    p.add_argument(
        "--drafts",
        default="",
        help="speculative: comma-separated drafters, 'ngram' or run directories "
        "(a smaller AR run, a block run; default ngram; none: the --spec run alone)",
    )
    p.add_argument(
        "--draft_ks",
        type=int,
        nargs="+",
        default=None,
        help="speculative: the drafts a round of each --drafts drafter (default 2 4 8 16)",
    )
    p.add_argument(
        "--spec",
        default="",
        help="speculative: comma-separated runs that draft for themselves (spec runs, AR runs with a draft head), "
        "each sampled with its own drafts",
    )
    p.add_argument(
        "--layouts",
        nargs="+",
        default=None,
        help="speculative: the --spec runs' round layouts, each 'K,GROUPS' (a spec run), 'K' (a head run) or "
        "'auto' (the fastest here, timed at each batch; default: the run's own)",
    )
    p.add_argument("--quality_samples", type=int, default=64, help="speculative: texts each cell's quality is of")
    p.add_argument("--cost_only", action="store_true", help="speculative: the call-cost curve only")
    p.add_argument(
        "--profile_size",
        default="",
        choices=["", "shakespeare_char", "gpt2_small"],
        help="speculative: where a step's time goes at this size too (random weights, L 128), per "
        "--layouts; with --spec, each run's tokens a call at that step's price",
    )
    p.add_argument(
        "--dtypes",
        default="",
        help="speculative: comma-separated compute dtypes (float32,bfloat16): "
        "AR's text and the first --spec run's in each, interleaved (which is AR at its best here)",
    )
    p.add_argument(
        "--positions",
        type=int,
        nargs="+",
        default=None,
        help="speculative: the n of the call-cost curve (default 1 .. 32)",
    )
    p.add_argument(
        "--widths",
        type=int,
        nargs="+",
        default=None,
        help="speculative: the call-cost curve of the plays' network at these widths (--blocks layers, "
        "default 4; max(8, W / 64) heads) in place of the default's and GPT-2 small's",
    )
    p.add_argument(
        "--verifications",
        default="joint",
        help="speculative: comma-separated, each cell verified by "
        "each: 'joint' (Sun et al.'s block verification) and/or 'token' (Leviathan et al.); the same law",
    )
    p.add_argument(
        "--temperatures",
        type=float,
        nargs="+",
        default=[1.0],
        help="speculative: each cell at each temperature, against AR at it (0: greedy, one text)",
    )
    p.add_argument("--picture", default="", help="speculative, frontier: a PNG of speed against quality")


def parser() -> argparse.ArgumentParser:
    """The argument parser of this script."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("which", choices=sorted(RUNNERS) + ["all", "gpu_summary"])
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of a few seconds")
    p.add_argument(
        "--json",
        default="",
        help="output file, a folder with `all` (default: experiments/benchmarks/results/NAME_PLATFORM.json)",
    )
    p.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds")
    p.add_argument("--width", type=int, default=None, help="H (train default 512, ar default 128)")
    p.add_argument("--blocks", type=int, default=None, help="n_layers (train default 2, ar default 2)")
    p.add_argument("--seq_len", type=int, default=None, help="L (default 128)")
    p.add_argument("--batch_sizes", type=int, nargs="+", default=None, help="train default: 32; ar default: 1 64")
    p.add_argument("--dtype", default="", help="model.dtype override (float32, bfloat16) for train, sampler, ar")
    p.add_argument("--matmul_n", type=int, default=2048, help="train: size of the peak-rate matmul")
    p.add_argument("--batch", type=int, default=16, help="sampler: batch of the char model")
    p.add_argument("--batch_gpt2", type=int, default=4, help="sampler: batch of the V=50257 model")
    p.add_argument(
        "--steps",
        type=int,
        nargs="+",
        default=None,
        help="ar: step counts (default 16 .. 1024); block: SEDD's (default 64 128)",
    )
    p.add_argument(
        "--max_direct_steps",
        type=int,
        default=128,
        help="ar: step counts above this are predicted from a linear fit, not timed",
    )
    p.add_argument("--configs", nargs="*", default=None, help="memory: config names (default: all shipped)")
    p.add_argument(
        "--config", dest="configs", action="append", help="memory, train: a shipped config's own step (repeatable)"
    )
    p.add_argument("--mesh", default="", help="memory: mesh sizes, e.g. data=8,fsdp=1 (on as many fake CPU devices)")
    p.add_argument(
        "--device_gib",
        type=float,
        default=None,
        help="memory: a device's memory; find the cheapest accum_steps / remat that fits",
    )
    p.add_argument("--length", type=int, default=1024, help="block: tokens to write")
    p.add_argument(
        "--workdirs",
        nargs="*",
        default=None,
        help="block: trained run directories (an AR, a SEDD and block runs) instead of random weights",
    )
    p.add_argument(
        "--attention",
        nargs="+",
        default=None,
        choices=kernels.ATTENTION_IMPLEMENTATIONS,
        help="train: attention paths to time, one result each (sedd.kernels.ATTENTION; cudnn: a GPU's)",
    )
    p.add_argument(
        "--peak_iters",
        type=int,
        default=0,
        help="train: the peak from this many chained matmul_n^3 products a jitted call (0: one a call)",
    )
    p.add_argument("--no_profile", action="store_true", help="train: time the step and the peak only")
    p.add_argument("--vocab", type=int, default=None, help="decode: V (default 50257 at width >= 768)")
    p.add_argument("--unroll", type=int, nargs="*", default=None, help="decode: unroll factors of the AR loop")
    p.add_argument(
        "--block_sizes",
        type=int,
        nargs="*",
        default=None,
        help="decode: block models' b (default 4 16); bound: (default 16)",
    )
    p.add_argument("--no_block", action="store_true", help="decode: AR only")
    p.add_argument("--trace", action="store_true", help="decode: a jax.profiler trace of the AR and block calls")
    frontier.add_arguments(p)
    p.add_argument("--dump", default="", help="decode: a folder for the AR loop's HLO and the traces (.xplane.pb.gz)")
    speculative_options(p)
    return p


_DEFAULTS = {
    "train": {"width": 512, "blocks": 2, "seq_len": 128, "batch_sizes": [32]},
    "ar": {"width": 128, "blocks": 2, "seq_len": 128, "batch_sizes": [1, 64], "steps": [16, 32, 64, 128, 256, 1024]},
    "block": {"width": 128, "blocks": 4, "seq_len": 128, "batch_sizes": [1, 16], "steps": [64, 128]},
    "decode": {"width": 128, "blocks": 2, "seq_len": 128, "unroll": [2, 4], "block_sizes": [4, 16]},
    "bound": {"seq_len": 128, "batch_sizes": [32], "block_sizes": [16]},
    "speculative": {"batch_sizes": [1, 16]},
    "frontier": {"batch_sizes": [1, 4]},
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
    print(
        f"== {result['benchmark']} on {m['platform']} ({m['device_kind']}; {m['device_count']} device(s); "
        f"{m['cpu_count']} CPUs, {m['cpu_model']}, {bf16} AVX512-BF16; load {m['load_average_1_5_15min']}; jax {m['jax']}; "
        f"XLA_FLAGS={m['xla_flags']!r}); {result['wall_s']:.0f} s"
    )
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
        path.with_suffix(".md").write_text(
            f"# bench.py speculative ({m['platform']}, {m['cpu_model']}, "
            f"jax {m['jax']})\n\n```\n{result['table']}\n```\n"
        )
    if which == "frontier":  # the table as Markdown naming the machine, and the chart
        title = args.title or f"Every decoder against AR: {', '.join(result['runs'])}"
        md = Path(args.markdown) if args.markdown else path.with_suffix(".md")
        md.write_text(frontier.frontier_markdown(result, title))
        frontier.frontier_picture(result, Path(args.picture) if args.picture else path.with_suffix(".png"), title)
        print(f"wrote {md}")
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
            sizes = memory.parse_mesh(args.mesh)
        except ValueError as e:
            parser().error(str(e))
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", int(np.prod(list(sizes.values()))))
    if args.device_gib is not None and not args.device_gib > 0:
        parser().error(f"--device_gib must be a positive size in GiB, got {args.device_gib}")
    if args.which == "gpu_summary":
        print(gpu_summary(args.json or str(RESULTS_DIR)))
        return 0
    for which in sorted(RUNNERS) if args.which == "all" else [args.which]:
        run(which, args)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["speculative"]:  # as `sedd train` does, before JAX's CPU backend starts (not as `sample`)
        step_profile.KEPT_MEMORY = kernels.keep_freed_memory()
    sys.exit(main())
