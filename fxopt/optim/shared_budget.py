"""One byte budget for activations and optimizer state: the shared-budget search (Mist's idea).

With an offloaded optimizer (:func:`fxopt.optim.offload`), the optimizer state resident
on the device and the step's predicted peak share one budget, so the activation plan and
the subgroups' placement are chosen together (an outer search around the activation
MILP, see :mod:`fxopt.planner.search`):

- every non-dominated placement of the subgroups (:func:`fxopt.optim.model.
  offload_frontier`: resident bytes vs predicted optimizer seconds) leaves
  ``budget - resident`` for the step, and ``plan_step`` solves the activation plan under
  it; on a CPU device, where "host" memory is the device's, a host subgroup's master
  weights, state and buffers count as resident too;
- per tempo variant (``variants``, as :mod:`fxopt.passes.tempo.auto` builds them) the same;
- the separately chosen pair (activations planned under the whole budget, then the
  fastest placement in what is left) is a candidate too, so the shared-budget plan is never
  predicted slower than it;
- the plan taken: the least predicted step + optimizer time whose peak plus resident
  state fits (:func:`fxopt.planner.search.best_candidate`; ties to fewer tempo kinds).

Cost: one MILP per (variant, frontier placement) plus one per variant for the separate
pair; the frontier has at most a few points per subgroup.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from fxopt.config import MemoryBudget
from fxopt.optim.model import OffloadPlan, ParamInfo, Subgroup, offload_frontier, split_subgroups
from fxopt.planner.hardware import HardwareProfile
from fxopt.planner.ledger import BudgetLedger
from fxopt.planner.plan import Plan
from fxopt.planner.search import (
    Candidate,
    JointChoice,
    best_candidate,
    choose_tempo,
    predicted_seconds,
    quiet_plan,
)
from fxopt.planner.step import StepProblem

__all__ = ["choose_with_optimizer", "plan_model", "resident_bytes", "subgroups_of"]


def resident_bytes(plan: OffloadPlan, hardware: HardwareProfile) -> int:
    """The optimizer's bytes in the device's budget under ``plan``: its device state, and
    on a CPU device its host subgroups' bytes as well (the same memory)."""
    return plan.gpu_state_bytes + (plan.host_bytes if hardware.device_type == "cpu" else 0)


def choose_with_optimizer(variants: dict[tuple[str, ...], StepProblem], budget_bytes: int,
                          subgroups: Sequence[Subgroup], hardware: HardwareProfile, *,
                          time_limit: float = 10.0, states_per_param: int = 2
                          ) -> tuple[JointChoice, Candidate]:
    """The shared-budget plan under ``budget_bytes`` for the step and the optimizer state, and the
    separately chosen pair without tempo: (shared-budget choice, separate candidate)."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) \
            or budget_bytes <= 0:
        raise ValueError(f"fxopt: the shared-budget search takes a byte budget, "
                         f"got {budget_bytes!r}")
    if () not in variants:
        raise ValueError("fxopt: the shared-budget search needs the variant without tempo")
    frontier = offload_frontier(subgroups, hardware, states_per_param=states_per_param)

    def solve(problem: StepProblem, bound: int) -> Plan:
        return quiet_plan(problem, MemoryBudget(bytes=max(1, bound)), hardware,
                          time_limit=time_limit)

    def candidate(kinds: tuple[str, ...], problem: StepProblem, plan: Plan,
                  offload: OffloadPlan) -> Candidate:
        resident = resident_bytes(offload, hardware)
        peak = int(plan.predictions["peak_bytes"]) + resident
        if plan.feasible and peak > budget_bytes:  # the state does not fit beside it
            plan = dataclasses.replace(plan, feasible=False)
        return Candidate(kinds, plan, predicted_seconds(problem, plan), offload, resident)

    candidates, separate = [], None
    for kinds, problem in variants.items():
        alone = solve(problem, budget_bytes)
        left = budget_bytes - int(alone.predictions["peak_bytes"])
        fits = [o for o in frontier if resident_bytes(o, hardware) <= left]
        pair = candidate(kinds, problem, alone, min(
            fits or frontier[:1], key=lambda o: (o.predicted_seconds, o.gpu_state_bytes)))
        candidates.append(pair)
        if kinds == ():
            separate = pair
        for offload in frontier:
            plan = solve(problem, budget_bytes - resident_bytes(offload, hardware))
            candidates.append(candidate(kinds, problem, plan, offload))
    best, reason = best_candidate(candidates)
    return JointChoice(best, tuple(candidates), reason), separate


def subgroups_of(parameters: Iterable[Any], count: int) -> list[Subgroup]:
    """``count`` subgroups of a model's trainable parameters in reverse order (the order
    their gradients become ready, as DDP assumes), as :func:`fxopt.optim.offload` splits
    them without a compiled backend to read the order from."""
    params = [p for p in parameters if p.requires_grad]
    infos = [ParamInfo(key=i, numel=p.numel(), itemsize=p.element_size())
             for i, p in reversed(list(enumerate(params)))]
    return split_subgroups(infos, max(1, min(count, len(infos))))


def plan_model(graphs: Sequence[dict[tuple[str, ...], StepProblem]], budget: MemoryBudget,
               hardware: HardwareProfile, *, subgroups: Sequence[Subgroup] | None = None,
               time_limit: float = 10.0) -> list[JointChoice]:
    """The shared-budget choice for each graph of a model (``graphs``: each one's tempo variants,
    in compilation order). A fraction is the model's, shared through a
    :class:`~fxopt.planner.ledger.BudgetLedger` as compilation shares it. With
    ``subgroups`` (a byte budget), the optimizer is planned jointly with the graph holding
    the most parameters and inputs, and the other graphs are planned in what its
    resident state leaves."""
    fraction = budget.fraction
    if subgroups is not None and fraction is not None:
        raise ValueError("fxopt: planning the optimizer state with the activations needs a "
                         "byte budget (e.g. 6GiB): a fraction bounds saved bytes only")
    ledger = BudgetLedger() if fraction is not None else None
    choices: list[JointChoice | None] = [None] * len(graphs)
    left = budget
    if subgroups is not None:
        main = max(range(len(graphs)), key=lambda i: graphs[i][()].baseline_bytes)
        choices[main], _ = choose_with_optimizer(graphs[main], budget.bytes, subgroups,
                                                 hardware, time_limit=time_limit)
        left = MemoryBudget(bytes=max(1, budget.bytes - choices[main].chosen.resident_bytes))
    for index, variants in enumerate(graphs):
        if choices[index] is not None:
            continue

        def plan(problem: StepProblem) -> Plan:
            return quiet_plan(problem, left, hardware, time_limit=time_limit,
                              ledger=copy.deepcopy(ledger))

        choices[index] = choose_tempo(variants, left, hardware, plan=plan)
        if ledger is not None:  # the chosen variant's share, recorded as compilation will
            quiet_plan(variants[choices[index].chosen.tempo], left, hardware, ledger=ledger)
    return [c for c in choices if c is not None]
