"""The whole ``nn.LSTM`` / ``nn.GRU`` calls that recompute_rnn and library_rnn replace by a
library op, read and replaced in one place.

Both passes take a ``torch.lstm`` / ``torch.gru`` call of Dynamo's graph (traced under
``torch._dynamo.config.allow_rnn``; fuse_rnn, when on, has taken the calls it fuses) and put
an fxopt op that runs the library's fused RNN in its place; they differ in what the op keeps
for the backward. They decline the same calls, with the reason: packed sequences and
unrecognised arguments, unbatched inputs, autocast regions (eager's dtypes there depend on
the library path), and a result used other than by index. A replaying op also declines
inter-layer dropout while training: a replay would draw new masks. A call no gradient flows
through (under ``torch.no_grad``, or none of its inputs requiring grad) is taken too: left
alone, AOTAutograd's inference graph would decompose it into per-step ops as well, and the
ops run the library's inference kernel for it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.fx as fx

from fxopt import _compat
from fxopt.kernels.library_rnn_calls import zero_state_shapes
from fxopt.passes.base import Verdicts
from fxopt.passes.fuse_rnn.graph import autocast_dtypes
from fxopt.passes.torch_calls import (
    RNN_CALLS,
    RnnCall,
    example_tensor,
    example_value,
    rnn_call,
)

__all__ = ["replace_whole_rnns"]


class _Decline(Exception):
    pass


def _read(node: fx.Node, in_autocast: bool, replays: bool) -> RnnCall:
    """The call as read, or :class:`_Decline` with the reason."""
    try:
        call = rnn_call(node)
    except ValueError as why:
        raise _Decline(str(why)) from None
    if any(example_tensor(t) is None or example_tensor(t).dim() != 3
           for t in [call.x, *call.states]):
        raise _Decline("unbatched input or state")
    if replays and call.dropout and call.train and call.layers > 1:
        raise _Decline("inter-layer dropout while training (a recompute would draw new masks)")
    if in_autocast:
        raise _Decline("inside an autocast region (eager's dtypes depend on the library path)")
    if any(u.op != "call_function" or u.target is not operator.getitem for u in node.users):
        raise _Decline("the result is used other than by index")
    return call


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


def replace_whole_rnns(gm: fx.GraphModule, op: Callable[..., object], pass_name: str,
                       arguments: Callable[[RnnCall, list[fx.Node], bool], tuple], *,
                       replays: bool, allow: Callable[[], bool] = lambda: True,
                       saved_bytes: Callable[[RnnCall], int] = lambda call: 0) -> Verdicts:
    """Replace each ``torch.lstm`` / ``torch.gru`` call of ``gm`` that ``allow`` accepts by
    ``op``, called with ``arguments(call, states, grad)`` (``states``: the call's initial
    states, or none where they are the module's zeros, which the op makes itself; ``grad``:
    whether a gradient flows through the call, read from its outputs' example values);
    ``op`` returns
    the call's ``[output, h_n(, c_n)]`` first. ``replays``: whether the op runs the call
    again in the backward. The verdicts: per mode the calls replaced and
    ``saved_bytes(call)``, the bytes each takes out of the step; per call left its reason."""
    verdicts = Verdicts()
    autocast = autocast_dtypes(gm.graph)
    for node in [n for n in gm.graph.nodes
                 if n.op == "call_function" and n.target in RNN_CALLS]:
        mode = RNN_CALLS[node.target]
        try:
            call = _read(node, bool(autocast.get(node)), replays)
        except _Decline as why:
            verdicts.decline(node.name, f"{mode}: {why}")
            continue
        if not allow():
            continue
        states = [] if _module_zero_states(call, node) else call.states
        with gm.graph.inserting_before(node):
            grad = any(t.requires_grad for t in example_value(node)
                       if isinstance(t, torch.Tensor))
            new = gm.graph.call_function(op, arguments(call, states, grad))
        new.meta["example_value"] = list(example_value(node))
        new.meta["fxopt"] = {"pass": pass_name, "replaces": [node.name]}
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        for state in call.states:
            if not state.users:  # the module's zero states, made inside the op now
                gm.graph.erase_node(state)
        verdicts.match(mode, bytes=saved_bytes(call))
    return verdicts
