"""tempo's GELU backward reference (the CPU path): its accuracy against the exact derivative
with y in fp32 and bf16, its interval choice against a binary search at every interval's
start, and the Triton kernel against it under TRITON_INTERPRET=1 at the same points."""

import functools
import math

import numpy as np
import pytest
import torch

from fxopt.kernels import triton_runs_on
from fxopt.kernels.tempo import fit_gelu
from fxopt.kernels.tempo import gelu as tempo_gelu_module
from fxopt.kernels.tempo.bitmask import pack_bits
from fxopt.kernels.tempo.gelu_coefficients import DEGREE, FITS

APPROXIMATIONS = ("none", "tanh")


@functools.cache
def _fit_grid(approximate: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fit_gelu's error grid: x, gelu(x) rounded to fp32, the exact derivative (float64)."""
    x = np.linspace(-10.0, 10.0, 400_001)
    return (x, fit_gelu.gelu(x, approximate).astype(np.float32),
            fit_gelu.gelu_derivative(x, approximate))


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_is_as_accurate_as_the_fit(approximate, dtype):
    """On fit_gelu's own grid (x in [-10, 10], y rounded to ``dtype``) the reference's
    max error is the one fit_gelu recorded for the table (kept to 4 significant digits,
    hence the 1e-3 relative slack)."""
    x, y, exact = _fit_grid(approximate)
    y = torch.from_numpy(y).to(dtype)
    right = torch.from_numpy(x >= FITS[approximate]["x_min"])
    fitted = tempo_gelu_module.gelu_derivative_from_output(y, right, approximate)
    assert fitted.dtype == torch.float32
    error = np.abs(fitted.double().numpy() - exact).max()
    recorded = FITS[approximate]["max_error_fp32" if dtype == torch.float32
                                 else "max_error_bf16"]
    assert error <= recorded * (1 + 1e-3)


def _binary_search_derivative(y: torch.Tensor, right: torch.Tensor, approximate: str
                              ) -> torch.Tensor:
    """The fit evaluated with bucketize and per-coefficient gathers (the reference's former
    form, plainly written): the interval choice to compare with."""
    fit = FITS[approximate]
    s = (y.float() - fit["y_min"]).clamp_min(0).sqrt()
    result = torch.empty_like(s)
    for branch, mask, beyond in (("right", right, 1.0), ("left", ~right, 0.0)):
        part = fit[branch]
        starts = torch.tensor(part["starts"])
        index = (torch.bucketize(s[mask], starts, right=True) - 1).clamp_min(0)
        t = (s[mask] - starts[index]) * torch.tensor(part["scales"])[index]
        coefficients = torch.tensor(part["coefficients"])[index]
        value = torch.zeros_like(t)
        for k in range(DEGREE, -1, -1):
            value = value * t + coefficients[:, k]
        result[mask] = torch.where(s[mask] >= part["end"], beyond, value)
    return result


def _outputs_at_interval_starts(approximate: str) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 outputs y (and branch bits) whose s lands on, and a few ulps either side of,
    every interval's start and each branch's end; plus outputs from x in [-8, 8]."""
    fit = FITS[approximate]
    ys, rights = [], []
    for branch in ("left", "right"):
        part = fit[branch]
        s = torch.tensor(part["starts"] + [part["end"]], dtype=torch.float64)
        y = (s * s + fit["y_min"]).float()
        for _ in range(3):  # 7 neighbours of each: 3 ulps down, 3 up
            y = torch.cat([y, torch.nextafter(y, torch.tensor(-math.inf)),
                           torch.nextafter(y, torch.tensor(math.inf))]).unique()
        ys.append(y)
        rights.append(torch.full(y.shape, branch == "right"))
    x = torch.linspace(-8, 8, 301)
    ys.append(torch.nn.functional.gelu(x, approximate=approximate))
    rights.append(x >= fit["x_min"])
    return torch.cat(ys), torch.cat(rights)


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_reference_picks_the_interval_a_binary_search_picks(approximate):
    """The key table and one comparison choose the interval a binary search over the
    starts chooses, on and next to every start (the values cannot show a wrong choice
    there: neighbouring polynomials agree to 1e-7 at their common start)."""
    y, right = _outputs_at_interval_starts(approximate)
    tables = tempo_gelu_module._reference_tables(approximate, y.device)
    interval, s = tempo_gelu_module._intervals(y, right.view(torch.uint8), tables)
    fit = FITS[approximate]
    expected = torch.empty_like(interval)
    for branch, mask, first in (("left", ~right, 0),
                                ("right", right, len(fit["left"]["starts"]) + 1)):
        starts = torch.tensor(fit[branch]["starts"] + [fit[branch]["end"]])
        expected[mask] = first + (torch.bucketize(s[mask], starts, right=True) - 1)
    assert torch.equal(interval, expected)
    # ... and the same derivative up to the rounding of its multiply-adds
    torch.testing.assert_close(
        tempo_gelu_module.gelu_derivative_from_output(y, right, approximate),
        _binary_search_derivative(y, right, approximate), rtol=0, atol=1e-6)


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_reference_backward_handles_infinities_and_bf16(approximate):
    """dx = dy * derivative in dy's dtype: bf16 in, bf16 out; y = +inf has derivative 1
    (tanh form; erf's 1.0 + erf is exact there too) and a NaN y gives a NaN dx."""
    y = torch.tensor([math.inf, math.nan, 3.0, -0.1], dtype=torch.bfloat16)
    right = torch.tensor([True, True, True, False])
    dy = torch.full_like(y, 2.0)
    dx = tempo_gelu_module._backward_reference(dy, y, pack_bits(right), approximate)
    assert dx.dtype == torch.bfloat16
    assert dx[0] == 2.0 and dx[1].isnan() and dx[2:].isfinite().all()


@pytest.mark.skipif(not triton_runs_on("cpu"), reason="Triton kernels need TRITON_INTERPRET=1")
@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_triton_backward_equals_the_reference_at_interval_starts(approximate):
    from fxopt.kernels.tempo import gelu_triton

    y, right = _outputs_at_interval_starts(approximate)
    y, right = y[: y.numel() // 2 * 2 - 1], right[: y.numel() // 2 * 2 - 1]  # odd length
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(5))
    packed = pack_bits(right)
    torch.testing.assert_close(gelu_triton.backward(dy, y, packed, approximate),
                               tempo_gelu_module._backward_reference(dy, y, packed,
                                                                     approximate),
                               rtol=1e-5, atol=1e-6)
