"""Tempo's memory-lean GELU: ``fxopt::tempo_gelu`` saves its output and a bit-packed branch
mask for backward instead of its input.

The backward evaluates GELU's derivative from the output y: on the branch the mask picks
(x >= x_min, left or right of GELU's minimum), a piecewise polynomial in
s = sqrt(y - y_min) fitted by ``fit_gelu.py`` (coefficients in ``gelu_coefficients.py``).
Memory: the input x (4 bytes/element in fp32) is replaced by 1 bit/element; y costs nothing
when the next op keeps it anyway (a Linear after GELU does), which the pass checks.

Both ops run a Triton kernel where :func:`fxopt.kernels.triton_runs_on` says Triton runs
(the backward evaluating the fit), and the pure-torch reference here elsewhere (the backward
reading a dense table of the exact derivative, faster on the CPU than the fit's gathers);
both save the same tensors, and both derivatives are within the fit's max error.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from fxopt.kernels import triton_runs_on
from fxopt.kernels.tempo.bitmask import pack_bits, packed_size, unpack_bits
from fxopt.kernels.tempo.gelu_coefficients import FITS

__all__ = ["APPROXIMATIONS", "gelu_derivative_from_output", "gelu_tables", "tempo_gelu",
           "tempo_gelu_backward"]

APPROXIMATIONS = tuple(FITS)  # "none" (erf) and "tanh", as F.gelu's approximate=


@functools.cache
def gelu_tables(approximate: str, device: torch.device) -> dict[str, torch.Tensor | float]:
    """The fit as fp32 tensors: interval starts (left branch's, then right's), their
    scales (1 / width), their polynomial coefficients [intervals, DEGREE + 1], each
    branch's end, and x_min, y_min."""
    fit = FITS[approximate]
    left, right = fit["left"], fit["right"]

    def tensor(values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=device)

    return {"starts": tensor(left["starts"] + right["starts"]),
            "scales": tensor(left["scales"] + right["scales"]),
            "coefficients": tensor(left["coefficients"] + right["coefficients"]),
            "num_left": len(left["starts"]), "left_end": left["end"],
            "right_end": right["end"], "x_min": fit["x_min"], "y_min": fit["y_min"]}


# The reference (the CPU path) does not evaluate the fit: it reads GELU's exact derivative
# from a dense table, linearly interpolated, where each element's bucket is computed from
# the bits of a variable v rather than searched. The top bits of v's fp32 pattern
# (exponent and _MANTISSA_BITS mantissa bits: 2**_MANTISSA_BITS buckets per octave,
# logarithmic) give the bucket, its low bits the position in it, so one element costs two
# gathers (value and slope) where the fit's intervals cost twelve (measured 3x faster per
# element on one CPU thread). The derivative is smooth in v, per region: on the right
# branch and near the minimum of the left one v = s = sqrt(y - y_min) (the fit's
# variable), on the left tail (y > -_TAIL, x below about -1.6) v = -y, where the
# derivative behaves like 2 y log|y| and s would need ever shorter buckets. Outside the
# table's range of v the derivative is constant: its limit as v -> 0 (0) or its value at
# _V_HIGH (1 to fp32 precision on the right). Table error (linear interpolation of the
# exact derivative): below 2e-6, beside the fit's 7.5e-5 (both dominated by y's rounding).
_MANTISSA_BITS = 9
_SHIFT = 23 - _MANTISSA_BITS
_V_LOW, _V_HIGH = 2.0 ** -40, 8.0
_TAIL = 0.1
_REGIONS = 3  # right (v = s), left near the minimum (v = s), left tail (v = -y)


class _DenseTable(NamedTuple):
    value: torch.Tensor  # [_REGIONS * n] fp32: the derivative at each bucket's start
    slope: torch.Tensor  # [_REGIONS * n] fp32: to the next bucket's start (0 at the ends)
    key_low: int  # the key of the first bucket (below _V_LOW: the constant one)
    size: int  # n, buckets per region
    y_min: float
    s_cap_squared: float  # s is clamped below sqrt of this: beyond _V_HIGH


