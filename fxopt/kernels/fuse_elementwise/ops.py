"""The pointwise aten ops the kernel generator knows, and the Triton expression of each.

:func:`lower` reads one aten call and returns an :class:`Op`: a template name, its operands
(fx nodes or Python scalars), static parameters, and how its compute dtype is chosen. The
generator (:mod:`fxopt.kernels.fuse_elementwise.triton_source`) converts every operand to
the compute dtype before applying :data:`EXPRESSIONS`, then rounds the result to the node's
dtype, so each value holds exactly what eager's op would have produced (fp16/bf16 are
computed in fp32 and rounded once per op, as eager's CPU and CUDA kernels do). Ops with no
entry here, or with arguments the table declines (a rounding mode, a memory format, a tensor
exponent), raise :class:`Unsupported` with the reason; the pass leaves them in the graph and
counts the reason. Triton's ``libdevice`` functions return nothing under the interpreter, so
tanh, log1p and expm1 are written with ``tl.exp``/``tl.log``: their absolute error stays
below 1e-7 in fp32.

"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

__all__ = ["Op", "Unsupported", "EXPRESSIONS", "lower", "SUPPORTED_DTYPES"]

aten = torch.ops.aten

SUPPORTED_DTYPES = frozenset({
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool,
    torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
})


class Unsupported(Exception):
    """This call cannot be generated; the message is the reason the stats count."""


@dataclass(frozen=True)
class Op:
    """One pointwise call, ready for the generator.

    ``compute`` says which dtype the operands are converted to: ``"out"`` the node's own
    dtype, ``"promote"`` the promoted dtype of the operands (comparisons), ``"bool"``
    (logical ops). ``where``'s condition is always read as bool.
    """

    name: str
    operands: tuple[Any, ...]
    params: tuple[Any, ...] = ()
    compute: str = "out"


_SQRT_HALF = 1 / math.sqrt(2)
_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)


def _tanh(x: str) -> str:
    # sign(x) * (1 - e) / (1 + e) with e = exp(-2|x|): no overflow for large |x|
    return (f"tl.where({x} < 0, -1.0, 1.0) * (1.0 - tl.exp(-2.0 * tl.abs({x})))"
            f" / (1.0 + tl.exp(-2.0 * tl.abs({x})))")


def _gelu(x: str, approximate: str) -> str:
    if approximate == "tanh":
        inner = f"{_SQRT_2_OVER_PI!r} * ({x} + 0.044715 * {x} * {x} * {x})"
        return f"(0.5 * {x} * (1.0 + {_tanh(f'({inner})')}))"
    return f"(0.5 * {x} * (1.0 + tl.erf({x} * {_SQRT_HALF!r})))"


def _gelu_backward(g: str, x: str, approximate: str) -> str:
    if approximate == "tanh":
        inner = f"({_SQRT_2_OVER_PI!r} * ({x} + 0.044715 * {x} * {x} * {x}))"
        t = f"({_tanh(inner)})"
        d_inner = f"({_SQRT_2_OVER_PI!r} * (1.0 + 3.0 * 0.044715 * {x} * {x}))"
        return (f"({g} * (0.5 * (1.0 + {t}) + 0.5 * {x} * (1.0 - {t} * {t}) * {d_inner}))")
    cdf = f"(0.5 * (1.0 + tl.erf({x} * {_SQRT_HALF!r})))"
    pdf = f"({_INV_SQRT_2PI!r} * tl.exp(-0.5 * {x} * {x}))"
    return f"({g} * ({cdf} + {x} * {pdf}))"


def _maximum(a: str, b: str, dtype: torch.dtype) -> str:
    nan = ", propagate_nan=tl.PropagateNan.ALL" if dtype.is_floating_point else ""
    return f"tl.maximum({a}, {b}{nan})"


def _minimum(a: str, b: str, dtype: torch.dtype) -> str:
    nan = ", propagate_nan=tl.PropagateNan.ALL" if dtype.is_floating_point else ""
    return f"tl.minimum({a}, {b}{nan})"


def _clamp(x: str, low: str | None, high: str | None, dtype: torch.dtype) -> str:
    if low is not None:
        x = _maximum(x, low, dtype)
    if high is not None:
        x = _minimum(x, high, dtype)
    return x


def _pow_scalar(x: str, exponent: float) -> str:
    if float(exponent).is_integer() and 0 < exponent <= 4:
        return "(" + " * ".join([x] * int(exponent)) + ")"
    if exponent == 0.5:
        return f"tl.sqrt({x})"
    if exponent == -0.5:
        return f"tl.rsqrt({x})"
    if float(exponent).is_integer() and -4 <= exponent < 0:
        return "(1.0 / (" + " * ".join([x] * int(-exponent)) + "))"
    # x < 0 gives nan through log2, as torch does for a non-integer exponent
    return f"tl.exp2({exponent!r} * tl.log2({x}))"


Expression = Callable[[list[str], tuple[Any, ...], torch.dtype], str]

# template name -> (operand expressions, params, compute dtype) -> Triton expression
EXPRESSIONS: dict[str, Expression] = {
    "identity": lambda a, p, d: a[0],
    "add": lambda a, p, d: f"({a[0]} + {a[1]})" if p[0] == 1 else f"({a[0]} + {a[1]} * {p[0]!r})",
    "sub": lambda a, p, d: f"({a[0]} - {a[1]})" if p[0] == 1 else f"({a[0]} - {a[1]} * {p[0]!r})",
    "rsub": lambda a, p, d: f"({a[1]} - {a[0]})" if p[0] == 1 else f"({a[1]} - {a[0]} * {p[0]!r})",
    "mul": lambda a, p, d: f"({a[0]} * {a[1]})",
    "mul_scaled": lambda a, p, d: f"({a[0]} * {a[1]} * {p[0]!r})",
    "div": lambda a, p, d: f"({a[0]} / {a[1]})",
    "maximum": lambda a, p, d: _maximum(a[0], a[1], d),
    "minimum": lambda a, p, d: _minimum(a[0], a[1], d),
    "clamp": lambda a, p, d: _clamp(a[0], a[1] if p[0] else None, a[-1] if p[1] else None, d),
    "pow": lambda a, p, d: _pow_scalar(a[0], p[0]),
    "eq": lambda a, p, d: f"({a[0]} == {a[1]})",
    "ne": lambda a, p, d: f"({a[0]} != {a[1]})",
    "lt": lambda a, p, d: f"({a[0]} < {a[1]})",
    "le": lambda a, p, d: f"({a[0]} <= {a[1]})",
    "gt": lambda a, p, d: f"({a[0]} > {a[1]})",
    "ge": lambda a, p, d: f"({a[0]} >= {a[1]})",
    "logical_and": lambda a, p, d: f"({a[0]} & {a[1]})",
    "logical_or": lambda a, p, d: f"({a[0]} | {a[1]})",
    "logical_xor": lambda a, p, d: f"({a[0]} ^ {a[1]})",
    "logical_not": lambda a, p, d: f"({a[0]} == 0)",
    "where": lambda a, p, d: f"tl.where({a[0]}, {a[1]}, {a[2]})",
    "neg": lambda a, p, d: f"(-{a[0]})",
    "abs": lambda a, p, d: f"tl.abs({a[0]})",
    "reciprocal": lambda a, p, d: f"(1.0 / {a[0]})",
    "exp": lambda a, p, d: f"tl.exp({a[0]})",
    "expm1": lambda a, p, d: f"(tl.exp({a[0]}) - 1.0)",
    "log": lambda a, p, d: f"tl.log({a[0]})",
    "log1p": lambda a, p, d: f"tl.log(1.0 + {a[0]})",
    "sqrt": lambda a, p, d: f"tl.sqrt({a[0]})",
    "rsqrt": lambda a, p, d: f"tl.rsqrt({a[0]})",
    "sin": lambda a, p, d: f"tl.sin({a[0]})",
    "cos": lambda a, p, d: f"tl.cos({a[0]})",
    "erf": lambda a, p, d: f"tl.erf({a[0]})",
    "tanh": lambda a, p, d: f"({_tanh(a[0])})",
    "sigmoid": lambda a, p, d: f"tl.sigmoid({a[0]})",
    "relu": lambda a, p, d: f"tl.where({a[0]} < 0, 0, {a[0]})",
    "gelu": lambda a, p, d: _gelu(a[0], p[0]),
    "silu": lambda a, p, d: f"({a[0]} * tl.sigmoid({a[0]}))",
    "leaky_relu": lambda a, p, d: f"tl.where({a[0]} > 0, {a[0]}, {a[0]} * {p[0]!r})",
    "threshold_backward": lambda a, p, d: f"tl.where({a[1]} <= {p[0]!r}, 0, {a[0]})",
    "sigmoid_backward": lambda a, p, d: f"({a[0]} * {a[1]} * (1.0 - {a[1]}))",
    "tanh_backward": lambda a, p, d: f"({a[0]} * (1.0 - {a[1]} * {a[1]}))",
    "gelu_backward": lambda a, p, d: _gelu_backward(a[0], a[1], p[0]),
    "silu_backward": lambda a, p, d: (f"({a[0]} * tl.sigmoid({a[1]}) * (1.0 + {a[1]} * "
                                      f"(1.0 - tl.sigmoid({a[1]}))))"),
    "leaky_relu_backward": lambda a, p, d: f"tl.where({a[1]} > 0, {a[0]}, {a[0]} * {p[0]!r})",
}

_UNARY = {
    aten.neg.default: "neg", aten.abs.default: "abs", aten.reciprocal.default: "reciprocal",
    aten.exp.default: "exp", aten.expm1.default: "expm1", aten.log.default: "log",
    aten.log1p.default: "log1p", aten.sqrt.default: "sqrt", aten.rsqrt.default: "rsqrt",
    aten.sin.default: "sin", aten.cos.default: "cos", aten.erf.default: "erf",
    aten.tanh.default: "tanh", aten.sigmoid.default: "sigmoid", aten.relu.default: "relu",
    aten.silu.default: "silu",
}
_BINARY = {
    aten.mul.Tensor: "mul", aten.mul.Scalar: "mul", aten.div.Tensor: "div",
    aten.div.Scalar: "div", aten.maximum.default: "maximum",
    aten.minimum.default: "minimum", aten.sigmoid_backward.default: "sigmoid_backward",
    aten.tanh_backward.default: "tanh_backward", aten.silu_backward.default: "silu_backward",
}
_WITH_ALPHA = {
    aten.add.Tensor: "add", aten.add.Scalar: "add", aten.sub.Tensor: "sub",
    aten.sub.Scalar: "sub", aten.rsub.Tensor: "rsub", aten.rsub.Scalar: "rsub",
}
_COMPARISONS = {
    getattr(getattr(aten, name), kind): name
    for name in ("eq", "ne", "lt", "le", "gt", "ge") for kind in ("Tensor", "Scalar")
}
_LOGICAL = {
    aten.logical_and.default: "logical_and", aten.logical_or.default: "logical_or",
    aten.logical_xor.default: "logical_xor", aten.logical_not.default: "logical_not",
}
_BITWISE_ON_BOOL = {
    aten.bitwise_and.Tensor: "logical_and", aten.bitwise_or.Tensor: "logical_or",
    aten.bitwise_xor.Tensor: "logical_xor", aten.bitwise_not.default: "logical_not",
}


def _arg(node: fx.Node, index: int, name: str, default: Any) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _dtype(value: Any) -> torch.dtype | None:
    val = value.meta.get("val") if isinstance(value, fx.Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def _scalar(value: Any, what: str) -> Any:
    """A Python number argument, or Unsupported (bools, symbolic values, None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Unsupported(f"{what} is {type(value).__name__}, not an int or float")
    return value


def _no_extra_kwargs(node: fx.Node, allowed: set[str]) -> None:
    extra = set(node.kwargs) - allowed
    if extra:
        raise Unsupported(f"{node.target} with {sorted(extra)}")


def lower(node: fx.Node) -> Op:
    """The :class:`Op` for one aten call, or :class:`Unsupported` saying why not."""
    target = node.target
    if target in _UNARY:
        _no_extra_kwargs(node, set())
        return Op(_UNARY[target], (node.args[0],))
    if target in _BINARY:
        _no_extra_kwargs(node, set())
        return Op(_BINARY[target], tuple(node.args[:2]))
    if target in _WITH_ALPHA:
        _no_extra_kwargs(node, {"alpha"})
        alpha = _scalar(_arg(node, 2, "alpha", 1), "alpha")
        return Op(_WITH_ALPHA[target], tuple(node.args[:2]), (alpha,))
    if target in _COMPARISONS:
        return Op(_COMPARISONS[target], tuple(node.args[:2]), compute="promote")
    if target in _LOGICAL:
        return Op(_LOGICAL[target], tuple(node.args), compute="bool")
    if target in _BITWISE_ON_BOOL and all(_dtype(a) == torch.bool for a in node.args):
        return Op(_BITWISE_ON_BOOL[target], tuple(node.args), compute="bool")
    return _lower_special(node)


def _lower_special(node: fx.Node) -> Op:
    target = node.target
    if target == aten.where.self:
        return Op("where", tuple(node.args[:3]))
    if target in (aten.masked_fill.Scalar, aten.masked_fill.Tensor):
        x, mask, value = node.args[:3]
        return Op("where", (mask, value, x))
    if target == aten.pow.Tensor_Scalar:
        exponent = float(_scalar(node.args[1], "exponent"))
        if exponent == 0:
            raise Unsupported("pow with exponent 0")
        return Op("pow", (node.args[0],), (exponent,))
    if target in (aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default):
        low = _arg(node, 1, "min", None) if target != aten.clamp_max.default else None
        high = (_arg(node, 2, "max", None) if target == aten.clamp.default
                else _arg(node, 1, "max", None) if target == aten.clamp_max.default else None)
        bounds = tuple(_scalar(b, "a clamp bound") for b in (low, high) if b is not None)
        return Op("clamp", (node.args[0], *bounds), (low is not None, high is not None))
    if target in (aten.gelu.default, aten.gelu_backward.default):
        approximate = node.kwargs.get("approximate", "none")
        name = "gelu" if target == aten.gelu.default else "gelu_backward"
        return Op(name, tuple(node.args[: 1 if name == "gelu" else 2]), (approximate,))
    if target == aten.leaky_relu.default:
        return Op("leaky_relu", (node.args[0],), (float(_arg(node, 1, "negative_slope", 0.01)),))
    if target == aten.leaky_relu_backward.default:
        if node.args[3] is True:
            raise Unsupported("leaky_relu_backward of an in-place leaky_relu")
        return Op("leaky_relu_backward", tuple(node.args[:2]), (float(node.args[2]),))
    if target == aten.native_dropout_backward.default:
        return Op("mul_scaled", tuple(node.args[:2]),
                  (float(_scalar(node.args[2], "dropout scale")),))
    if target == aten.threshold_backward.default:
        return Op("threshold_backward", tuple(node.args[:2]),
                  (_scalar(node.args[2], "threshold"),))
    return _lower_copy(node)


def _lower_copy(node: fx.Node) -> Op:
    """Casts and copies: the generator's operand conversion does the cast."""
    target = node.target
    if target == torch.ops.prims.convert_element_type.default:
        return Op("identity", (node.args[0],))
    if target == aten._to_copy.default:
        _no_extra_kwargs(node, {"dtype", "layout", "device"})
        source = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
        val = node.meta.get("val")
        if node.kwargs.get("layout", torch.strided) != torch.strided or (
                source is None or val is None or source.device != val.device):
            raise Unsupported("_to_copy that changes device or layout")
        return Op("identity", (node.args[0],))
    if target == aten.clone.default:
        # the output is allocated with the strides the node recorded, so a clone that
        # changes the layout is a strided read and a linear write
        if node.kwargs.get("memory_format") not in (None, torch.contiguous_format,
                                                    torch.preserve_format):
            raise Unsupported(f"clone to {node.kwargs['memory_format']}")
        return Op("identity", (node.args[0],))
    name = getattr(target, "__name__", str(target))
    raise Unsupported(f"no pointwise kernel for {name}")
