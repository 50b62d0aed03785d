"""library_rnn: on CUDA with no budget, a traced ``nn.LSTM`` / ``nn.GRU`` call that fuse_rnn
does not unroll runs once, as eager's, its library graph kept for the backward
(``fxopt::library_rnn``), instead of AOTAutograd's per-step decomposition or recompute_rnn's
second forward.

The op is the library's training call bit for bit (outputs and gradients, inter-layer
dropout included). Compiled models keep eager's loss and gradients under both code
generators, with ``library_rnn=True`` on the CPU (oneDNN's fused RNN stands in for cuDNN). The
graph's buffers the kept graph reads are safe from Inductor's buffer reuse (a model whose
generated code reuses both). No kept graph outlives its backward or its forward's
outputs, and a second backward through one forward says what to do."""

import gc

import pytest
import torch
import torch.nn.functional as F
from models import RNNLanguageModel, rnn_tokens
from torch import nn
from torch._inductor.utils import run_and_get_code

import fxopt
from fxopt import _compat
from fxopt.analysis import measure_saved_bytes
from fxopt.config import resolve
from fxopt.kernels.library_rnn import kept_calls, library_rnn
from fxopt.passes import GraphKind, PassContext, Stage, get_pass
from fxopt.testing import assert_same_as_eager


@pytest.fixture
def nothing_left_kept():
    yield
    gc.collect()
    assert kept_calls() == 0


def _call(module: nn.RNNBase, x: torch.Tensor, states: list[torch.Tensor]) -> list:
    hx = None if not states else tuple(states) if isinstance(module, nn.LSTM) else states[0]
    output, last = module(x, hx)
    return [output, *(last if isinstance(module, nn.LSTM) else [last])]


@pytest.mark.parametrize("mode, layers, bidirectional, batch_first, bias, dropout, states", [
    ("lstm", 2, True, False, True, 0.0, True), ("lstm", 2, False, True, False, 0.3, False),
    ("gru", 3, False, True, True, 0.2, True), ("gru", 2, True, False, False, 0.0, False)])
def test_op_is_the_library_training_call_bit_for_bit(mode, layers, bidirectional, batch_first,
                                                      bias, dropout, states):
    torch.manual_seed(0)
    module = (nn.LSTM if mode == "lstm" else nn.GRU)(
        7, 5, layers, bias=bias, batch_first=batch_first, bidirectional=bidirectional,
        dropout=dropout)
    x = torch.randn(3, 4, 7, requires_grad=True)
    batch = x.shape[0] if batch_first else x.shape[1]
    hx = [torch.randn(layers * (2 if bidirectional else 1), batch, 5, requires_grad=True)
          for _ in range(2 if mode == "lstm" else 1)] if states else []
    torch.manual_seed(1)
    *actual, handle = library_rnn(x, hx, list(module._flat_weights), mode, bias, layers,
                                  dropout, True, bidirectional, batch_first, True)
    assert handle.dtype == torch.int64 and handle.dim() == 0 and kept_calls() == 1
    torch.manual_seed(1)
    expected = _call(module, x, hx)
    assert [a.stride() for a in actual] == [e.stride() for e in expected]
    assert all(torch.equal(a, e) for a, e in zip(actual, expected, strict=True))
    weights = [torch.randn_like(e) for e in expected]
    leaves = [x, *hx, *module._flat_weights]
    actual_grads = torch.autograd.grad(actual, leaves, weights)
    expected_grads = torch.autograd.grad(expected, leaves, weights)
    assert all(torch.equal(a, e) for a, e in zip(actual_grads, expected_grads, strict=True))
    assert kept_calls() == 0  # the backward took the library graph out


