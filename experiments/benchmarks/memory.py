"""`sedd bench memory`: see sedd/bench.py for what is measured and how.

  python experiments/benchmarks/memory.py [--quick] [--json PATH] [options]
"""

import sys

from sedd import bench

if __name__ == "__main__":
    sys.exit(bench.main(["memory", *sys.argv[1:]]))
