"""Saved bytes against CPU step time: fxopt's ``memory_budget`` against Inductor's
``activation_memory_budget`` at the same fractions and per-block ``torch.utils.checkpoint``.

    PYTHONPATH=. python benchmarks/budget_frontier.py [--models gpt2 bert mlp]
        [--budgets 0.7 0.5 0.3] [--rounds 7] [--hidden 128] [--seq 64] [--batch 8]

Per model (``budget_reach.build``: transformers' GPT-2 and BERT at 2 layers, dropout 0.1,
eager attention; the 3-block MLP) every configuration is compiled and warmed up, its bytes
kept for backward measured once (saved-tensor hooks; parameters, buffers and inputs
excluded), then timed: one thread, ``--rounds`` rounds, each round one step (forward and
backward, no optimizer) of every configuration in turn (interleaved), reporting the
median and the spread (min-max). Prints a markdown table per model (pipe it to
``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

# Each Inductor configuration compiles afresh: a cached graph would ignore the budget.
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from budget_reach import build, loss_of

import fxopt
from fxopt.analysis import measure_saved_bytes
from fxopt.bench.configs import _activation_budget  # torch's private knob


def _blocks(model: nn.Module) -> list[nn.Module]:
    if hasattr(model, "blocks"):
        return list(model.blocks)
    base = getattr(model, model.base_model_prefix)
    return list(getattr(base, "h", None) or base.encoder.layer)


def _checkpointed(model: nn.Module) -> nn.Module:
    from torch.utils.checkpoint import checkpoint

    for block in _blocks(model):
        forward = block.forward
        block.forward = lambda *a, _f=forward, **k: checkpoint(_f, *a, use_reentrant=False, **k)
    return model


def _inductor(model: nn.Module) -> Callable:
    """Inductor through a backend object of its own: Dynamo would otherwise reuse another
    configuration's compiled graph (parameters are graph inputs, the backend is equal) and
    its activation_memory_budget with it."""
    compile_fx = torch._dynamo.lookup_backend("inductor")
    return torch.compile(model, backend=lambda gm, example_inputs: compile_fx(gm, example_inputs))


def configurations(budgets: list[float]) -> dict[str, tuple[Callable, Callable]]:
    """name -> (prepare(model) -> callable, context() around every call)."""
    null = contextlib.nullcontext
    configs = {"eager": (lambda m: m, null), "checkpoint": (_checkpointed, null),
               "fxopt": (lambda m: torch.compile(m, backend=fxopt.backend()), null),
               "inductor": (_inductor, null)}
    for f in budgets:
        configs[f"fxopt {f}"] = (
            lambda m, f=f: torch.compile(m, backend=fxopt.backend(memory_budget=f)), null)
        configs[f"inductor {f}"] = (_inductor, lambda f=f: _activation_budget(f))
    return configs


def run_model(name: str, args: argparse.Namespace) -> list[str]:
    _, kwargs = build(name, args.hidden, args.seq, args.batch)
    prepared = {}
    for config, (prepare, context) in configurations(args.budgets).items():
        model, _ = build(name, args.hidden, args.seq, args.batch)
        fn = prepare(model)
        owned = [*model.parameters(), *model.buffers(), *kwargs.values()]

        def step(fn=fn, context=context):
            with context():
                loss_of(fn(**kwargs)).backward()
        for _ in range(2):
            step()
        with context():
            saved = measure_saved_bytes(lambda fn=fn: loss_of(fn(**kwargs)), exclude=owned)
        prepared[config] = (step, saved.bytes, [])
    for _ in range(args.rounds):
        for step, _, times in prepared.values():
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    eager_bytes = prepared["eager"][1]
    eager_time = statistics.median(prepared["eager"][2])
    lines = [f"\n### {name} (hidden {args.hidden}, seq {args.seq}, batch {args.batch})\n",
             ("| configuration | saved bytes | x eager | step ms (median) | spread ms | "
             "x eager time |"), "| --- | --- | --- | --- | --- | --- |"]
    for config, (_, nbytes, times) in prepared.items():
        median = statistics.median(times)
        lines.append(f"| {config} | {nbytes:,} | {nbytes / eager_bytes:.3f} | "
                     f"{1e3 * median:.2f} | {1e3 * min(times):.2f}-{1e3 * max(times):.2f} | "
                     f"{median / eager_time:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "bert", "mlp"])
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.7, 0.5, 0.3])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    # every configuration compiles the same forward code for its own model: let Dynamo
    # keep them all (a reset would drop the earlier ones, which would then recompile
    # inside the timed rounds)
    torch._dynamo.config.recompile_limit = 64
    print(f"# budget_frontier: torch {torch.__version__}, CPU, 1 thread, {args.rounds} "
          "interleaved rounds; saved bytes measured with saved-tensor hooks")
    for name in args.models:
        print("\n".join(run_model(name, args)), flush=True)


if __name__ == "__main__":
    main()
