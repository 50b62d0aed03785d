"""Tempo's ops in a form Inductor can fuse: autograd Functions written in aten ops only.

Under ``codegen="inductor"`` the tempo pass inserts these instead of the ``fxopt::tempo_*``
custom ops, which Inductor can only call as opaque extern kernels (measured on the CPU:
1.07-1.26x plain ``torch.compile``'s step with those, 0.97-1.04x with these;
benchmarks/results/fast_path_tempo_inductor_cpu.md).
AOTAutograd traces each Function's forward and backward into the joint graph, so Inductor
generates fused C++/Triton kernels around and through them. Each computes what its custom
op computes and hands backward the same tensors: the output and a bit-packed mask (GELU,
attention), the output, rstd and the guarded columns (norms). Which of them are kept is
then the partitioner's choice; ``benchmarks/fast_path.py`` measures that tempo's cut
survives it (the ``saved`` column).

Differences from the custom ops, for fusion only: masks are packed by shift-and-or
(:func:`pack_bits_fusible`) and read back by shift-and-mask, the norms rebuild x_hat
reading the guarded columns by ops the partitioner may recompute (``_xhat_from_output``),
and GELU's backward reads the same dense derivative table as the CPU reference
(``gelu._dense_table``: two gathers, which Inductor turns into indirect loads inside the
fused kernel), unchunked, since a fused kernel has no temporaries to bound. The table
enters the traced graph as a constant.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from fxopt import _compat
from fxopt.kernels.tempo import attention as _attention
from fxopt.kernels.tempo import gelu as _gelu
from fxopt.kernels.tempo import norm as _norm
from fxopt.kernels.tempo.bitmask import packed_size

__all__ = ["fusible_form", "pack_bits_fusible", "unpack_bits_fusible"]


def pack_bits_fusible(mask: torch.Tensor) -> torch.Tensor:
    """:func:`~fxopt.kernels.tempo.bitmask.pack_bits`'s layout by shifts and ors of the 8
    lanes (no dtype-changing views, which Inductor cannot fuse): a pointwise kernel over the
    packed bytes. Written as a sum over a [bytes, 8] dimension instead, Inductor's C++
    backend made it a vector reduction per byte: 69 ms against 1.3 ms for GELU's forward on
    512Ki elements, one thread."""
    flat = mask.reshape(-1).to(torch.uint8)
    padding = packed_size(flat.numel()) * 8 - flat.numel()
    if padding:
        flat = F.pad(flat, (0, padding))
    lanes = flat.view(-1, 8)
    packed = lanes[:, 0]
    for bit in range(1, 8):
        packed = packed | (lanes[:, bit] << bit)
    return packed


def unpack_bits_fusible(packed: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The bool tensor of ``shape`` that :func:`pack_bits_fusible` packed."""
    shifts = torch.arange(8, device=packed.device, dtype=torch.uint8)
    bits = (packed.unsqueeze(1) >> shifts) & 1
    return bits.reshape(-1)[:shape.numel()].view(shape) != 0


# --- GELU -------------------------------------------------------------------------------

class _TableConstants(NamedTuple):
    values: list[float]
    slopes: list[float]
    key_low: int
    size: int
    y_min: float
    s_cap_squared: float


@functools.cache
def _table_constants(approximate: str) -> _TableConstants:
    """The dense table as Python numbers. Built (about a second) by :func:`fusible_form`
    before tracing: inside AOTAutograd's trace its construction would itself be traced."""
    table = _gelu._dense_table(approximate, torch.device("cpu"))
    return _TableConstants(table.value.tolist(), table.slope.tolist(), table.key_low,
                           table.size, table.y_min, table.s_cap_squared)


def _derivative(y: torch.Tensor, right: torch.Tensor, approximate: str) -> torch.Tensor:
    """``gelu._derivative_from_output`` without in-place ops or dtype views of masks; the
    tables built inside the trace (``torch.tensor``), so they become graph constants."""
    table = _table_constants(approximate)
    value = torch.tensor(table.values, dtype=torch.float32, device=y.device)
    slope = torch.tensor(table.slopes, dtype=torch.float32, device=y.device)
    y = y.float()
    s = (y - table.y_min).clamp(0, table.s_cap_squared).sqrt()
    tail = (y > -_gelu._TAIL) & ~right
    v = torch.where(tail, (-y).clamp(0, _gelu._TAIL), s)
    bits = v.view(torch.int32)
    key = (bits >> _gelu._SHIFT).clamp(table.key_low, table.key_low + table.size - 1)
    region = torch.where(right, 0, torch.where(tail, 2, 1))
    index = key + region * table.size - table.key_low
    position = (bits & ((1 << _gelu._SHIFT) - 1)).float() * 2.0 ** -_gelu._SHIFT
    position = position + v * 0.0  # NaN where y is NaN (v is finite otherwise)
    return value[index] + slope[index] * position


