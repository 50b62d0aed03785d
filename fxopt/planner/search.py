"""The shared-budget search: tempo sites, the activation plan and the optimizer split under
one budget.

The activation MILP (:func:`fxopt.planner.plan_step`) decides keep, recompute or swap per
saved tensor. Two more knobs change what it should do, and are chosen here by an outer
search around it (Mist's co-optimization, as a documented outer loop, since folding them
into the MILP would multiply its size):

- **tempo sites** (:func:`choose_tempo`): each candidate is one set of tempo site kinds
  (``gelu``, ``layer_norm``/``rms_norm``, ``attention``) rewritten, with the plan
  ``plan_step`` makes for that variant's graph under the same budget. The winner is the
  variant whose plan meets the budget with the least predicted step time (keep-all time
  plus the plan's added seconds). Times equal up to rounding (:data:`TEMPO_TIE`, relative)
  are a tie, and a tie goes to fewer tempo kinds (tempo rebuilds gradients from outputs, a
  numerics change taken only when it pays). The margin is only rounding's: a wider one
  would let a tempo-free plan win while a predicted-faster one meets the budget, and the
  shared-budget plan must never be predicted slower than the best separately chosen one. When no
  variant meets the budget, the one closest to it wins (least saved bytes or peak), then
  fewer kinds.
- **optimizer subgroups** (:func:`fxopt.optim.shared_budget.choose_with_optimizer`, in the optimizer
  package, which the planner must not import): under a byte budget with an
  offloaded optimizer, the device-resident optimizer state and the step's predicted peak
  share the budget. For every non-dominated placement of the subgroups
  (:func:`fxopt.optim.model.offload_frontier`: resident state vs optimizer seconds), the
  activation plan is solved under what that placement leaves; the shared-budget plan is the one
  with the least predicted step + optimizer time. The separately chosen pair (activations
  planned under the whole budget, then the fastest placement in what is left) is always a
  candidate too, so the shared-budget choice is never predicted slower.

Cost: one ``plan_step`` per candidate; the tempo search has ``2**k`` variants for the
``k`` kinds present (at most 8 in a transformer: GELU, norm, attention), each also needing
the variant's joint graph (its caller's trace); the optimizer search solves one MILP per
frontier placement (at most ``subgroups + 1`` points in practice).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fxopt.config import MemoryBudget
from fxopt.planner.hardware import HardwareProfile
from fxopt.planner.plan import Plan
from fxopt.planner.step import StepProblem, plan_step
from fxopt.units import format_bytes

__all__ = ["TEMPO_TIE", "Candidate", "JointChoice", "choose_tempo", "predicted_seconds",
           "quiet_plan", "best_candidate"]

TEMPO_TIE = 1e-9  # a relative predicted-time difference below this is a tie (rounding)


def predicted_seconds(problem: StepProblem, plan: Plan) -> float:
    """The step's predicted time under ``plan``: everything kept, plus what the plan adds."""
    return problem.step_seconds + float(plan.predictions.get("added_seconds", 0.0))


def _reached(plan: Plan) -> float:
    """What a plan reaches against its budget: saved bytes (fraction) or peak (bytes)."""
    p = plan.predictions
    return float(p["saved_bytes"] if "saved_bytes" in p else p["peak_bytes"])


@dataclass(frozen=True)
class Candidate:
    """One point of an outer search: the tempo kinds rewritten, the optimizer placement
    (None: no offloaded optimizer), the activation plan, and its predictions."""

    tempo: tuple[str, ...]
    plan: Plan
    step_seconds: float                 # activations' step: keep-all + the plan's added
    offload: Any = None  # fxopt.optim.model.OffloadPlan
    resident_bytes: int = 0  # the optimizer's bytes in the budget (its device state)

    @property
    def feasible(self) -> bool:
        return self.plan.feasible

    @property
    def optimizer_seconds(self) -> float:
        return self.offload.predicted_seconds if self.offload is not None else 0.0

    @property
    def seconds(self) -> float:
        return self.step_seconds + self.optimizer_seconds

    @property
    def peak_bytes(self) -> int | None:
        """Predicted peak of the step with the optimizer's resident state (byte plans)."""
        peak = self.plan.predictions.get("peak_bytes")
        if peak is None:
            return None
        return int(peak) + self.resident_bytes

    @property
    def reached(self) -> float:
        """What the candidate reaches against the budget: its peak with the resident
        optimizer bytes (byte budgets), or its saved bytes (fractions)."""
        peak = self.peak_bytes
        return float(peak) if peak is not None else _reached(self.plan)

    def row(self) -> dict[str, Any]:
        out = {"tempo": list(self.tempo), "feasible": self.feasible,
               "seconds": self.seconds, "step_seconds": self.step_seconds,
               "optimizer_seconds": self.optimizer_seconds, "reached": self.reached,
               "recompute": sum(1 for a in self.plan.actions.values() if a == "recompute"),
               "swap": sum(1 for a in self.plan.actions.values() if a == "swap")}
        if self.offload is not None:
            out["optimizer_on_host"] = sum(1 for s in self.offload.subgroups
                                           if s.placement == "cpu")
            out["optimizer_state_bytes"] = self.resident_bytes
        return out


