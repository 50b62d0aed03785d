"""The library's whole-sequence RNN call (``torch.lstm`` / ``torch.gru``: cuDNN on CUDA,
oneDNN on the CPU) as the whole-call RNN ops run it: ``fxopt::recompute_rnn``, which runs it
again in the backward, and ``fxopt::library_rnn``, which runs it once and keeps its graph.

The ops take the call's arguments as ``torch.lstm``'s input overload does, ``hx`` as a list
(``[h0, c0]`` for an LSTM, ``[h0]`` for a GRU; empty: the zero states ``nn.LSTM`` makes when
given none, made here, so they are neither the ops' inputs nor saved), and return
``[output, h_n(, c_n)]`` first.

A custom op's returns may share storage with none of its inputs and none of its other
returns (torch checks this on every call). The library does not promise that: cuDNN's
backward returns the weights' gradients as views of one flat gradient buffer
(``_cudnn_rnn_backward_weight`` views its ``dw`` when the weights' layout matches cuDNN's),
and autograd may hand back a gradient it was given. The ops pass their results through
:func:`owning`, which copies exactly the returns that share a storage with an input or an
earlier return, so every device's path keeps the contract and the CPU's, which shares none,
copies nothing.
"""

from __future__ import annotations

import torch

__all__ = ["LIBRARY_CALLS", "call", "call_on_leaves", "fake_outputs", "inference_call",
           "leaf_gradients", "owning", "zero_state_shapes"]

LIBRARY_CALLS = {"lstm": torch.lstm, "gru": torch.gru}


def zero_state_shapes(x: torch.Tensor, params: list[torch.Tensor], mode: str,
                      num_layers: int, bidirectional: bool, batch_first: bool
                      ) -> list[tuple[int, ...]]:
    """The shapes of the initial states ``nn.LSTM``/``nn.GRU`` make when given none:
    ``(layers x directions, batch, size)``, h's size the hidden weight's columns (the
    projection's, with ``proj_size``), c's its rows over the gate count."""
    stacked = num_layers * (2 if bidirectional else 1)
    batch = x.shape[0 if batch_first else 1]
    rows, columns = params[1].shape  # weight_hh_l0: (gates x hidden, hidden or proj_size)
    if mode == "gru":
        return [(stacked, batch, columns)]
    return [(stacked, batch, columns), (stacked, batch, rows // 4)]


def call(mode: str, x: torch.Tensor, hx: list[torch.Tensor], params: list[torch.Tensor],
         has_biases: bool, num_layers: int, dropout: float, train: bool, bidirectional: bool,
         batch_first: bool) -> tuple[torch.Tensor, ...]:
    """``torch.lstm`` / ``torch.gru`` (``mode``); no ``hx``: the module's zero states."""
    states = hx or [x.new_zeros(shape) for shape in zero_state_shapes(
        x, params, mode, num_layers, bidirectional, batch_first)]
    return LIBRARY_CALLS[mode](x, states if mode == "lstm" else states[0], params, has_biases,
                              num_layers, dropout, train, bidirectional, batch_first)


def inference_call(mode: str, x: torch.Tensor, hx: list[torch.Tensor],
                   params: list[torch.Tensor], has_biases: bool, num_layers: int,
                   dropout: float, train: bool, bidirectional: bool, batch_first: bool
                   ) -> list[torch.Tensor]:
    """:func:`call` under ``no_grad`` (the library's inference kernel, which allocates no
    workspace), its output in :func:`fake_outputs`' layout and its returns owning their
    storage (:func:`owning`)."""
    with torch.no_grad():
        output, *states = call(mode, x, hx, params, has_biases, num_layers, dropout, train,
                               bidirectional, batch_first)
    if batch_first and not output.transpose(0, 1).is_contiguous():
        output = output.transpose(0, 1).contiguous().transpose(0, 1)  # the fakes' layout
    return owning([output, *states], [x, *hx, *params])


def call_on_leaves(mode: str, x: torch.Tensor, hx: list[torch.Tensor],
                   params: list[torch.Tensor], has_biases: bool, num_layers: int,
                   dropout: float, train: bool, bidirectional: bool, batch_first: bool, *,
                   copy_inputs: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """:func:`call` on detached leaves that require grad (the floating-point ones):
    ``([x, *hx, *params]`` as leaves, the outputs). ``copy_inputs``: the sequence's and the
    states' leaves are copies (the weights' never are). The caller sets the grad mode (an
    op's kernel also needs :func:`fxopt._compat.autograd_dispatch_restored`)."""
    def leaf(t: torch.Tensor, copy: bool) -> torch.Tensor:
        return (t.detach().clone() if copy else t.detach()).requires_grad_(
            t.is_floating_point())

    leaves = [leaf(t, copy_inputs) for t in (x, *hx)] + [leaf(p, False) for p in params]
    x_leaf, hx_leaves, param_leaves = leaves[0], leaves[1:1 + len(hx)], leaves[1 + len(hx):]
    outputs = call(mode, x_leaf, hx_leaves, param_leaves, has_biases, num_layers, dropout,
                   train, bidirectional, batch_first)
    return leaves, list(outputs)


def leaf_gradients(leaves: list[torch.Tensor], outputs: list[torch.Tensor],
                   grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """The gradient of every leaf of :func:`call_on_leaves` given ``grads`` of its
    ``outputs``: zeros where a leaf does not require grad or is unused, contiguous (the ops'
    fakes' layout). Run under the grad mode the call was recorded in."""
    wanted = [leaf for leaf in leaves if leaf.requires_grad]
    found = iter(torch.autograd.grad(outputs, wanted, grads, allow_unused=True))
    return [torch.zeros_like(leaf) if not leaf.requires_grad or (g := next(found)) is None
            else g.contiguous() for leaf in leaves]


def fake_outputs(x: torch.Tensor, hx: list[torch.Tensor], params: list[torch.Tensor],
                 mode: str, num_layers: int, bidirectional: bool, batch_first: bool
                 ) -> list[torch.Tensor]:
    """Empty ``[output, h_n(, c_n)]`` of the call's shapes and strides (the ops' fakes)."""
    states = hx or [x.new_empty(shape) for shape in zero_state_shapes(
        x, params, mode, num_layers, bidirectional, batch_first)]
    features = (2 if bidirectional else 1) * states[0].shape[-1]
    if batch_first:  # the library computes time-major and returns the transposed view
        output = x.new_empty((x.shape[1], x.shape[0], features)).transpose(0, 1)
    else:
        output = x.new_empty((*x.shape[:-1], features))
    return [output, *(h.new_empty(h.shape) for h in states)]


def owning(results: list[torch.Tensor], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """``results`` with each one that shares a storage with an input or an earlier result
    replaced by a copy (``clone``, which keeps the layout), so that no two of the returned
    and input tensors share memory (the custom-op contract, module doc)."""
    taken = {t.untyped_storage().data_ptr() for t in inputs}
    owned = []
    for t in results:
        if t.untyped_storage().data_ptr() in taken:
            t = t.clone()
        taken.add(t.untyped_storage().data_ptr())
        owned.append(t)
    return owned
