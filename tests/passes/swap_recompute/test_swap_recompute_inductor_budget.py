"""A fraction ``memory_budget`` under ``codegen="inductor"``: Inductor's budgeted min-cut
partitions within the graph's share of the budget (swap_recompute's ``BudgetedMinCut``),
the measured saved bytes are within the budget, random ops min-cut recomputes replay their
forward's RNG state (gradients equal eager's: Inductor alone recomputes dropout with a new
mask), and the model's ledger spans graph breaks.

Inductor calls eager's random ops here (``fallback_random``) so masks compare with eager's;
its fused kernels round differently from eager's ops, so gradients agree to fp32 rounding.
"""

import pytest
import torch
import torch.nn.functional as F
from models import seeded_step
from torch import nn

import fxopt

pytestmark = pytest.mark.slow

# Inductor's fused kernels sum in another order than eager's aten ops: fp32 rounding of
# sums over <= 64 terms, relative to the largest gradient entry.
RTOL = torch.finfo(torch.float32).eps * 2**6


class DropoutMLP(nn.Module):
    """Dropout after each Linear, pointwise ops after it: under a low budget min-cut
    recomputes the dropout to avoid saving its mask and output."""

    def __init__(self, graph_break: bool = False) -> None:
        super().__init__()
        self.graph_break = graph_break
        self.a, self.b, self.c = nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.dropout(self.a(x), 0.3, True)
        h = F.gelu(h) * torch.sigmoid(h)
        if self.graph_break:
            torch._dynamo.graph_break()
        h = F.dropout(self.b(h), 0.3, True)
        return self.c(torch.tanh(h) * h).square().mean()


def _assert_close(got, want):
    for a, b in zip(got, want, strict=True):
        assert float((a - b).abs().max()) <= RTOL * float(b.abs().max())


@pytest.mark.parametrize("graph_break", [False, True], ids=["one-graph", "graph-break"])
def test_budget_met_by_inductor_min_cut_with_replayed_dropout(graph_break):
    torch.manual_seed(0)
    model, x = DropoutMLP(graph_break), torch.randn(64, 32)
    eager_loss, eager_grads, plain = seeded_step(model, model, x)
    # with the break, graph 1 keeps its input (graph 0's (64, 64) output, which its Linear
    # saves): the two graphs' floors together are 0.22 of the plain bytes, so 0.3
    budget = 0.3 if graph_break else 0.2
    backend = fxopt.backend(memory_budget=budget, codegen="inductor", strict=True)
    compiled = torch.compile(model, backend=backend)
    with torch._inductor.config.patch(fallback_random=True):
        seeded_step(model, compiled, x)  # compiles
        loss, grads, saved = seeded_step(model, compiled, x)
    assert saved <= budget * plain * 1.05
    _assert_close([loss, *grads], [eager_loss, *eager_grads])
    records = [r for g in backend.graphs for r in g.pass_records("swap_recompute")]
    assert len(records) == (2 if graph_break else 1)
    partitions = [r.stats["inductor"] for r in records if "inductor" in r.stats]
    assert partitions and all(p["partition"] == "inductor min-cut" for p in partitions)
    # min-cut recomputed a dropout: it runs in the backward replaying the forward's state
    backward = backend.graphs[0].graphs["backward"]
    assert any("run_with_rng_state" in str(n.target).lower() or "RunWithRngState" in
               type(n.target).__name__ for n in backward.graph.nodes)
    # the ledger holds what the chosen partitions keep, within the model's budget
    ledger = backend.budget_ledger
    assert [s.kept_bytes for s in ledger.shares][:len(partitions)] == \
        [p["saved_bytes_after"] for p in partitions]
    assert ledger.kept_bytes <= budget * ledger.plain_bytes
