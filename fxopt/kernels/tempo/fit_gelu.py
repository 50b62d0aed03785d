"""Fits GELU's derivative as a piecewise polynomial of GELU's output (Tempo's GELU backward).

GELU falls from 0 to its minimum y_min at x_min and rises after it, so y alone does not
tell x; the branch bit (x >= x_min) does. Near the minimum y - y_min grows like
(x - x_min)^2, so the derivative is a smooth function of s = sqrt(y - y_min), not of y: the
fit is in s, per branch, on intervals of s, by least squares on dense
samples of x. The intervals' ends are chosen in x and mapped to s: the left branch's tail
(y -> 0-) behaves like 2 y log|y| and needs short intervals. Beyond the last right interval
the derivative is 1, beyond the last left one 0 (errors below 1e-6).

Run ``python -m fxopt.kernels.tempo.fit_gelu`` to refit and print the fit's maximum
absolute error with y stored in fp32 and in bf16 (both dominated by the rounding of y near
the minimum, where s keeps only half of y's bits; the fit alone, in float64, is within
1e-7). It writes the table to ``gelu_coefficients.py`` in the working directory (``--out``
to choose), never into the installed package unless asked: ``--update-package`` rewrites
the package's own ``gelu_coefficients.py``, the table the kernels use (a developer's step,
in a source checkout). It says whether the new table equals the package's. numpy only.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import pprint
from collections.abc import Sequence

import numpy as np

FORMS = ("none", "tanh")
DEGREE = 7
# Interval ends in x (mapped to s = sqrt(gelu(x) - y_min)), from the minimum outwards.
LEFT_ENDS_X = (-1.1, -1.5, -2.0, -2.5, -3.0, -3.5, -4.0, -4.5, -5.0, -6.0)
RIGHT_ENDS_X = (-0.4, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu(x: np.ndarray, form: str) -> np.ndarray:
    if form == "tanh":
        return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)))
    from math import erf

    return x * 0.5 * (1.0 + np.vectorize(erf)(x / math.sqrt(2.0)))


def gelu_derivative(x: np.ndarray, form: str) -> np.ndarray:
    if form == "tanh":
        t = np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3))
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI * (
            1 + 3 * 0.044715 * x * x)
    from math import erf

    cdf = 0.5 * (1.0 + np.vectorize(erf)(x / math.sqrt(2.0)))
    return cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def minimum(form: str) -> tuple[float, float]:
    """(x_min, y_min): where the derivative crosses zero, by bisection in float64."""
    lo, hi = -1.0, -0.5
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if gelu_derivative(np.array([mid]), form)[0] < 0:
            lo = mid
        else:
            hi = mid
    x_min = 0.5 * (lo + hi)
    return x_min, float(gelu(np.array([x_min]), form)[0])


def fit_branch(form: str, right: bool) -> dict[str, object]:
    """Least-squares polynomials of the derivative in s, one per interval of s; each in
    the interval's local variable t = (s - start) / width in [0, 1], so that the
    coefficients stay within fp32's range on the left tail's very short intervals."""
    x_min, y_min = minimum(form)
    ends_x = RIGHT_ENDS_X if right else LEFT_ENDS_X
    starts, scales, coefficients = [], [], []
    previous = x_min
    for end in ends_x:
        x = np.linspace(previous, end, 20_001)
        s = np.sqrt(np.maximum(gelu(x, form) - y_min, 0.0))
        start, width = float(s.min()), float(s.max() - s.min())
        poly = np.polynomial.polynomial.polyfit((s - start) / width,
                                                gelu_derivative(x, form), DEGREE)
        starts.append(start)
        scales.append(1.0 / width)
        coefficients.append([float(c) for c in poly])
        previous = end
    s_end = float(np.sqrt(gelu(np.array([ends_x[-1]]), form)[0] - y_min))
    return {"starts": starts, "scales": scales, "end": s_end, "coefficients": coefficients}


def evaluate(y: np.ndarray, right: np.ndarray, fit: dict[str, object], form: str
             ) -> np.ndarray:
    """The fitted derivative at outputs ``y`` on branches ``right``, in y's dtype (fp32
    to see the error of fp32 arithmetic, as in the kernels)."""
    dtype = y.dtype.type
    s = np.sqrt(np.maximum(y - dtype(fit["y_min"]), dtype(0)))
    out = np.empty_like(y)
    for branch, mask, beyond in (("right", right, 1.0), ("left", ~right, 0.0)):
        part = fit[branch]
        starts = np.array(part["starts"], dtype=y.dtype)
        coefficients = np.array(part["coefficients"], dtype=y.dtype)
        index = np.clip(np.searchsorted(starts, s[mask], side="right") - 1, 0,
                        len(starts) - 1)
        t = (s[mask] - starts[index]) * np.array(part["scales"], dtype=y.dtype)[index]
        value = np.zeros_like(t)
        for k in range(DEGREE, -1, -1):
            value = value * t + coefficients[index, k]
        out[mask] = np.where(s[mask] >= dtype(part["end"]), dtype(beyond), value)
    return out


def max_error(form: str, fit: dict[str, object], bf16: bool) -> float:
    """Max |fitted - exact| derivative over x in [-10, 10] when y is stored in fp32 (or
    bf16) and the evaluation runs in fp32. Rounding y costs more than the fit itself: near
    the minimum s = sqrt(y - y_min) keeps only half of y's bits."""
    x = np.linspace(-10.0, 10.0, 400_001)
    y = gelu(x, form).astype(np.float32)
    if bf16:  # round to bf16: round to nearest even on the fp32 bits
        bits = y.view(np.uint32)
        y = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).view(np.float32)
    return float(np.abs(evaluate(y, x >= fit["x_min"], fit, form)
                        - gelu_derivative(x, form)).max())


