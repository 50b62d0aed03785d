"""swap_recompute's post-partition half: where each swapped activation's prefetch starts.

The joint-stage pass inserts each swap's ``fxopt::swap_prefetch_start`` with the backward
node it must be issued before (as many steps ahead of the first use as the roofline says
the copy needs). The partitioner may reorder the backward, so once the backward exists
this pass moves each start back to that place
(:func:`fxopt.passes.swap_recompute.apply.place_prefetches`), and pins each start and
wait there by an ordering argument (``after``), which Inductor's scheduler, free to hoist
a call whose inputs are ready, must respect. A swap whose offload the partitioner ran in
the backward (saving the device tensor) is undone first
(:func:`~fxopt.passes.swap_recompute.apply.undo_backward_offloads`). It is registered under
swap_recompute's flag and default, so it runs whenever swap_recompute does, and leaves a
backward without swaps unchanged.
"""

from __future__ import annotations

import torch.fx as fx

from fxopt.passes.base import PassContext, PassResult, Verdicts
from fxopt.passes.swap_recompute.apply import place_prefetches, undo_backward_offloads

__all__ = ["swap_prefetch"]


def swap_prefetch(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    undone = undo_backward_offloads(gm)
    moved, pinned = place_prefetches(gm)
    verdicts = Verdicts()
    for name in undone:
        verdicts.decline(name, "swap undone: the partitioner runs its offload in the backward "
                               "and saves the device tensor (kept, no copies)")
    if moved:
        verdicts.match("prefetch_start_moved", count=moved)
    if pinned:
        verdicts.match("prefetch_call_pinned", count=pinned)
    return PassResult(gm, bool(undone) or pinned > 0, verdicts)
