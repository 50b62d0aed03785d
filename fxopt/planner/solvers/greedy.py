"""A greedy solver for the saved-activation problem: the MILP's fallback, and DELTA's rules.

Two modes share one loop (look at the step where the predicted peak is, take the cheapest
way of freeing bytes there, repeat):

- ``mode="peak"`` (the default, the MILP's fallback, described below);
- ``mode="delta"``: the DELTA-style heuristic (``swap_recompute`` with ``planner=False``),
  a *filter* and a *director*; the paper's exact rules are not public, so these are
  fxopt's own. The filter offers the tensors not decided yet, not read by a chosen
  recompute, with a choice whose window covers the peak step and whose ``requires`` are all
  kept (a large tensor with a long gap between its last forward use and first backward
  use covers many steps, so it passes the filter at more peaks). The director takes the
  lowest ``seconds / nbytes``; ties go to the larger tensor, then to recompute over swap
  (recomputing moves nothing over the host link), then to the name. A decision is never
  revisited and no sweep undoes one, so the sequence of choices does not depend on the
  budget (it only says when to stop), every choice lowers the timeline pointwise, and a
  lower budget never gives a higher predicted peak. ``details["order"]`` is the sequence.

In the default mode it runs where the MILP cannot (scipy missing, a problem above its size
limit, a time limit hit with no solution) and repairs an MILP answer that floating-point tolerance
left a few bytes over the budget. Each round looks at the step where the predicted peak
is and takes the cheapest way, in added seconds per byte, of freeing bytes there: a
(tensor, choice) whose window holds that step, whose required tensors are kept and which
no other chosen recompute reads, or a switch of a tensor already not kept to another of its
choices that frees that step (priced by the difference in seconds). It stops when the
peak is within budget or nothing frees bytes at the peak step any more (then the answer is
infeasible, at the lowest peak it reached). A last sweep undoes choices, most expensive
first, that the budget does not need.

Cost: one round is O(steps + choices) with numpy; at most two rounds per
(tensor, choice) pair.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fxopt.planner.activations import (
    Action,
    ActivationProblem,
    Decision,
    SavedActivation,
    evaluate,
    improve_overlap,
)

__all__ = ["GREEDY_MODES", "solve_greedy"]

GREEDY_MODES = ("peak", "delta")
_ACTION_RANK = {"recompute": 0, "swap": 1}


def solve_greedy(problem: ActivationProblem, *, start: Mapping[str, Action] | None = None,
                 mode: str = "peak", **details: object) -> Decision:
    """Greedy actions for ``problem``, starting from ``start`` (absent names are kept);
    ``mode`` is one of :data:`GREEDY_MODES` (module doc)."""
    if mode not in GREEDY_MODES:
        raise ValueError(f"fxopt: greedy mode {mode!r} is not one of {GREEDY_MODES}")
    if mode == "delta":
        return _solve_delta(problem)
    state = _State(problem, dict(start or {}))
    budget = problem.budget_bytes
    best_peak, best_round, moves = state.current.max(initial=0), 0, []
    for _ in range(2 * len(state.pairs) + 1):  # a switch can undo an earlier one: bound it
        timeline = state.current
        if timeline.size == 0 or timeline.max() <= budget:
            break
        step = int(timeline.argmax())
        candidate = state.best_candidate(step)
        if candidate is None:
            break
        state.apply(*candidate)
        moves.append(candidate)
        if state.current.max() < best_peak:
            best_peak, best_round = state.current.max(), len(moves)
    if state.current.max(initial=0) > max(best_peak, budget):
        # A switch raised steps outside the one it freed: go back to the lowest peak.
        state = _State(problem, dict(start or {}))
        for move in moves[:best_round]:
            state.apply(*move)
    state.undo_unneeded(budget)
    return improve_overlap(problem, evaluate(problem, state.actions, "greedy", **details))


def _solve_delta(problem: ActivationProblem) -> Decision:
    state = _State(problem, {})
    order: list[str] = []
    while state.current.size and state.current.max() > problem.budget_bytes:
        candidate = state.best_candidate(int(state.current.argmax()), delta=True)
        if candidate is None:
            break
        state.apply(*candidate)
        order.append(candidate[0].name)
    return evaluate(problem, state.actions, "delta", order=order)


class _State:
    """The chosen actions and their timeline, updated in place; the (tensor, choice) pairs
    as numpy arrays so that a round's search is vectorised."""

    def __init__(self, problem: ActivationProblem, actions: dict[str, Action]) -> None:
        self.problem = problem
        self.acts = problem.by_name()
        index = {a.name: i for i, a in enumerate(problem.activations)}
        pairs = [(index[a.name], c) for a in problem.activations for c in a.choices]
        self.owner = np.array([i for i, _ in pairs], dtype=np.int64)
        self.start = np.array([c.window[0] for _, c in pairs], dtype=np.int64)
        self.end = np.array([c.window[1] for _, c in pairs], dtype=np.int64)
        nbytes = np.array([a.nbytes for a in problem.activations], dtype=np.int64)
        self.pair_bytes = nbytes[self.owner] if pairs else np.zeros(0, dtype=np.int64)
        self.seconds = np.array([c.seconds for _, c in pairs], dtype=np.float64)
        self.pairs = pairs
        self.index = index
        count = len(problem.activations)
        self.taken = np.zeros(count, dtype=bool)   # not kept
        # The chosen choice of each taken tensor: its window and seconds.
        self.cur_start = np.zeros(count, dtype=np.int64)
        self.cur_end = np.zeros(count, dtype=np.int64)
        self.cur_seconds = np.zeros(count, dtype=np.float64)
        self.pinned = np.zeros(len(problem.activations), dtype=np.int64)  # read by recomputes
        self.current = np.asarray(problem.live_bytes, dtype=np.int64).copy()
        self.actions: dict[str, Action] = {}
        for name, action in actions.items():
            if action != "keep":
                self.apply(self.acts[name], action)

    def best_candidate(self, step: int, *, delta: bool = False
                       ) -> tuple[SavedActivation, Action] | None:
        """The cheapest (tensor, action) that frees bytes at ``step``: a kept tensor's choice,
        or (not in the ``delta`` mode) a not-kept tensor's other choice when its current one
        leaves ``step`` resident."""
        if not self.pairs:
            return None
        owners = self.owner
        covers = (self.start <= step) & (step < self.end)
        decided = self.taken if delta else (
            self.taken & (self.cur_start <= step) & (step < self.cur_end))
        mask = covers & ~decided[owners] & (self.pinned[owners] == 0) & (self.pair_bytes > 0)
        rate = (self.seconds - self.cur_seconds[owners]) / np.maximum(self.pair_bytes, 1)
        # Cheapest seconds per freed byte; ties: more bytes, then problem order, or in the
        # delta mode recompute first, then the name (lexsort is stable and sorts by its last
        # key first).
        if delta:
            names = np.argsort(np.argsort([self.problem.activations[i].name
                                           for i, _ in self.pairs], kind="stable"))
            actions = np.array([_ACTION_RANK[c.action] for _, c in self.pairs])
            order = np.lexsort((names, actions, -self.pair_bytes, rate))
        else:
            order = np.lexsort((-self.pair_bytes, rate))
        for k in order[mask[order]]:
            owner, choice = self.pairs[k]
            if not any(self.taken[self.index[dep]] for dep in choice.requires):
                return self.problem.activations[owner], choice.action
        return None

    def _shift(self, act: SavedActivation, action: Action, sign: int) -> None:
        choice = act.choice(action)
        start, end = choice.window
        self.current[start:end] -= sign * act.nbytes
        i = self.index[act.name]
        self.taken[i] = sign > 0
        self.cur_start[i], self.cur_end[i] = start, end
        self.cur_seconds[i] = choice.seconds if sign > 0 else 0.0
        for dep in choice.requires:
            self.pinned[self.index[dep]] += sign

    def apply(self, act: SavedActivation, action: Action) -> None:
        if act.name in self.actions:
            self._shift(act, self.actions[act.name], -1)
        self._shift(act, action, +1)
        self.actions[act.name] = action

    def undo_unneeded(self, budget: int) -> None:
        if self.current.max(initial=0) > budget:
            return
        order = sorted(self.actions, key=lambda n: -self.acts[n].choice(self.actions[n]).seconds)
        for name in order:
            act, action = self.acts[name], self.actions.pop(name)
            self._shift(act, action, -1)
            start, end = act.choice(action).window
            if end > start and self.current[start:end].max() > budget:
                self._shift(act, action, +1)
                self.actions[name] = action
