"""fuse_rnn on every form it supports: outputs and all gradients equal to eager, and fired.

Batch 3, hidden 37, 5 steps; fp32 and bf16 autocast. Under ``TRITON_INTERPRET=1`` the fused
ops run their Triton kernels, otherwise the torch reference. ``nn.LSTM``/``nn.GRU`` reach the
pass only with Dynamo's ``allow_rnn`` (else Dynamo runs them eagerly).
"""

import copy

import pytest
import torch
from fuse_rnn_helpers import dynamo_graph, run_fuse_rnn
from models import BF16Autocast, Block
from torch import nn

from fxopt.analysis import measure_saved_bytes
from fxopt.compiler import Backend
from fxopt.testing import TOLERANCES, assert_same_as_eager

B, H, IN, STEPS = 3, 37, 11, 5
ON = {"fuse_rnn": True, "strict": True}
# Under bf16 autocast the fp32 tensors compared hold bf16 values: the gates come from bf16
# GEMMs (the states are fp32 sums of them) and each weight's gradient is a bf16 GEMM result
# cast up, so both sides carry bf16 rounding; hence bf16's rtol, not the fp32 kernel's.
# Absolute: both sides are off from the fp64 gradients by a few bf16 ulps of the largest
# gradient (|g| < 8 here, ulp 2**-5): measured on the GRU cell loop, eager by 5.7e-2 (1.8
# ulps), the fused kernel by 2.6e-2, plain fxopt without fuse_rnn by 4.9e-2; the two sides
# may differ by the sum, so the bound is 3 ulps. A wrong kernel is off by O(|g|).
AUTOCAST_TOLERANCES = {torch.float32: (TOLERANCES[torch.bfloat16][0], 3 * 2**-5)}


class CellLoop(nn.Module):
    """An nn.LSTMCell / nn.GRUCell stepped through a sequence in a Python loop."""

    def __init__(self, kind, batch_first=False):
        super().__init__()
        self.kind, self.batch_first = kind, batch_first
        self.cell = (nn.LSTMCell if kind == "lstm" else nn.GRUCell)(IN, H)

    def forward(self, x, h, c):
        outputs = []
        for t in range(x.shape[1 if self.batch_first else 0]):
            step = x[:, t] if self.batch_first else x[t]
            if self.kind == "lstm":
                h, c = self.cell(step, (h, c))
            else:
                h = self.cell(step, h)
            outputs.append(h)
        return torch.stack(outputs), c


class HandLSTM(nn.Module):
    """An LSTM cell as research code writes it: gate order i, f, o, g; a bias on the input
    projection only (or on both)."""

    def __init__(self, hidden_bias=False):
        super().__init__()
        self.wi, self.wh = nn.Linear(IN, 4 * H), nn.Linear(H, 4 * H, bias=hidden_bias)

    def forward(self, x, h, c):
        for t in range(x.shape[0]):
            gates = self.wi(x[t]) + self.wh(h)
            i, f, o, g = gates.chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + i.sigmoid() * torch.tanh(g)
            h = o.sigmoid() * c.tanh()
        return h, c


class HandGRU(nn.Module):
    """A GRU cell as research code writes it, batch first, gate order z, r, n."""

    def __init__(self):
        super().__init__()
        self.wi, self.wh = nn.Linear(IN, 3 * H), nn.Linear(H, 3 * H)

    def forward(self, x, h, c):
        for t in range(x.shape[1]):
            i_z, i_r, i_n = self.wi(x[:, t]).chunk(3, 1)
            h_z, h_r, h_n = self.wh(h).chunk(3, 1)
            r, z = torch.sigmoid(h_r + i_r), torch.sigmoid(i_z + h_z)
            n = torch.tanh(i_n + r * h_n)
            h = (1 - z) * n + h * z
        return h


def _inputs(batch_first=False):
    torch.manual_seed(0)
    x = torch.randn(*((B, STEPS) if batch_first else (STEPS, B)), IN, requires_grad=True)
    return x, torch.randn(B, H, requires_grad=True), torch.randn(B, H, requires_grad=True)


def _stats(comparison):
    (record,) = [r for r in comparison.passes if r.name == "fuse_rnn"]
    return _verdicts(record)


def _verdicts(result):
    """fuse_rnn's verdicts as counts: per kind fused, per reason declined."""
    return {"fused": result.verdicts.counts(), "declined": result.verdicts.reasons(),
            "hoisted_input_projections": result.stats["hoisted_input_projections"]}


@pytest.mark.parametrize("kind,batch_first", [("lstm", False), ("gru", True)])
def test_cell_loops(kind, batch_first):
    comparison = assert_same_as_eager(CellLoop(kind, batch_first), _inputs(batch_first), ON)
    assert comparison.fired("fuse_rnn")
    stats = _stats(comparison)
    assert stats["fused"] == {f"{kind}_cell": STEPS} and not stats["declined"]
    assert stats["hoisted_input_projections"] == 1  # one GEMM for all steps' inputs


