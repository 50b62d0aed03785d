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

The ops take and return what :mod:`fxopt.kernels.library_rnn_calls` says, and keep its
custom-op contract on the storage of their returns.
"""

from __future__ import annotations

import torch

from fxopt import _compat
from fxopt.kernels import library_rnn_calls

__all__ = ["recompute_rnn", "recompute_rnn_backward"]


def _private_saves() -> torch.autograd.graph.saved_tensors_hooks:
    """Saved-tensor hooks that keep the replay's saves to itself: a caller's hooks (an
    offloading hook, ``measure_saved_bytes``) never see the tensors the library call saves
    inside the op, which the op frees before it returns."""
    return torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)


@torch.library.custom_op("fxopt::recompute_rnn", mutates_args=())
def recompute_rnn(x: torch.Tensor, hx: list[torch.Tensor], params: list[torch.Tensor],
                  mode: str, has_biases: bool, num_layers: int, bidirectional: bool,
                  batch_first: bool) -> list[torch.Tensor]:
    """``torch.lstm`` / ``torch.gru`` (``mode``) whose backward recomputes it."""
    return library_rnn_calls.inference_call(mode, x, hx, params, has_biases, num_layers,
                                            0.0, True, bidirectional, batch_first)


@recompute_rnn.register_fake
def _(x, hx, params, mode, has_biases, num_layers, bidirectional, batch_first):
    return library_rnn_calls.fake_outputs(x, hx, params, mode, num_layers, bidirectional,
                                          batch_first)


@torch.library.custom_op("fxopt::recompute_rnn_backward", mutates_args=())
def recompute_rnn_backward(x: torch.Tensor, hx: list[torch.Tensor],
                           params: list[torch.Tensor], grads: list[torch.Tensor], mode: str,
                           has_biases: bool, num_layers: int, bidirectional: bool,
                           batch_first: bool) -> list[torch.Tensor]:
    """The gradients of ``[x, *hx, *params]`` given those of ``[output, h_n(, c_n)]``: the
    call run again under autograd, then differentiated."""
    with torch.enable_grad(), _compat.autograd_dispatch_restored(), _private_saves():
        leaves, outputs = library_rnn_calls.call_on_leaves(
            mode, x, hx, params, has_biases, num_layers, 0.0, True, bidirectional,
            batch_first, copy_inputs=False)
        results = library_rnn_calls.leaf_gradients(leaves, outputs, grads)
    return library_rnn_calls.owning(results, [x, *hx, *params, *grads])


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
