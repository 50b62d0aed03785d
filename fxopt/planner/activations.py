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
    "SavedActivation", "added_seconds", "evaluate", "peak_bytes", "timeline_bytes",
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

    def __post_init__(self) -> None:
        steps = len(self.live_bytes)
        names = [a.name for a in self.activations]
        if len(set(names)) != len(names):
            raise ValueError("fxopt: saved activation names must be unique")
        for act in self.activations:
            for c in act.choices:
                start, end = c.window
                if c.action == "keep" or not 0 <= start <= end <= steps:
                    raise ValueError(f"fxopt: bad choice {c} for {act.name!r} on a timeline "
                                     f"of {steps} steps")
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
    """Step time the actions add: the sum of their chosen choices' seconds."""
    _check(problem, actions)
    known = problem.by_name()
    return sum(known[n].choice(a).seconds for n, a in actions.items() if a != "keep")


def evaluate(problem: ActivationProblem, actions: Mapping[str, Action], solver: str,
             **details: Any) -> Decision:
    """A :class:`Decision` for ``actions``, with its predicted peak, time and feasibility."""
    peak = peak_bytes(problem, actions)
    chosen = {n: a for n, a in actions.items() if a != "keep"}
    return Decision(actions=chosen, peak_bytes=peak,
                    added_seconds=added_seconds(problem, actions),
                    feasible=peak <= problem.budget_bytes, solver=solver, details=details)
