"""Compare samplers of a trained run: quality, entropy, cost per predictor x steps.

  python experiments/compare_samplers.py --workdir checkpoints/markov \
      --predictors euler,analytic --steps 8,16,32,64,128,256,1024 --num-samples 16

For each predictor and step count: the judge's generative perplexity (an AR
baseline run: --judge, default WORKDIR/ar), the unigram entropy of the samples,
the exact NLL of the samples when the data is synthetic (data.name = "markov"),
network evaluations and wall time. Writes compare_samplers.csv, .md and .png
into the run directory (or --out). The work is done by
sedd.evaluate.compare_samplers; this file only parses arguments.
"""

from __future__ import annotations

import argparse
import sys

from sedd import evaluate


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", required=True, help="a trained diffusion run directory")
    p.add_argument("--predictors", default="euler,analytic", help="comma-separated predictor names")
    p.add_argument("--steps", default=",".join(map(str, evaluate.DEFAULT_STEPS)),
                   help="comma-separated positive step counts")
    p.add_argument("--num-samples", type=int, default=16, help="samples per row")
    p.add_argument("--judge", default=None, help="an AR run directory (default: WORKDIR/ar if it exists)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--categorical", default=None, help="precise | gumbel32 (default: the run's config)")
    p.add_argument("--no-warmup", action="store_true", help="time the first (compiling) call")
    p.add_argument("--out", default=None, help="output folder (default: the run directory)")
    args = p.parse_args(argv)
    try:
        steps = [int(s) for s in args.steps.split(",") if s.strip()]
    except ValueError:
        p.error(f"--steps must be comma-separated integers, got {args.steps!r}")
    try:
        rows = evaluate.compare_samplers(
            args.workdir, predictors=[s.strip() for s in args.predictors.split(",") if s.strip()],
            steps=steps, num_samples=args.num_samples, judge=args.judge, seed=args.seed,
            categorical=args.categorical, warmup=not args.no_warmup, out_dir=args.out)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = args.out or args.workdir
    print(open(f"{out}/compare_samplers.md").read())
    print(f"wrote {out}/compare_samplers.csv, .md, .png ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
