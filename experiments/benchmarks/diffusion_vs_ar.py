"""`sedd bench ar`: see sedd/bench.py for what is measured and how.

  python experiments/benchmarks/diffusion_vs_ar.py [--quick] [--json PATH] [options]
"""

import sys

from sedd import bench

if __name__ == "__main__":
    sys.exit(bench.main(["ar", *sys.argv[1:]]))
