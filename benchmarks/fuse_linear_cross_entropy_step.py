"""Step time of benchmarks/fuse_linear_cross_entropy.py's whole model (forward + backward of
``model(ids, labels=ids).loss`` under ``fxopt.ignore_transformers_logging()``, fp32): eager,
plain Inductor and fxopt with and without the fused loss, in one process, interleaved.

Each configuration compiles its own copy of the model through a forward of its own (a
distinct code object): Dynamo caches compiled graphs per code object, and copies of one
model class compiled with different backends in one process could otherwise be served
each other's graphs. After one untimed step each, ``--steps`` rounds run every
configuration once, the order rotated each round; each row gives the median and min-max
(ms) and the ratios of the medians to eager's and to plain Inductor's.

    PYTHONPATH=. python benchmarks/fuse_linear_cross_entropy_step.py --model llama \\
        [--threads 1] [--steps 7] [--flush-denormal] [--configs eager inductor ...]

``--threads``: torch's intra-op threads (default 1: on a shared, loaded machine two OpenMP
threads wait on each other at every parallel op, and the fused loss runs several hundred
of them per step). ``--flush-denormal``: ``torch.set_flush_denormal(True)`` first.
``--logit-scale S``: the LM head's weight times S, a confident model whose softmax is
mostly entries below fp32's normal range (at initialisation none are).
``fxopt-inductor-pass-unclamped``: the pass with the op's exponents not clamped
(``EXP_FLOOR`` set to -inf around its steps), as before the clamp.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
import types

import torch
from torch import nn

from fxopt.graph_breaks import ignore_transformers_logging
from fxopt.kernels import fuse_linear_cross_entropy as kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fuse_linear_cross_entropy import _backend, build  # noqa: E402

CONFIGS = {
    "eager": None,
    "inductor": lambda: "inductor",
    "fxopt-inductor-plain": lambda: _backend("inductor", False),
    "fxopt-inductor-pass": lambda: _backend("inductor", True),
    "fxopt-fx-pass": lambda: _backend("fx", True),
    "fxopt-inductor-pass-unclamped": lambda: _backend("inductor", True),
}


@contextlib.contextmanager
def exp_floor(config: str):
    """The op's exponent floor as ``config`` runs it (module doc)."""
    saved = kernel.EXP_FLOOR
    kernel.EXP_FLOOR = float("-inf") if config.endswith("-unclamped") else saved
    try:
        yield
    finally:
        kernel.EXP_FLOOR = saved


def _loss(self, ids):
    return self.model(ids, labels=ids).loss


def loss_module(config: str, model: nn.Module) -> nn.Module:
    """``model``'s loss as a module whose forward is a code object of its own."""
    code = _loss.__code__.replace(co_name=f"loss_{config.replace('-', '_')}")
    cls = type(f"Loss_{config}", (nn.Module,),
               {"forward": types.FunctionType(code, _loss.__globals__)})
    module = cls()
    module.model = model
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama", choices=["gpt2", "llama"])
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS),
                        default=["eager", "inductor", "fxopt-inductor-plain",
                                 "fxopt-inductor-pass"])
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--flush-denormal", action="store_true")
    parser.add_argument("--logit-scale", type=float, default=1.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.flush_denormal:
        torch.set_flush_denormal(True)
    ids = torch.randint(0, 32000, (4, 128), generator=torch.Generator().manual_seed(1))
    runs = {}
    with ignore_transformers_logging():
        for config in args.configs:
            model = build(args.model)
            with torch.no_grad():
                model.get_output_embeddings().weight.mul_(args.logit_scale)
            module = loss_module(config, model)
            backend = CONFIGS[config]
            runs[config] = (module, module if backend is None
                            else torch.compile(module, backend=backend()))
            with exp_floor(config):
                runs[config][1](ids).backward()  # compiles
            module.zero_grad(set_to_none=True)
        times: dict[str, list[float]] = {config: [] for config in args.configs}
        for step in range(args.steps):
            shift = step % len(args.configs)
            for config in args.configs[shift:] + args.configs[:shift]:
                module, fn = runs[config]
                with exp_floor(config):
                    start = time.perf_counter()
                    fn(ids).backward()
                    times[config].append(1e3 * (time.perf_counter() - start))
                module.zero_grad(set_to_none=True)
    median = {config: statistics.median(values) for config, values in times.items()}
    print(f"# {args.model}, {args.threads} thread(s), flush denormal {args.flush_denormal}, "
          f"logit scale {args.logit_scale:g}, {args.steps} interleaved steps, "
          f"torch {torch.__version__}")
    print("| model | configuration | ms median (min-max) | / eager | / inductor |")
    print("| --- | --- | --- | --- | --- |")
    for config, values in times.items():
        ratios = [f"{median[config] / median[base]:.2f}" if base in median else "-"
                  for base in ("eager", "inductor")]
        print(f"| {args.model} | {config} | {median[config]:.0f} ({min(values):.0f}-"
              f"{max(values):.0f}) | {ratios[0]} | {ratios[1]} |")


if __name__ == "__main__":
    main()
