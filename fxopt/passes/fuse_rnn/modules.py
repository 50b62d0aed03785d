"""fuse_rnn's rewrite of whole ``nn.LSTM`` / ``nn.GRU`` calls (``torch.lstm`` / ``torch.gru``
in Dynamo's graph; Dynamo traces them only with ``torch._dynamo.config.allow_rnn = True``,
otherwise it breaks the graph around the module and runs it eagerly).

Each layer and direction becomes the input projection of the whole sequence (with
``b_ih``) as one GEMM, then one ``fxopt::lstm_sequence`` / ``fxopt::gru_sequence`` op that
steps through time (per step the hidden projection and the fused cell; its backward
computes ``W_hh``'s gradient as one GEMM, :mod:`fxopt.kernels.fuse_rnn_sequence`). The
layer's output concatenates the directions on the feature dimension; the last states are
stacked into ``h_n`` (and ``c_n``). Multi-layer, ``batch_first``, with or without bias,
bidirectional, any sequence length (a symbolic one too): the graph and its compile time do
not grow with the length.

Declined with the reason: packed sequences, ``proj_size``, inter-layer dropout while
training (cuDNN draws its own dropout masks, so no rewrite can reproduce eager's), autocast
regions (eager's dtypes there depend on the library path it takes) and unbatched input.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

import fxopt.kernels.fuse_rnn_sequence  # noqa: F401  (registers the ops)
from fxopt import _compat
from fxopt.passes.fuse_rnn.choice import choose, warn_forced
from fxopt.passes.fuse_rnn.graph import Rewrite, dtype_problem
from fxopt.passes.fuse_rnn.hoist import LINEAR
from fxopt.passes.torch_calls import RNN_CALLS, example_tensor, example_value, rnn_call

# one layer-direction's steps, by cell kind
SEQUENCES = {"lstm": torch.ops.fxopt.lstm_sequence.default,
             "gru": torch.ops.fxopt.gru_sequence.default}


class _Decline(Exception):
    pass


def _parse(node: fx.Node) -> tuple:
    try:
        call = rnn_call(node)
    except ValueError as why:
        raise _Decline(str(why)) from None
    directions = 2 if call.bidirectional else 1
    if len(call.params) != call.layers * directions * (4 if call.has_biases else 2):
        raise _Decline("proj_size or an unexpected weight list")
    if call.dropout and call.train and call.layers > 1:
        raise _Decline("inter-layer dropout while training")
    xv = example_tensor(call.x)
    if xv is None or xv.dim() != 3:
        raise _Decline("unbatched input")
    hx = call.states if call.mode == "lstm" else call.states[0]
    return call.x, hx, call.params, call.has_biases, call.layers, directions, call.batch_first


def _library_or_fused(rw: Rewrite, node: fx.Node, kind: str, x: fx.Node, w_hh: fx.Node,
                      layers: int, directions: int, batch_first: bool) -> None:
    """Raise _Decline where ``fuse_rnn="auto"`` leaves the call to cuDNN (the cost model,
    `fxopt.passes.fuse_rnn.choice`); warn where ``fuse_rnn=True`` fuses a call predicted
    slower. Each priced call is in the stats' ``cost_model``; a symbolic size is priced at
    its hint, without a guard."""
    xv = example_tensor(x)
    batch, steps = xv.shape[0], xv.shape[1]
    batch, steps = (steps, batch) if not batch_first else (batch, steps)
    features, hidden = xv.shape[2], example_tensor(w_hh).shape[1]
    batch, steps, features, hidden = (_compat.size_hint(d, 1)
                                      for d in (batch, steps, features, hidden))
    choice = choose(node.name, kind, batch, steps, features, hidden, layers, directions,
                    xv.dtype, rw.ctx.device)
    if choice is None:
        return
    rw.cost_model.append(choice.as_stat())
    if not choice.keep_library:
        return
    if rw.ctx.options.fuse_rnn == "auto":
        raise _Decline(f"left to cuDNN: {choice.text()}")
    warn_forced(choice)


def _direction(rw: Rewrite, kind: str, node: fx.Node, layer_input: fx.Node,
               weights: list, h: fx.Node, c: fx.Node | None, batch_first: bool,
               reverse: bool, state_dtype: torch.dtype, given: torch.dtype) -> tuple:
    """Emit one layer's one direction; returns (its output sequence, last h, last c)."""
    w_ih, w_hh, b_ih, b_hh = (weights + [None, None])[:4]
    replaces = [node.name]

    def emit(target, *args, method=False):
        return rw.emit(target, *args, method=method, replaces=replaces)

    projected = emit(LINEAR, layer_input, w_ih, b_ih)  # all steps
    if batch_first:
        projected = emit("transpose", projected, 0, 1, method=True)
    if kind == "lstm":
        c = rw.cast(c, given, state_dtype, replaces)
        sequence = emit(SEQUENCES[kind], projected, h, c, w_hh, b_hh, reverse)
    else:
        h = rw.cast(h, given, state_dtype, replaces)
        sequence = emit(SEQUENCES[kind], projected, h, w_hh, b_hh, reverse)
    out = emit(operator.getitem, sequence, 0)
    if batch_first:
        out = emit("transpose", out, 0, 1, method=True)
    last_c = emit(operator.getitem, sequence, 2) if kind == "lstm" else None
    return out, emit(operator.getitem, sequence, 1), last_c


