"""fuse_rnn's form of whole ``nn.LSTM`` / ``nn.GRU`` calls: per layer and direction one
input-projection GEMM and one sequence op, so the graph is the same at any sequence length
(the unrolled form grew a node group per step, and its compile time with it), a symbolic
length compiles once, and what the backward keeps is the sequence ops' buffers, counted
exactly.
"""

import copy

import pytest
import torch
from fuse_rnn_helpers import dynamo_graph, run_fuse_rnn
from models import RNNLanguageModel, rnn_tokens
from torch import nn

from fxopt.analysis import measure_saved_bytes
from fxopt.compiler import Backend
from fxopt.testing import assert_same_as_eager

B, H, IN = 3, 13, 7
ON = {"fuse_rnn": True, "strict": True}
SEQUENCE_OPS = {torch.ops.fxopt.lstm_sequence.default, torch.ops.fxopt.gru_sequence.default}


def _fused_graph(module, steps):
    gm = dynamo_graph(module, torch.randn(B, steps, IN))
    assert run_fuse_rnn(gm, **ON).modified
    return gm


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_the_graph_does_not_grow_with_the_sequence(mode):
    module = (nn.LSTM if mode == "lstm" else nn.GRU)(IN, H, num_layers=2, batch_first=True,
                                                     bidirectional=True)
    short, long = (_fused_graph(module, steps) for steps in (3, 40))
    assert len(short.graph.nodes) == len(long.graph.nodes)
    targets = [n.target for n in long.graph.nodes]
    assert sum(t in SEQUENCE_OPS for t in targets) == 4     # 2 layers x 2 directions
    assert torch.lstm not in targets and torch.gru not in targets


def _assert_step_matches(eager, fused, compiled, x):
    """One forward and backward of ``compiled`` (over ``fused``, a copy of ``eager``) equal
    to eager's: the output sequence and every parameter's gradient (accumulated)."""
    expected, actual = eager(x)[0], compiled(x)[0]
    torch.testing.assert_close(actual, expected)
    weights = torch.randn_like(expected)
    (expected * weights).sum().backward()
    (actual * weights).sum().backward()
    for (name, p), q in zip(eager.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_a_symbolic_sequence_length_compiles_once_and_matches_eager():
    """The input's length marked dynamic: one graph serves both lengths, fused. (Dynamo
    itself specializes the length of an ``nn.GRU`` call, and of an ``nn.LSTM`` whose input
    is computed from a sliced input, e.g. an LM's ``embed(tokens[:, :-1])``, with fuse_rnn
    off too, in torch 2.13: the rewrite then sees ints.)"""
    torch.manual_seed(0)
    eager = nn.LSTM(IN, H, num_layers=2, batch_first=True)
    fused = copy.deepcopy(eager)
    backend = Backend(ON)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True):
        compiled = torch.compile(fused, backend=backend)
        for steps in (6, 11):
            x = torch.randn(B, steps, IN)
            torch._dynamo.mark_dynamic(x, 1)
            _assert_step_matches(eager, fused, compiled, x)
    (record,) = backend.graphs
    (fired,) = [r for r in record.passes if r.name == "fuse_rnn"]
    assert fired.fired and fired.verdicts.counts() == {"lstm_module": 1}


def test_the_backward_keeps_the_sequence_ops_buffers():
    """One layer, fp32, no initial state given: the op keeps every step's activated gates
    (4H), cell state and output (the next step's hidden input for W_hh's gradient), and the
    zero initial states; the input projection's GEMM keeps the input (excluded here, the
    caller's). Autograd's own LSTM on the CPU keeps more (measured alongside)."""
    steps = 5
    module = nn.LSTM(IN, H)
    x = torch.randn(steps, B, IN, requires_grad=True)
    with torch._dynamo.config.patch(allow_rnn=True):
        torch._dynamo.reset()
        compiled = torch.compile(module, backend=Backend(ON))
        compiled(x)[0].sum().backward()
        fused = measure_saved_bytes(lambda: compiled(x),
                                    exclude=[*module.parameters(), x]).bytes
    step = B * H * 4
    assert fused == steps * (4 + 1 + 1) * step + 2 * step
    eager = measure_saved_bytes(lambda: module(x), exclude=[*module.parameters(), x]).bytes
    assert fused < eager


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_the_lm_heads_fused_loss_still_fires_after_it(mode):
    """Under a budget the LM head's loss is fused too (fuse_linear_cross_entropy, a later
    pre-autograd pass that reads the head input's shape): the call's replacement carries
    the call's traced value, so the head after a fused batch-first call is still seen.
    (Both passes run before the code generator: fx's compile is the faster here.)"""
    with torch._dynamo.config.patch(allow_rnn=True):
        comparison = assert_same_as_eager(RNNLanguageModel(mode), rnn_tokens(),
                                          {**ON, "memory_budget": 0.5, "codegen": "fx"})
    assert comparison.fired("fuse_rnn") and comparison.fired("fuse_linear_cross_entropy")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_on_cuda_the_sequence_ops_match_cudnn(mode):
    """The Triton path against cuDNN's call, TF32 off on both sides (cuDNN's RNNs use it
    by default), a 2-layer bidirectional call at odd sizes."""
    torch.manual_seed(0)
    eager = (nn.LSTM if mode == "lstm" else nn.GRU)(IN, H, num_layers=2, batch_first=True,
                                                     bidirectional=True).cuda()
    fused = copy.deepcopy(eager)
    x = torch.randn(B, 9, IN, device="cuda")
    backend = Backend(ON)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True), torch.backends.cudnn.flags(
            enabled=True, allow_tf32=False):
        _assert_step_matches(eager, fused, torch.compile(fused, backend=backend), x)
    (record,) = backend.graphs
    assert any(r.fired for r in record.passes if r.name == "fuse_rnn")