def _key(v: float) -> int:
    return int(torch.tensor(v, dtype=torch.float32).view(torch.int32)) >> _SHIFT


def _invert(y: torch.Tensor, approximate: str, right: bool, x_min: float) -> torch.Tensor:
    """x with gelu(x) = y on one branch (float64 bisection; y clamped into the branch)."""
    low = torch.full_like(y, x_min if right else -40.0)
    high = torch.full_like(y, 100.0 if right else x_min)
    for _ in range(100):
        middle = (low + high) / 2
        above = torch.nn.functional.gelu(middle, approximate=approximate) > y
        # gelu rises with x on the right branch and falls on the left one
        low, high = (torch.where(above, low, middle), torch.where(above, middle, high)) if right \
            else (torch.where(above, middle, low), torch.where(above, high, middle))
    return (low + high) / 2


@functools.cache
def _dense_table(approximate: str, device: torch.device) -> _DenseTable:
    """The exact derivative at every bucket start of the three regions (float64 inversion
    of gelu), and the slopes to the next start."""
    fit = FITS[approximate]
    x_min, y_min = fit["x_min"], fit["y_min"]
    key_low, key_high = _key(_V_LOW) - 1, _key(_V_HIGH)
    keys = torch.arange(key_low, key_high + 2, dtype=torch.int64)
    v = (keys << _SHIFT).to(torch.int32).view(torch.float32).double()
    v[0] = 0.0  # the constant bucket below _V_LOW: the limit as v -> 0
    values, slopes = [], []
    for right, tail in ((True, False), (False, False), (False, True)):
        y = -v.clamp(max=-y_min) if tail else v.clamp(max=math.sqrt(-y_min) if not right
                                                   else _V_HIGH) ** 2 + y_min
        x = _invert(y, approximate, right, x_min)
        derivative = torch.ops.aten.gelu_backward(torch.ones_like(x), x,
                                                  approximate=approximate)
        slope = derivative[1:] - derivative[:-1]
        slope[0] = slope[-1] = 0.0  # constant below _V_LOW and from _V_HIGH on
        values.append(derivative[:-1])
        slopes.append(slope)
    return _DenseTable(torch.cat(values).float().to(device), torch.cat(slopes).float().to(device),
                       key_low, keys.numel() - 1, y_min, _V_HIGH ** 2)


def _derivative_from_output(y: torch.Tensor, right: torch.Tensor, approximate: str
                            ) -> torch.Tensor:
    """:func:`gelu_derivative_from_output` on flat ``y`` and ``right`` as 0/1 uint8."""
    table = _dense_table(approximate, y.device)
    y = y.float()
    s = (y - table.y_min).clamp_(0, table.s_cap_squared).sqrt_()
    # Masks as 0/1 uint8 and selects in arithmetic: on the CPU, ops on bool tensors and
    # torch.where take 5-10x as long as the same ops on uint8 or fp32.
    left = 1 - right
    tail = (y > -_TAIL).view(torch.uint8).bitwise_and_(left)
    # v = s, or -y on the tail, with -y clamped so that y = +inf never meets a 0 * inf
    v = torch.addcmul(s, tail.to(torch.float32), (-y).clamp_(0, _TAIL).sub_(s))
    bits = v.view(torch.int32)
    key = (bits >> _SHIFT).clamp_(table.key_low, table.key_low + table.size - 1)
    region = left.add_(tail).to(torch.int32)  # 0 right, 1 left near the minimum, 2 tail
    index = key.add_(region, alpha=table.size).sub_(table.key_low).to(torch.int64)
    position = (bits & ((1 << _SHIFT) - 1)).to(torch.float32).mul_(2.0 ** -_SHIFT)
    position.add_(v, alpha=0.0)  # NaN where y is NaN (v is finite otherwise)
    return torch.addcmul(torch.index_select(table.value, 0, index),
                         torch.index_select(table.slope, 0, index), position)


