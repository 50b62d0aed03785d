"""One fraction budget for a model with graph breaks: a ledger of its graphs' shares.

A fraction ``f`` bounds the bytes one step keeps for backward to ``f`` x plain autograd's,
summed over every graph of the model, not ``f`` of each graph. Dynamo compiles the graphs
one at a time, in the order the first step reaches them, and a compiled graph's plan
cannot change afterwards; so the budget is split as they come:

- graph ``k``'s share is what the budget leaves once the graphs before it are counted:
  ``f x (plain bytes of graphs 1..k) - (bytes graphs 1..k-1 keep)``, at least 0;
- within its share, :func:`fxopt.planner.plan_step` takes the fastest state of graph
  ``k``'s time-vs-saved-bytes path, so the bytes that are left go to the graph being
  planned, where each buys the most time (cheapest bytes first), and what an earlier
  graph left unused (its path moves in steps of whole tensors) is the next one's;
- a graph whose floor is above its share, where the floors of all the graphs so far fit
  ``f`` x their plain bytes, gets its floor's share, and earlier graphs give the
  difference back: each of them, first compiled first, is given a smaller share (down to
  its floor) and planned again (recompiled) at its next call (:meth:`BudgetLedger.
  rebalance`, :class:`Replannable`, which the backend wraps each budgeted graph in; the
  step that compiled the late graph ran the earlier graphs' first plans, so the budget
  holds from the next step). A loss graph after a graph break is such a graph: its
  logits are its input, kept whatever it recomputes, and only the graphs before it can
  make room;
- where even the floors do not fit, the graph keeps its floor (warned, or
  ``InfeasibleBudget`` under ``strict``, as for one graph), and the graphs after it pay
  for the excess out of their own shares.

So from the step after each compilation the graphs compiled so far keep at most ``f`` x
their plain bytes, unless the floors of all of them together are above it. What this
cannot do is give an earlier graph bytes a later one would leave unused: the first graph
gets ``f`` of its own. A graph first reached in a later step joins the ledger like any
other, with its plain bytes added to the total. A recompilation of a graph already in it
(the same Dynamo frame, compiled again for new guards or shapes: transformers'
classification losses set ``config.problem_type`` at the first call, so every such model
recompiles at its second step) runs in place of the earlier compile, never beside it: its
entry takes the earlier one's place (:meth:`BudgetLedger.begin`). Before, it was added, so
the recompiled graph's share was ``f`` of twice its plain bytes less what the first
compile kept: ConvNeXt kept 0.330 of eager's bytes under ``memory_budget=0.3``. Only a
compile that plans a backward replaces an entry (:meth:`BudgetLedger.replace_earlier_compile`):
a validation pass under ``torch.no_grad`` compiles every frame again for inference, and
those graphs, which keep nothing and never run in a training step, leave the training
graphs' entries as they are (they used to clear them, so a training recompile after a
validation pass was given a share that left the other graphs out).

The ledger lives on one :class:`fxopt.Backend` (``torch.compile(model,
backend=fxopt.backend(memory_budget=0.5))``); the string backend ``backend="fxopt"`` makes
a backend per graph, so each graph is then held to ``f`` of its own. ``fxopt plan`` keeps
a ledger over the graphs it captures, in the same order, so it shows the shares
compilation gives.

Where every graph is known at once (``fxopt plan --joint``, which captures the whole step
first), :func:`split_by_frontiers` splits the budget by the graphs' time-vs-saved-bytes
paths instead: every graph starts at its floor and the bytes left go, a step of one
graph's path at a time, where they save the most predicted seconds per byte (the cheapest
bytes first). Compilation replays such a split from the saved plans (``plan=``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fxopt.config import MemoryBudget
from fxopt.planner.solvers.fraction import SavedBytesProblem, solve_fraction

__all__ = ["BudgetLedger", "GraphShare", "Replannable", "split_by_frontiers"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GraphShare:
    """One planned graph in the ledger: its plain saved bytes, its share of the budget and
    the bytes its plan keeps (all predicted)."""

    graph: str
    plain_bytes: int
    share_bytes: int
    kept_bytes: int
    floor_bytes: int = 0
    frame: int | None = None  # Dynamo's frame (None: unknown)
    superseded: bool = False  # compiled again: zeroed, kept at its index for its graph


@dataclass
class BudgetLedger:
    """The graphs of one model planned under a fraction budget, in compilation order.

    ``replans``: earlier graphs can be planned again (the backend's compiled graphs are
    :class:`Replannable`); ``fxopt plan``'s ledger cannot, so it never rebalances.
    ``replan_shares``: entry -> the smaller share it is to be planned again with;
    ``replanning``: the entry being planned again now (its share is set, its entry is
    replaced, not appended); ``frame``: the Dynamo frame of the graph being planned
    (:meth:`begin`)."""

    shares: list[GraphShare] = field(default_factory=list)
    replans: bool = False
    replan_shares: dict[int, int] = field(default_factory=dict)
    replanning: int | None = None
    frame: int | None = None

    def begin(self, frame: int | None) -> None:
        """A graph of Dynamo frame ``frame`` is about to be compiled (for training, or for
        inference, which plans nothing: the entries stay until
        :meth:`replace_earlier_compile`)."""
        self.frame = frame

    def replace_earlier_compile(self) -> None:
        """The graph begun is being planned for a training step: an earlier training
        compile of the same frame no longer runs in the steps that run this one (Dynamo
        runs the newest compile whose guards pass), so its entry stops counting: zeroed and
        marked superseded, kept at its index for the compiled graph that refers to it.
        Nothing to replace while an entry is planned again (:class:`Replannable`)."""
        if self.frame is None or self.replanning is not None:
            return
        for i, entry in enumerate(self.shares):
            if entry.frame == self.frame and not entry.superseded:
                self.shares[i] = GraphShare(entry.graph, 0, 0, 0, frame=entry.frame,
                                            superseded=True)
                self.replan_shares.pop(i, None)

    def share_for(self, budget: MemoryBudget, plain_bytes: int) -> int:
        """The saved bytes the next graph (``plain_bytes`` with everything kept) may keep
        under the fraction ``budget``."""
        if self.replanning is not None:
            return self.replan_shares[self.replanning]
        plain = sum(s.plain_bytes for s in self.shares) + plain_bytes
        kept = sum(s.kept_bytes for s in self.shares)
        return max(0, budget.saved_bytes_bound(plain) - kept)

    def record(self, graph: str, plain_bytes: int, share_bytes: int, kept_bytes: int,
               floor_bytes: int = 0) -> int:
        """Enter a planned graph (or replace the entry being planned again); its index."""
        replanned = self.replanning
        frame = self.frame if replanned is None else self.shares[replanned].frame
        share = GraphShare(graph, plain_bytes, share_bytes, kept_bytes, floor_bytes, frame)
        if replanned is not None:
            self.shares[replanned] = share
            self.replan_shares.pop(replanned, None)
            return replanned
        self.shares.append(share)
        return len(self.shares) - 1

    def rebalance(self, budget: MemoryBudget, plain_bytes: int,
                  floor_bytes: int) -> int | None:
        """The share of a next graph whose floor (``floor_bytes``) is above
        :meth:`share_for`: where the floors of every graph fit the fraction ``budget`` of
        the plain bytes, earlier graphs, first compiled first, are marked to be planned again with
        smaller shares (``replan_shares``, each down to at most its floor) so that the
        next graph's floor fits, and that share is returned; None where the floors do not
        fit (every earlier graph is then planned again at its floor: the model's floor's
        plan, as for one graph below its floor) or earlier graphs cannot be planned again."""
        if not self.replans or self.replanning is not None:
            return None
        bound = budget.saved_bytes_bound(self.plain_bytes + plain_bytes)
        if sum(s.floor_bytes for s in self.shares) + floor_bytes > bound:
            # below the model's floor: its floor's plan, every earlier graph at its floor
            self.replan_shares.update({i: s.floor_bytes for i, s in enumerate(self.shares)
                                       if s.kept_bytes > s.floor_bytes})
            return None
        excess = floor_bytes - (bound - sum(self._promised(i) for i in range(len(self.shares))))
        for i, entry in enumerate(self.shares):
            give = min(self._promised(i) - entry.floor_bytes, excess)
            if give > 0:
                self.replan_shares[i] = self._promised(i) - give
                excess -= give
                log.info("fxopt: memory_budget: graph %s is to be planned again within "
                         "%d bytes (it keeps %d), making room for a later graph's floor",
                         entry.graph, self.replan_shares[i], entry.kept_bytes)
        return bound - sum(self._promised(i) for i in range(len(self.shares)))

    def _promised(self, entry: int) -> int:
        """What an entry keeps, or its smaller share where it is to be planned again."""
        return self.replan_shares.get(entry, self.shares[entry].kept_bytes)

    @property
    def graphs(self) -> int:
        """The graphs a training step runs: entries not superseded by a recompile."""
        return sum(not s.superseded for s in self.shares)

    @property
    def plain_bytes(self) -> int:
        return sum(s.plain_bytes for s in self.shares)

    @property
    def kept_bytes(self) -> int:
        return sum(s.kept_bytes for s in self.shares)


class Replannable:
    """A compiled graph of the model's ledger entry ``entry`` that is compiled again,
    by ``recompile(inputs)`` with the call's inputs, at its first call after the ledger
    gives the entry a smaller share (:meth:`BudgetLedger.rebalance`). Dynamo calls it as
    it calls what a backend returns: with the graph's inputs as arguments."""

    def __init__(self, compiled: Callable[..., Any], ledger: BudgetLedger, entry: int,
                 recompile: Callable[[list[Any]], Callable[..., Any]]) -> None:
        self.compiled = compiled
        self.ledger = ledger
        self.entry = entry
        self.recompile = recompile

    def __call__(self, *args: Any) -> Any:
        if self.entry in self.ledger.replan_shares:
            try:
                self.compiled = self.recompile(list(args))
            finally:  # planned again, or failed (recompile warned or raised): once
                self.ledger.replan_shares.pop(self.entry, None)
        return self.compiled(*args)


