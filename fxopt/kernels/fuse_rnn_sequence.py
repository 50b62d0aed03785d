"""A whole sequence of fused LSTM or GRU steps as one op: fuse_rnn's form of one layer and
direction of an ``nn.LSTM`` / ``nn.GRU`` call.

``fxopt::lstm_sequence`` / ``fxopt::gru_sequence`` take the input projection of the whole
sequence (``x @ W_ih^T + b_ih``, one GEMM outside the op, time-major ``[T, B, G*H]``), the
initial states, ``W_hh`` and ``b_hh``, and step through time inside the op: per step the
hidden projection (one GEMM) and the fused cell (:mod:`fxopt.kernels.fuse_rnn`'s Triton
kernel where Triton runs, its reference elsewhere), each step's outputs written in place
into the sequence's buffers. The backward op steps back through time the same way: per
step the cell's backward kernel and one GEMM that carries the hidden gradient to the
previous step with the next output's gradient added (``addmm``); ``W_hh``'s gradient is
then one GEMM over the whole sequence and ``b_hh``'s one reduction, as cuDNN computes
them.

Why one op and not the steps unrolled in the graph: an unrolled call made a graph that
grows with every step, and its compile time with it (30 s at 8 steps and 78 s at 32 for a
2-layer LSTM on the CPU; over the GPU check's 100 s limit on an H200), and per step it
accumulated the recurrent weight's gradient (a read and write of ``W_hh``'s size per step).
As one op the compile is the same at any length, a symbolic length included.

Saved for the backward (outputs of the op, so a budget's plan sees them): the LSTM's
activated gates and cell states of every step ``[T, B, 4H]`` and ``[T, B, H]``, the GRU's
``[r, z, n, hn]`` per step ``[T, B, 4H]``; and the output sequence (the previous step's
hidden state is what ``W_hh``'s gradient needs), the initial states and ``W_hh``.

FLOPs (``torch.utils.flop_counter``'s registry, which fxopt's cost model reads: a budget's
plan prices recomputing a sequence op as the GEMMs it runs again): the recurrent GEMMs,
``2 T B H G`` forward (``G`` the gates' width) and twice that backward (the hidden
gradient's per step and ``W_hh``'s over the sequence); the cells' elementwise work is left
out, as it is for an aten GEMM's epilogue.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import register_flop_formula

from fxopt.kernels.fuse_rnn import (
    GRU_ORDER,
    LSTM_ORDER,
    gru_backward,
    gru_forward,
    lstm_backward,
    lstm_forward,
)

__all__ = ["lstm_sequence", "gru_sequence"]


def _steps(length: int, reverse: bool) -> range:
    return range(length - 1, -1, -1) if reverse else range(length)


def _dtype(a: torch.Tensor, w_hh: torch.Tensor, state: torch.Tensor) -> torch.dtype:
    """What the cell returns (``fuse_rnn``'s rule): its projections' and state's promotion;
    the hidden projection has ``W_hh``'s dtype."""
    return torch.promote_types(torch.promote_types(a.dtype, w_hh.dtype), state.dtype)


def _previous_hidden(out: torch.Tensor, h0: torch.Tensor, reverse: bool) -> torch.Tensor:
    """Each step's incoming hidden state, ``[T, B, H]`` in time order: ``h0`` then the
    outputs one step behind (ahead, for the reverse direction)."""
    h0 = h0.to(out.dtype).unsqueeze(0)
    return torch.cat([out[1:], h0]) if reverse else torch.cat([h0, out[:-1]])


def _weight_grads(d_pre: torch.Tensor, out: torch.Tensor, h0: torch.Tensor,
                  w_hh: torch.Tensor, reverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``W_hh``'s gradient as one GEMM over all steps, ``b_hh``'s as one reduction (in
    ``W_hh``'s dtype; the autograd formula drops it where the call has no bias)."""
    gates = d_pre.shape[-1]
    hidden_in = _previous_hidden(out, h0, reverse).reshape(-1, out.shape[-1])
    d_w = d_pre.reshape(-1, gates).t().to(w_hh.dtype) @ hidden_in.to(w_hh.dtype)
    return d_w, d_pre.sum((0, 1), dtype=torch.float32).to(w_hh.dtype)


# ---------------------------------------------------------------- LSTM

@torch.library.custom_op("fxopt::lstm_sequence", mutates_args=())
def lstm_sequence(a: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, w_hh: torch.Tensor,
                  b_hh: torch.Tensor | None, reverse: bool
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                             torch.Tensor]:
    """One LSTM layer-direction over ``a`` ``[T, B, 4H]``: (outputs ``[T, B, H]`` in time
    order, last h, last c, and the gates and cell states of every step, kept for the
    backward)."""
    length, batch, hidden = a.shape[0], h0.shape[0], h0.shape[1]
    dtype = _dtype(a, w_hh, c0)
    out = a.new_empty((length, batch, hidden), dtype=dtype)
    cells = torch.empty_like(out)
    gates = a.new_empty((length, batch, 4 * hidden), dtype=dtype)
    h, c = h0, c0
    for t in _steps(length, reverse):
        recurrent = torch.mm(h.to(w_hh.dtype), w_hh.t())
        h, c, _ = lstm_forward(a[t], recurrent, c, None, b_hh, LSTM_ORDER,
                               out=(out[t], cells[t], gates[t]))
    return out, h.clone(), c.clone(), gates, cells


@lstm_sequence.register_fake
def _(a, h0, c0, w_hh, b_hh, reverse):
    dtype = _dtype(a, w_hh, c0)
    out = a.new_empty((a.shape[0], *h0.shape), dtype=dtype)
    state = h0.new_empty(h0.shape, dtype=dtype)
    return (out, state, torch.empty_like(state), a.new_empty(
        (a.shape[0], h0.shape[0], 4 * h0.shape[1]), dtype=dtype), torch.empty_like(out))


@torch.library.custom_op("fxopt::lstm_sequence_backward", mutates_args=())
def lstm_sequence_backward(d_out: torch.Tensor, d_h: torch.Tensor, d_c: torch.Tensor,
                           gates: torch.Tensor, cells: torch.Tensor, out: torch.Tensor,
                           h0: torch.Tensor, c0: torch.Tensor, w_hh: torch.Tensor,
                           reverse: bool
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                      torch.Tensor, torch.Tensor]:
    """Gradients of (``a``, ``h0``, ``c0``, ``W_hh``, ``b_hh``) from those of the outputs,
    last h and last c: the gate gradients and the hidden-state carry in the outputs' dtype
    (what the GEMMs take), the cell-state carry in fp32."""
    length = out.shape[0]
    d_pre = torch.empty_like(gates)
    dc = d_c.float()
    steps = list(_steps(length, reverse))[::-1]   # the backward's order
    dh = d_out[steps[0]] + d_h.to(d_out.dtype)
    for k, t in enumerate(steps):
        c_prev = c0 if k == len(steps) - 1 else cells[steps[k + 1]]
        _, dc = lstm_backward(dh, dc, gates[t], c_prev, cells[t], LSTM_ORDER,
                              out=(d_pre[t], torch.empty_like(dc)))
        step_in = d_pre[t].to(w_hh.dtype)
        if k < len(steps) - 1:
            dh = torch.addmm(d_out[steps[k + 1]], step_in, w_hh)
        else:
            dh0 = step_in @ w_hh
    d_w, d_b = _weight_grads(d_pre, out, h0, w_hh, reverse)
    return d_pre, dh0.to(h0.dtype), dc.to(c0.dtype), d_w, d_b


@lstm_sequence_backward.register_fake
def _(d_out, d_h, d_c, gates, cells, out, h0, c0, w_hh, reverse):
    return (torch.empty_like(gates), torch.empty_like(h0), torch.empty_like(c0),
            torch.empty_like(w_hh), w_hh.new_empty(w_hh.shape[0]))


def _grad(grad: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like) if grad is None else grad


def _lstm_setup_context(ctx, inputs, output):
    a, h0, c0, w_hh, b_hh, reverse = inputs
    out, _, _, gates, cells = output
    ctx.save_for_backward(gates, cells, out, h0, c0, w_hh)
    ctx.reverse, ctx.a_dtype = reverse, a.dtype
    ctx.bias_dtype = None if b_hh is None else b_hh.dtype


def _lstm_backward(ctx, d_out, d_h, d_c, _d_gates, _d_cells):
    gates, cells, out, h0, c0, w_hh = ctx.saved_tensors
    d_a, dh0, dc0, d_w, d_b = lstm_sequence_backward(
        _grad(d_out, out), _grad(d_h, h0), _grad(d_c, c0), gates, cells, out, h0, c0, w_hh,
        ctx.reverse)
    return (d_a.to(ctx.a_dtype), dh0, dc0, d_w,
            None if ctx.bias_dtype is None else d_b.to(ctx.bias_dtype), None)


lstm_sequence.register_autograd(_lstm_backward, setup_context=_lstm_setup_context)


# ---------------------------------------------------------------- GRU

@torch.library.custom_op("fxopt::gru_sequence", mutates_args=())
def gru_sequence(a: torch.Tensor, h0: torch.Tensor, w_hh: torch.Tensor,
                 b_hh: torch.Tensor | None, reverse: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One GRU layer-direction over ``a`` ``[T, B, 3H]``: (outputs ``[T, B, H]`` in time
    order, last h, and ``[r, z, n, hn]`` of every step, kept for the backward)."""
    length, batch, hidden = a.shape[0], h0.shape[0], h0.shape[1]
    dtype = _dtype(a, w_hh, h0)
    out = a.new_empty((length, batch, hidden), dtype=dtype)
    saved = a.new_empty((length, batch, 4 * hidden), dtype=dtype)
    h = h0
    for t in _steps(length, reverse):
        recurrent = torch.mm(h.to(w_hh.dtype), w_hh.t())
        h, _ = gru_forward(a[t], recurrent, h, None, b_hh, GRU_ORDER, out=(out[t], saved[t]))
    return out, h.clone(), saved


@gru_sequence.register_fake
def _(a, h0, w_hh, b_hh, reverse):
    dtype = _dtype(a, w_hh, h0)
    return (a.new_empty((a.shape[0], *h0.shape), dtype=dtype),
            h0.new_empty(h0.shape, dtype=dtype),
            a.new_empty((a.shape[0], h0.shape[0], 4 * h0.shape[1]), dtype=dtype))


@torch.library.custom_op("fxopt::gru_sequence_backward", mutates_args=())
def gru_sequence_backward(d_out: torch.Tensor, d_h: torch.Tensor, saved: torch.Tensor,
                          out: torch.Tensor, h0: torch.Tensor, w_hh: torch.Tensor,
                          reverse: bool
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of (``a``, ``h0``, ``W_hh``, ``b_hh``): the input side's gate gradients
    and the hidden side's (whose n-gate part is scaled by ``r``) differ, so the backward
    keeps both, in the outputs' dtype, as the hidden-state carry."""
    length, hidden = out.shape[0], out.shape[-1]
    d_a = saved.new_empty((length, out.shape[1], 3 * hidden))
    d_b = torch.empty_like(d_a)
    previous = _previous_hidden(out, h0, reverse)
    steps = list(_steps(length, reverse))[::-1]   # the backward's order
    dh = d_out[steps[0]] + d_h.to(d_out.dtype)
    for k, t in enumerate(steps):
        _, _, through_gates = gru_backward(dh, saved[t], previous[t], GRU_ORDER,
                                           out=(d_a[t], d_b[t], torch.empty_like(dh)))
        step_in = d_b[t].to(w_hh.dtype)
        if k < len(steps) - 1:
            dh = torch.addmm(d_out[steps[k + 1]], step_in, w_hh).add_(through_gates)
        else:
            dh0 = torch.addmm(through_gates.to(w_hh.dtype), step_in, w_hh)
    d_w, d_bias = _weight_grads(d_b, out, h0, w_hh, reverse)
    return d_a, dh0.to(h0.dtype), d_w, d_bias


@gru_sequence_backward.register_fake
def _(d_out, d_h, saved, out, h0, w_hh, reverse):
    shape = (out.shape[0], out.shape[1], 3 * out.shape[2])
    return (saved.new_empty(shape), torch.empty_like(h0), torch.empty_like(w_hh),
            w_hh.new_empty(w_hh.shape[0]))


def _gru_setup_context(ctx, inputs, output):
    a, h0, w_hh, b_hh, reverse = inputs
    out, _, saved = output
    ctx.save_for_backward(saved, out, h0, w_hh)
    ctx.reverse, ctx.a_dtype = reverse, a.dtype
    ctx.bias_dtype = None if b_hh is None else b_hh.dtype


def _gru_backward(ctx, d_out, d_h, _d_saved):
    saved, out, h0, w_hh = ctx.saved_tensors
    d_a, dh0, d_w, d_b = gru_sequence_backward(
        _grad(d_out, out), _grad(d_h, h0), saved, out, h0, w_hh, ctx.reverse)
    d_bias = None if ctx.bias_dtype is None else d_b.to(ctx.bias_dtype)
    return d_a.to(ctx.a_dtype), dh0, d_w, d_bias, None


gru_sequence.register_autograd(_gru_backward, setup_context=_gru_setup_context)


# ---------------------------------------------------------------- FLOPs


def _recurrent_flops(a_shape, w_shape) -> int:
    """One pass of the recurrent GEMMs over the sequence: ``2 T B H G``."""
    length, batch, gates = a_shape
    return 2 * length * batch * gates * w_shape[1]


@register_flop_formula([torch.ops.fxopt.lstm_sequence, torch.ops.fxopt.gru_sequence])
def _sequence_flops(a_shape, h0_shape, *args, out_shape=None, **kwargs) -> int:
    w_shape = args[1] if len(args) == 4 else args[0]   # the LSTM's c0 comes first
    return _recurrent_flops(a_shape, w_shape)


@register_flop_formula([torch.ops.fxopt.lstm_sequence_backward,
                        torch.ops.fxopt.gru_sequence_backward])
def _sequence_backward_flops(*args, out_shape=None, **kwargs) -> int:
    d_a_shape, w_shape = out_shape[0], out_shape[-2]
    return 2 * _recurrent_flops(d_a_shape, w_shape)
