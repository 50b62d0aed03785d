"""recompute_rnn: whole ``nn.LSTM`` / ``nn.GRU`` calls that save only their inputs, before autograd.

Under a memory budget, each ``torch.lstm`` / ``torch.gru`` call in Dynamo's graph (Dynamo
traces one only under ``torch._dynamo.config.allow_rnn``; fuse_rnn, when on, has taken the
calls it fuses) becomes :func:`fxopt.kernels.recompute_rnn.recompute_rnn`: the library's
fused RNN (oneDNN, cuDNN) in the forward, the same call run again and differentiated in the
backward. Left alone, AOTAutograd decomposes the call into per-step ops, which runs slower
than the fused call and its recompute together and saves every step's gates; the
rewritten call saves its inputs only. On a 2-layer ``nn.LSTM`` LM (hidden 256, seq 64,
batch 8, CPU) the compiled step keeps 0.067 of eager's saved bytes in 1.33x eager's time
at any fraction, where the decomposed call under Inductor kept 0.12 at 0.5 in 1.69x
(``benchmarks/results/budget_frontier_models_cpu.md``). A fraction's base keeps a lower
bound of what the call would have saved (:func:`removed_saved_bytes`, the stat
``plain_saved_bytes_removed``), so the fraction stays one of eager's bytes.

Outputs and gradients are eager's to fp32 rounding (the op's doc). Declined, with the reason in
``verdicts.declined``: packed sequences and unrecognised arguments, inter-layer dropout while
training (a recompute would draw new masks), autocast regions (eager's dtypes there depend on
the library path), a result used other than by index, and calls none of whose inputs require
grad (nothing would be saved). It runs under the ``swap_recompute`` flag (on with a budget),
after fuse_rnn.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from fxopt import _compat
from fxopt.kernels.recompute_rnn import zero_state_shapes
from fxopt.passes.base import REMOVED_SAVED_BYTES, PassContext, PassResult, Verdicts
from fxopt.passes.fuse_rnn.graph import autocast_dtypes
from fxopt.passes.torch_calls import (
    RNN_CALLS,
    RnnCall,
    example_tensor,
    example_value,
    rnn_call,
)

__all__ = ["recompute_rnn", "recompute_whole_rnns", "removed_saved_bytes"]

PASS = "recompute_rnn"


class _Decline(Exception):
    pass


def _arguments(node: fx.Node, in_autocast: bool) -> tuple[tuple, RnnCall]:
    """The op's arguments for one call and the call as read, or :class:`_Decline` with the
    reason."""
    try:
        call = rnn_call(node)
    except ValueError as why:
        raise _Decline(str(why)) from None
    if any(example_tensor(t) is None or example_tensor(t).dim() != 3
           for t in [call.x, *call.states]):
        raise _Decline("unbatched input or state")
    if call.dropout and call.train and call.layers > 1:
        raise _Decline("inter-layer dropout while training (a recompute would draw new masks)")
    if in_autocast:
        raise _Decline("inside an autocast region (eager's dtypes depend on the library path)")
    if not any(example_tensor(t).requires_grad for t in [call.x, *call.states, *call.params]):
        raise _Decline("no input requires grad (nothing would be saved)")
    if any(u.op != "call_function" or u.target is not operator.getitem for u in node.users):
        raise _Decline("the result is used other than by index")
    states = [] if _module_zero_states(call, node) else call.states
    return (call.x, states, call.params, call.mode, call.has_biases, call.layers,
            call.bidirectional, call.batch_first), call


def _module_zero_states(call: RnnCall, node: fx.Node) -> bool:
    """Whether the call's initial states are the zeros ``nn.LSTM``/``nn.GRU`` make when given
    none, made for this call alone: the op then makes them itself, so they are neither
    inputs nor saved (static shapes only: a symbolic one would need a guard to compare)."""
    values = [example_tensor(t) for t in (call.x, *call.params)]
    shapes = zero_state_shapes(values[0], values[1:], call.mode, call.layers,
                               call.bidirectional, call.batch_first)
    for state, shape in zip(call.states, shapes, strict=True):
        value = example_tensor(state)
        if (state.op != "call_function" or state.target is not torch.zeros
                or list(state.users) != [node] or value.requires_grad
                or value.dtype != values[0].dtype or any(map(_compat.is_symbolic, shape))
                or tuple(value.shape) != tuple(shape)):
            return False
    return True


def removed_saved_bytes(call: RnnCall) -> int:
    """A lower bound on the bytes plain autograd keeps for one call that the rewritten graph
    no longer keeps. Per time step, layer and direction, any implementation that does not
    recompute keeps the gate activations (an LSTM's 4 of hidden size and its new cell state;
    a GRU's 3 and the hidden projection's candidate part) and, but for the last layer (whose
    output the graph may still keep), the layer's output (the next layer's input). A lower
    bound, so that a fraction is never taken of more than plain autograd keeps: eager keeps
    more (on the CPU, 8 hidden-size tensors per LSTM step with oneDNN off, about 17 with it
    on)."""
    xv = example_tensor(call.x)
    steps, batch = (_compat.size_hint(xv.shape[i], 1) for i in ((1, 0) if call.batch_first
                                                                 else (0, 1)))
    # weight_hh_l0: (gates x hidden, hidden or proj_size)
    rows, output = (_compat.size_hint(d, 1) for d in example_tensor(call.params[1]).shape)
    lstm = call.mode == "lstm"
    hidden = rows // (4 if lstm else 3)
    per_step = (5 if lstm else 4) * hidden * call.layers + output * (call.layers - 1)
    directions = 2 if call.bidirectional else 1
    return per_step * directions * steps * batch * xv.element_size()


def recompute_whole_rnns(gm: fx.GraphModule, allow=lambda: True) -> Verdicts:
    """Replace each ``torch.lstm`` / ``torch.gru`` call of ``gm`` by the recomputing op
    (those ``allow`` accepts); the verdicts: per mode the calls replaced and the plain saved
    bytes they removed (:func:`removed_saved_bytes`), per call left its reason."""
    verdicts = Verdicts()
    autocast = autocast_dtypes(gm.graph)
    for node in [n for n in gm.graph.nodes
                 if n.op == "call_function" and n.target in RNN_CALLS]:
        mode = RNN_CALLS[node.target]
        try:
            arguments, call = _arguments(node, bool(autocast.get(node)))
        except _Decline as why:
            verdicts.decline(node.name, f"{mode}: {why}")
            continue
        if not allow():
            continue
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(torch.ops.fxopt.recompute_rnn.default, arguments)
        new.meta["example_value"] = list(example_value(node))
        new.meta["fxopt"] = {"pass": PASS, "replaces": [node.name]}
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        for state in call.states:
            if not state.users:  # the module's zero states, made inside the op now
                gm.graph.erase_node(state)
        verdicts.match(mode, bytes=removed_saved_bytes(call))
    return verdicts


def recompute_rnn(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    verdicts = recompute_whole_rnns(gm, ctx.rewrites.allow)
    removed = sum(m.bytes for m in verdicts.matched.values())
    return PassResult(gm, bool(verdicts.matched), verdicts, {REMOVED_SAVED_BYTES: removed})
