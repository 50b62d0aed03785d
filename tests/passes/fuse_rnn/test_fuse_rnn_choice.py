"""fuse_rnn's cost-model decision (issue 30.2), on the CPU with a CUDA pass context and the
H100 profile: fuse_rnn="auto" leaves the GPU table's nn.LSTM to cuDNN (predicted faster)
and says so with the predicted numbers, fuse_rnn=True unrolls it with a warning naming the
slowdown, cells are fused either way (in the code generator's form), and off CUDA nothing
changes."""

import importlib
import warnings

import pytest
import torch
from torch import nn

from fxopt.config import Options
from fxopt.explain import _plan_rows
from fxopt.passes import GraphKind, PassContext, Stage
from fxopt.passes.fuse_rnn import fuse_rnn
from fxopt.planner.hardware import KNOWN_GPUS

choice = importlib.import_module("fxopt.passes.fuse_rnn.choice")
graph = importlib.import_module("fxopt.passes.fuse_rnn.graph")


@pytest.fixture
def h100(monkeypatch):
    monkeypatch.setattr(choice, "profile_for", lambda device: KNOWN_GPUS["H100"])


def _captured(fn, *args):
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True), torch.no_grad():
        torch.compile(fn, backend=capture)(*args)
    return graphs[0]


def _run(gm, device, **options):
    ctx = PassContext(options=Options(**options), stage=Stage.PRE_AUTOGRAD,
                      graph_kind=GraphKind.DYNAMO, graph_name="g0", device=torch.device(device))
    return fuse_rnn(gm, ctx)


def _table_lstm():
    """The GPU table's nn.LSTM (512 -> 1024, 2 layers) at batch 32 x 128 steps."""
    return nn.LSTM(512, 1024, num_layers=2, batch_first=True), torch.randn(32, 128, 512)


@pytest.mark.parametrize("codegen,slower", [("inductor", 1.3), ("fx", 3)])
def test_auto_leaves_the_tables_lstm_to_cudnn_and_says_why(h100, codegen, slower):
    """Unrolled under Inductor (fusible cells) the chain of per-step GEMMs and weight
    gradient accumulations is predicted 1.55x cuDNN's; with the Python cell ops (fx; the
    table measured them under Inductor: 6.6x) the host's 512 op calls 7x."""
    module, x = _table_lstm()
    result = _run(_captured(module, x), "cuda", fuse_rnn="auto", codegen=codegen)
    assert not result.modified
    (declined,) = result.verdicts.reasons()
    assert declined.startswith("lstm_module: left to cuDNN: cuDNN predicted ")
    (priced,) = result.stats["cost_model"]
    assert priced["keep_library"] and priced["hardware"] == "H100"
    assert priced["fused_ms"] > slower * priced["library_ms"]
    (row,) = _plan_rows(result.stats)
    assert "cuDNN predicted" in row and "cuDNN faster" in row


def test_library_rnn_takes_the_call_cudnn_keeps(h100):
    """Without a budget too: else AOTAutograd would decompose the call into per-step ops.
    The call runs once, as eager's (recompute_rnn's second forward only under a budget:
    tests/passes/library_rnn)."""
    from fxopt.passes import get_pass
    from fxopt.passes.library_rnn import library_rnn

    module, x = _table_lstm()
    gm = _captured(module, x)
    _run(gm, "cuda", fuse_rnn="auto")
    ctx = PassContext(options=Options(fuse_rnn="auto"), stage=Stage.PRE_AUTOGRAD,
                      graph_kind=GraphKind.DYNAMO, graph_name="g0", device=torch.device("cuda"))
    assert get_pass("library_rnn").decide(ctx)[0]
    assert not get_pass("recompute_rnn").decide(ctx)[0]
    result = library_rnn(gm, ctx)
    assert result.modified and result.verdicts.counts() == {"lstm": 1}


def test_true_still_unrolls_it_warning_of_the_predicted_slowdown(h100):
    module, x = _table_lstm()
    with pytest.warns(UserWarning, match=r"fuse_rnn=True unrolls the RNN call .* slower; "
                                         r"fuse_rnn='auto' leaves"):
        result = _run(_captured(module, x), "cuda", fuse_rnn=True)
    assert result.modified and result.verdicts.counts() == {"lstm_module": 1}


def test_cells_are_fused_under_auto_on_cuda(h100):
    cell = nn.LSTMCell(16, 32)

    def loop(x):
        h = c = x.new_zeros(x.shape[1], 32)
        for t in range(x.shape[0]):
            h, c = cell(x[t], (h, c))
        return h

    for codegen, fusible in (("inductor", True), ("fx", False)):
        gm = _captured(loop, torch.randn(6, 4, 16))
        result = _run(gm, "cuda", fuse_rnn="auto", codegen=codegen)
        assert result.modified and "cost_model" not in result.stats
        assert result.verdicts.count >= 1
        cell_target = graph.CELLS["lstm"][fusible]
        assert sum(n.target is cell_target for n in gm.graph.nodes) == 6


def test_off_cuda_auto_unrolls_as_before_without_pricing():
    module = nn.LSTM(8, 16, num_layers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = _run(_captured(module, torch.randn(5, 3, 8)), "cpu", fuse_rnn="auto")
    assert result.modified and "cost_model" not in result.stats


def test_the_option_takes_auto_and_refuses_other_strings():
    from fxopt.config import resolve

    assert resolve({"fuse_rnn": " Auto "}).fuse_rnn == "auto"
    with pytest.raises(TypeError, match="'fuse_rnn' must be True, False, None or 'auto'"):
        resolve({"fuse_rnn": "fast"})
