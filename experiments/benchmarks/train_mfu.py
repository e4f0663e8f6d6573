"""`sedd bench train`: see sedd/bench.py for what is measured and how.

  python experiments/benchmarks/train_mfu.py [--quick] [--json PATH] [options]
"""

import sys

from sedd import bench

if __name__ == "__main__":
    sys.exit(bench.main(["train", *sys.argv[1:]]))
