"""A byte budget with recompute on a transformer block: the peak the plan predicts is within
5% of the peak measured when the partitioned forward and backward graphs run on real tensors
(``run_step_graphs``: what fxopt's fx code generation executes), where chains of recomputed
tensors are rebuilt from other recomputed tensors in the backward. Bounds at 90% and 85%
of the keep-all peak (1,320,704 bytes), both reachable. Measured on this block: predicted
1,185,536 and 1,107,584 bytes against 1,185,536 and 1,077,888 (0% and +2.8%). Not 80%:
whether a plan reaches it depends on how far the time-limited MILP gets on a loaded machine.
"""

import pytest
import torch
from models import Block

from fxopt.analysis import measure_peak_memory, run_step_graphs
from fxopt.compiler import Backend

TOLERANCE = 0.05  # issue 15: the recompute memory model's required accuracy


def _step(budget):
    """The measured peak of the compiled step's graphs, and swap_recompute's record."""
    torch.manual_seed(0)
    # noop_dropout off: the block's dropout(p=0) clone stays, as when the numbers above were
    # measured; without it the lowest reachable peak is 93% of the keep-all one
    options = {"rewrite_limit": {"noop_dropout": 0}}
    backend = Backend(options if budget is None else {**options, "memory_budget": budget})
    torch.compile(Block(dim=32, heads=4), backend=backend)(torch.randn(4, 64, 32)).sum().backward()
    torch._dynamo.reset()
    (graph,) = backend.graphs
    fw, bw = graph.graphs["forward"], graph.graphs["backward"]
    # values do not change the bytes: random primals of the placeholders' shapes
    primals = [torch.randn(p.meta["val"].shape) for p in fw.graph.nodes if p.op == "placeholder"]
    measured = measure_peak_memory(lambda: run_step_graphs(fw, bw, primals),
                                   baseline_tensors=primals)
    return measured.peak_bytes, graph.pass_records("swap_recompute")


@pytest.mark.parametrize("fraction", [0.9, 0.85])
def test_predicted_peak_within_5_percent_of_measured(fraction):
    keep_all, _ = _step(None)
    bound = int(fraction * keep_all)
    measured, (record,) = _step(bound)
    assert record.fired and record.verdicts.matched["recompute"].count > 0
    predicted = record.stats["plan"]["predictions"]["peak_bytes"]
    assert predicted == pytest.approx(measured, rel=TOLERANCE)
    assert record.stats["feasible"] and measured <= bound
