"""The tempo pass under ``codegen="inductor"``: each kind of site is rewritten into its
aten-only form (stats ``form == "fusible"``), which Inductor compiles with no fallback
(strict), outputs and every gradient equal eager's, no graph it compiles waits for the host
(the norms' zero-gamma guard is decided on the device), and what autograd keeps for backward
after Inductor's partitioner is tempo's cut: the output and the packed mask (GELU), the
output, rstd and the guarded columns (norms), S (or what S is recomputed from) and the
packed mask (attention); never the input or a dense mask. The custom-op form's tests are
tests/passes/tempo/test_tempo.py."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxopt
from fxopt.analysis import measure_saved_bytes
from fxopt.analysis.host_sync import graph_syncs
from fxopt.kernels.tempo.bitmask import packed_size
from fxopt.kernels.tempo.norm import guard_capacity
from fxopt.passes.torch_calls import symbolic_float
from fxopt.testing import TEMPO_TOLERANCES, assert_same_as_eager

TEMPO_INDUCTOR = {"tempo": True, "codegen": "inductor", "strict": True}
ROWS, DIM = 15, 37  # a Sandwich's middle sees [3, 5, 37]


class Sandwich(nn.Module):
    """Linear -> ``middle`` -> Linear: the second Linear keeps the middle's output."""

    def __init__(self, middle):
        super().__init__()
        self.fc1, self.middle, self.fc2 = nn.Linear(13, DIM), middle, nn.Linear(DIM, 11)

    def forward(self, x):
        return self.fc2(self.middle(self.fc1(x)))


class Attention(nn.Module):
    """dropout(softmax(q k^T)) @ v with q, k, v from Linears."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 13, 3, 8).unbind(2)
        return F.dropout((q @ k.transpose(-2, -1)).softmax(-1), 0.1, training=True) @ v


_Y = 4 * ROWS * DIM  # an fp32 middle output
_NORM_KEEPS = _Y + 4 * ROWS + 4 * ROWS * guard_capacity(DIM)  # y, rstd, guarded x_hat


# Inductor's partitioner may keep the scores and softmax's row max and sum (2 fp32 per row:
# 8 * 26 bytes here) and recompute S in the backward, as it does without tempo (measured:
# it does here). A dense mask (338 bytes bool) or the dropout output (1352) would not fit in
# this slack.
_SOFTMAX_STATS = 8 * 2 * 13


@pytest.mark.parametrize("build, kind, keeps, slack", [
    pytest.param(lambda: Sandwich(nn.GELU()), "gelu", _Y + packed_size(ROWS * DIM), 0,
                 id="gelu"),
    pytest.param(lambda: Sandwich(nn.LayerNorm(DIM)), "layer_norm", _NORM_KEEPS, 0,
                 id="layer_norm"),
    pytest.param(lambda: Sandwich(nn.RMSNorm(DIM)), "rms_norm", _NORM_KEEPS, 0, id="rms_norm"),
    pytest.param(Attention, "attention",
                 # the Linear's output [2, 13, 24] (q, k, v are its views) and S and the mask
                 4 * 2 * 13 * 24 + 4 * 2 * 13 * 13 + packed_size(2 * 13 * 13),
                 _SOFTMAX_STATS, id="attention"),
])
def test_fusible_form_matches_eager_and_keeps_tempos_cut(build, kind, keeps, slack):
    torch.manual_seed(0)
    model = build()
    for p in model.parameters():  # a zero in gamma: the norms' guard is exercised
        with torch.no_grad():
            p.view(-1)[3] = 0.0
    x = torch.randn(3, 5, 13) if kind != "attention" else torch.randn(2, 13, 8)
    # Eager's dropout masks: Inductor calls aten's random ops (tests/test_codegen_inductor.py)
    with torch._inductor.config.patch(fallback_random=True):
        comparison = assert_same_as_eager(model, (x,), TEMPO_INDUCTOR,
                                          tolerances=TEMPO_TOLERANCES)
        (record,) = [r for r in comparison.passes if r.name == "tempo" and r.fired]
        assert record.verdicts.counts() == {kind: 1} and record.stats["form"] == "fusible"
        assert [g.every_fallback() for g in comparison.graphs] == [[]]
        (graphs,) = [g.graphs for g in comparison.graphs]
        assert [s for kind in ("forward", "backward") for s in graph_syncs(graphs[kind])] == []
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=fxopt.backend(**TEMPO_INDUCTOR))
        saved = measure_saved_bytes(lambda: compiled(x), exclude=[*model.parameters(), x])
    assert keeps <= saved.bytes <= keeps + slack


class _RmsNormFormula(nn.Module):
    """Llama's RMSNorm as transformers writes it, eps an attribute."""

    def __init__(self, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.rand(DIM) + 0.5), eps

    def forward(self, x):
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps))


def test_a_formula_whose_eps_changed_between_calls_keeps_it_symbolic():
    """The second model's eps reaches the graph as a symbolic float (torch's
    ``specialize_float=False``); the fusible form computes with it as plain aten ops do,
    so Inductor compiles the graph once, for every eps (tests/passes/tempo/test_tempo.py
    has the custom-op form, which specializes it)."""
    torch.manual_seed(0)
    for eps in (1e-5, 1e-3):
        comparison = assert_same_as_eager(Sandwich(_RmsNormFormula(eps)),
                                          (torch.randn(3, 5, 13),), TEMPO_INDUCTOR,
                                          tolerances=TEMPO_TOLERANCES)
        (record,) = [r for r in comparison.passes if r.name == "tempo"]
        assert record.verdicts.counts() == {"rms_norm": 1} and record.stats["form"] == "fusible"
    (graph,) = comparison.graphs
    assert any(symbolic_float(node) for node in graph.graphs["dynamo"].graph.nodes)
