"""The DELTA-style decider: a filter and a director, as a pure function on plain data.

``decide_delta(problem) -> Decision`` has the signature every decider shares
(``Callable[[ActivationProblem], Decision]``; the planner's MILP has the same one), reads
only the :class:`~fxopt.planner.ActivationProblem` and never an fx graph.

DELTA releases tensors chosen by a *filter* and lets a *director* pick swap or recompute
per tensor; the paper's exact rules are not public, so these are fxopt's own:

1. Start from keeping everything. While the predicted peak is above the budget, look at
   the step where the peak is (the first such step).
2. **Filter**: the candidates are the tensors not decided yet, not required by an earlier
   recompute, with a choice whose window covers that step (only those lower this peak) and
   whose ``requires`` are all still kept. A large tensor with a long gap between its last
   forward use and first backward use covers many steps, so it passes the filter at more
   peaks.
3. **Director**: take the candidate choice with the lowest cost per byte freed,
   ``seconds / nbytes``: recompute FLOPs against the copy time that compute cannot hide.
   Ties go to the larger tensor, then to recompute over swap (recomputing moves nothing
   over the host link, which DELTA argues is not always the better first choice), then to
   the name. The tensors a recompute reads are locked as kept.
4. Stop when the peak is within the budget, or when no candidate covers the peak step:
   the plan is then the lowest peak this procedure reaches, and infeasible.

Properties (tested): deterministic; the sequence of choices does not depend on the budget
(the budget only says when to stop) and every choice lowers the timeline pointwise, so a
lower budget never gives a higher predicted peak; a problem that fits needs no action.
"""

from __future__ import annotations

from fxopt.planner import ActivationProblem, Decision, evaluate, timeline_bytes
from fxopt.planner.activations import Action

__all__ = ["decide_delta"]

_ACTION_ORDER = {"recompute": 0, "swap": 1}


def decide_delta(problem: ActivationProblem) -> Decision:
    """Keep, recompute or swap each saved tensor until the predicted peak fits the budget."""
    actions: dict[str, Action] = {}
    locked: set[str] = set()
    order: list[str] = []
    while True:
        timeline = timeline_bytes(problem, actions)
        peak = max(timeline, default=0)
        if peak <= problem.budget_bytes:
            break
        step = timeline.index(peak)
        options = []
        for act in problem.activations:
            if act.name in actions or act.name in locked or act.nbytes <= 0:
                continue
            for choice in act.choices:
                start, end = choice.window
                if start <= step < end and all(r not in actions for r in choice.requires):
                    options.append((choice.seconds / act.nbytes, -act.nbytes,
                                    _ACTION_ORDER[choice.action], act.name, choice))
        if not options:
            break
        *_, name, choice = min(options, key=lambda o: o[:4])
        actions[name] = choice.action
        locked.update(choice.requires)
        order.append(name)
    return evaluate(problem, actions, "delta", order=order)
