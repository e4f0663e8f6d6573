"""`sedd bench sampler`: see sedd/bench.py for what is measured and how.

  python experiments/benchmarks/sampler_overhead.py [--quick] [--json PATH] [options]
"""

import sys

from sedd import bench

if __name__ == "__main__":
    sys.exit(bench.main(["sampler", *sys.argv[1:]]))
