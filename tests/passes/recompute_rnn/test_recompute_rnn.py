"""recompute_rnn: under a memory budget, a traced ``nn.LSTM`` / ``nn.GRU`` call becomes the
library's fused RNN saving only its inputs (``fxopt::recompute_rnn``), run again in the
backward. The op is the library call bit for bit: its output is the inference kernel's (the
call under ``no_grad``), its gradients eager's backward at the gradients given; compiled
models keep eager's loss and gradients to fp32 rounding (the inference kernel's output
differs from the training kernel's in the last bits), the pass fired and the step keeps at
most the budget's share of eager's saved bytes; calls a replay cannot reproduce are
declined with the reason."""

import importlib

import pytest
import torch
from models import RNNLanguageModel, rnn_tokens
from torch import nn

import fxopt
from fxopt import _compat
from fxopt.analysis import measure_saved_bytes
from fxopt.kernels.recompute_rnn import recompute_rnn
from fxopt.testing import assert_same_as_eager


def _call(module: nn.RNNBase, x: torch.Tensor, states: list[torch.Tensor] | None = None
          ) -> list:
    hx = None if states is None else tuple(states) if isinstance(module, nn.LSTM) else states[0]
    output, last = module(x, hx)
    return [output, *(last if isinstance(module, nn.LSTM) else [last])]


def _assert_is_the_library_call(module: nn.RNNBase, x: torch.Tensor, states: list, actual):
    """``actual`` (the op's outputs) is the call's under ``no_grad`` bit for bit (strides
    too), and its gradients are eager's at the same output gradients."""
    with torch.no_grad():
        inference = _call(module, x, states or None)
    assert [a.stride() for a in actual] == [e.stride() for e in inference]
    assert all(torch.equal(a, e) for a, e in zip(actual, inference, strict=True))
    expected = _call(module, x, states or None)
    weights = [torch.randn_like(e) for e in expected]
    leaves = [x, *states, *module._flat_weights]
    expected_grads = torch.autograd.grad(expected, leaves, weights)
    actual_grads = torch.autograd.grad(actual, leaves, weights)
    assert all(torch.equal(a, e) for a, e in zip(actual_grads, expected_grads, strict=True))


@pytest.mark.parametrize("mode, layers, bidirectional, batch_first, bias", [
    ("lstm", 2, True, False, True), ("lstm", 1, False, True, False),
    ("gru", 3, False, True, True), ("gru", 2, True, False, False)])
def test_op_is_the_library_call(mode, layers, bidirectional, batch_first, bias):
    torch.manual_seed(0)
    module = (nn.LSTM if mode == "lstm" else nn.GRU)(
        7, 5, layers, bias=bias, batch_first=batch_first, bidirectional=bidirectional)
    x = torch.randn(3, 4, 7, requires_grad=True)
    batch = x.shape[0] if batch_first else x.shape[1]
    states = [torch.randn(layers * (2 if bidirectional else 1), batch, 5, requires_grad=True)
              for _ in range(2 if mode == "lstm" else 1)]
    actual = recompute_rnn(x, states, list(module._flat_weights), mode, bias, layers,
                           bidirectional, batch_first)
    _assert_is_the_library_call(module, x, states, actual)


@pytest.mark.parametrize("module", [
    nn.LSTM(7, 6, 2, proj_size=4), nn.GRU(7, 5, 2, bidirectional=True, batch_first=True)],
    ids=["lstm-proj", "gru-bidirectional"])
def test_op_without_states_makes_the_module_s_zeros(module):
    torch.manual_seed(0)
    x = torch.randn(3, 4, 7, requires_grad=True)
    mode = "lstm" if isinstance(module, nn.LSTM) else "gru"
    actual = recompute_rnn(x, [], list(module._flat_weights), mode, True, 2,
                           module.bidirectional, module.batch_first)
    _assert_is_the_library_call(module, x, [], actual)


def test_op_registration_is_consistent():
    module = nn.LSTM(6, 5, 2, batch_first=True)
    x = torch.randn(2, 3, 6, requires_grad=True)
    states = [torch.zeros(2, 2, 5), torch.zeros(2, 2, 5)]
    torch.library.opcheck(recompute_rnn, (x, states, list(module._flat_weights), "lstm", True,
                                          2, False, True))