PACKAGE_TABLE = pathlib.Path(__file__).with_name("gelu_coefficients.py")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m fxopt.kernels.tempo.fit_gelu",
        description="Refit GELU's derivative for tempo's GELU backward and write the table.")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", type=pathlib.Path, default=pathlib.Path("gelu_coefficients.py"),
                       help="where to write the table (default: ./gelu_coefficients.py)")
    where.add_argument("--update-package", action="store_true",
                       help=f"rewrite the package's own table, {PACKAGE_TABLE}")
    args = parser.parse_args(argv)
    fits = {}
    for form in FORMS:
        x_min, y_min = minimum(form)
        fit = {"x_min": x_min, "y_min": y_min, "right": fit_branch(form, True),
               "left": fit_branch(form, False)}
        fit["max_error_fp32"] = float(f"{max_error(form, fit, False):.3e}")
        fit["max_error_bf16"] = float(f"{max_error(form, fit, True):.3e}")
        print(f"gelu approximate={form!r}: x_min={x_min:.9f} y_min={y_min:.9f} "
              f"max |error| of the derivative: y in fp32 {fit['max_error_fp32']:.2e}, "
              f"y in bf16 {fit['max_error_bf16']:.2e}")
        fits[form] = fit
    path = PACKAGE_TABLE if args.update_package else args.out
    before = PACKAGE_TABLE.read_text()
    path.write_text('"""Generated by fit_gelu.py (do not edit): GELU\'s derivative as piecewise '
                    'polynomials\nin s = sqrt(y - y_min), per branch; see fit_gelu.py."""\n\n'
                    f"DEGREE = {DEGREE}\n\n"
                    f"FITS = {pprint.pformat(fits, width=96, sort_dicts=False)}\n")
    same = path.read_text() == before
    print(f"wrote {path}; it {'equals' if same else 'differs from'} the package's table "
          f"{PACKAGE_TABLE}" + ("" if same or args.update_package else
                                " (--update-package would replace that one)"))


if __name__ == "__main__":
    main()
