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

import torch

from fxopt.kernels import triton_runs_on
from fxopt.kernels.tempo.bitmask import pack_bits, packed_size, unpack_bits
from fxopt.kernels.tempo.gelu_coefficients import DEGREE, FITS

__all__ = ["APPROXIMATIONS", "gelu_tables", "gelu_derivative_from_output", "tempo_gelu",
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


def gelu_derivative_from_output(y: torch.Tensor, right: torch.Tensor, approximate: str
                                ) -> torch.Tensor:
    """GELU's derivative (fp32) at the inputs whose outputs are ``y`` and whose branch is
    ``right`` (x >= x_min), from the fitted polynomials."""
    tables = gelu_tables(approximate, y.device)
    s = (y.float() - tables["y_min"]).clamp_min(0).sqrt()
    num_left, starts = tables["num_left"], tables["starts"]
    left_index = torch.bucketize(s, starts[:num_left], right=True).clamp(1, num_left) - 1
    right_index = torch.bucketize(s, starts[num_left:], right=True).clamp(
        1, len(starts) - num_left) - 1 + num_left
    index = torch.where(right, right_index, left_index)
    t = (s - starts[index]) * tables["scales"][index]
    coefficients = tables["coefficients"]
    value = torch.zeros_like(t)
    for k in range(DEGREE, -1, -1):  # one coefficient per element at a time, not a row
        value = value * t + coefficients[:, k][index]
    beyond = torch.where(right, s >= tables["right_end"], s >= tables["left_end"])
    return torch.where(beyond, right.float(), value)


def _forward_reference(x: torch.Tensor, approximate: str) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.nn.functional.gelu(x, approximate=approximate)
    return y, pack_bits(x >= gelu_tables(approximate, x.device)["x_min"])


# The reference's temporaries (int64 interval indices and a dozen fp32 intermediates per
# element) would make the backward's peak larger than the activation tempo saved (measured
# on the benchmark suite's GPT-2 smoke step: 708 KiB of temporaries at the peak against
# 93 KiB with plain GELU, before chunking). Chunks of this many elements bound them.
_REFERENCE_CHUNK = 1 << 12


def _backward_reference(dy: torch.Tensor, y: torch.Tensor, packed: torch.Tensor,
                        approximate: str) -> torch.Tensor:
    right = unpack_bits(packed, y.shape).reshape(-1)
    dx = torch.empty(y.shape, dtype=dy.dtype, device=dy.device)
    flat_dx, flat_dy, flat_y = dx.view(-1), dy.reshape(-1), y.reshape(-1)
    for start in range(0, flat_dx.numel(), _REFERENCE_CHUNK):
        chunk = slice(start, start + _REFERENCE_CHUNK)
        derivative = gelu_derivative_from_output(flat_y[chunk], right[chunk], approximate)
        flat_dx[chunk] = flat_dy[chunk].float() * derivative
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
