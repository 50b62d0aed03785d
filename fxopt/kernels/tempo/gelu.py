"""Tempo's memory-lean GELU: ``fxopt::tempo_gelu`` saves its output and a bit-packed branch
mask for backward instead of its input.

The backward evaluates GELU's derivative from the output y: on the branch the mask picks
(x >= x_min, left or right of GELU's minimum), a piecewise polynomial in
s = sqrt(y - y_min) fitted by ``fit_gelu.py`` (coefficients in ``gelu_coefficients.py``).
Memory: the input x (4 bytes/element in fp32) is replaced by 1 bit/element; y costs nothing
when the next op keeps it anyway (a Linear after GELU does), which the pass checks.

Both ops run a Triton kernel where :func:`fxopt.kernels.triton_runs_on` says Triton runs,
and the pure-torch reference here elsewhere; both save the same tensors.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from fxopt.kernels import triton_runs_on
from fxopt.kernels.tempo.bitmask import pack_bits, packed_size, unpack_bits
from fxopt.kernels.tempo.gelu_coefficients import DEGREE, FITS

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


# The reference picks each element's interval without a binary search: the top bits of y's
# fp32 pattern (sign, exponent, 5 mantissa bits: a key per 1/32 octave of |y|, fine enough
# near the minimum and logarithmic on the left tail, whose intervals shrink to 3e-7 in s)
# index a table of the first interval the key's range of y meets; one comparison with the
# next interval's start finishes the choice (a key's range never holds two starts; checked
# when the table is built). Each interval's row is then read with int64 index_select, the
# CPU's fast gather (int32 indices and advanced indexing take 4-10x longer).
_KEY_SHIFT = 18
_KEYS = 1 << (32 - _KEY_SHIFT)


class _ReferenceTables(NamedTuple):
    columns: torch.Tensor  # [2 + DEGREE + 1, intervals]: start, scale, c0 .. c_DEGREE
    next_starts: torch.Tensor  # [intervals]: the next interval's start (inf at the last)
    first_interval: torch.Tensor  # [2 * _KEYS] int64: left branch's keys, then right's
    y_min: float
    s_cap_squared: float  # s is clamped below sqrt of this: beyond both branches' ends


@functools.cache
def _reference_tables(approximate: str, device: torch.device) -> _ReferenceTables:
    """The fit as one table of intervals, each branch ending in a constant interval (1 on
    the right, 0 on the left) that starts at the branch's end, and the key table."""
    fit = FITS[approximate]
    rows, next_starts, branch_starts = [], [], []
    for branch, beyond in (("left", 0.0), ("right", 1.0)):
        part = fit[branch]
        starts = part["starts"] + [part["end"]]
        branch_starts.append((len(rows), torch.tensor(starts, dtype=torch.float32)))
        rows += [[start, scale, *coefficients] for start, scale, coefficients
                 in zip(part["starts"], part["scales"], part["coefficients"])]
        rows.append([part["end"], 0.0, beyond] + [0.0] * DEGREE)
        next_starts += starts[1:] + [math.inf]
    s_cap_squared = (2 * max(fit["left"]["end"], fit["right"]["end"])) ** 2
    # Each key's y range (its smallest and largest fp32 pattern), s computed as the
    # reference computes it. A key holds only finite patterns or only infinities and NaNs
    # (-inf is s = 0, NaN propagates through t whatever the interval): those go unchecked.
    low = (torch.arange(_KEYS, dtype=torch.int64) << _KEY_SHIFT).to(torch.int32)
    ends = torch.stack([low, low | ((1 << _KEY_SHIFT) - 1)]).view(torch.float32)
    finite = ends.isfinite().all(0)
    s = (ends - fit["y_min"]).clamp_(0, s_cap_squared).sqrt_().nan_to_num_(nan=math.inf)
    first_interval = []
    for offset, starts in branch_starts:
        interval = torch.searchsorted(starts, s, right=True) - 1
        lowest, highest = interval.min(0).values, interval.max(0).values
        if (highest - lowest > 1)[finite].any():
            raise RuntimeError(f"tempo GELU fit {approximate!r}: an interval is narrower than "
                               "a key's range of y; lower _KEY_SHIFT in gelu.py")
        first_interval.append(lowest + offset)

    def tensor(values, dtype=torch.float32) -> torch.Tensor:
        return torch.as_tensor(values, dtype=dtype).to(device)

    return _ReferenceTables(tensor(rows).t().contiguous(), tensor(next_starts),
                            tensor(torch.cat(first_interval), torch.int64), fit["y_min"],
                            s_cap_squared)


def _intervals(y: torch.Tensor, right: torch.Tensor, tables: _ReferenceTables
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(each element's row in ``tables``, int64; s = sqrt(y - y_min), fp32) for flat ``y``
    and ``right`` as 0/1 uint8."""
    y = y.float()
    key = (y.view(torch.int32) >> _KEY_SHIFT).bitwise_and_(_KEYS - 1)
    interval = torch.index_select(tables.first_interval, 0,
                                  key.add_(right, alpha=_KEYS).to(torch.int64))
    s = (y - tables.y_min).clamp_(0, tables.s_cap_squared).sqrt_()
    interval += s >= torch.index_select(tables.next_starts, 0, interval)
    return interval, s


def _derivative_from_output(y: torch.Tensor, right: torch.Tensor, approximate: str
                            ) -> torch.Tensor:
    """:func:`gelu_derivative_from_output` on flat ``y`` and ``right`` as 0/1 uint8."""
    tables = _reference_tables(approximate, y.device)
    interval, s = _intervals(y, right, tables)

    def column(k: int) -> torch.Tensor:
        return torch.index_select(tables.columns[k], 0, interval)

    t = s.sub_(column(0)).mul_(column(1))
    value = torch.addcmul(column(1 + DEGREE), column(2 + DEGREE), t)
    for k in range(DEGREE, 1, -1):  # Horner, c_(DEGREE-2) .. c0 (column k is c_(k-2))
        torch.addcmul(column(k), value, t, out=value)
    return value


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


# The reference's temporaries (int64 interval indices and keys, a few fp32 intermediates:
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
