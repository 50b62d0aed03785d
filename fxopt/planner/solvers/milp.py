"""The exact solver of the saved-activation problem: an MILP on scipy's HiGHS.

``solve_activations(problem) -> Decision`` has the signature of every activation decider
(the ``swap_recompute`` pass's heuristic included), so either can be plugged in.

Formulation. One binary ``x[i,c]`` per saved tensor ``i`` and choice ``c`` (keep is all of
them 0); ``sum_c x[i,c] <= 1``; a choice that reads tensor ``j`` (``requires``) excludes
every choice of ``j``: ``x[i,c] + sum_c' x[j,c'] <= 1``. The peak constraint is written over
the memory timeline itself, not a proxy: the bytes freed at step ``t`` are
``sum of nbytes_i * x[i,c]`` over the choices whose window holds ``t``, and
``live[t] - freed[t] <= budget`` for every step. Which choices hold a step changes only at
window ends, so the timeline is cut into segments between consecutive window ends and one
row per segment (with the segment's largest live bytes) is exact. Writing ``freed`` per
segment directly would take O(choices x segments) nonzeros (windows of saved activations
nest and span most of the step); instead a continuous ``f[k]`` per segment carries the
running sum, ``f[k] = f[k-1] + (bytes of windows opening at k) - (bytes closing at k)``,
and the budget is a lower bound on ``f[k]``: O(choices + segments) nonzeros. Bytes are
scaled by the largest tensor so that HiGHS sees coefficients near 1.

Objective: added seconds, plus ``1e-6`` of the smallest positive choice cost spread over all
variables, so that free choices (a swap hidden entirely by compute) are not taken unless
they are needed: the budget then costs nothing when the model fits.

An infeasible budget (HiGHS proves it) is answered with the lowest peak found (an MILP
minimising the peak, and the greedy), at the least added time there (``feasible=False``).
Fallback to :func:`~fxopt.planner.solvers.greedy.solve_greedy`: scipy missing, more than
``max_variables`` binaries, or the time limit hit before any solution (then the greedy
starts from its own lowest-peak plan and undoes what the budget does not need); a solution
that HiGHS's tolerances leave over the budget by a few bytes is repaired by the greedy from
there; a solution the time limit cut short competes with the greedy's (the better is
returned). HiGHS checks its time limit between phases, so a solve can overrun it by seconds
on large problems. Every answer's ``details`` say ``solver``, ``status``,
``planning_seconds`` and the model's size.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

import numpy as np

from fxopt.planner.activations import (
    Action,
    ActivationProblem,
    Decision,
    evaluate,
    improve_overlap,
)
from fxopt.planner.solvers.greedy import solve_greedy

__all__ = ["lowest_peak", "lowest_peak_plan", "solve_activations"]

log = logging.getLogger(__name__)

DEFAULT_TIME_LIMIT = 10.0
DEFAULT_MAX_VARIABLES = 50_000
# Relative optimality gap at which HiGHS stops (its default): plans within 0.01% of the
# optimum in added seconds.
MIP_GAP = 1e-4


def solve_activations(problem: ActivationProblem, *, time_limit: float = DEFAULT_TIME_LIMIT,
                      max_variables: int = DEFAULT_MAX_VARIABLES) -> Decision:
    """Actions that minimise added seconds with the predicted peak within the budget."""
    if time_limit <= 0:
        raise ValueError(f"fxopt: time_limit must be positive, got {time_limit}")
    began = time.perf_counter()
    decision = improve_overlap(problem, _solve(problem, time_limit, max_variables))
    decision.details["planning_seconds"] = time.perf_counter() - began
    log.info("activation plan: %s (%s), peak %d of budget %d, +%.3g s, planned in %.3f s",
             decision.solver, decision.details.get("status"), decision.peak_bytes,
             problem.budget_bytes, decision.added_seconds, decision.details["planning_seconds"])
    return decision


def lowest_peak(problem: ActivationProblem, *, time_limit: float = DEFAULT_TIME_LIMIT) -> int:
    """The lowest predicted peak found: the better of the greedy's and (where it runs) the
    MILP's within ``time_limit``. Minimising the peak is the hard end of the problem (on the
    GPT-2-medium-sized benchmark HiGHS's root bound is within ~2% of it after seconds, but
    proving it takes longer), so this is a reachable peak, not a proven minimum."""
    return lowest_peak_plan(problem, time_limit=time_limit).peak_bytes


def lowest_peak_plan(problem: ActivationProblem, *,
                     time_limit: float = DEFAULT_TIME_LIMIT) -> Decision:
    """The plan of :func:`lowest_peak`, with the choices that peak does not need undone;
    judged against ``problem``'s own budget."""
    began = time.perf_counter()
    lowest = _lowest_plan(problem, _Model.build(problem), time_limit)
    trimmed = solve_greedy(_with_budget(problem, lowest.peak_bytes), start=lowest.actions)
    return evaluate(problem, trimmed.actions, "milp+greedy", status="lowest peak found",
                    planning_seconds=time.perf_counter() - began)


