"""The package's GELU table (``gelu_coefficients.py``, 397 generated lines that nobody
reads) is what ``fit_gelu`` produces today: a refit that drifts from the committed table
(a changed interval, degree or form) fails here instead of shipping a stale table.

The fit's error report (``max_error``, 400k erf evaluations per form) is not recomputed:
it is printed information, not what the kernels use. The coefficients are compared to
1e-9 relative: least squares on another BLAS or numpy may differ in the last bits, while
any change of the fit itself moves them by far more."""

import math

import pytest

from fxopt.kernels.tempo import fit_gelu, gelu_coefficients


@pytest.mark.parametrize("form", fit_gelu.FORMS)
def test_package_table_is_what_fit_gelu_produces(form):
    table = gelu_coefficients.FITS[form]
    assert gelu_coefficients.DEGREE == fit_gelu.DEGREE
    x_min, y_min = fit_gelu.minimum(form)
    assert math.isclose(table["x_min"], x_min, rel_tol=1e-12)
    assert math.isclose(table["y_min"], y_min, rel_tol=1e-12)
    for branch, right in (("right", True), ("left", False)):
        fit = fit_gelu.fit_branch(form, right)
        stored = table[branch]
        assert stored["starts"] == pytest.approx(fit["starts"], rel=1e-9, abs=1e-12)
        assert stored["scales"] == pytest.approx(fit["scales"], rel=1e-9)
        assert stored["end"] == pytest.approx(fit["end"], rel=1e-9)
        assert len(stored["coefficients"]) == len(fit["coefficients"])
        for kept, refit in zip(stored["coefficients"], fit["coefficients"]):
            assert kept == pytest.approx(refit, rel=1e-9, abs=1e-9)