class _AliasingCall(torch.autograd.Function):
    """A stand-in for the library's RNN whose backward returns what cuDNN's and autograd's
    can: the weights' gradients as views of one flat buffer (``_cudnn_rnn_backward_weight``)
    and the sequence's and states' gradients as the very tensors it was given (an identity
    path). Its outputs are ``x`` and the states scaled by 2; its gradients (a stub's, not the
    derivative) are those given for the sequence and states and 2 for every weight."""

    @staticmethod
    def forward(ctx, n_states, x, *rest):
        ctx.n_states, ctx.shapes = n_states, [t.shape for t in rest]
        return (x * 2, *(t * 2 for t in rest[:n_states]))

    @staticmethod
    def backward(ctx, *grads):
        flat = torch.cat([torch.full((s.numel(),), 2.0) for s in ctx.shapes[ctx.n_states:]])
        views = list(flat.split([s.numel() for s in ctx.shapes[ctx.n_states:]]))
        weights = [v.view(s) for v, s in zip(views, ctx.shapes[ctx.n_states:])]
        return (None, *grads, *weights)


def _aliasing_library_call(x, states, params, *flags):
    """``torch.lstm``'s / ``torch.gru``'s signature; under ``no_grad`` (the op's forward) it
    returns its inputs themselves, as an identity path can."""
    states = list(states) if isinstance(states, (list, tuple)) else [states]
    if not torch.is_grad_enabled():
        return (x, *states)
    return _AliasingCall.apply(len(states), x, *states, *params)


def _storages(tensors) -> list[int]:
    return [t.untyped_storage().data_ptr() for t in tensors]


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_op_returns_own_their_storage_whatever_the_library_returns(mode, monkeypatch):
    """The custom-op contract (no return is an input or shares storage with an input or
    another return) on every path a device can take: the library call is replaced by one
    that returns aliases as cuDNN's backward does; the ops' returns are still fresh and
    equal to what the call computed."""
    module = importlib.import_module("fxopt.kernels.library_rnn_calls")
    monkeypatch.setitem(module.LIBRARY_CALLS, mode, _aliasing_library_call)
    x = torch.randn(4, 3, 5)
    hx = [torch.randn(1, 3, 5) for _ in range(2 if mode == "lstm" else 1)]
    params = [torch.randn(20, 5), torch.randn(20, 5), torch.randn(20)]
    outputs = torch.ops.fxopt.recompute_rnn(x, hx, params, mode, True, 1, False, False)
    assert len(set(_storages([*outputs, x, *hx, *params]))) == len(outputs) + 1 + len(hx) + 3
    assert all(torch.equal(o, i) for o, i in zip(outputs, [x, *hx], strict=True))
    grads = [torch.randn_like(t) for t in (x, *hx)]
    results = torch.ops.fxopt.recompute_rnn_backward(x, hx, params, grads, mode, True, 1,
                                                     False, False)
    inputs = [x, *hx, *params, *grads]
    assert len(set(_storages([*results, *inputs]))) == len(results) + len(inputs)
    expected = [*grads, *(torch.full_like(p, 2.0) for p in params)]
    assert all(torch.equal(r, e) for r, e in zip(results, expected, strict=True))


def _pass_verdicts(comparison):
    records = [r for r in comparison.passes if r.name == "recompute_rnn"]
    assert records, "recompute_rnn did not run"
    return records[0].verdicts


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_budget_recomputes_the_whole_call_with_eager_gradients(mode):
    model, (ids, labels) = RNNLanguageModel(mode), rnn_tokens()
    options = {"codegen": "fx", "memory_budget": 0.5, "strict": True}
    with _compat.dynamo_allow_rnn():
        # fp32 tolerance: the forward's inference kernel rounds its last bits differently
        comparison = assert_same_as_eager(model, (ids, labels), options, steps=2)
        assert comparison.fired("recompute_rnn")
        assert _pass_verdicts(comparison).counts() == {mode: 1}
        calls = [n for g in comparison.graphs for n in g.graphs["dynamo"].graph.nodes
                 if n.target is torch.ops.fxopt.recompute_rnn.default]
        assert len(calls) == 1 and calls[0].args[1] == []  # the module's zeros: made inside
        assert not [n for g in comparison.graphs for n in g.graphs["dynamo"].graph.nodes
                    if n.target is torch.zeros]  # and gone from the graph
        params = list(model.parameters())
        eager = measure_saved_bytes(lambda: model(ids, labels), exclude=params).bytes
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=fxopt.backend(**options))
        kept = measure_saved_bytes(lambda: compiled(ids, labels), exclude=params).bytes
    # the call's own saves (every step's gates, eager's oneDNN workspace) are gone
    assert kept <= 0.5 * eager


