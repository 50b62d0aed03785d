"""fuse_rnn's cost-model decision (issue 30.2), on the CPU with a CUDA pass context and the
H100 profile: fuse_rnn="auto" leaves the GPU table's nn.LSTM to cuDNN (predicted faster)
and says so with the predicted numbers, fuse_rnn=True fuses it (its sequence ops) with a
warning naming the slowdown, cells are fused either way (in the code generator's form), and
off CUDA nothing changes."""

import importlib
import warnings

import pytest
import torch
from fuse_rnn_helpers import dynamo_graph, run_fuse_rnn
from torch import nn

from fxopt.config import Options
from fxopt.explain import _plan_rows
from fxopt.passes import GraphKind, PassContext, Stage
from fxopt.planner.hardware import KNOWN_GPUS

choice = importlib.import_module("fxopt.passes.fuse_rnn.choice")
graph = importlib.import_module("fxopt.passes.fuse_rnn.graph")


@pytest.fixture
def h100(monkeypatch):
    monkeypatch.setattr(choice, "profile_for", lambda device: KNOWN_GPUS["H100"])


def _table_lstm():
    """The GPU table's nn.LSTM (512 -> 1024, 2 layers) at batch 32 x 128 steps."""
    return nn.LSTM(512, 1024, num_layers=2, batch_first=True), torch.randn(32, 128, 512)


@pytest.mark.parametrize("codegen", ["inductor", "fx"])
def test_auto_leaves_the_tables_lstm_to_cudnn_and_says_why(h100, codegen):
    """The sequence ops (the same op under either code generator) launch 4 kernels per
    layer-step from Python: host-bound, predicted 2.6x cuDNN's call alone (its C++ loop
    launches as fast as the device runs them)."""
    module, x = _table_lstm()
    result = run_fuse_rnn(dynamo_graph(module, x), "cuda", fuse_rnn="auto", codegen=codegen)
    assert not result.modified
    (declined,) = result.verdicts.reasons()
    assert declined.startswith("lstm_module: left to cuDNN: cuDNN predicted ")
    (priced,) = result.stats["cost_model"]
    assert priced["keep_library"] and priced["hardware"] == "H100"
    assert priced["fused_ms"] > 2.5 * priced["library_ms"]
    (row,) = _plan_rows(result.stats)
    assert "cuDNN predicted" in row and "cuDNN faster" in row


def test_library_rnn_takes_the_call_cudnn_keeps(h100):
    """Without a budget too: else AOTAutograd would decompose the call into per-step ops.
    The call runs once, as eager's (recompute_rnn's second forward only under a budget:
    tests/passes/library_rnn)."""
    from fxopt.passes import get_pass
    from fxopt.passes.library_rnn import library_rnn

    module, x = _table_lstm()
    gm = dynamo_graph(module, x)
    run_fuse_rnn(gm, "cuda", fuse_rnn="auto")
    ctx = PassContext(options=Options(fuse_rnn="auto"), stage=Stage.PRE_AUTOGRAD,
                      graph_kind=GraphKind.DYNAMO, graph_name="g0", device=torch.device("cuda"))
    assert get_pass("library_rnn").decide(ctx)[0]
    assert not get_pass("recompute_rnn").decide(ctx)[0]
    result = library_rnn(gm, ctx)
    assert result.modified and result.verdicts.counts() == {"lstm": 1}


def test_true_still_fuses_it_warning_of_the_predicted_slowdown(h100):
    module, x = _table_lstm()
    with pytest.warns(UserWarning, match=r"fuse_rnn=True fuses the RNN call .* 2.6x slower; "
                                         r"fuse_rnn='auto' leaves"):
        result = run_fuse_rnn(dynamo_graph(module, x), "cuda", fuse_rnn=True)
    assert result.modified and result.verdicts.counts() == {"lstm_module": 1}
    sequences = [n for n in result.graph_module.graph.nodes
                 if n.target is torch.ops.fxopt.lstm_sequence.default]
    assert len(sequences) == 2   # one per layer


def test_cells_are_fused_under_auto_on_cuda(h100):
    cell = nn.LSTMCell(16, 32)

    def loop(x):
        h = c = x.new_zeros(x.shape[1], 32)
        for t in range(x.shape[0]):
            h, c = cell(x[t], (h, c))
        return h

    for codegen, fusible in (("inductor", True), ("fx", False)):
        gm = dynamo_graph(loop, torch.randn(6, 4, 16))
        result = run_fuse_rnn(gm, "cuda", fuse_rnn="auto", codegen=codegen)
        assert result.modified and "cost_model" not in result.stats
        assert result.verdicts.count >= 1
        cell_target = graph.CELLS["lstm"][fusible]
        assert sum(n.target is cell_target for n in gm.graph.nodes) == 6


def test_off_cuda_auto_fuses_as_before_without_pricing():
    module = nn.LSTM(8, 16, num_layers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = run_fuse_rnn(dynamo_graph(module, torch.randn(5, 3, 8)), fuse_rnn="auto")
    assert result.modified and "cost_model" not in result.stats


def test_the_option_takes_auto_and_refuses_other_strings():
    from fxopt.config import resolve

    assert resolve({"fuse_rnn": " Auto "}).fuse_rnn == "auto"
    with pytest.raises(TypeError, match="'fuse_rnn' must be True, False, None or 'auto'"):
        resolve({"fuse_rnn": "fast"})
