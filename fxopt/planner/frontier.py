"""The predicted time-vs-memory Pareto frontier of a saved-activation problem.

A user picks a budget from it: the first point is the lowest peak found
(:func:`~fxopt.planner.solvers.milp.lowest_peak_plan`), then budgets are swept evenly up to the
keep-all peak, each is solved (:func:`~fxopt.planner.solvers.milp.solve_activations`),
and only the non-dominated (peak, added seconds) points are kept: a point is dropped when
another has a peak and a time both no larger, one of them smaller. Shown as a text table
and, where matplotlib is installed, a PNG.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from fxopt.planner.activations import ActivationProblem, Decision
from fxopt.planner.solvers.milp import DEFAULT_TIME_LIMIT, lowest_peak_plan, solve_activations
from fxopt.units import format_bytes

__all__ = ["Frontier", "FrontierPoint", "pareto_frontier", "non_dominated"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FrontierPoint:
    budget_bytes: int
    peak_bytes: int
    added_seconds: float
    actions: dict[str, str]
    solver: str


@dataclass(frozen=True)
class Frontier:
    """Non-dominated points, lowest peak first; ``step_seconds``: the keep-all step time
    (0 when unknown), added to every point's time in the table and the chart."""

    points: tuple[FrontierPoint, ...]
    step_seconds: float = 0.0

    def table(self) -> str:
        rows = [f"{'peak':>11} {'step ms':>10} {'+ms':>9} {'recompute':>9} {'swap':>5}  "
                "solver"]
        for p in self.points:
            counts = {a: sum(1 for v in p.actions.values() if v == a)
                      for a in ("recompute", "swap")}
            step = 1e3 * (self.step_seconds + p.added_seconds)
            rows.append(f"{format_bytes(p.peak_bytes):>11} {step:>10.3f} "
                        f"{1e3 * p.added_seconds:>9.3f} {counts['recompute']:>9} "
                        f"{counts['swap']:>5}  {p.solver}")
        return "\n".join(rows)

    def to_dict(self) -> dict[str, Any]:
        return {"step_seconds": self.step_seconds, "points": [asdict(p) for p in self.points]}

    def plot(self, path: str | Path, title: str = "fxopt plan: predicted frontier", *,
             chosen: tuple[int, float] | None = None) -> Path:
        """Write the frontier as a PNG, with the ``chosen`` plan's (peak bytes, added
        seconds) marked; needs matplotlib (``pip install fxopt[plot]``)."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as error:
            raise RuntimeError("fxopt: drawing the frontier needs matplotlib "
                               "(pip install 'fxopt[plot]')") from error
        fig, ax = plt.subplots(figsize=(6, 4))
        peaks = [p.peak_bytes / 2**20 for p in self.points]
        times = [1e3 * (self.step_seconds + p.added_seconds) for p in self.points]
        ax.step(peaks, times, where="post", marker="o", label="frontier")
        if chosen is not None:
            ax.plot([chosen[0] / 2**20], [1e3 * (self.step_seconds + chosen[1])], "r*",
                    markersize=14, label="the plan")
            ax.legend()
        ax.set_xlabel("predicted peak memory (MiB)")
        ax.set_ylabel("predicted step time (ms)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        path = Path(path)
        fig.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(fig)
        return path


def non_dominated(decisions: list[Decision]) -> list[Decision]:
    """The decisions no other one beats on both peak and added time, lowest peak first."""
    ordered = sorted(decisions, key=lambda d: (d.peak_bytes, d.added_seconds))
    kept: list[Decision] = []
    for d in ordered:
        if not kept or d.added_seconds < kept[-1].added_seconds:
            if kept and kept[-1].peak_bytes == d.peak_bytes:
                kept.pop()
            kept.append(d)
    return kept


def pareto_frontier(problem: ActivationProblem, *, points: int = 12,
                    time_limit: float = DEFAULT_TIME_LIMIT,
                    step_seconds: float = 0.0) -> Frontier:
    """About ``points`` plans from the lowest peak found to the keep-all peak, non-dominated
    ones kept; ``step_seconds`` (the keep-all step time, when known) is shown added."""
    if points < 2:
        raise ValueError(f"fxopt: a frontier needs at least 2 points, got {points}")
    keep_all = max(problem.live_bytes, default=0)
    lowest = lowest_peak_plan(problem, time_limit=time_limit)
    floor = lowest.peak_bytes
    lowest.details["budget_bytes"] = floor
    decisions = [lowest]
    # Coarse sweep to the keep-all peak, then the rest of the points between the floor and
    # the lowest peak that costs no time: past it the frontier is flat.
    coarse = max(2, points // 2)
    decisions += _sweep(problem, floor, keep_all, coarse, time_limit)
    free = min((d.peak_bytes for d in decisions if d.added_seconds == 0), default=keep_all)
    decisions += _sweep(problem, floor, free, points - coarse + 1, time_limit)
    best = non_dominated(decisions)
    log.info("frontier: %d budgets, %d non-dominated points", len(decisions), len(best))
    return Frontier(tuple(FrontierPoint(d.details["budget_bytes"], d.peak_bytes, d.added_seconds,
                                        dict(d.actions), d.solver) for d in best),
                    step_seconds)


def _sweep(problem: ActivationProblem, low: int, high: int, points: int,
           time_limit: float) -> list[Decision]:
    """Solve ``points - 1`` budgets evenly spaced in (low, high]."""
    out = []
    for budget in sorted({int(low + i * (high - low) / (points - 1)) for i in range(1, points)}):
        if budget <= low:
            continue
        at = replace(problem, budget_bytes=budget)  # keeps the per-step times
        decision = solve_activations(at, time_limit=time_limit)
        decision.details["budget_bytes"] = budget
        out.append(decision)
    return out