def _lowest_plan(problem: ActivationProblem, model: _Model | None,
                 time_limit: float) -> Decision:
    floor = _with_budget(problem, 0)
    best = solve_greedy(floor)
    if model is not None and 0 < model.size <= DEFAULT_MAX_VARIABLES:
        actions = model.min_peak(time_limit)
        if actions is not None:
            polished = solve_greedy(floor, start=actions)
            if polished.peak_bytes < best.peak_bytes:
                best = polished
    return best


def _solve(problem: ActivationProblem, time_limit: float, max_variables: int) -> Decision:
    keep_all = max(problem.live_bytes, default=0)
    if keep_all <= problem.budget_bytes:
        return evaluate(problem, {}, "milp", status="fits: nothing to decide")
    model = _Model.build(problem)
    if model is None:
        return _greedy(problem, 0, "fallback: scipy is not installed")
    if model.size > max_variables:
        return _greedy(problem, model.size,
                       f"fallback: {model.size} variables > max_variables={max_variables}")
    deadline = time.perf_counter() + time_limit

    def left() -> float:
        return max(deadline - time.perf_counter(), 0.1)

    actions, status = model.min_time(problem.budget_bytes, time_limit)
    if actions is not None:
        return _finish(problem, actions, model.size, status)
    if status != "infeasible":
        # No solution in time: the greedy's lowest-peak plan is feasible whenever the
        # greedy can reach the budget at all; the greedy then undoes what is not needed.
        floor = solve_greedy(_with_budget(problem, 0)).actions
        return _greedy(problem, model.size, f"fallback: {status}, greedy from its "
                       "lowest-peak plan", start=floor)
    lowest = _lowest_plan(problem, model, left())
    relaxed = _with_budget(problem, lowest.peak_bytes)
    actions, status = model.min_time(lowest.peak_bytes, left())
    status = f"infeasible budget; lowest reachable peak {lowest.peak_bytes} ({status})"
    decision = _finish(relaxed, actions if actions is not None else lowest.actions,
                       model.size, status)
    return evaluate(problem, decision.actions, decision.solver, **decision.details)


def _finish(problem: ActivationProblem, actions: dict[str, Action], size: int,
            status: str) -> Decision:
    decision = evaluate(problem, actions, "milp", status=status, variables=size)
    if not decision.feasible:
        # HiGHS's feasibility tolerance can leave a peak a few bytes over: repair greedily.
        decision = _greedy(problem, size, f"{status}; repaired by greedy", start=actions)
    if status == "optimal" and decision.solver == "milp":
        return decision
    # Stopped by the time limit: HiGHS's incumbent can be far from the optimum (on the
    # GPT-2-medium-sized benchmark, 2x the greedy's time near the lowest peak), so the
    # greedy's answer, alone and from the incumbent, competes.
    candidates = [decision, _greedy(problem, size, f"{status}; greedy beat the incumbent"),
                  _greedy(problem, size, f"{status}; greedy improved the incumbent",
                          start=decision.actions)]
    feasible = [d for d in candidates if d.feasible] or candidates
    return min(feasible, key=lambda d: (d.peak_bytes if not d.feasible else 0,
                                        d.added_seconds))


def _greedy(problem: ActivationProblem, size: int, status: str,
            start: dict[str, Action] | None = None) -> Decision:
    return solve_greedy(problem, start=start, status=status, variables=size)


def _with_budget(problem: ActivationProblem, budget: int) -> ActivationProblem:
    return dataclasses.replace(problem, budget_bytes=budget)


