"""The saved-activation decision as plain data: keep, recompute or swap each saved tensor.

A training step is a timeline of executed nodes (the forward's, then the backward's), with
the live bytes at each step predicted by the memory simulation
(:mod:`fxopt.analysis.memory`) when every saved tensor is kept. Not keeping a saved tensor
removes its bytes from the live set over a *window* of that timeline and costs time:

- **recompute**: its bytes are free from just after its last forward use until it is
  rebuilt just before its first backward use; the cost is the recompute's roofline time. A
  recompute may read other saved tensors (``requires``), which then must be kept.
- **swap**: its bytes are free once the copy to host memory has finished until the
  prefetch starts; the cost is the copy time that compute in the window cannot hide.

Step time (:func:`added_seconds`). Alone, a choice adds its ``seconds``. Where the problem
has the compute time of every step (``step_seconds``) and a swap its link data (copy time,
the step its offload is issued at, the step that waits for its prefetch), the chosen
actions are priced together, by running the step on two resources: the compute stream
(every step's compute, each recompute just before the step that first reads its tensor,
the waits for offloads to finish and for prefetches) and one host link that copies in
issue order, one copy at a
time. So swaps that share the link queue behind each other instead of each being hidden
as if it had the link alone, and a recompute placed while a prefetch is still copying
fills that wait instead of adding to it. The added time is the simulated step's length
less the compute of the plain step. The solvers optimise the choices' own ``seconds`` (a
linear objective), then :func:`improve_overlap` moves swaps to recompute or keep where
the joint price falls within the budget.

Whoever builds an :class:`ActivationProblem` (the ``swap_recompute`` pass, from the joint
graph) computes each choice's window and cost; whoever decides (the pass's heuristic, or the
planner's solver) only reads this data and returns a :class:`Decision`. The functions here
evaluate a set of actions exactly as both sides must agree on: the predicted peak is the
maximum over the timeline of ``live_bytes[t] - sum(bytes of tensors whose window holds t)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = [
    "ACTIONS", "Action", "ActivationChoice", "ActivationProblem", "Decision",
    "SavedActivation", "added_seconds", "evaluate", "improve_overlap", "peak_bytes",
    "timeline_bytes",
]

Action = Literal["keep", "recompute", "swap"]
ACTIONS: tuple[Action, ...] = ("keep", "recompute", "swap")


@dataclass(frozen=True)
class ActivationChoice:
    """One way of not keeping a saved tensor.

    ``window`` is ``(start, end)``: timeline steps ``start <= t < end`` during which the
    tensor's bytes are not resident. ``seconds`` is the step time it adds (recompute time, or
    the unhidden part of the copies). ``requires`` names saved tensors this choice reads,
    which must then be kept.
    """

    action: Action
    window: tuple[int, int]
    seconds: float
    requires: tuple[str, ...] = ()
    # a swap's host link data (copy_seconds 0: none, priced by ``seconds`` alone): one
    # copy's time each way, the step its offload is issued before (compute waits for it
    # before ``window[0]``), and the step that waits for its prefetch (issued before
    # ``window[1]``)
    copy_seconds: float = 0.0
    offload_step: int = 0
    use_step: int = 0


@dataclass(frozen=True)
class SavedActivation:
    """A tensor the forward saves for backward, and its alternatives to keeping it."""

    name: str
    nbytes: int
    choices: tuple[ActivationChoice, ...] = ()

    def choice(self, action: Action) -> ActivationChoice | None:
        return next((c for c in self.choices if c.action == action), None)


@dataclass(frozen=True)
class ActivationProblem:
    """Live bytes per timeline step with everything kept, the saved tensors, and the budget.

    ``labels`` names the steps (``fw:<node>`` / ``bw:<node>``, as in the memory timeline).
    """

    live_bytes: tuple[int, ...]
    activations: tuple[SavedActivation, ...]
    budget_bytes: int
    labels: tuple[str, ...] = ()
    step_seconds: tuple[float, ...] = ()   # compute per step, everything kept (or unknown)

    def __post_init__(self) -> None:
        steps = len(self.live_bytes)
        if self.step_seconds and len(self.step_seconds) != steps:
            raise ValueError(f"fxopt: {len(self.step_seconds)} step_seconds for a timeline "
                             f"of {steps} steps")
        names = [a.name for a in self.activations]
        if len(set(names)) != len(names):
            raise ValueError("fxopt: saved activation names must be unique")
        for act in self.activations:
            for c in act.choices:
                start, end = c.window
                if c.action == "keep" or not 0 <= start <= end <= steps:
                    raise ValueError(f"fxopt: bad choice {c} for {act.name!r} on a timeline "
                                     f"of {steps} steps")
                if c.copy_seconds > 0 and not (0 <= c.offload_step <= start
                                               and end <= c.use_step <= steps):
                    raise ValueError(f"fxopt: {act.name!r}'s swap is offloaded at step "
                                     f"{c.offload_step} and waited for at {c.use_step}, "
                                     f"outside its window {c.window}")
                if missing := set(c.requires) - set(names):
                    raise ValueError(f"fxopt: {act.name!r} requires unknown tensors {missing}")

    def by_name(self) -> dict[str, SavedActivation]:
        return {a.name: a for a in self.activations}


@dataclass
class Decision:
    """The answer: an action per saved tensor (absent means keep) and its predictions."""

    actions: dict[str, Action]
    peak_bytes: int
    added_seconds: float
    feasible: bool
    solver: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check(problem: ActivationProblem, actions: Mapping[str, Action]) -> None:
    known = problem.by_name()
    for name, action in actions.items():
        if name not in known:
            raise KeyError(f"fxopt: no saved activation named {name!r}")
        if action != "keep" and known[name].choice(action) is None:
            raise ValueError(f"fxopt: {name!r} cannot be {action}d")
        if action != "keep":
            for dep in known[name].choice(action).requires:
                if actions.get(dep, "keep") != "keep":
                    raise ValueError(f"fxopt: {name!r} is {action}d from {dep!r}, "
                                     f"which must then be kept")


def timeline_bytes(problem: ActivationProblem, actions: Mapping[str, Action]) -> list[int]:
    """Predicted live bytes per step under ``actions`` (absent names are kept)."""
    _check(problem, actions)
    delta = [0] * (len(problem.live_bytes) + 1)
    for act in problem.activations:
        action = actions.get(act.name, "keep")
        if action == "keep":
            continue
        start, end = act.choice(action).window
        delta[start] -= act.nbytes
        delta[end] += act.nbytes
    out, running = [], 0
    for live, change in zip(problem.live_bytes, delta):
        running += change
        out.append(live + running)
    return out


def peak_bytes(problem: ActivationProblem, actions: Mapping[str, Action]) -> int:
    """The predicted peak under ``actions`` (0 for an empty timeline)."""
    return max(timeline_bytes(problem, actions), default=0)


def added_seconds(problem: ActivationProblem, actions: Mapping[str, Action]) -> float:
    """Step time the actions add: their choices' seconds, or, where a chosen swap has link
    data and the problem its steps' compute, the two-resource simulation of the module
    doc."""
    _check(problem, actions)
    known = problem.by_name()
    chosen = [known[n].choice(a) for n, a in actions.items() if a != "keep"]
    if not problem.step_seconds or not any(c.copy_seconds > 0 for c in chosen):
        return sum(c.seconds for c in chosen)
    return _overlapped_seconds(problem.step_seconds, chosen)


def _overlapped_seconds(step_seconds: tuple[float, ...],
                        chosen: list[ActivationChoice]) -> float:
    steps = len(step_seconds)
    recompute = [0.0] * (steps + 1)
    offloads: dict[int, list[int]] = {}
    finishes: dict[int, list[int]] = {}
    prefetches: dict[int, list[int]] = {}
    waits: dict[int, list[int]] = {}
    fixed = 0.0
    for i, c in enumerate(chosen):
        if c.action == "recompute":
            recompute[c.window[1]] += c.seconds
        elif c.copy_seconds > 0:
            offloads.setdefault(c.offload_step, []).append(i)
            finishes.setdefault(c.window[0], []).append(i)
            prefetches.setdefault(c.window[1], []).append(i)
            waits.setdefault(c.use_step, []).append(i)
        else:
            fixed += c.seconds
    clock = link = 0.0
    offloaded: dict[int, float] = {}
    fetched: dict[int, float] = {}
    for step in range(steps + 1):
        for i in offloads.get(step, ()):
            link = max(clock, link) + chosen[i].copy_seconds
            offloaded[i] = link
        for i in finishes.get(step, ()):  # compute waits for the copy before the bytes free
            clock = max(clock, offloaded[i])
        for i in prefetches.get(step, ()):
            link = max(clock, link, offloaded[i]) + chosen[i].copy_seconds
            fetched[i] = link
        clock += recompute[step]       # recomputes run while prefetches are copying
        for i in waits.get(step, ()):
            clock = max(clock, fetched[i])
        if step < steps:
            clock += step_seconds[step]
    return max(clock, link) - sum(step_seconds) + fixed


def improve_overlap(problem: ActivationProblem, decision: Decision) -> Decision:
    """``decision`` with swaps moved to another choice or kept, one at a time, while that
    lowers :func:`added_seconds` (the joint price) and the peak stays within the budget
    (or does not rise, for an infeasible decision). A no-op without link data."""
    actions = dict(decision.actions)
    bound = max(problem.budget_bytes, decision.peak_bytes)
    best = added_seconds(problem, actions)
    known = problem.by_name()
    improved = True
    while improved:
        improved = False
        for name in [n for n, a in actions.items() if a == "swap"]:
            if known[name].choice("swap").copy_seconds <= 0:
                continue
            for other in ("keep", *(c.action for c in known[name].choices)):
                trial = {**actions, name: other}
                if other == "swap" or not _allowed(problem, trial):
                    continue
                trial = {n: a for n, a in trial.items() if a != "keep"}
                seconds = added_seconds(problem, trial)
                if seconds < best - 1e-12 and peak_bytes(problem, trial) <= bound:
                    actions, best, improved = trial, seconds, True
                    break
    if actions == decision.actions:
        return decision
    return evaluate(problem, actions, decision.solver, **{
        **decision.details, "status": f"{decision.details.get('status', '')}; swaps "
        "repriced together on the host link"})


def _allowed(problem: ActivationProblem, actions: Mapping[str, Action]) -> bool:
    try:
        _check(problem, actions)
    except ValueError:
        return False
    return True


def evaluate(problem: ActivationProblem, actions: Mapping[str, Action], solver: str,
             **details: Any) -> Decision:
    """A :class:`Decision` for ``actions``, with its predicted peak, time and feasibility."""
    peak = peak_bytes(problem, actions)
    chosen = {n: a for n, a in actions.items() if a != "keep"}
    return Decision(actions=chosen, peak_bytes=peak,
                    added_seconds=added_seconds(problem, actions),
                    feasible=peak <= problem.budget_bytes, solver=solver, details=details)
