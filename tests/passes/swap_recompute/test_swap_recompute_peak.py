"""A byte budget with recompute on a transformer block: the peak the plan predicts is within
5% of the peak measured when the partitioned forward and backward graphs run on real tensors
(``run_step_graphs``: what fxopt's fx code generation executes), where chains of recomputed
tensors are rebuilt from other recomputed tensors in the backward.

The bounds lie between the keep-all peak and the lowest one a plan reaches (the floor,
from a budget of half the keep-all peak), at 60% and 25% of the way down: torch moves both
ends. torch 2.13 keeps 1,320,704 bytes with the floor at 1,043,072 (79%); torch 2.14's
forward has 4 clones to 2.13's 6 and keeps 1,077,888, floor 1,006,208 (93%), so fixed
fractions of 90% and 85%, which these tests used, lay below its floor. Measured on both:
every plan's prediction equal to its measured peak. Not closer to the floor than 25%:
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


@pytest.fixture(scope="module")
def keep_all_and_floor():
    """The measured keep-all peak, and the floor: the measured peak of the plan that half
    the keep-all peak gets (warned: below what any plan reaches), which its prediction
    equals."""
    keep_all, _ = _step(None)
    with pytest.warns(UserWarning, match="the lowest predicted peak reachable is"):
        floor, (record,) = _step(keep_all // 2)
    assert record.stats["peak_after"] == pytest.approx(floor, rel=TOLERANCE)
    assert floor < keep_all
    return keep_all, floor


@pytest.mark.parametrize("share", [0.6, 0.25])
def test_predicted_peak_within_5_percent_of_measured(share, keep_all_and_floor):
    keep_all, floor = keep_all_and_floor
    bound = int(floor + share * (keep_all - floor))
    measured, (record,) = _step(bound)
    assert record.fired and record.verdicts.matched["recompute"].count > 0
    predicted = record.stats["plan"]["predictions"]["peak_bytes"]
    assert predicted == pytest.approx(measured, rel=TOLERANCE)
    assert record.stats["feasible"] and measured <= bound
