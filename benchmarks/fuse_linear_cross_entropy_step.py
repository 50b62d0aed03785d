"""Step time of one configuration of benchmarks/fuse_linear_cross_entropy.py's whole model,
in a process of its own, against eager in the same process.

One compiled copy per process: several compiled copies of one model class in one process
can be served each other's Dynamo cache entries, which invalidated the main script's timing
rows. Per configuration: compile, then ``--steps`` steps of the compiled model and of an
eager copy, interleaved; prints one markdown row (median and min-max of each, the ratio).

    for c in inductor fxopt-inductor-plain fxopt-inductor-pass fxopt-fx-pass; do
        PYTHONPATH=. python benchmarks/fuse_linear_cross_entropy_step.py --config $c
    done
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from fxopt.graph_breaks import ignore_transformers_logging

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fuse_linear_cross_entropy import LossOnly, _backend, build  # noqa: E402

CONFIGS = {
    "inductor": lambda: "inductor",
    "fxopt-inductor-plain": lambda: _backend("inductor", False),
    "fxopt-inductor-pass": lambda: _backend("inductor", True),
    "fxopt-fx-pass": lambda: _backend("fx", True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=list(CONFIGS), required=True)
    parser.add_argument("--model", default="gpt2", choices=["gpt2", "llama"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ids = torch.randint(0, 32000, (4, 128), generator=torch.Generator().manual_seed(1))
    with ignore_transformers_logging():
        compiled_model, eager = LossOnly(build(args.model)), LossOnly(build(args.model))
        compiled = torch.compile(compiled_model, backend=CONFIGS[args.config]())
        compiled(ids).backward()
        times = {"compiled": [], "eager": []}
        for _ in range(args.steps):
            for name, fn, module in (("compiled", compiled, compiled_model),
                                     ("eager", eager, eager)):
                start = time.perf_counter()
                fn(ids).backward()
                times[name].append(1e3 * (time.perf_counter() - start))
                module.zero_grad(set_to_none=True)
    c, e = (statistics.median(times[k]) for k in ("compiled", "eager"))
    print(f"| {args.model} | {args.config} | {c:.0f} ({min(times['compiled']):.0f}-"
          f"{max(times['compiled']):.0f}) | {e:.0f} ({min(times['eager']):.0f}-"
          f"{max(times['eager']):.0f}) | {c / e:.2f} |")


if __name__ == "__main__":
    main()