class _Gelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, approximate: str) -> torch.Tensor:
        y = F.gelu(x, approximate=approximate)
        packed = pack_bits_fusible(x >= _gelu.FITS[approximate]["x_min"])
        ctx.approximate = approximate
        ctx.save_for_backward(y, packed)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        y, packed = ctx.saved_tensors
        right = unpack_bits_fusible(packed, y.shape)
        return (dy * _derivative(y, right, ctx.approximate)).to(dy.dtype), None


def fusible_gelu(x: torch.Tensor, approximate: str) -> tuple[torch.Tensor]:
    """(GELU of x,): the tempo pass's site output convention (item 0 is the value)."""
    return (_Gelu.apply(x, approximate),)


# --- LayerNorm / RMSNorm ----------------------------------------------------------------

def _grad_like(grad: torch.Tensor, t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else grad.reshape(t.shape).to(t.dtype)


def _xhat_from_output(y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                      guard_xhat: torch.Tensor, guard_index: torch.Tensor) -> torch.Tensor:
    """``norm._xhat_from_output`` in ops the partitioners may recompute in the backward
    (pointwise ops, indexing and sums over the guard), not index_fill/index_copy. Those are
    not recomputable, so the partitioner ran them in the forward and kept their result,
    the dense x_hat (measured: a LayerNorm between two Linears kept y and x_hat, 4501
    bytes, instead of y, rstd and the guard, 2416).

    The guarded columns' saved values are read in the form that Inductor's code generator
    for the device runs best (:func:`fxopt._compat.inductor_generates_triton`):

    - Triton (CUDA): each column reads its value through its slot in the guard (an [n]
      index from a [capacity, n] comparison), a gather inside the row that Inductor fuses
      into the norm's backward. Summed over a one-hot product instead, the values became a
      dense [rows, n] fp32 tensor written and read back: at GPT-2's GPU size, 96 MiB and 2
      launches more a block (benchmarks/results/generated_kernels_cpu.md);
    - C++ (the CPU): through the one-hot [capacity, n] product summed, whose dense
      [rows, n] values stay in cache there, where gathers do not vectorize: the gather
      form took 1.02-1.04x its step (GPT-2 and BERT at the suite size, bf16, one thread)."""
    n = weight.numel()
    matches = guard_index[:, None] == torch.arange(n, device=y.device)
    guarded = matches.any(0)
    rows = y.reshape(-1, n).float()
    from_output = (rows - bias) / torch.where(guarded, 1.0, weight)
    if _compat.inductor_generates_triton(y.device):
        slots = torch.arange(guard_index.numel(), device=y.device)
        slot = (matches * slots[:, None]).sum(0)  # 0 (any valid slot) where not guarded
        saved = guard_xhat[:, slot]
    else:
        saved = (guard_xhat[:, :, None] * matches.float()).sum(1)
    return torch.where(guarded, saved, from_output)


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n, weight, bias, eps, out_dtype):
        y, rstd, guard_xhat, guard = _norm.layer_norm_forward(x, n, weight, bias, eps,
                                                              out_dtype)
        ctx.x_meta = (x.shape, x.dtype)
        ctx.save_for_backward(y, rstd, guard_xhat, guard, weight, bias)
        return y

    @staticmethod
    def backward(ctx, dy):
        y, rstd, guard_xhat, guard, weight, bias = ctx.saved_tensors
        dx, dweight, dbias = _norm.layer_norm_backward(dy, y, rstd, guard_xhat, guard,
                                                       weight, bias, _xhat_from_output)
        shape, dtype = ctx.x_meta
        return (dx.view(shape).to(dtype), None, _grad_like(dweight, weight),
                _grad_like(dbias, bias), None, None)


class _LayerNormCast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n, weight, bias, eps, out_dtype, kept_dtype):
        y, y_kept, rstd, guard_xhat, guard = _norm.layer_norm_cast_forward(
            x, n, weight, bias, eps, out_dtype, kept_dtype)
        ctx.x_meta = (x.shape, x.dtype)
        ctx.save_for_backward(y_kept, rstd, guard_xhat, guard, weight, bias)
        return y, y_kept

    @staticmethod
    def backward(ctx, dy, dy_kept):
        y_kept, rstd, guard_xhat, guard, weight, bias = ctx.saved_tensors
        dx, dweight, dbias = _norm.layer_norm_backward(
            _norm.sum_grads(dy, dy_kept), y_kept, rstd, guard_xhat, guard, weight, bias,
            _xhat_from_output)
        shape, dtype = ctx.x_meta
        return (dx.view(shape).to(dtype), None, _grad_like(dweight, weight),
                _grad_like(dbias, bias), None, None, None)


