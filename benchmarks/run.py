"""The training benchmark suite: a thin entry for ``python -m fxopt bench`` (same options).

    python benchmarks/run.py --smoke                      # CPU: tiny sizes, a few minutes
    python benchmarks/run.py --out benchmarks/results/h100  # CUDA: real sizes
"""

import argparse
import sys

from fxopt.cli.bench import add_bench_arguments, run_bench

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="benchmarks/run.py", description=__doc__)
    add_bench_arguments(parser)
    sys.exit(run_bench(parser.parse_args()))
