"""Tempo's memory-lean LayerNorm and RMSNorm: ``fxopt::tempo_layer_norm`` and
``fxopt::tempo_rms_norm`` save their output y and rstd for backward, not their input.

The backward rebuilds the normalized input from the output: x_hat = (y - beta) / gamma
(RMSNorm: y / gamma), then the usual formulas
dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)) with g = dy * gamma (RMSNorm without
the mean(g) term), dgamma = sum(dy * x_hat), dbeta = sum(dy). Memory: the input (and
LayerNorm's mean) are replaced by rstd, one fp32 per row; y costs nothing when the next op
keeps it anyway (a Linear after the norm does), which the pass checks.

Gamma at or near zero (the guard). Where gamma_j is 0, y_j = beta_j holds nothing of x_j,
and where |gamma_j| is small beside |beta_j| the division amplifies y's rounding error by
|beta_j| / |gamma_j|. So the forward also saves x_hat exactly for the
``guard_capacity(n)`` columns with the largest amplification (about 1.6% of the input),
and the backward uses those saved values there: exact for up to that many unsafe columns
(amplification above MAX_AMPLIFICATION for y's dtype: 100 in fp32 keeps x_hat's error
near 1e-5; 2 in bf16, whose rounding alone is 4e-3; or |gamma_j| < 1e-30). With more
unsafe columns than that, x is not recoverable from what was saved: the backward then
returns NaN for dx and dgamma (dbeta needs no x_hat and stays exact), never a silently
wrong gradient, and loss or gradient-norm checks (AMP's GradScaler skips such a step)
report it. The decision is made on the device from gamma and beta, so a norm never waits
for the host (no host sync per norm per step). In bf16 the error grows with
|beta| / |gamma| below that bound: Tempo's trade, exact only in the guarded columns.
The computation is in fp32; y has the dtype the replaced code's output had.

Under autocast (``fxopt::tempo_layer_norm_cast``, ``fxopt::tempo_rms_norm_cast``) y is
fp32 but its users that keep it keep their bf16 cast: the op returns both, saves the cast
and rebuilds x_hat from it, so x_hat carries bf16's rounding (2**-8 relative, amplified by
|beta / gamma| <= 2 outside the guard, bf16's MAX_AMPLIFICATION; RMSNorm has no beta: 2**-8
alone; the bounds are written out in tests/passes/tempo/test_tempo_autocast.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

__all__ = ["MAX_AMPLIFICATION", "guard_capacity", "sum_grads", "tempo_layer_norm",
           "tempo_layer_norm_cast", "tempo_rms_norm", "tempo_rms_norm_cast"]

# Largest |beta| / |gamma| (the factor that multiplies y's rounding error in x_hat) that is
# not guarded, per dtype of y.
MAX_AMPLIFICATION = {torch.float32: 100.0, torch.float64: 1e6, torch.bfloat16: 2.0,
                     torch.float16: 10.0}
_TINY = 1e-30


def guard_capacity(n: int) -> int:
    """How many columns of an n-wide norm get their x_hat saved exactly."""
    return min(n, max(2, math.ceil(n / 64)))


def _rows(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.reshape(-1, n).float()


def _unsafe_scores(weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype
                   ) -> torch.Tensor:
    """|gamma_j| / (|beta_j| / amplification bound): column j is unsafe where this is <= 1."""
    threshold = (bias.detach().float().abs() / MAX_AMPLIFICATION.get(out_dtype, 2.0)
                 if bias is not None else 0.0)
    return weight.detach().float().abs() / (threshold + _TINY)


def _guard_columns(weight: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype
                   ) -> torch.Tensor:
    """The guarded columns (int64 [capacity]): the least safe ones."""
    capacity = guard_capacity(weight.numel())
    return torch.topk(_unsafe_scores(weight, bias, out_dtype), capacity, largest=False).indices


def _nan_if_unguarded(grads: tuple[torch.Tensor, ...], weight: torch.Tensor,
                      bias: torch.Tensor | None, out_dtype: torch.dtype
                      ) -> tuple[torch.Tensor, ...]:
    """``grads`` all NaN when more columns are unsafe than the guard saved (decided on the
    device: a 0-d mask, no host sync)."""
    unsafe = (_unsafe_scores(weight, bias, out_dtype) <= 1).sum()
    too_many = unsafe > guard_capacity(weight.numel())
    # a 0-d NaN-or-0 added (in place: the grads are this backward's own temporaries), a
    # plain vectorized add; masked_fill with a 0-d mask takes 4x as long on the CPU
    penalty = torch.where(too_many, math.nan, 0.0)
    return tuple(g.add_(penalty) for g in grads)


def _rms_normalize(x: torch.Tensor, n: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    rows = _rows(x, n)
    rstd = torch.rsqrt(rows.pow(2).mean(-1) + eps)
    return rows * rstd[:, None], rstd


def _vector(t: torch.Tensor | None, n: int, fill: float, like: torch.Tensor) -> torch.Tensor:
    if t is None:
        return torch.full((n,), fill, dtype=torch.float32, device=like.device)
    return t.reshape(n).float()


XhatFromOutput = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                           torch.Tensor], torch.Tensor]


def _xhat_from_output(y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                      guard_xhat: torch.Tensor, guard_index: torch.Tensor) -> torch.Tensor:
    n = weight.numel()
    safe_weight = weight.index_fill(0, guard_index, 1.0)
    xhat = (_rows(y, n) - bias) / safe_weight
    return xhat.index_copy(1, guard_index, guard_xhat)


def _rms_norm_backward_rows(dy: torch.Tensor, xhat: torch.Tensor, rstd: torch.Tensor,
                           weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm's (dx, dgamma) from x_hat (LayerNorm's backward is ATen's, see below)."""
    dy = _rows(dy, weight.numel())
    g = dy * weight
    projected = g - xhat * (g * xhat).mean(-1, keepdim=True)
    return projected * rstd[:, None], (dy * xhat).sum(0)