@pytest.mark.parametrize("hidden_bias", [False, True])
def test_handwritten_lstm(hidden_bias):
    comparison = assert_same_as_eager(HandLSTM(hidden_bias), _inputs(), ON)
    assert comparison.fired("fuse_rnn")
    stats = _stats(comparison)
    assert stats["fused"] == {"handwritten_lstm": STEPS}
    assert stats["hoisted_input_projections"] == 1  # x[t] @ W_ih for all t: one GEMM


def test_handwritten_gru():
    comparison = assert_same_as_eager(HandGRU(), _inputs(batch_first=True), ON)
    assert comparison.fired("fuse_rnn")
    stats = _stats(comparison)
    assert stats["fused"] == {"handwritten_gru": STEPS} and not stats["declined"]
    assert stats["hoisted_input_projections"] == 1


@pytest.mark.parametrize("model,batch_first", [
    (HandLSTM(), False), (HandGRU(), True), (CellLoop("lstm"), False), (CellLoop("gru"), False),
], ids=["hand-lstm", "hand-gru", "lstm-cell", "gru-cell"])
def test_bf16_autocast(model, batch_first):
    """Outputs, the inputs' and every parameter's gradients (the model is a module, so
    each side trains its own copy)."""
    comparison = assert_same_as_eager(BF16Autocast(model), _inputs(batch_first), ON,
                                      tolerances=AUTOCAST_TOLERANCES)
    assert comparison.fired("fuse_rnn")


@pytest.mark.parametrize("make,kind", [
    (lambda: nn.LSTM(IN, H, num_layers=2), "lstm"),
    (lambda: nn.LSTM(IN, H, bias=False, batch_first=True, bidirectional=True), "lstm"),
    (lambda: nn.GRU(IN, H, num_layers=2, batch_first=True, bidirectional=True), "gru"),
], ids=["lstm-2layer", "lstm-nobias-bidir-batchfirst", "gru-2layer-bidir-batchfirst"])
def test_rnn_modules_with_initial_states(make, kind):
    module = make()
    directions = 2 if module.bidirectional else 1
    x = _inputs(module.batch_first)[0]
    h0 = torch.randn(module.num_layers * directions, B, H, requires_grad=True)
    state = (h0, torch.randn_like(h0, requires_grad=True)) if kind == "lstm" else h0
    with torch._dynamo.config.patch(allow_rnn=True):
        comparison = assert_same_as_eager(module, (x, state), ON)
    assert comparison.fired("fuse_rnn")
    assert _stats(comparison)["fused"] == {f"{kind}_module": 1}


def _saved_bytes(model, inputs, fuse):
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=Backend({"fuse_rnn": fuse}))
    compiled(*inputs)[0].sum().backward()  # compile forward and backward first
    return measure_saved_bytes(lambda: compiled(*inputs),
                               exclude=[*model.parameters(), *inputs]).bytes


@pytest.mark.parametrize("model", [HandLSTM(), CellLoop("gru")], ids=["hand-lstm", "gru-cell"])
def test_saves_less_for_backward_than_autograd(model):
    """The fused ops save the activated gates and the states, not each op's operands:
    measured 12876 vs 14652 bytes (LSTM) and 10656 vs 12876 (GRU cell) at these sizes."""
    inputs = _inputs()
    assert _saved_bytes(model, inputs, True) < _saved_bytes(model, inputs, False)


class LanguageModel(nn.Module):
    def __init__(self, vocab=23):
        super().__init__()
        self.embed = nn.Embedding(vocab, H)
        self.lstm = nn.LSTM(H, H, num_layers=2, batch_first=True)
        self.head = nn.Linear(H, vocab)

    def forward(self, tokens):
        return self.head(self.lstm(self.embed(tokens))[0])


