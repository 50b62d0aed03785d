"""``fxopt::recompute_rnn``: a whole ``nn.LSTM`` / ``nn.GRU`` call that saves only its inputs.

The op runs the library's own fused RNN (``torch.lstm`` / ``torch.gru``: oneDNN on the CPU,
cuDNN on CUDA) and keeps nothing of it for backward but its inputs (the sequence, the initial
states; the weights are parameters). Its backward, ``fxopt::recompute_rnn_backward``, runs
the same call again under autograd and differentiates it: per-block activation
checkpointing of one library call, inside a compiled graph. This is what
:mod:`fxopt.passes.recompute_rnn` puts in place of a traced ``torch.lstm``
under a memory budget, where the alternative, AOTAutograd's per-step decomposition of the
call, runs slower than the fused call and its recompute together (measured in
``benchmarks/results/budget_frontier_models_cpu.md``).

The forward runs the library's inference kernel, which allocates no workspace: the training
kernel would allocate the whole of what eager keeps (cuDNN's reserve space, oneDNN's
workspace) only to drop it when the op returns, at the forward's peak, and it is slower
(oneDNN, 2 layers of 256, 64 steps, batch 8: 11.3 against 13.0 ms). Its output equals the
training kernel's to fp32 rounding (1e-7 there; bit for bit at small sizes), so the op's
output is eager's to that rounding, and its gradients are eager's backward of the call
(the training kernel's forward and backward) at the gradients it is given. Inter-layer
dropout while training is not taken (the pass declines it): a replay would draw new masks.

The ops take the call's arguments as ``torch.lstm``'s input overload does, ``hx`` as a list
(``[h0, c0]`` for an LSTM, ``[h0]`` for a GRU; empty: zero states made inside the op, as
``nn.LSTM`` makes them when given none, so they are neither inputs nor saved), and return
``[output, h_n(, c_n)]``.

A custom op's returns may share storage with none of its inputs and none of its other returns
(torch checks this on every call). The library does not promise that: cuDNN's backward returns
the weights' gradients as views of one flat gradient buffer (``_cudnn_rnn_backward_weight``
views its ``dw`` when the weights' layout matches cuDNN's), and autograd may hand back a
gradient it was given. Both ops therefore pass their results through :func:`_owning`, which
copies exactly the returns that share a storage with an input or an earlier return, so every
device's path keeps the contract and the CPU's, which shares none, copies nothing.
"""

from __future__ import annotations

import torch

from fxopt import _compat

__all__ = ["recompute_rnn", "recompute_rnn_backward", "zero_state_shapes"]

_LIBRARY_CALLS = {"lstm": torch.lstm, "gru": torch.gru}


def _private_saves() -> torch.autograd.graph.saved_tensors_hooks:
    """Saved-tensor hooks that keep the replay's saves to itself: a caller's hooks (an
    offloading hook, ``measure_saved_bytes``) never see the tensors the library call saves
    inside the op, which the op frees before it returns."""
    return torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)