def _fake_outputs(x: torch.Tensor, n: int, out_dtype: torch.dtype
                  ) -> tuple[torch.Tensor, ...]:
    rows = x.numel() // n
    capacity = guard_capacity(n)
    return (torch.empty(x.shape, dtype=out_dtype, device=x.device),
            x.new_empty((rows,), dtype=torch.float32),
            x.new_empty((rows, capacity), dtype=torch.float32),
            x.new_empty((capacity,), dtype=torch.int64))


def _grad_like(grad: torch.Tensor, t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else grad.reshape(t.shape).to(t.dtype)


# --- LayerNorm --------------------------------------------------------------------------

def _layer_norm_rows(x: torch.Tensor, n: int, weight: torch.Tensor | None,
                     bias: torch.Tensor | None, eps: float, kept_dtype: torch.dtype
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y as fp32 rows, rstd [rows], guarded x_hat, guarded columns), the guard chosen for
    x_hat rebuilt from y rounded to ``kept_dtype``."""
    rows = _rows(x, n)
    w, b = _vector(weight, n, 1.0, x), _vector(bias, n, 0.0, x)
    # ATen's fused kernel (eager's own): y, mean and rstd in one pass over the rows
    y, mean, rstd = torch.native_layer_norm(rows, (n,), w, b, eps)
    guard = (_guard_columns(w, b, kept_dtype) if weight is not None
             else torch.arange(guard_capacity(n), device=x.device))
    guard_xhat = (rows.index_select(1, guard) - mean) * rstd
    return y, rstd.view(-1), guard_xhat, guard


def layer_norm_forward(x: torch.Tensor, n: int, weight: torch.Tensor | None,
                       bias: torch.Tensor | None, eps: float, out_dtype: torch.dtype
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """LayerNorm over the last dims (``n`` elements per row), in fp32, y in ``out_dtype``.
    Returns (y, rstd [rows], guarded x_hat [rows, capacity], guarded columns)."""
    y, rstd, guard_xhat, guard = _layer_norm_rows(x, n, weight, bias, eps, out_dtype)
    return y.to(out_dtype).view(x.shape), rstd, guard_xhat, guard


def layer_norm_cast_forward(x: torch.Tensor, n: int, weight: torch.Tensor | None,
                            bias: torch.Tensor | None, eps: float, out_dtype: torch.dtype,
                            kept_dtype: torch.dtype
                            ) -> tuple[torch.Tensor, ...]:
    """LayerNorm under autocast, whose output feeds both ops that keep its low-precision
    cast (autocast's Linears) and ops that take it as is (a residual add): (y in
    ``out_dtype``, y in ``kept_dtype``, rstd, guarded x_hat, guarded columns). The cast is
    what the backward rebuilds x_hat from, so the guard is chosen for its dtype."""
    y, rstd, guard_xhat, guard = _layer_norm_rows(x, n, weight, bias, eps, kept_dtype)
    return (y.to(out_dtype).view(x.shape), y.to(kept_dtype).view(x.shape), rstd,
            guard_xhat, guard)


@torch.library.custom_op("fxopt::tempo_layer_norm", mutates_args=())
def tempo_layer_norm(x: torch.Tensor, n: int, weight: torch.Tensor | None,
                     bias: torch.Tensor | None, eps: float, out_dtype: torch.dtype
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`layer_norm_forward` as an op opaque to tracing."""
    return layer_norm_forward(x, n, weight, bias, eps, out_dtype)


@tempo_layer_norm.register_fake
def _(x, n, weight, bias, eps, out_dtype):
    return _fake_outputs(x, n, out_dtype)


def layer_norm_backward(dy: torch.Tensor, y: torch.Tensor, rstd: torch.Tensor,
                        guard_xhat: torch.Tensor, guard_index: torch.Tensor,
                        weight: torch.Tensor | None, bias: torch.Tensor | None,
                        xhat_from_output: XhatFromOutput = _xhat_from_output
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx in fp32 rows, dweight, dbias) of :func:`layer_norm_forward` from its outputs;
    ``xhat_from_output(y, weight, bias, guard_xhat, guard_index)`` rebuilds x_hat."""
    n = y.numel() // rstd.numel()
    w, b = _vector(weight, n, 1.0, y), _vector(bias, n, 0.0, y)
    xhat = xhat_from_output(y, w, b, guard_xhat, guard_index)
    # ATen's fused LayerNorm backward given x_hat as the input with mean 0 and rstd 1
    # gives rstd-free dx (the projection of g = dy * gamma), dgamma and dbeta exactly
    rows = rstd.numel()
    unit = xhat.new_ones((rows, 1))
    dx, dweight, dbias = torch.ops.aten.native_layer_norm_backward(
        _rows(dy, n), xhat, (n,), unit.new_zeros((rows, 1)), unit, w, b, (True, True, True))
    dx = dx.mul_(rstd[:, None])
    if weight is None:
        return dx, dweight, dbias
    return (*_nan_if_unguarded((dx, dweight), w, b, y.dtype), dbias)


@torch.library.custom_op("fxopt::tempo_layer_norm_backward", mutates_args=())
def tempo_layer_norm_backward(dy: torch.Tensor, y: torch.Tensor, rstd: torch.Tensor,
                              guard_xhat: torch.Tensor, guard_index: torch.Tensor,
                              weight: torch.Tensor | None, bias: torch.Tensor | None
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`layer_norm_backward` as an op opaque to tracing."""
    return layer_norm_backward(dy, y, rstd, guard_xhat, guard_index, weight, bias)


@tempo_layer_norm_backward.register_fake
def _(dy, y, rstd, guard_xhat, guard_index, weight, bias):
    n = y.numel() // rstd.numel()
    return (y.new_empty((rstd.numel(), n), dtype=torch.float32),
            y.new_empty((n,), dtype=torch.float32), y.new_empty((n,), dtype=torch.float32))


def _layer_norm_setup(ctx, inputs, output) -> None:
    x, n, weight, bias, _, _ = inputs
    ctx.x_meta = (x.shape, x.dtype)
    ctx.save_for_backward(output[0], output[1], output[2], output[3], weight, bias)


def _layer_norm_backward(ctx, dy, *_unused):
    y, rstd, guard_xhat, guard_index, weight, bias = ctx.saved_tensors
    dx, dweight, dbias = tempo_layer_norm_backward(dy, y, rstd, guard_xhat, guard_index,
                                                   weight, bias)
    shape, dtype = ctx.x_meta
    return (dx.view(shape).to(dtype), None, _grad_like(dweight, weight),
            _grad_like(dbias, bias), None, None)


tempo_layer_norm.register_autograd(_layer_norm_backward, setup_context=_layer_norm_setup)


@torch.library.custom_op("fxopt::tempo_layer_norm_cast", mutates_args=())
def tempo_layer_norm_cast(x: torch.Tensor, n: int, weight: torch.Tensor | None,
                          bias: torch.Tensor | None, eps: float, out_dtype: torch.dtype,
                          kept_dtype: torch.dtype
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                     torch.Tensor]:
    """:func:`layer_norm_cast_forward` as an op opaque to tracing."""
    return layer_norm_cast_forward(x, n, weight, bias, eps, out_dtype, kept_dtype)


@tempo_layer_norm_cast.register_fake
def _(x, n, weight, bias, eps, out_dtype, kept_dtype):
    y, *rest = _fake_outputs(x, n, out_dtype)
    return (y, torch.empty(x.shape, dtype=kept_dtype, device=x.device), *rest)


def sum_grads(dy: torch.Tensor | None, dy_kept: torch.Tensor | None) -> torch.Tensor:
    """The gradient of y from its two outputs (either may be None), in fp32: what eager's
    autograd adds up for y's uses (the cast's backward converts its share to fp32 first)."""
    grads = [g.float() for g in (dy, dy_kept) if g is not None]
    return grads[0] if len(grads) == 1 else grads[0] + grads[1]


def _layer_norm_cast_setup(ctx, inputs, output) -> None:
    x, n, weight, bias, _, _, _ = inputs
    ctx.x_meta = (x.shape, x.dtype)
    ctx.save_for_backward(output[1], output[2], output[3], output[4], weight, bias)


def _layer_norm_cast_backward(ctx, dy, dy_kept, *_unused):
    y_kept, rstd, guard_xhat, guard_index, weight, bias = ctx.saved_tensors
    dx, dweight, dbias = tempo_layer_norm_backward(sum_grads(dy, dy_kept), y_kept, rstd,
                                                   guard_xhat, guard_index, weight, bias)
    shape, dtype = ctx.x_meta
    return (dx.view(shape).to(dtype), None, _grad_like(dweight, weight),
            _grad_like(dbias, bias), None, None, None)


tempo_layer_norm_cast.register_autograd(_layer_norm_cast_backward,
                                        setup_context=_layer_norm_cast_setup)


# --- RMSNorm ----------------------------------------------------------------------------

def _rms_norm_rows(x: torch.Tensor, n: int, weight: torch.Tensor | None, eps: float,
                   round_before_weight: bool, kept_dtype: torch.dtype
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y as fp32 rows, rstd [rows], guarded x_hat, guarded columns), the guard chosen for
    x_hat rebuilt from y rounded to ``kept_dtype``."""
    xhat, rstd = _rms_normalize(x, n, eps)
    if round_before_weight:
        xhat = xhat.to(x.dtype).float()
    w = _vector(weight, n, 1.0, x)
    guard = (_guard_columns(w, None, kept_dtype) if weight is not None
             else torch.arange(guard_capacity(n), device=x.device))
    return xhat * w, rstd, xhat[:, guard].contiguous(), guard


def rms_norm_forward(x: torch.Tensor, n: int, weight: torch.Tensor | None, eps: float,
                     round_before_weight: bool, out_dtype: torch.dtype
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dims, in fp32, y in ``out_dtype``. ``round_before_weight``
    rounds the normalized input to x's dtype before the weight multiplies it, as Llama's
    hand-written RMSNorm does. Returns what :func:`layer_norm_forward` returns."""
    y, rstd, guard_xhat, guard = _rms_norm_rows(x, n, weight, eps, round_before_weight,
                                                out_dtype)
    return y.to(out_dtype).view(x.shape), rstd, guard_xhat, guard


def rms_norm_cast_forward(x: torch.Tensor, n: int, weight: torch.Tensor | None, eps: float,
                          round_before_weight: bool, out_dtype: torch.dtype,
                          kept_dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """RMSNorm under autocast whose output feeds both ops that keep its low-precision cast
    and ops that take it as is: (y in ``out_dtype``, y in ``kept_dtype``, rstd, guarded
    x_hat, guarded columns), as :func:`layer_norm_cast_forward`."""
    y, rstd, guard_xhat, guard = _rms_norm_rows(x, n, weight, eps, round_before_weight,
                                                kept_dtype)
    return (y.to(out_dtype).view(x.shape), y.to(kept_dtype).view(x.shape), rstd,
            guard_xhat, guard)


@torch.library.custom_op("fxopt::tempo_rms_norm", mutates_args=())
def tempo_rms_norm(x: torch.Tensor, n: int, weight: torch.Tensor | None, eps: float,
                   round_before_weight: bool, out_dtype: torch.dtype
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`rms_norm_forward` as an op opaque to tracing."""
    return rms_norm_forward(x, n, weight, eps, round_before_weight, out_dtype)


@tempo_rms_norm.register_fake
def _(x, n, weight, eps, round_before_weight, out_dtype):
    return _fake_outputs(x, n, out_dtype)


def rms_norm_backward(dy: torch.Tensor, y: torch.Tensor, rstd: torch.Tensor,
                      guard_xhat: torch.Tensor, guard_index: torch.Tensor,
                      weight: torch.Tensor | None,
                      xhat_from_output: XhatFromOutput = _xhat_from_output
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx in fp32 rows, dweight) of :func:`rms_norm_forward` from its outputs (x_hat as
    :func:`layer_norm_backward` rebuilds it)."""
    n = y.numel() // rstd.numel()
    w = _vector(weight, n, 1.0, y)
    xhat = xhat_from_output(y, w, torch.zeros_like(w), guard_xhat, guard_index)
    dx, dweight = _rms_norm_backward_rows(dy, xhat, rstd, w)
    if weight is None:
        return dx, dweight
    return _nan_if_unguarded((dx, dweight), w, None, y.dtype)


@torch.library.custom_op("fxopt::tempo_rms_norm_backward", mutates_args=())
def tempo_rms_norm_backward(dy: torch.Tensor, y: torch.Tensor, rstd: torch.Tensor,
                            guard_xhat: torch.Tensor, guard_index: torch.Tensor,
                            weight: torch.Tensor | None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rms_norm_backward` as an op opaque to tracing."""
    return rms_norm_backward(dy, y, rstd, guard_xhat, guard_index, weight)


@tempo_rms_norm_backward.register_fake
def _(dy, y, rstd, guard_xhat, guard_index, weight):
    n = y.numel() // rstd.numel()
    return (y.new_empty((rstd.numel(), n), dtype=torch.float32),
            y.new_empty((n,), dtype=torch.float32))


def _rms_norm_setup(ctx, inputs, output) -> None:
    x, n, weight, _, _, _ = inputs
    ctx.x_meta = (x.shape, x.dtype)
    ctx.save_for_backward(output[0], output[1], output[2], output[3], weight)


def _rms_norm_backward(ctx, dy, *_unused):
    y, rstd, guard_xhat, guard_index, weight = ctx.saved_tensors
    dx, dweight = tempo_rms_norm_backward(dy, y, rstd, guard_xhat, guard_index, weight)
    shape, dtype = ctx.x_meta
    return dx.view(shape).to(dtype), None, _grad_like(dweight, weight), None, None, None


tempo_rms_norm.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup)


@torch.library.custom_op("fxopt::tempo_rms_norm_cast", mutates_args=())
def tempo_rms_norm_cast(x: torch.Tensor, n: int, weight: torch.Tensor | None, eps: float,
                        round_before_weight: bool, out_dtype: torch.dtype,
                        kept_dtype: torch.dtype
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                   torch.Tensor]:
    """:func:`rms_norm_cast_forward` as an op opaque to tracing."""
    return rms_norm_cast_forward(x, n, weight, eps, round_before_weight, out_dtype,
                                 kept_dtype)


@tempo_rms_norm_cast.register_fake
def _(x, n, weight, eps, round_before_weight, out_dtype, kept_dtype):
    y, *rest = _fake_outputs(x, n, out_dtype)
    return (y, torch.empty(x.shape, dtype=kept_dtype, device=x.device), *rest)


def _rms_norm_cast_setup(ctx, inputs, output) -> None:
    x, n, weight, _, _, _, _ = inputs
    ctx.x_meta = (x.shape, x.dtype)
    ctx.save_for_backward(output[1], output[2], output[3], output[4], weight)


def _rms_norm_cast_backward(ctx, dy, dy_kept, *_unused):
    y_kept, rstd, guard_xhat, guard_index, weight = ctx.saved_tensors
    dx, dweight = tempo_rms_norm_backward(sum_grads(dy, dy_kept), y_kept, rstd, guard_xhat,
                                          guard_index, weight)
    shape, dtype = ctx.x_meta
    return (dx.view(shape).to(dtype), None, _grad_like(dweight, weight), None, None, None,
            None)


tempo_rms_norm_cast.register_autograd(_rms_norm_cast_backward,
                                      setup_context=_rms_norm_cast_setup)