def split_by_frontiers(problems: list[SavedBytesProblem], budget: MemoryBudget) -> list[int]:
    """Each graph's share of the fraction ``budget`` of the plain saved bytes of all
    ``problems``, from
    their search paths (:func:`fxopt.planner.solvers.fraction.solve_fraction`): from every
    graph's floor, repeatedly move one graph along its path to the state that saves the
    most seconds per byte added and still fits; the shares are the states' kept bytes
    (the floors, where even they do not fit)."""
    paths = []
    for problem in problems:
        path = solve_fraction(problem, 0).path
        floor = min(range(len(path)), key=lambda i: (path[i][0], path[i][1]))
        paths.append(path[floor:])
    at = [0] * len(paths)
    left = (budget.saved_bytes_bound(sum(p.plain_bytes for p in problems))
            - sum(p[0][0] for p in paths))
    while True:
        best = None  # (seconds saved per byte, graph, state)
        for graph, path in enumerate(paths):
            kept, seconds = path[at[graph]]
            for state in range(at[graph] + 1, len(path)):
                added, saved = path[state][0] - kept, seconds - path[state][1]
                if added <= left and saved > 0:
                    rate = saved / max(added, 1)
                    if best is None or rate > best[0]:
                        best = (rate, graph, state)
        if best is None:
            return [path[i][0] for path, i in zip(paths, at, strict=True)]
        _, graph, state = best
        left -= paths[graph][state][0] - paths[graph][at[graph]][0]
        at[graph] = state
