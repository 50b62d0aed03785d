"""Are gradients right when a fraction budget recomputes dropout under Inductor?

Inductor draws dropout masks from one seeds tensor per graph (``inductor_seeds``, with its
own RNG, ``fallback_random`` off). This compares, on transformers' GPT-2 (2 layers, 64 wide,
seq 32, batch 4, dropout 0.1; the same seed before every step, so the forward's masks are
the same in every configuration), the gradients of Inductor with
``activation_memory_budget=f`` and of fxopt with ``codegen="inductor", memory_budget=f``
against Inductor with no budget, where nothing random is recomputed. A budget that only
changes what is saved must leave the gradients equal up to fp32 rounding.

    PYTHONPATH=. python benchmarks/budget_inductor_rng.py [--budgets 0.5 0.3]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import budget_reach as reach

import fxopt
from fxopt._compat import activation_memory_budget


def gradients(compile_model, context) -> list[torch.Tensor]:
    """The gradients of the second seeded step (the first compiles)."""
    model, kwargs = reach.build("gpt2", 64, 32, 4)
    compiled = compile_model(model)
    with context:
        for _ in range(2):
            model.zero_grad()
            torch.manual_seed(1)
            reach.loss_of(compiled(**kwargs)).backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.5, 0.3])
    args = parser.parse_args()
    compile_fx = torch._dynamo.lookup_backend("inductor")

    def inductor(model):  # a backend object of its own: no graph reused across budgets
        return torch.compile(model, backend=lambda gm, inputs: compile_fx(gm, inputs))

    reference = gradients(inductor, contextlib.nullcontext())

    def largest_relative_difference(grads: list[torch.Tensor]) -> float:
        return max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(grads, reference))

    print(f"torch {torch.__version__}; largest relative gradient difference against Inductor "
          "with no budget (same seed, same forward masks)")
    for f in args.budgets:
        alone = gradients(inductor, activation_memory_budget(f))
        fxopt_grads = gradients(lambda m, f=f: torch.compile(
            m, backend=fxopt.backend(codegen="inductor", memory_budget=f)),
            contextlib.nullcontext())
        ours, theirs = (largest_relative_difference(g) for g in (fxopt_grads, alone))
        print(f"budget {f}: Inductor activation_memory_budget {theirs:.2e} | fxopt "
              f"codegen=inductor memory_budget {ours:.2e}", flush=True)


if __name__ == "__main__":
    main()
