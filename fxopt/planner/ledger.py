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
- a graph whose floor is above its share keeps its floor (warned, as for one graph), and
  the graphs after it pay for the excess out of their own shares.

So after each compilation the graphs compiled so far keep at most ``f`` x their plain
bytes, unless the floors of all of them together are above it. What this cannot do is
give an earlier graph bytes a later one would leave unused: the first graph gets ``f`` of
its own. Graphs compiled later (a recompilation for new shapes, a graph first reached in
a later step) join the ledger like any other, with their plain bytes added to the total.

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

from dataclasses import dataclass, field

from fxopt.planner.solvers.fraction import SavedBytesProblem, solve_fraction

__all__ = ["BudgetLedger", "GraphShare", "split_by_frontiers"]


@dataclass(frozen=True)
class GraphShare:
    """One planned graph in the ledger: its plain saved bytes, its share of the budget and
    the bytes its plan keeps (all predicted)."""

    graph: str
    plain_bytes: int
    share_bytes: int
    kept_bytes: int


@dataclass
class BudgetLedger:
    """The graphs of one model planned under a fraction budget, in compilation order."""

    shares: list[GraphShare] = field(default_factory=list)

    def share_for(self, fraction: float, plain_bytes: int) -> int:
        """The saved bytes the next graph (``plain_bytes`` with everything kept) may keep."""
        plain = sum(s.plain_bytes for s in self.shares) + plain_bytes
        kept = sum(s.kept_bytes for s in self.shares)
        return max(0, int(fraction * plain) - kept)

    def record(self, graph: str, plain_bytes: int, share_bytes: int, kept_bytes: int) -> None:
        self.shares.append(GraphShare(graph, plain_bytes, share_bytes, kept_bytes))

    @property
    def plain_bytes(self) -> int:
        return sum(s.plain_bytes for s in self.shares)

    @property
    def kept_bytes(self) -> int:
        return sum(s.kept_bytes for s in self.shares)


def split_by_frontiers(problems: list[SavedBytesProblem], fraction: float) -> list[int]:
    """Each graph's share of ``fraction`` x the plain saved bytes of all ``problems``, from
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
    left = int(fraction * sum(p.plain_bytes for p in problems)) - sum(p[0][0] for p in paths)
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