def _rewrite_one(rw: Rewrite, node: fx.Node, kind: str) -> None:
    x, hx, params, has_biases, layers, directions, batch_first = _parse(node)
    h0, c0 = hx if kind == "lstm" else (hx, None)
    if rw.autocast.get(node):
        # Dynamo's fake value can disagree with eager here: on the CPU eager takes oneDNN's
        # path and returns bf16 where the traced value says fp32 (seen with torch 2.13).
        raise _Decline("inside an autocast region (eager's dtypes depend on the oneDNN or "
                       "cuDNN path)")
    if (problem := dtype_problem(example_tensor(x), example_tensor(h0),
                                 *map(example_tensor, params))) is not None:
        raise _Decline(problem)
    expected = example_value(node)[0].dtype
    xv, wv = example_tensor(x), example_tensor(params[0])
    sv = example_tensor(h0 if c0 is None else c0)
    state_dtype = rw.state_dtype_for(sv.dtype, rw.projection_dtype(node, xv, wv), expected)
    if state_dtype is None or example_tensor(h0).dtype != sv.dtype:
        raise _Decline(f"eager returns {expected}, the fused op would not")
    if any(u.op != "call_function" or u.target is not operator.getitem for u in node.users):
        raise _Decline("the result is used other than by index")
    _library_or_fused(rw, node, kind, x, params[1], layers, directions, batch_first)
    if not rw.ctx.rewrites.allow():
        return
    per = 4 if has_biases else 2
    emit = rw.emit
    with rw.graph.inserting_before(node):
        layer_input, last_h, last_c = x, [], []
        for layer in range(layers):
            outs = []
            for d in range(directions):
                k = layer * directions + d
                h = emit(operator.getitem, h0, k, replaces=[node.name])
                c = emit(operator.getitem, c0, k, replaces=[node.name]) if c0 is not None else None
                seq, h, c = _direction(rw, kind, node, layer_input,
                                       params[k * per:(k + 1) * per], h, c, batch_first,
                                       d == 1, state_dtype, sv.dtype)
                outs.append(seq)
                last_h.append(h)
                last_c.append(c)
            layer_input = outs[0] if directions == 1 else emit(
                torch.cat, outs, 2, replaces=[node.name])
        results = [layer_input, emit(torch.stack, last_h, 0, replaces=[node.name])]
        if kind == "lstm":
            results.append(emit(torch.stack, last_c, 0, replaces=[node.name]))
    for user in list(node.users):
        result = results[user.args[1]]
        if "example_value" in user.meta:   # later passes read the shape (the LM head's)
            result.meta.setdefault("example_value", user.meta["example_value"])
        user.replace_all_uses_with(result)
        rw.graph.erase_node(user)
    rw.graph.erase_node(node)
    rw.count(f"{kind}_module")


def rewrite_modules(rw: Rewrite) -> None:
    """Replace every ``torch.lstm`` / ``torch.gru`` call by fused sequence ops."""
    for node in [n for n in rw.graph.nodes
                 if n.op == "call_function" and n.target in RNN_CALLS]:
        kind = RNN_CALLS[node.target]
        try:
            _rewrite_one(rw, node, kind)
        except _Decline as why:
            rw.decline(f"{kind}_module", str(why), node)