class _RmsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n, weight, eps, round_before_weight, out_dtype):
        y, rstd, guard_xhat, guard = _norm.rms_norm_forward(x, n, weight, eps,
                                                            round_before_weight, out_dtype)
        ctx.x_meta = (x.shape, x.dtype)
        ctx.save_for_backward(y, rstd, guard_xhat, guard, weight)
        return y

    @staticmethod
    def backward(ctx, dy):
        y, rstd, guard_xhat, guard, weight = ctx.saved_tensors
        dx, dweight = _norm.rms_norm_backward(dy, y, rstd, guard_xhat, guard, weight,
                                              _xhat_from_output)
        shape, dtype = ctx.x_meta
        return dx.view(shape).to(dtype), None, _grad_like(dweight, weight), None, None, None


class _RmsNormCast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n, weight, eps, round_before_weight, out_dtype, kept_dtype):
        y, y_kept, rstd, guard_xhat, guard = _norm.rms_norm_cast_forward(
            x, n, weight, eps, round_before_weight, out_dtype, kept_dtype)
        ctx.x_meta = (x.shape, x.dtype)
        ctx.save_for_backward(y_kept, rstd, guard_xhat, guard, weight)
        return y, y_kept

    @staticmethod
    def backward(ctx, dy, dy_kept):
        y_kept, rstd, guard_xhat, guard, weight = ctx.saved_tensors
        dx, dweight = _norm.rms_norm_backward(_norm.sum_grads(dy, dy_kept), y_kept, rstd,
                                              guard_xhat, guard, weight, _xhat_from_output)
        shape, dtype = ctx.x_meta
        return (dx.view(shape).to(dtype), None, _grad_like(dweight, weight), None, None,
                None, None)


def fusible_layer_norm(x, n, weight, bias, eps, out_dtype) -> tuple[torch.Tensor]:
    """(``fxopt::tempo_layer_norm``'s y,), traceable."""
    return (_LayerNorm.apply(x, n, weight, bias, eps, out_dtype),)


def fusible_layer_norm_cast(x, n, weight, bias, eps, out_dtype, kept_dtype
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(``fxopt::tempo_layer_norm_cast``'s y, y_kept), traceable."""
    return _LayerNormCast.apply(x, n, weight, bias, eps, out_dtype, kept_dtype)


def fusible_rms_norm(x, n, weight, eps, round_before_weight, out_dtype
                     ) -> tuple[torch.Tensor]:
    """(``fxopt::tempo_rms_norm``'s y,), traceable."""
    return (_RmsNorm.apply(x, n, weight, eps, round_before_weight, out_dtype),)


def fusible_rms_norm_cast(x, n, weight, eps, round_before_weight, out_dtype, kept_dtype
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(``fxopt::tempo_rms_norm_cast``'s y, y_kept), traceable."""
    return _RmsNormCast.apply(x, n, weight, eps, round_before_weight, out_dtype, kept_dtype)


# --- attention --------------------------------------------------------------------------

class _SoftmaxDropoutMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, v, dim, p, softmax_dtype, probs_dtype, out_dtype):
        out, s, packed = _attention.attention_forward(
            scores, v, dim, p, softmax_dtype, probs_dtype, out_dtype, pack_bits_fusible)
        ctx.args = (dim, p, probs_dtype, scores.dtype)
        ctx.save_for_backward(s, packed, v)
        return out

    @staticmethod
    def backward(ctx, dout):
        s, packed, v = ctx.saved_tensors
        dim, p = ctx.args[:2]
        mask = unpack_bits_fusible(packed, s.shape) if p > 0 else None
        dscores, dv = _attention.attention_backward(dout, s, mask, v, *ctx.args)
        return dscores, dv, None, None, None, None, None


def fusible_softmax_dropout_matmul(scores, v, dim, p, softmax_dtype, probs_dtype, out_dtype
                                   ) -> tuple[torch.Tensor]:
    """(``fxopt::tempo_softmax_dropout_matmul``'s output,), traceable."""
    return (_SoftmaxDropoutMatmul.apply(scores, v, dim, p, softmax_dtype, probs_dtype,
                                        out_dtype),)


_FORMS: dict[Any, Callable[..., tuple[torch.Tensor]]] = {
    torch.ops.fxopt.tempo_gelu.default: fusible_gelu,
    torch.ops.fxopt.tempo_layer_norm.default: fusible_layer_norm,
    torch.ops.fxopt.tempo_layer_norm_cast.default: fusible_layer_norm_cast,
    torch.ops.fxopt.tempo_rms_norm.default: fusible_rms_norm,
    torch.ops.fxopt.tempo_rms_norm_cast.default: fusible_rms_norm_cast,
    torch.ops.fxopt.tempo_softmax_dropout_matmul.default: fusible_softmax_dropout_matmul,
}


def fusible_form(op: Any, args: tuple[Any, ...]) -> Callable[..., tuple[torch.Tensor]]:
    """The aten-only form of the tempo custom op ``op`` (same arguments, a tuple of the
    outputs the graph uses: the first, and the ``*_cast`` norms' cast second), with
    what it needs at trace time (GELU's table) built now, eagerly."""
    if op is torch.ops.fxopt.tempo_gelu.default:
        _table_constants(args[1])
    return _FORMS[op]
