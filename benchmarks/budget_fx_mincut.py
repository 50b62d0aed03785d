"""Would min-cut's recompute choices help fx code generation? An experiment for issue 15.

Under ``codegen="inductor"`` a fraction ``memory_budget`` is met by Inductor's budgeted
min-cut (it recomputes cheap pointwise chains, which Inductor then fuses). This measures
the same search under fx code generation, where the recomputed ops run one aten call each:
configuration ``fxopt-mincut f`` partitions with torch's min-cut partitioner under the
same search (``swap_recompute.inductor_budget.BudgetedMinCut``) instead of AOTAutograd's
default partitioner with fxopt's recompute tags (``fxopt f``), beside Inductor's
``activation_memory_budget`` (``inductor f``) and eager; one thread, interleaved rounds,
median and spread, as ``budget_frontier.py`` (whose tables it prints).

    PYTHONPATH=. python benchmarks/budget_fx_mincut.py [--models gpt2 bert]
        [--budgets 0.5 0.3] [--rounds 7] [--layers 4] [--hidden 256] [--seq 128] [--batch 4]

It patches the pass and the partitioner inside the ``fxopt-mincut`` calls only; fxopt has
no option for it (see benchmarks/results/budget_fx_mincut_cpu.md for why).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import budget_frontier as frontier

import fxopt
from fxopt import _compat

swap_recompute = sys.modules["fxopt.passes.swap_recompute"]
frontier_configurations = frontier.configurations


@contextlib.contextmanager
def min_cut_under_fx() -> Iterator[None]:
    """fx code generation, partitioned by the budgeted min-cut search."""
    default_partition = _compat.default_partition

    def partition(joint, joint_inputs, **kwargs):
        search = joint.meta.get(_compat.PARTITION_SEARCH)
        if search is None:
            return default_partition(joint, joint_inputs, **kwargs)

        def min_cut(copy, budget):
            with (_compat.activation_memory_budget(budget) if budget is not None
                  else contextlib.nullcontext()):
                return _compat.min_cut_partition(copy, joint_inputs, **kwargs)
        return search(joint, min_cut)

    saved = swap_recompute.partitions_by_min_cut, _compat.default_partition
    swap_recompute.partitions_by_min_cut = lambda ctx: True
    _compat.default_partition = partition
    try:
        yield
    finally:
        swap_recompute.partitions_by_min_cut, _compat.default_partition = saved


def configurations(budgets: list[float]) -> dict:
    every = frontier_configurations(budgets)
    configs = {name: every[name] for name in ("eager", "fxopt", "inductor")}
    for f in budgets:
        configs[f"fxopt {f}"] = every[f"fxopt {f}"]
        configs[f"fxopt-mincut {f}"] = (
            lambda m, f=f: torch.compile(m, backend=fxopt.backend(codegen="fx",
                                                                  memory_budget=f)),
            min_cut_under_fx)
        configs[f"inductor {f}"] = every[f"inductor {f}"]
    return configs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "bert"])
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.5, 0.3])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch._dynamo.config.recompile_limit = 64
    frontier.configurations = configurations
    print(f"# budget_fx_mincut: torch {torch.__version__}, CPU, 1 thread, {args.rounds} "
          "interleaved rounds; saved bytes measured with saved-tensor hooks")
    for name in args.models:
        lines, _ = frontier.run_model(name, args)
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
