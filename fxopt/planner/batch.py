"""The largest batch that fits a byte budget with a plan's own savings (``fxopt plan
--max-batch``).

:meth:`fxopt.planner.symbolic.SymbolicStep.largest_fitting` answers with everything kept.
A plan frees each saved tensor it recomputes or swaps over its window of the timeline
(:mod:`fxopt.planner.activations`), so with the plan the live bytes at step ``t`` are
``live(t, sizes) - sum(bytes_a(sizes) for the tensors a whose window holds t)``, where
``live`` is the symbolic model (the same timeline as the planner's, step for step) and
``bytes_a`` is the saved tensor's storage size as an expression of the size symbols, read
from its node in the (dynamic) joint graph. Many candidate sizes are evaluated at once
(numpy), as ``largest_fitting`` does.

A plan's actions are structural (which tensor, which window), so the plan made at the
captured size applies at every size; :func:`largest_batch` takes the one given, and
``fxopt plan --max-batch`` gives the lowest-peak plan (the most savings: the largest batch
any plan of these actions reaches; compile at that batch with the byte budget and the
MILP picks the fastest plan that fits). Predicted time at a size: the symbolic step time
plus the plan's added seconds scaled with the symbol (recompute and copies grow with the
batch).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import sympy
from torch import fx

from fxopt.planner.activations import ActivationProblem
from fxopt.planner.symbolic import SymbolicStep, storage_bytes

__all__ = ["largest_batch", "plan_peaks"]


def plan_peaks(step: SymbolicStep, joint_gm: fx.GraphModule, problem: ActivationProblem,
               actions: Mapping[str, str], **values: Any) -> np.ndarray:
    """Predicted peak bytes under ``actions`` for sizes ``values`` (scalars or arrays of
    candidates); ``problem`` is the activation problem of ``joint_gm`` (same timeline)."""
    if len(step.labels) != len(problem.live_bytes):
        raise ValueError(f"fxopt: the symbolic model has {len(step.labels)} timeline steps "
                         f"and the plan's problem {len(problem.live_bytes)}: not the same "
                         "joint graph")
    live = step.live @ step._basis_values(values)  # steps x candidates
    nodes = {n.name: n for n in joint_gm.graph.nodes}
    freed = [(act, act.choice(actions[act.name])) for act in problem.activations
             if actions.get(act.name, "keep") != "keep"]
    if freed:
        exprs = [storage_bytes(nodes[act.name].meta["val"]) for act, _ in freed]
        sizes = _evaluate(step, exprs, values, live.shape[1])
        hinted = _evaluate(step, exprs, {}, 1)[:, 0]
        for (act, choice), now, then in zip(freed, sizes, hinted, strict=True):
            start, end = choice.window
            # the planner's bytes at the captured size, grown as the storage grows
            live[start:end] -= act.nbytes * (now / then if then else 1.0)
    return live.max(axis=0) if live.size else np.zeros(1)


def largest_batch(step: SymbolicStep, joint_gm: fx.GraphModule, problem: ActivationProblem,
                  actions: Mapping[str, str], added_seconds: float, symbol: str,
                  budget_bytes: int, *, upper: int = 1 << 14, **fixed: Any
                  ) -> tuple[int, float, float] | None:
    """The largest ``symbol`` in ``1..upper`` whose predicted peak under ``actions`` fits
    ``budget_bytes``, with its peak and predicted throughput (``symbol`` units per
    second); None if even 1 does not fit."""
    if symbol not in step.symbols:
        raise ValueError(f"fxopt: no size symbol {symbol!r}; this graph has "
                         f"{dict(step.symbols)}")
    candidates = np.arange(1, upper + 1)
    peaks = plan_peaks(step, joint_gm, problem, actions, **fixed, **{symbol: candidates})
    fits = np.nonzero(peaks <= budget_bytes)[0]
    if fits.size == 0:
        return None
    best = int(candidates[fits[-1]])
    seconds = (float(step.step_seconds(**fixed, **{symbol: best})[0])
               + added_seconds * best / step.symbols[symbol])
    return best, float(peaks[fits[-1]]), best / seconds if seconds else math.inf


def _evaluate(step: SymbolicStep, exprs: list[sympy.Expr], values: Mapping[str, Any],
              candidates: int) -> np.ndarray:
    """``exprs`` at ``values`` (other symbols at their hints): exprs x candidates."""
    full = {**step.symbols, **values}
    fn = sympy.lambdify(list(step.symbol_objects), exprs, "numpy")
    args = [np.broadcast_to(np.asarray(full[str(s)], dtype=np.float64), (candidates,))
            for s in step.symbol_objects]
    return np.stack([np.broadcast_to(np.asarray(v, dtype=np.float64), (candidates,))
                     for v in fn(*args)])