def _owning(results: list[torch.Tensor], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
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


def _run(mode: str, x: torch.Tensor, hx: list[torch.Tensor], params: list[torch.Tensor],
         has_biases: bool, num_layers: int, bidirectional: bool, batch_first: bool
         ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The library call under autograd on detached leaves: (leaves, outputs). No ``hx``:
    zero initial states, made here as the module makes them (not leaves)."""
    leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in (x, *hx, *params)]
    x_leaf, hx_leaves, param_leaves = leaves[0], leaves[1:1 + len(hx)], leaves[1 + len(hx):]
    outputs = _call(mode, x_leaf, hx_leaves, param_leaves, has_biases, num_layers,
                    bidirectional, batch_first)
    return leaves, list(outputs)


def _call(mode: str, x: torch.Tensor, hx: list[torch.Tensor], params: list[torch.Tensor],
          has_biases: bool, num_layers: int, bidirectional: bool, batch_first: bool
          ) -> tuple[torch.Tensor, ...]:
    """``torch.lstm`` / ``torch.gru``, no dropout; no ``hx``: the module's zero states."""
    states = hx or [x.new_zeros(shape) for shape in zero_state_shapes(
        x, params, mode, num_layers, bidirectional, batch_first)]
    return _LIBRARY_CALLS[mode](x, states if mode == "lstm" else states[0], params, has_biases,
                               num_layers, 0.0, True, bidirectional, batch_first)


@torch.library.custom_op("fxopt::recompute_rnn", mutates_args=())
def recompute_rnn(x: torch.Tensor, hx: list[torch.Tensor], params: list[torch.Tensor],
                  mode: str, has_biases: bool, num_layers: int, bidirectional: bool,
                  batch_first: bool) -> list[torch.Tensor]:
    """``torch.lstm`` / ``torch.gru`` (``mode``) whose backward recomputes it."""
    with torch.no_grad():  # the inference kernel (module doc)
        output, *states = _call(mode, x, hx, params, has_biases, num_layers, bidirectional,
                                batch_first)
    if batch_first and not output.transpose(0, 1).is_contiguous():
        output = output.transpose(0, 1).contiguous().transpose(0, 1)  # the fake's layout
    return _owning([output, *states], [x, *hx, *params])


@recompute_rnn.register_fake
def _(x, hx, params, mode, has_biases, num_layers, bidirectional, batch_first):
    states = hx or [x.new_empty(shape) for shape in zero_state_shapes(
        x, params, mode, num_layers, bidirectional, batch_first)]
    features = (2 if bidirectional else 1) * states[0].shape[-1]
    if batch_first:  # the library computes time-major and returns the transposed view
        output = x.new_empty((x.shape[1], x.shape[0], features)).transpose(0, 1)
    else:
        output = x.new_empty((*x.shape[:-1], features))
    return [output, *(h.new_empty(h.shape) for h in states)]


@torch.library.custom_op("fxopt::recompute_rnn_backward", mutates_args=())
def recompute_rnn_backward(x: torch.Tensor, hx: list[torch.Tensor],
                           params: list[torch.Tensor], grads: list[torch.Tensor], mode: str,
                           has_biases: bool, num_layers: int, bidirectional: bool,
                           batch_first: bool) -> list[torch.Tensor]:
    """The gradients of ``[x, *hx, *params]`` given those of ``[output, h_n(, c_n)]``: the
    call run again under autograd, then differentiated."""
    with torch.enable_grad(), _compat.autograd_dispatch_restored(), _private_saves():
        leaves, outputs = _run(mode, x, hx, params, has_biases, num_layers, bidirectional,
                               batch_first)
        wanted = [leaf for leaf in leaves if leaf.requires_grad]
        found = iter(torch.autograd.grad(outputs, wanted, grads, allow_unused=True))
    results = [torch.zeros_like(leaf) if not leaf.requires_grad or (g := next(found)) is None
               else g.contiguous() for leaf in leaves]  # the fake's layout
    return _owning(results, [x, *hx, *params, *grads])


@recompute_rnn_backward.register_fake
def _(x, hx, params, grads, mode, has_biases, num_layers, bidirectional, batch_first):
    return [t.new_empty(t.shape) for t in (x, *hx, *params)]


def _setup_context(ctx, inputs, output):
    x, hx, params, *arguments = inputs
    ctx.save_for_backward(x, *hx, *params)
    ctx.counts, ctx.arguments = (len(hx), len(params)), arguments
    ctx.output_shapes = [(out.shape, out.dtype, out.device) for out in output]


def _backward(ctx, grads):
    x, *rest = ctx.saved_tensors
    n_hx, _ = ctx.counts
    hx, params = rest[:n_hx], rest[n_hx:]
    grads = [torch.zeros(shape, dtype=dtype, device=device) if g is None else g
             for g, (shape, dtype, device) in zip(grads, ctx.output_shapes)]
    result = recompute_rnn_backward(x, list(hx), list(params), grads, *ctx.arguments)
    return (result[0], result[1:1 + n_hx], result[1 + n_hx:], *([None] * len(ctx.arguments)))


recompute_rnn.register_autograd(_backward, setup_context=_setup_context)