@dataclass
class _Model:
    """The MILP's matrices, built once and solved for several budgets."""

    problem: ActivationProblem
    keys: list[tuple[str, Action]]        # variable j -> (tensor, action)
    costs: np.ndarray
    seg_live: np.ndarray                  # largest live bytes per segment (scaled)
    scale: float
    exclusive: object                     # sparse rows: at most one choice, requires
    flow: object                          # sparse rows: the running freed bytes per segment

    @property
    def size(self) -> int:
        return len(self.keys)

    @classmethod
    def build(cls, problem: ActivationProblem) -> _Model | None:
        try:
            from scipy import sparse
        except ImportError:
            return None
        acts = problem.activations
        keys, owners, windows, costs, sizes = [], [], [], [], []
        for i, act in enumerate(acts):
            for c in act.choices:
                if act.nbytes > 0 and c.window[1] > c.window[0]:
                    keys.append((act.name, c.action))
                    owners.append(i)
                    windows.append(c.window)
                    costs.append(c.seconds)
                    sizes.append(act.nbytes)
        steps = len(problem.live_bytes)
        cuts = sorted({0, steps, *(w for win in windows for w in win)})
        cuts = [c for c in cuts if c < steps] or [0]
        live = np.asarray(problem.live_bytes, dtype=np.float64)
        seg_live = np.maximum.reduceat(live, cuts) if steps else np.zeros(1)
        scale = float(max(sizes, default=1))
        n, segs = len(keys), len(cuts)
        seg_of = {c: k for k, c in enumerate(cuts)}

        # Exclusivity rows: one per tensor with 2+ choices, one per (choice, requirement).
        rows, cols = [], []
        by_tensor: dict[int, list[int]] = {}
        for j, i in enumerate(owners):
            by_tensor.setdefault(i, []).append(j)
        vars_of = {acts[i].name: js for i, js in by_tensor.items()}
        r = 0
        for js in by_tensor.values():
            if len(js) > 1:
                rows += [r] * len(js)
                cols += js
                r += 1
        for j, (_, action) in enumerate(keys):
            for dep in next(c for c in acts[owners[j]].choices if c.action == action).requires:
                rows += [r] * (1 + len(vars_of.get(dep, [])))
                cols += [j, *vars_of.get(dep, [])]
                r += 1
        exclusive = sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(r, n + segs))

        # Flow rows: f[k] - f[k-1] - sum(opening at k) + sum(closing at k) = 0.
        frows, fcols, fvals = [], [], []
        for k in range(segs):
            frows.append(k), fcols.append(n + k), fvals.append(1.0)
            if k:
                frows.append(k), fcols.append(n + k - 1), fvals.append(-1.0)
        for j, (start, end) in enumerate(windows):
            frows.append(seg_of[start]), fcols.append(j), fvals.append(-sizes[j] / scale)
            if end < steps:
                frows.append(seg_of[end]), fcols.append(j), fvals.append(sizes[j] / scale)
        flow = sparse.csr_matrix((fvals, (frows, fcols)), shape=(segs, n + segs))
        return cls(problem, keys, np.asarray(costs, dtype=np.float64), seg_live / scale,
                   scale, exclusive, flow)

    def _run(self, cost: np.ndarray, lower_f: np.ndarray, extra: list, time_limit: float,
             extra_vars: int = 0):
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import hstack

        n, segs = self.size, len(self.seg_live)
        constraints = [
            LinearConstraint(_pad(self.exclusive, extra_vars, hstack), -np.inf, 1.0),
            LinearConstraint(_pad(self.flow, extra_vars, hstack), 0.0, 0.0),
            *extra,
        ]
        lower = np.concatenate([np.zeros(n), lower_f, np.zeros(extra_vars)])
        upper = np.concatenate([np.ones(n), np.full(segs, np.inf), np.full(extra_vars, np.inf)])
        integrality = np.concatenate([np.ones(n), np.zeros(segs + extra_vars)])
        return milp(cost, constraints=constraints, bounds=Bounds(lower, upper),
                    integrality=integrality,
                    options={"time_limit": time_limit, "mip_rel_gap": MIP_GAP})

    def _actions(self, x: np.ndarray) -> dict[str, Action]:
        return {name: action for (name, action), v in zip(self.keys, x[:self.size]) if v > 0.5}

    def min_time(self, budget: int, time_limit: float) -> tuple[dict[str, Action] | None, str]:
        n, segs = self.size, len(self.seg_live)
        positive = self.costs[self.costs > 0]
        tie = 1e-6 * (positive.min() if positive.size else 1.0) / max(n, 1)
        cost = np.concatenate([self.costs + tie, np.zeros(segs)])
        lower_f = np.maximum(self.seg_live - budget / self.scale, 0.0)
        result = self._run(cost, lower_f, [], time_limit)
        return _answer(result, self._actions)

    def min_peak(self, time_limit: float) -> dict[str, Action] | None:
        """Actions reaching the lowest peak P: minimise P with f[k] + P >= live[k]."""
        from scipy.optimize import LinearConstraint
        from scipy.sparse import csr_matrix

        n, segs = self.size, len(self.seg_live)
        rows = np.arange(segs)
        matrix = csr_matrix((np.ones(2 * segs), (np.concatenate([rows, rows]), np.concatenate(
            [n + rows, np.full(segs, n + segs)]))), shape=(segs, n + segs + 1))
        cost = np.concatenate([np.zeros(n + segs), [1.0]])
        result = self._run(cost, np.zeros(segs),
                           [LinearConstraint(matrix, self.seg_live, np.inf)], time_limit,
                           extra_vars=1)
        return _answer(result, self._actions)[0]


def _pad(matrix, extra: int, hstack):
    if not extra:
        return matrix
    from scipy.sparse import csr_matrix
    return hstack([matrix, csr_matrix((matrix.shape[0], extra))]).tocsr()


def _answer(result, actions_of) -> tuple[dict[str, Action] | None, str]:
    # scipy.optimize.milp status: 0 optimal, 1 iteration/time limit, 2 infeasible,
    # 3 unbounded, 4 other.
    names = {0: "optimal", 1: "time limit", 2: "infeasible", 3: "unbounded", 4: "error"}
    status = names.get(result.status, str(result.status))
    if result.x is None:
        return None, status
    return actions_of(result.x), status