def test_op_registration_is_consistent():
    """opcheck's schema, autograd-registration and fake-tensor checks. Its AOTAutograd
    check compares two calls' outputs, and every call's handle is a new key by design; the
    compiled models below test the op under AOTAutograd instead."""
    module = nn.LSTM(6, 5, 2, batch_first=True)
    x = torch.randn(2, 3, 6, requires_grad=True)
    states = [torch.zeros(2, 2, 5, requires_grad=True), torch.zeros(2, 2, 5)]
    torch.library.opcheck(library_rnn, (x, states, list(module._flat_weights), "lstm", True,
                                        2, 0.0, True, False, True, True),
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor"))
    gc.collect()
    assert kept_calls() == 0


def test_a_forward_never_differentiated_leaves_nothing_kept():
    module = nn.GRU(4, 3, 1)
    outputs = library_rnn(torch.randn(5, 2, 4), [], list(module._flat_weights), "gru", True,
                          1, 0.0, True, False, False, True)
    assert kept_calls() == 1
    del outputs
    gc.collect()
    assert kept_calls() == 0


@pytest.mark.parametrize("codegen", ["fx", "inductor"])
@pytest.mark.parametrize("mode, dropout", [("lstm", 0.0), ("gru", 0.0), ("lstm", 0.25)],
                         ids=["lstm", "gru", "lstm-dropout"])
def test_compiled_models_keep_eagers_loss_and_gradients(nothing_left_kept, codegen, mode, dropout):
    """Inter-layer dropout while training too: the masks are drawn once, in the forward,
    from the same generator state as eager's."""
    model, (ids, labels) = RNNLanguageModel(mode, dropout=dropout), rnn_tokens()
    with _compat.dynamo_allow_rnn():
        # Inductor's fused head and loss round differently from eager's ops: fp32 tolerance
        comparison = assert_same_as_eager(
            model, (ids, labels), {"codegen": codegen, "library_rnn": True}, steps=2)
    assert comparison.fired("library_rnn")
    assert not comparison.fired("recompute_rnn")
    calls = [n for g in comparison.graphs for n in g.graphs["dynamo"].graph.nodes
             if n.target is torch.ops.fxopt.library_rnn.default]
    assert len(calls) == 1 and calls[0].args[1] == []  # the module's zeros: made inside


@pytest.mark.parametrize("codegen", ["fx", "inductor"])
def test_under_no_grad_the_inference_kernel_runs_and_nothing_is_kept(codegen):
    """An evaluation loop under ``torch.no_grad``: AOTAutograd's inference graph would
    decompose the call too; the op runs the library's inference kernel, keeping nothing."""
    model, (ids, labels) = RNNLanguageModel("lstm", dropout=0.25).eval(), rnn_tokens()
    backend = fxopt.backend(codegen=codegen, library_rnn=True)
    with _compat.dynamo_allow_rnn(), torch.no_grad():
        expected = model(ids, labels)
        actual = torch.compile(model, backend=backend)(ids, labels)
        assert kept_calls() == 0
    torch.testing.assert_close(actual, expected)
    calls = [n for g in backend.graphs for n in g.graphs["dynamo"].graph.nodes
             if n.target is torch.ops.fxopt.library_rnn.default]
    assert len(calls) == 1 and calls[0].args[-1] is False  # keep=False


def test_dynamic_shapes_give_the_backward_its_symbolic_shapes(nothing_left_kept):
    """The backward's fake takes the inputs' shapes as symbolic sizes: with a dynamic batch
    and length the call is still replaced and the gradients are eager's."""
    model, (ids, labels) = RNNLanguageModel("gru"), rnn_tokens()
    with _compat.dynamo_allow_rnn():
        comparison = assert_same_as_eager(model, (ids, labels),
                                          {"codegen": "fx", "library_rnn": True}, dynamic=True)
    assert comparison.fired("library_rnn")
    calls = [n for g in comparison.graphs for n in g.graphs["dynamo"].graph.nodes
             if n.target is torch.ops.fxopt.library_rnn.default]
    assert len(calls) == 1 and len(calls[0].args[1]) == 1  # symbolic zeros stay inputs


def test_the_step_keeps_eagers_bytes_and_a_copy_of_the_sequence(nothing_left_kept):
    """What eager's call keeps (oneDNN's workspace and its inputs), measured by the same
    saved-tensor hooks, plus the op's copy of the sequence, and its final states and handle,
    which the compiled graph keeps for the backward (the kernel's doc; oneDNN's backward
    reads the final states)."""
    model, (ids, labels) = RNNLanguageModel("lstm", batch_first=False), rnn_tokens()
    params = list(model.parameters())
    eager = measure_saved_bytes(lambda: model(ids, labels), exclude=params).bytes
    with _compat.dynamo_allow_rnn():
        compiled = torch.compile(model, backend=fxopt.backend(codegen="fx",
                                                              library_rnn=True))
        kept = measure_saved_bytes(lambda: compiled(ids, labels), exclude=params).bytes
    sequence = ids.numel() * model.embed.embedding_dim * 4
    states = 2 * 2 * ids.shape[1] * model.embed.embedding_dim * 4  # h_n, c_n: 2 layers
    assert eager <= kept <= eager + sequence + states + 8


class _ReusingModel(nn.Module):
    """A graph whose generated code (Inductor) reuses the buffer of the LSTM's input, and
    would write into the buffer of its output in place, once the graph has no further use
    for them: the sequence is a product nothing else saves (time-major, so the library
    reads it as given, not a contiguous copy of its own) and the output feeds one pointwise
    chain."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(29, 12), nn.Linear(12, 29)
        self.rnn = nn.LSTM(12, 12, 2)

    def forward(self, ids, labels):
        out, _ = self.rnn(self.embed(ids) * 2)
        return F.cross_entropy(self.head(torch.sigmoid(out * 3 + 1)).flatten(0, 1),
                               labels.flatten())


def test_inductors_buffer_reuse_never_reaches_what_the_kept_graph_reads(nothing_left_kept):
    """Checked to fail without the op's copy of the sequence (a wrong weight_ih_l0
    gradient) and without the outputs passed to the backward (a wrong bias gradient)."""
    model, (ids, labels) = _ReusingModel(), rnn_tokens()
    with _compat.dynamo_allow_rnn():
        comparison, (forward, backward) = run_and_get_code(
            assert_same_as_eager, model, (ids.T, labels.T),
            {"codegen": "inductor", "library_rnn": True})
    assert comparison.fired("library_rnn")
    # the sequence's buffer, reused (torch 2.11's Inductor fuses the product into the op's
    # input and frees it after the call instead: there the model only checks the values)
    assert "= buf0; del buf0  # reuse" in forward or torch.__version__ < "2.13"
    # the library's call runs once: the partition recomputes nothing of it in the backward
    assert forward.count("fxopt.library_rnn.default(") == 1
    assert "fxopt.library_rnn.default(" not in backward
    assert backward.count("fxopt.library_rnn_backward.default(") == 1


def test_a_second_backward_through_one_forward_names_the_fix(nothing_left_kept):
    model, (ids, labels) = RNNLanguageModel("gru"), rnn_tokens()
    with _compat.dynamo_allow_rnn():
        compiled = torch.compile(model, backend=fxopt.backend(codegen="fx", library_rnn=True))
        loss = compiled(ids, labels)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="already freed by an earlier backward.*"
                                           "fuse_rnn=True"):
        loss.backward()
    del loss


def _context(device: str, **options) -> PassContext:
    return PassContext(options=resolve(options), stage=Stage.PRE_AUTOGRAD,
                       graph_kind=GraphKind.DYNAMO, graph_name="g0",
                       device=torch.device(device))


@pytest.mark.parametrize("device, options, library, recompute", [
    ("cuda", {}, True, False),
    ("cuda", {"fuse_rnn": "auto"}, True, False),
    ("cuda", {"fuse_rnn": "auto", "memory_budget": 0.5}, False, True),
    ("cuda", {"fuse_rnn": False}, False, False),
    ("cpu", {"fuse_rnn": "auto"}, False, False),
    ("cpu", {"library_rnn": True}, True, False),
    ("cpu", {"memory_budget": 0.5}, False, True)])
def test_without_a_budget_cuda_keeps_the_library_call_and_a_budget_recomputes_it(
        device, options, library, recompute):
    ctx = _context(device, **options)
    assert get_pass("library_rnn").decide(ctx)[0] is library
    assert get_pass("recompute_rnn").decide(ctx)[0] is recompute


@pytest.mark.gpu
def test_on_cuda_the_default_keeps_cudnns_call_once(nothing_left_kept):
    """fxopt's defaults (Inductor) with Dynamo tracing the module: cuDNN's training call
    runs once, not AOTAutograd's per-step decomposition nor recompute_rnn's second forward,
    and the step keeps eager's loss and gradients (TF32 off: cuDNN's RNN would use it)."""
    model = RNNLanguageModel("lstm", hidden=64).cuda()
    ids, labels = (t.cuda() for t in rnn_tokens())
    with _compat.dynamo_allow_rnn(), torch.backends.cudnn.flags(allow_tf32=False):
        comparison = assert_same_as_eager(model, (ids, labels), {}, steps=2)
    assert comparison.fired("library_rnn") and not comparison.fired("recompute_rnn")


def test_the_memory_model_counts_what_the_library_keeps_outside_the_graph(monkeypatch):
    """The library's graph is out of the graph's sight but for the handle; the model gives
    the handle the bytes measured live once the op returned, so the step's predicted
    activations hold at least what the saved-tensor hooks see eager's call keep (oneDNN's
    workspace, its inputs and outputs). Measured as at run time: under the Python
    dispatcher a compilation turns on, the call would be AOTAutograd's decomposition."""
    import fxopt.analysis.memory as memory

    model, (ids, labels) = RNNLanguageModel("lstm", hidden=32), rnn_tokens()
    backend = fxopt.backend(codegen="fx", library_rnn=True)
    with _compat.dynamo_allow_rnn():
        torch.compile(model, backend=backend)(ids, labels).backward()
    (record,) = backend.graphs
    predicted = record.memory["fxopt"].activation_bytes
    embedded = model.embed(ids).detach().requires_grad_()
    call = measure_saved_bytes(lambda: model.rnn(embedded),
                               exclude=[embedded, *model.rnn.parameters()]).bytes
    assert predicted >= call
    from fxopt.analysis.workspace import held_bytes, workspace_bytes

    (op,) = [n for n in record.graphs["forward"].graph.nodes
             if n.target is torch.ops.fxopt.library_rnn.default]
    # what it holds is not counted again as the call's temporaries (they were equal)
    assert workspace_bytes(op) < held_bytes(op)
    monkeypatch.setattr(memory, "held_bytes", lambda node: 0)
    unseen = memory.estimate_step_memory(record.graphs["forward"], record.graphs["backward"])
    assert unseen.activation_bytes < call < predicted  # the handle's 8 bytes alone
