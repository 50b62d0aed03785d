"""fxopt's passes under codegen="inductor" (issue 17): each one that composes with Inductor
trains like eager, fires, and nothing falls back (strict). tempo's ops and the fused RNN
cells reach Inductor in their fusible forms, which it generates itself; fxopt's other ops
as custom ops that it calls as extern kernels.

swap_recompute under a budget with Inductor is tested in
tests/passes/test_swap_recompute.py (test_inductor_codegen_with_min_cut_partitioner);
fuse_elementwise's decline under Inductor in tests/passes/test_fuse_elementwise.py.
"""

import pytest
import torch
from models import MLP, Block
from torch import nn

import fxopt
from fxopt.testing import TEMPO_TOLERANCES, assert_same_as_eager

INDUCTOR = {"codegen": "inductor", "strict": True}


def _no_fallback(comparison):
    assert [g.every_fallback() for g in comparison.graphs] == [[]] * len(comparison.graphs)
    assert all(g.codegen.name == "inductor" for g in comparison.graphs)


@pytest.mark.slow
def test_tempo_with_dropout_under_inductor():
    torch.manual_seed(0)
    # Eager's dropout masks: Inductor calls aten's random ops (tests/test_codegen_inductor.py)
    with torch._inductor.config.patch(fallback_random=True):
        comparison = assert_same_as_eager(Block(dim=32, dropout=0.1).train(),
                                          (torch.randn(2, 9, 32),), {**INDUCTOR, "tempo": True},
                                          tolerances=TEMPO_TOLERANCES)
    assert comparison.fired("tempo")
    _no_fallback(comparison)


class LSTMCellLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(11, 37)

    def forward(self, x, h, c):
        outputs = []
        for t in range(x.shape[0]):
            h, c = self.cell(x[t], (h, c))
            outputs.append(h)
        return torch.stack(outputs), c


def test_fuse_rnn_under_inductor():
    torch.manual_seed(0)
    args = (torch.randn(4, 3, 11), torch.randn(3, 37), torch.randn(3, 37))
    comparison = assert_same_as_eager(LSTMCellLoop(), args, {**INDUCTOR, "fuse_rnn": True})
    assert comparison.fired("fuse_rnn")
    _no_fallback(comparison)


def test_offload_optimizer_under_inductor():
    comparison = assert_same_as_eager(MLP(), (torch.randn(4, 13),),
                                      {**INDUCTOR, "offload_optimizer": True})
    assert comparison.fired("offload_optimizer")
    _no_fallback(comparison)


def test_fuse_elementwise_declines_under_inductor_and_explain_says_so():
    report = fxopt.explain(MLP(), torch.randn(4, 13),
                           options={**INDUCTOR, "fuse_elementwise": True})
    records = [r for r in report.passes if r.name == "fuse_elementwise"]
    assert records and all(r.status == "unchanged" and not r.fired for r in records)
    assert all("inductor" in r.verdicts.declined[0].reason for r in records)
    assert "declined the graph: codegen='inductor' fuses pointwise ops" in str(report)