def gelu_derivative_from_output(y: torch.Tensor, right: torch.Tensor, approximate: str
                                ) -> torch.Tensor:
    """GELU's derivative (fp32) at the inputs whose outputs are ``y`` and whose branch is
    ``right`` (x >= x_min, bool), from the fitted polynomials."""
    value = _derivative_from_output(y.reshape(-1), right.reshape(-1).view(torch.uint8),
                                    approximate)
    return value.view(y.shape)


def _forward_reference(x: torch.Tensor, approximate: str) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.nn.functional.gelu(x, approximate=approximate)
    return y, pack_bits(x >= gelu_tables(approximate, x.device)["x_min"])


# The reference's temporaries (int64 indices, int32 keys, a few fp32 intermediates:
# about 40 bytes per element) would make the backward's peak larger than the activation
# tempo saved (measured on the benchmark suite's GPT-2 smoke step before chunking: 708 KiB
# of temporaries at the peak against 93 KiB with plain GELU). Chunks of this many elements
# bound them to about 2.5 MiB whatever the tensor's size; smaller chunks cost more in
# per-op overhead than they save (4096-element chunks took 5x as long on the CPU).
_REFERENCE_CHUNK = 1 << 16


def _backward_reference(dy: torch.Tensor, y: torch.Tensor, packed: torch.Tensor,
                        approximate: str) -> torch.Tensor:
    right = unpack_bits(packed, y.shape).view(-1).view(torch.uint8)
    dx = torch.empty(y.shape, dtype=dy.dtype, device=dy.device)
    flat_dx, flat_dy, flat_y = dx.view(-1), dy.reshape(-1), y.reshape(-1)
    for start in range(0, flat_dx.numel(), _REFERENCE_CHUNK):
        chunk = slice(start, start + _REFERENCE_CHUNK)
        torch.mul(flat_dy[chunk], _derivative_from_output(flat_y[chunk], right[chunk],
                                                          approximate), out=flat_dx[chunk])
    return dx


@torch.library.custom_op("fxopt::tempo_gelu", mutates_args=())
def tempo_gelu(x: torch.Tensor, approximate: str) -> tuple[torch.Tensor, torch.Tensor]:
    """GELU, returning (y, bit-packed mask of x >= x_min); y is contiguous."""
    x = x.contiguous()
    if triton_runs_on(x.device):
        from fxopt.kernels.tempo import gelu_triton

        return gelu_triton.forward(x, approximate)
    return _forward_reference(x, approximate)


@tempo_gelu.register_fake
def _(x: torch.Tensor, approximate: str) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            x.new_empty(packed_size(x.numel()), dtype=torch.uint8))


@torch.library.custom_op("fxopt::tempo_gelu_backward", mutates_args=())
def tempo_gelu_backward(dy: torch.Tensor, y: torch.Tensor, packed: torch.Tensor,
                        approximate: str) -> torch.Tensor:
    """dx of :func:`tempo_gelu` from its output and mask."""
    dy = dy.contiguous()
    if triton_runs_on(y.device):
        from fxopt.kernels.tempo import gelu_triton

        return gelu_triton.backward(dy, y, packed, approximate)
    return _backward_reference(dy, y, packed, approximate)


@tempo_gelu_backward.register_fake
def _(dy: torch.Tensor, y: torch.Tensor, packed: torch.Tensor, approximate: str
      ) -> torch.Tensor:
    return torch.empty(y.shape, dtype=dy.dtype, device=dy.device)


def _setup_context(ctx, inputs, output) -> None:
    ctx.approximate = inputs[1]
    ctx.save_for_backward(*output)


def _backward(ctx, dy: torch.Tensor, _dpacked: torch.Tensor | None):
    y, packed = ctx.saved_tensors
    return tempo_gelu_backward(dy, y, packed, ctx.approximate), None


tempo_gelu.register_autograd(_backward, setup_context=_setup_context)
