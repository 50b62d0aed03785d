"""tempo's GELU backward reference (the CPU path, a dense table of the exact derivative):
its accuracy against the exact derivative with y in fp32 and bf16, at the table's edges,
and the Triton kernel (the fit) against it under TRITON_INTERPRET=1 at the fit's interval
starts."""

import functools
import math

import numpy as np
import pytest
import torch

from fxopt.kernels import triton_runs_on
from fxopt.kernels.tempo import fit_gelu
from fxopt.kernels.tempo import gelu as tempo_gelu_module
from fxopt.kernels.tempo.bitmask import pack_bits
from fxopt.kernels.tempo.gelu_coefficients import FITS

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


def _outputs_at_region_edges(approximate: str) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 outputs y (and branch bits) on, and a few ulps either side of, the reference
    table's edges: its smallest and largest v on each branch (s = v), the left tail's
    switch (y = -_TAIL) and its smallest v (y = -v); plus outputs from x in [-12, 12]."""
    fit = FITS[approximate]
    edges = [(s * s + fit["y_min"], right) for s in (tempo_gelu_module._V_LOW, 1e-3, 0.3,
                                                      tempo_gelu_module._V_HIGH)
             for right in (True, False) if right or s * s < -fit["y_min"]]
    edges += [(-tempo_gelu_module._TAIL, False), (-tempo_gelu_module._V_LOW, False)]
    ys, rights = [], []
    for value, right in edges:
        y = torch.tensor([value], dtype=torch.float32)
        for _ in range(3):  # 7 neighbours: 3 ulps down, 3 up
            y = torch.cat([y, torch.nextafter(y, torch.tensor(-math.inf)),
                           torch.nextafter(y, torch.tensor(math.inf))]).unique()
        ys.append(y)
        rights.append(torch.full(y.shape, right))
    x = torch.linspace(-12, 12, 20_001, dtype=torch.float64)
    ys.append(torch.nn.functional.gelu(x, approximate=approximate).float())
    rights.append(x >= fit["x_min"])
    return torch.cat(ys), torch.cat(rights)


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_reference_reads_the_exact_derivative_at_region_edges(approximate):
    """The dense table, at and next to its edges and on a grid, against the exact
    derivative at the x whose GELU is that very fp32 y (float64 bisection, checked): within
    2e-6, except near the minimum, where s = sqrt(y - y_min) computed in fp32 keeps half
    of y's bits (y_min itself rounds by 1e-8 in fp32, so s by up to 1e-4, times a slope of
    0.93: the 3e-5 bound; the fit has the same floor, fit_gelu.py)."""
    y, right = _outputs_at_region_edges(approximate)
    fit = FITS[approximate]
    x = torch.empty(y.shape, dtype=torch.float64)
    for branch in (True, False):
        chosen = right == branch
        x[chosen] = tempo_gelu_module._invert(y[chosen].double(), approximate, branch,
                                              fit["x_min"])
    inverted = torch.nn.functional.gelu(x, approximate=approximate)
    reachable = y.double() >= fit["y_min"]  # fp32 rounding puts some y below GELU's minimum
    assert (inverted - y.double())[reachable].abs().max() < 1e-12  # x: y's preimage
    exact = torch.ops.aten.gelu_backward(torch.ones_like(x), x, approximate=approximate)
    error = (tempo_gelu_module.gelu_derivative_from_output(y, right, approximate).double()
             - exact).abs()
    near_minimum = (x - fit["x_min"]).abs() < 0.1
    assert error[~near_minimum].max() < 2e-6
    assert error[near_minimum].max() < 3e-5


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


@pytest.mark.skipif(not triton_runs_on("cpu"), reason="Triton kernels need TRITON_INTERPRET=1")
@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_triton_backward_equals_the_reference_at_interval_starts(approximate):
    from fxopt.kernels.tempo import gelu_triton

    y, right = _outputs_at_interval_starts(approximate)
    y, right = y[: y.numel() // 2 * 2 - 1], right[: y.numel() // 2 * 2 - 1]  # odd length
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(5))
    packed = pack_bits(right)
    # The kernel evaluates the fit, the reference the dense table of the exact derivative:
    # each is within the fit's recorded max error of the exact one, so they differ by at
    # most twice that, times |dy| (< 5 for these 0.5k normal samples).
    torch.testing.assert_close(gelu_triton.backward(dy, y, packed, approximate),
                               tempo_gelu_module._backward_reference(dy, y, packed,
                                                                     approximate),
                               rtol=0, atol=10 * FITS[approximate]["max_error_fp32"])