@dataclass(frozen=True)
class JointChoice:
    """The chosen candidate, every candidate evaluated (the search's table) and why."""

    chosen: Candidate
    candidates: tuple[Candidate, ...]
    reason: str

    def table(self) -> str:
        """The shared-budget plan as text: tempo sites taken and why, tensors recomputed, swapped
        and kept, optimizer subgroups on the host and the device, predicted peak and time;
        then one row per candidate evaluated."""
        c, p = self.chosen, self.chosen.plan
        counts = {a: sum(1 for v in p.actions.values() if v == a) for a in ("recompute", "swap")}
        saved = len(p.extra.get("tensors", []))
        lines = [f"shared-budget plan{'' if c.feasible else ' (OVER BUDGET)'}: {self.reason}",
                 f"  tempo sites taken: {', '.join(c.tempo) or 'none'}",
                 f"  tensors: recompute {counts['recompute']}, swap {counts['swap']}, keep "
                 f"{max(saved - counts['recompute'] - counts['swap'], 0)}"]
        if c.offload is not None:
            host = sum(1 for s in c.offload.subgroups if s.placement == "cpu")
            lines.append(f"  optimizer subgroups: {host} on host, "
                         f"{len(c.offload.subgroups) - host} on device "
                         f"({format_bytes(c.resident_bytes)} resident)")
        reached = (f"peak {format_bytes(c.peak_bytes)}" if c.peak_bytes is not None else
                   f"saved bytes {format_bytes(int(c.reached))}")
        lines.append(f"  predicted {reached}, time {1e3 * c.seconds:.3f} ms (step "
                     f"{1e3 * c.step_seconds:.3f} + optimizer {1e3 * c.optimizer_seconds:.3f})")
        lines.append(f"  {'tempo':<28} {'fits':>4} {'ms':>9} {'reached':>11} {'recomp':>6} "
                     f"{'swap':>4} {'host':>4}")
        for row in (x.row() for x in self.candidates):
            lines.append(f"  {','.join(row['tempo']) or '-':<28} "
                         f"{'yes' if row['feasible'] else 'no':>4} "
                         f"{1e3 * row['seconds']:>9.3f} "
                         f"{format_bytes(int(row['reached'])):>11} {row['recompute']:>6} "
                         f"{row['swap']:>4} {row.get('optimizer_on_host', '-'):>4}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"taken": list(self.chosen.tempo), "reason": self.reason,
                "chosen": self.chosen.row(),
                "candidates": [c.row() for c in self.candidates]}


def best_candidate(candidates: Sequence[Candidate]) -> tuple[Candidate, str]:
    """The rule of the module doc: feasible and fastest (ties: fewer tempo kinds), or the
    closest to the budget when none is feasible."""
    feasible = [c for c in candidates if c.feasible]
    if not feasible:
        best = min(candidates, key=lambda c: (c.reached, len(c.tempo), c.seconds))
        return best, "no candidate meets the budget: the one closest to it"
    fastest = min(c.seconds for c in feasible)
    tied = [c for c in feasible if c.seconds <= fastest * (1 + TEMPO_TIE)]
    best = min(tied, key=lambda c: (len(c.tempo), c.seconds))
    return best, (f"meets the budget with the least predicted time ({1e3 * best.seconds:.3f} "
                  f"ms; {len(feasible)} of {len(candidates)} candidates meet it)")


def quiet_plan(problem: StepProblem, budget: MemoryBudget | None, hardware: HardwareProfile,
                **kwargs: Any) -> Plan:
    """``plan_step``'s plan for a candidate; a candidate that misses the budget is a row
    of the search, not a warning (the plan compilation applies warns for itself)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plan_step(problem, budget, hardware, strict=False, **kwargs)


def choose_tempo(variants: dict[tuple[str, ...], StepProblem], budget: MemoryBudget | None,
                 hardware: HardwareProfile, *,
                 plan: Callable[[StepProblem], Plan] | None = None) -> JointChoice:
    """The tempo kinds to rewrite: ``variants`` maps each set of kinds (sorted tuple; ``()``
    is no tempo, which must be there) to its graph's problem; ``plan`` makes a variant's
    plan (default: ``plan_step`` under ``budget``, warnings kept out of the search)."""
    if () not in variants:
        raise ValueError("fxopt: the tempo search needs the variant without tempo")
    make = plan or (lambda problem: quiet_plan(problem, budget, hardware))
    candidates = []
    for kinds, problem in variants.items():
        chosen = make(problem)
        candidates.append(Candidate(tuple(kinds), chosen, predicted_seconds(problem, chosen)))
    best, reason = best_candidate(candidates)
    return JointChoice(best, tuple(candidates), reason)
