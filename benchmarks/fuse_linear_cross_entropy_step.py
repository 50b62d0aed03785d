"""Step time of benchmarks/fuse_linear_cross_entropy.py's whole model (forward + backward of
``model(ids, labels=ids).loss`` under ``fxopt.ignore_transformers_logging()``, fp32): eager,
plain Inductor and fxopt with and without the fused loss, in one process, interleaved.

Each configuration compiles its own copy of the model through a forward of its own (a
distinct code object): Dynamo caches compiled graphs per code object, and copies of one
model class compiled with different backends in one process could otherwise be served
each other's graphs. Timed by :func:`fxopt.bench.timing.interleaved`: after a first
(compiling) and a warm-up step each, ``--steps`` rounds run every configuration once, the
order rotated each round; each row gives the median and min-max (ms) and the ratios of
the medians to eager's and to plain Inductor's.

    PYTHONPATH=. python benchmarks/fuse_linear_cross_entropy_step.py --model llama \\
        [--threads 1] [--steps 7] [--batch 4] [--seq 128] [--logit-scale 1]
        [--configs eager inductor ...]

``--threads``: torch's intra-op threads (default 1: on a shared, loaded machine two OpenMP
threads wait on each other at every parallel op, and the fused loss runs several hundred
of them per step).
``--logit-scale S``: the LM head's weight times S, a confident model whose softmax is
mostly entries below fp32's normal range (at initialisation none are).
A configuration with the suffix ``-unclamped`` (``fxopt-inductor-pass-unclamped``) runs
the op with its exponents not clamped (``EXP_FLOOR`` set to -inf around its steps), as
before the clamp; with ``-ftz`` (``eager-ftz``), with denormals flushed to zero around its
steps, so that both runs of a configuration are timed in one process.
``--exp-only``: instead, the time of ATen's ``exp_`` on one vocabulary block (512 x 500
fp32) filled with one exponent, per exponent (the slow path below fp32's normal range).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import time
import types

import torch
from torch import nn

import fxopt
from fxopt.bench.timing import interleaved
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
}
VARIANTS = ("-unclamped", "-ftz")  # suffixes a configuration may take (module doc)


def _base(config: str) -> str:
    return next((config[:-len(v)] for v in VARIANTS if config.endswith(v)), config)


def _config(name: str) -> str:
    if _base(name) not in CONFIGS:
        raise argparse.ArgumentTypeError(f"{name!r} is none of {list(CONFIGS)}, with or "
                                         f"without a suffix {VARIANTS}")
    return name


@contextlib.contextmanager
def variant(config: str):
    """``config``'s variant around its step (module doc): the op's exponents unclamped, or
    denormals flushed to zero (``torch.set_flush_denormal``, this thread's FTZ/DAZ)."""
    saved = kernel.EXP_FLOOR
    kernel.EXP_FLOOR = float("-inf") if config.endswith("-unclamped") else saved
    torch.set_flush_denormal(config.endswith("-ftz"))
    try:
        yield
    finally:
        kernel.EXP_FLOOR = saved
        torch.set_flush_denormal(False)


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


def exp_times(threads: int) -> None:
    """Best of 5 ``exp_`` calls on a 512 x 500 block of one exponent, per exponent."""
    print(f"# exp_ on 512 x 500 fp32, {threads} thread(s), best of 5, torch {torch.__version__}")
    print("| exponent | ms | result |")
    print("| --- | --- | --- |")
    for exponent in (-10.0, -86.0, kernel.EXP_FLOOR, -88.0, -100.0, -200.0, float("-inf")):
        block, best = torch.full((512, 500), exponent), float("inf")
        for _ in range(5):
            copy = block.clone()
            start = time.perf_counter()
            copy.exp_()
            best = min(best, time.perf_counter() - start)
        print(f"| {exponent:g} | {1e3 * best:.2f} | {float(copy[0, 0]):.3g} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama", choices=["gpt2", "llama"])
    parser.add_argument("--configs", nargs="+", type=_config,
                        default=["eager", "inductor", "fxopt-inductor-plain",
                                 "fxopt-inductor-pass"])
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--logit-scale", type=float, default=1.0)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--exp-only", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.exp_only:
        return exp_times(args.threads)
    ids = torch.randint(0, 32000, (args.batch, args.seq),
                        generator=torch.Generator().manual_seed(1))
    steps, backends = {}, {}
    with ignore_transformers_logging():
        for config in args.configs:
            model = build(args.model, args.seq)
            with torch.no_grad():
                model.get_output_embeddings().weight.mul_(args.logit_scale)
            module = loss_module(config, model)
            make = CONFIGS[_base(config)]
            backends[config] = None if make is None else make()
            fn = module if make is None else torch.compile(module, backend=backends[config])
            steps[config] = functools.partial(_step, config, module, fn, ids)
        # the first call of each compiles (untimed), then one warm-up step each
        times = interleaved(steps, "cpu", warmup=1, rounds=args.steps)
    median = {config: timing.median_ms for config, timing in times.items()}
    print(f"# {args.model}, batch {args.batch} x seq {args.seq}, {args.threads} thread(s), "
          f"logit scale {args.logit_scale:g}, {args.steps} interleaved steps, "
          f"torch {torch.__version__}")
    print("| model | configuration | ms median (min-max) | / eager | / inductor | "
          "fused loss fired |")
    print("| --- | --- | --- | --- | --- | --- |")
    for config, timing in times.items():
        ratios = [f"{median[config] / median[base]:.2f}" if base in median else "-"
                  for base in ("eager", "inductor")]
        print(f"| {args.model} | {config} | {timing.text(0)} | {ratios[0]} | {ratios[1]} | "
              f"{_fired(backends[config])} |")


def _fired(backend) -> str:
    """Whether fuse_linear_cross_entropy changed a graph of ``backend`` ("-": not fxopt's;
    a loss behind a graph break is declined, not failed, so strict does not say it)."""
    if not isinstance(backend, fxopt.Backend):
        return "-"
    return "yes" if any(r.fired for g in backend.graphs for r in g.passes
                        if r.name == "fuse_linear_cross_entropy") else "no"


def _step(config: str, module: nn.Module, fn, ids: torch.Tensor) -> None:
    with variant(config):
        fn(ids).backward()
    module.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