def test_dynamic_shapes_keep_the_call_and_the_module_s_states_as_inputs():
    """With symbolic batch and length the call is still replaced; the module's zero states,
    whose shapes would need a guard to compare, stay the op's inputs."""
    model, (ids, labels) = RNNLanguageModel("gru"), rnn_tokens()
    with _compat.dynamo_allow_rnn():
        # fp32 tolerance: the forward's inference kernel rounds its last bits differently
        comparison = assert_same_as_eager(model, (ids, labels), {
            "codegen": "fx", "memory_budget": 0.5, "strict": True}, dynamic=True)
    assert comparison.fired("recompute_rnn")
    calls = [n for g in comparison.graphs for n in g.graphs["dynamo"].graph.nodes
             if n.target is torch.ops.fxopt.recompute_rnn.default]
    assert len(calls) == 1 and len(calls[0].args[1]) == 1


def test_under_inductor_the_call_stays_the_library_s_and_nothing_else_is_recomputed():
    """The default code generator under a fraction: Inductor compiles the rest of the graph
    around the op; with the call's saves out of the graph, the rest fits its share with
    Inductor's own partition (no activation_memory_budget)."""
    model, (ids, labels) = RNNLanguageModel("lstm"), rnn_tokens()
    with _compat.dynamo_allow_rnn():
        # Inductor's fused head and loss round differently from eager's ops: fp32 tolerance
        comparison = assert_same_as_eager(model, (ids, labels), {
            "codegen": "inductor", "memory_budget": 0.5, "strict": True})
    assert comparison.fired("recompute_rnn")
    inductor = [r.stats["inductor"] for r in comparison.passes if r.name == "swap_recompute"]
    assert inductor and all(s["activation_memory_budget"] is None for s in inductor)


def test_no_budget_leaves_the_call_alone():
    model, (ids, labels) = RNNLanguageModel("lstm"), rnn_tokens()
    with _compat.dynamo_allow_rnn():
        # eager runs oneDNN's fused LSTM, the graph AOTAutograd's per-step decomposition
        # (the gate GEMMs summed in another order): equal to fp32 rounding, not bitwise
        comparison = assert_same_as_eager(model, (ids, labels), {"codegen": "fx"},
                                          tolerances={torch.float32: (1e-5, 1e-6)})
    assert not comparison.fired("recompute_rnn")


def test_inter_layer_dropout_while_training_is_declined():
    model, (ids, labels) = RNNLanguageModel("lstm", dropout=0.25), rnn_tokens()
    backend = fxopt.backend(codegen="fx", memory_budget=0.5)
    with _compat.dynamo_allow_rnn():
        torch.compile(model, backend=backend)(ids, labels).backward()
    records = [r for g in backend.graphs for r in g.pass_records("recompute_rnn")]
    assert records and not any(r.fired for r in records)
    assert records[0].verdicts.reasons() == {
        "lstm: inter-layer dropout while training (a recompute would draw new masks)": 1}


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_fraction_base_keeps_a_lower_bound_of_the_calls_plain_bytes(mode):
    """The bytes the pass reports taken out of the graph stay at or below what eager keeps
    for the call (oneDNN on and off), and a fraction's base keeps them: at 0.5, under
    ``strict``, the rest of the graph fits 0.5 as it is (taken of the graph alone, without
    the call's saves, 0.5 would recompute part of it) and the step keeps at most 0.5 of
    eager's bytes."""
    model, (ids, labels) = RNNLanguageModel(mode), rnn_tokens()
    backend = fxopt.backend(codegen="fx", memory_budget=0.5, strict=True)
    params = list(model.parameters())
    with _compat.dynamo_allow_rnn():
        compiled = torch.compile(model, backend=backend)
        kept = measure_saved_bytes(lambda: compiled(ids, labels), exclude=params).bytes
    removed = [r.stats["plain_saved_bytes_removed"] for g in backend.graphs
               for r in g.pass_records("recompute_rnn") if r.fired]
    assert len(removed) == 1 and removed[0] > 0
    embedded = model.embed(ids).detach().requires_grad_()
    for onednn in (True, False):
        with torch.backends.mkldnn.flags(enabled=onednn):
            call = measure_saved_bytes(lambda: model.rnn(embedded),
                                       exclude=[embedded, *model.rnn.parameters()]).bytes
        assert removed[0] <= call
    swap = [r for g in backend.graphs for r in g.pass_records("swap_recompute")]
    assert swap and all(r.stats.get("fits") and not r.verdicts.matched for r in swap), swap
    assert kept <= 0.5 * measure_saved_bytes(lambda: model(ids, labels), exclude=params).bytes
