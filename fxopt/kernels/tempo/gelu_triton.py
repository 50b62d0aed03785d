"""Triton kernels of ``fxopt::tempo_gelu``: the forward writes y and the bit-packed branch
mask; the backward reads them and evaluates the fitted derivative polynomial.

Each program handles BLOCK bytes of mask, i.e. a [BLOCK, 8] tile of elements, so that a
byte's eight bits are one row of the tile and packing is a sum over that row. Imported
only where Triton runs (see ``fxopt.kernels.triton_runs_on``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fxopt.kernels.tempo.bitmask import packed_size
from fxopt.kernels.tempo.gelu import gelu_tables
from fxopt.kernels.tempo.gelu_coefficients import DEGREE

BLOCK = 128  # bytes of mask per program: 1024 elements


@triton.jit
def _tile(pid, BLOCK: tl.constexpr):
    rows = pid * BLOCK + tl.arange(0, BLOCK)
    bits = tl.arange(0, 8)
    return rows, bits, rows[:, None] * 8 + bits[None, :]


@triton.jit
def _split4(x):
    """The four [R, C] slices of an [R, C, 4] tile whose last dim each thread holds."""
    even, odd = tl.split(tl.reshape(x, [x.shape[0], x.shape[1], 2, 2]))
    c0, c2 = tl.split(even)
    c1, c3 = tl.split(odd)
    return c0, c1, c2, c3


@triton.jit
def _gelu_forward_kernel(x_ptr, y_ptr, packed_ptr, numel, num_bytes, x_min,
                         TANH: tl.constexpr, BLOCK: tl.constexpr):
    rows, bits, offsets = _tile(tl.program_id(0), BLOCK)
    inside = offsets < numel
    x = tl.load(x_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    if TANH:
        u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        e = tl.exp(-2.0 * tl.abs(u))  # tanh from exp(-2|u|): no overflow
        tanh_u = tl.where(u >= 0, 1.0, -1.0) * (1.0 - e) / (1.0 + e)
        y = 0.5 * x * (1.0 + tanh_u)
    else:
        y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=inside)
    right = ((x >= x_min) & inside).to(tl.int32)
    packed = tl.sum(right << bits[None, :], axis=1)
    tl.store(packed_ptr + rows, packed.to(tl.uint8), mask=rows < num_bytes)


@triton.jit
def _gelu_backward_kernel(dy_ptr, y_ptr, packed_ptr, dx_ptr, starts_ptr, scales_ptr,
                          coefficients_ptr, numel, num_bytes, y_min, left_end, right_end,
                          NUM_LEFT: tl.constexpr, NUM_RIGHT: tl.constexpr,
                          DEGREE: tl.constexpr, BLOCK: tl.constexpr):
    rows, bits, offsets = _tile(tl.program_id(0), BLOCK)
    inside = offsets < numel
    packed = tl.load(packed_ptr + rows, mask=rows < num_bytes, other=0).to(tl.int32)
    right = ((packed[:, None] >> bits[None, :]) & 1) != 0
    y = tl.load(y_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    s = tl.sqrt(tl.maximum(y - y_min, 0.0))
    # Interval index within the branch: how many of its interval starts (after the
    # first) s has reached; right-branch intervals follow the left ones in the tables.
    index = tl.where(right, NUM_LEFT, 0)
    for i in tl.static_range(1, NUM_LEFT):
        index += (~right & (s >= tl.load(starts_ptr + i))).to(tl.int32)
    for i in tl.static_range(1, NUM_RIGHT):
        index += (right & (s >= tl.load(starts_ptr + NUM_LEFT + i))).to(tl.int32)
    t = (s - tl.load(starts_ptr + index)) * tl.load(scales_ptr + index)
    # The interval's 8 coefficients as two 128-bit loads per element (a row of the table is
    # contiguous), split into registers, not 8 scalar gathers.
    tl.static_assert(DEGREE == 7)
    row = index[:, :, None] * 8 + tl.arange(0, 4)[None, None, :]
    c0, c1, c2, c3 = _split4(tl.load(coefficients_ptr + row))
    c4, c5, c6, c7 = _split4(tl.load(coefficients_ptr + row + 4))
    value = ((((((c7 * t + c6) * t + c5) * t + c4) * t + c3) * t + c2) * t + c1) * t + c0
    beyond = tl.where(right, s >= right_end, s >= left_end)
    derivative = tl.where(beyond, right.to(tl.float32), value)
    tl.store(dx_ptr + offsets, (dy * derivative).to(dx_ptr.dtype.element_ty), mask=inside)


def _grid(numel: int) -> tuple[int]:
    return (triton.cdiv(packed_size(numel), BLOCK),)


def forward(x: torch.Tensor, approximate: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, packed mask) for a contiguous ``x``."""
    y = torch.empty_like(x)
    packed = torch.empty(packed_size(x.numel()), dtype=torch.uint8, device=x.device)
    if x.numel():
        _gelu_forward_kernel[_grid(x.numel())](
            x, y, packed, x.numel(), packed.numel(), gelu_tables(approximate, x.device)["x_min"],
            TANH=approximate == "tanh", BLOCK=BLOCK)
    return y, packed


def backward(dy: torch.Tensor, y: torch.Tensor, packed: torch.Tensor, approximate: str
             ) -> torch.Tensor:
    """dx for a contiguous ``dy`` and the forward's ``y`` and ``packed``."""
    tables = gelu_tables(approximate, y.device)
    dx = torch.empty(y.shape, dtype=dy.dtype, device=dy.device)
    if y.numel():
        num_left = tables["num_left"]
        _gelu_backward_kernel[_grid(y.numel())](
            dy, y, packed, dx, tables["starts"], tables["scales"], tables["coefficients"],
            y.numel(), packed.numel(), tables["y_min"], tables["left_end"],
            tables["right_end"], NUM_LEFT=num_left,
            NUM_RIGHT=len(tables["starts"]) - num_left, DEGREE=DEGREE, BLOCK=BLOCK)
    return dx