def test_lstm_language_model_trains_like_eager():
    """Three SGD steps: the weights change between steps, so nothing may be cached stale."""
    torch.manual_seed(0)
    eager = LanguageModel()
    fused = copy.deepcopy(eager)
    tokens = torch.randint(0, 23, (B, STEPS + 1))
    with torch._dynamo.config.patch(allow_rnn=True):
        backend = Backend(ON)
        compiled = torch.compile(fused, backend=backend)
        for model in (eager, compiled):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
            losses = []
            for _ in range(3):
                logits = model(tokens[:, :-1])
                loss = nn.functional.cross_entropy(logits.reshape(-1, 23),
                                                   tokens[:, 1:].reshape(-1))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(loss.detach())
            model.losses = losses
    torch.testing.assert_close(torch.stack(fused.losses), torch.stack(eager.losses))
    assert fused.losses[0] > fused.losses[-1]
    for (name, p_eager), p_fused in zip(eager.named_parameters(), fused.parameters()):
        torch.testing.assert_close(p_fused, p_eager, msg=name)
    assert any(r.fired for g in backend.graphs for r in g.passes if r.name == "fuse_rnn")


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
def test_declines_proj_size_with_reason():
    module = nn.LSTM(IN, H, proj_size=5)
    with torch._dynamo.config.patch(allow_rnn=True):
        comparison = assert_same_as_eager(module, (_inputs()[0],), ON)
    assert not comparison.fired("fuse_rnn")
    assert _stats(comparison)["declined"] == {
        "lstm_module: proj_size or an unexpected weight list": 1}


class LeakyGateLSTM(HandLSTM):
    """A cell whose forget gate is also returned: fusing would lose that use."""

    def forward(self, x, h, c):
        gates = self.wi(x[0]) + self.wh(h)
        i, f, o, g = gates.chunk(4, dim=-1)
        forget = f.sigmoid()
        c = forget * c + i.sigmoid() * g.tanh()
        return o.sigmoid() * c.tanh(), c, forget


def test_declines_a_cell_whose_intermediates_escape():
    comparison = assert_same_as_eager(LeakyGateLSTM(), _inputs(), ON)
    assert not comparison.fired("fuse_rnn")
    assert _stats(comparison)["declined"] == {
        "handwritten_lstm: an intermediate value is used outside the cell": 1}


def test_dynamic_batch():
    comparison = assert_same_as_eager(CellLoop("lstm"), _inputs(), ON, dynamic=True)
    assert comparison.fired("fuse_rnn")


class InterpolatingGRU(HandGRU):
    """A GRU written with the update ``n + z * (h - n)``: the same math, another graph."""

    def forward(self, x, h, c):
        i_z, i_r, i_n = self.wi(x[:, 0]).chunk(3, 1)
        h_z, h_r, h_n = self.wh(h).chunk(3, 1)
        r, z = torch.sigmoid(h_r + i_r), torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        return n + z * (h - n)


def test_declines_another_gru_update_with_reason():
    comparison = assert_same_as_eager(InterpolatingGRU(), _inputs(batch_first=True), ON)
    assert not comparison.fired("fuse_rnn")
    assert _stats(comparison)["declined"] == {
        "handwritten_gru: the hidden update is not (1 - z) * n + z * h": 1}


def test_leaves_graphs_without_cells_alone():
    """A transformer block splits and activates tensors too; none of it is a cell."""
    comparison = assert_same_as_eager(Block(dim=16, heads=2), (torch.randn(3, 5, 16),), ON)
    assert not comparison.fired("fuse_rnn")
    assert _stats(comparison) == {"fused": {}, "declined": {}, "hoisted_input_projections": 0}


def test_declines_rnn_modules_under_autocast():
    """Eager nn.LSTM under CPU autocast returns bf16 (oneDNN) where Dynamo's traced value
    says fp32 (torch.compile returns fp32 there with any backend), so the pass cannot know
    eager's dtypes: it declines."""
    module = nn.LSTM(IN, H)

    def run(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return module(x)

    result = run_fuse_rnn(dynamo_graph(run, _inputs()[0]))
    assert not result.modified
    assert _verdicts(result)["declined"] == {"lstm_module: inside an autocast region (eager's "
                                        "dtypes depend on the oneDNN or cuDNN path)": 1}


def test_declines_inter_layer_dropout_while_training():
    result = run_fuse_rnn(dynamo_graph(nn.GRU(IN, H, num_layers=2, dropout=0.3),
                                       _inputs()[0]))
    assert not result.modified
    assert _verdicts(result)["declined"] == {"gru_module: inter-layer dropout while training": 1}


def test_declines_float64():
    """The kernels compute in fp32: fp64 cells stay as they are, exact."""
    model = CellLoop("gru").double()
    inputs = [t.detach().double().requires_grad_() for t in _inputs()]
    comparison = assert_same_as_eager(model, inputs, ON)
    assert not comparison.fired("fuse_rnn")
    assert _stats(comparison)["declined"] == {
        "gru_cell: torch.float64 (the kernels compute in fp32)": STEPS}


def test_rewrite_limit_fuses_only_the_first_cells():
    comparison = assert_same_as_eager(CellLoop("lstm"), _inputs(),
                                      {**ON, "rewrite_limit": {"fuse_rnn": 2}})
    stats = _stats(comparison)
    assert stats["fused"] == {"lstm_cell": 2}
    assert stats["hoisted_input_projections"] == 0  # 2 of 5 steps: not worth all 5
