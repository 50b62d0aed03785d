"""How far memory_budget gets on the quickstart's TinyGPT: bytes kept for backward, measured.

    python benchmarks/budget_reach.py [--budgets 0.9 0.7 0.5] [--batch 16]

For each budget and each decider (the planner's MILP, the default; the DELTA-style
heuristic, ``planner=False``) it compiles the model with fxopt, runs one forward under
saved-tensor hooks (``fxopt.analysis.measure_saved_bytes``, parameters excluded) and prints
the bytes kept for backward against plain autograd's, and whether the budget was reachable
(fxopt warns with the lowest reachable peak when it is not). Measured bytes, not timings:
the figures are the same on any CPU.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from quickstart import TinyGPT, batch  # noqa: E402

from fxopt.analysis import measure_saved_bytes  # noqa: E402


def saved_bytes(model: torch.nn.Module, args: tuple, options: dict) -> tuple[int, bool]:
    """Bytes the compiled forward keeps for backward, and whether fxopt reached the budget."""
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="fxopt", options=options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled(*args)
        saved = measure_saved_bytes(lambda: compiled(*args), exclude=list(model.parameters()))
    reached = not any("cannot fit" in str(w.message) for w in caught)
    return saved.bytes, reached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.9, 0.7, 0.5, 0.3])
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = TinyGPT()
    inputs = batch(64, args.batch, 32, torch.device("cpu"), torch.Generator().manual_seed(0))
    plain, _ = saved_bytes(model, inputs, {})
    print(f"TinyGPT, batch {args.batch}, torch {torch.__version__}: plain autograd keeps "
          f"{plain:,} bytes for backward")
    print(f"{'budget':>7}  {'decider':<10}{'saved bytes':>14}{'x plain':>9}  reached")
    for budget in args.budgets:
        for decider, planner in (("milp", None), ("delta", False)):
            saved, reached = saved_bytes(model, inputs,
                                         {"memory_budget": budget, "planner": planner})
            print(f"{budget:>7}  {decider:<10}{saved:>14,}{saved / plain:>9.3f}  "
                  f"{'yes' if reached else 'no (lowest reachable plan applied)'}")


if __name__ == "__main__":
    main()
