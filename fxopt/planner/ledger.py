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
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BudgetLedger", "GraphShare"]


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
