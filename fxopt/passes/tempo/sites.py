"""The four subgraphs tempo replaces, found in Dynamo's torch-level graph.

Each matcher looks at one node and answers None (not its kind), a reason string (its kind,
but left alone, e.g. an unsupported argument), or a :class:`Site`: the nodes it replaces,
the node whose value the new op's first output stands for, where to insert the op, the op
and its arguments, and the predicted bytes of saved activations it removes per step.

A norm's ``eps`` may be a graph value rather than a number: Dynamo makes a Python float
symbolic once it changes between calls of one forward (``specialize_float=False``, torch's
default; a second model of the same class, a sweep in one process). The norms take it as it
is; the attention site declines a symbolic dropout rate, with that reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from fxopt.analysis.shapes import nbytes, numel
from fxopt.kernels.tempo.bitmask import packed_size
from fxopt.kernels.tempo.norm import guard_capacity
from fxopt.passes.tempo.graph import cast_by_savers, is_noop_cast, kept_by_neighbour, only_user
from fxopt.passes.torch_calls import (
    arg,
    constant_operand,
    example_tensor,
    is_call,
    scalar_operand,
    symbolic_float,
)

__all__ = ["Site", "MATCHERS"]

fxopt_ops = torch.ops.fxopt


@dataclass
class Site:
    kind: str                 # "gelu" | "layer_norm" | "rms_norm" | "attention"
    replaced: list[fx.Node]   # every node of the subgraph; ``result`` among them
    result: fx.Node           # its value becomes the new op's first output
    insert_before: fx.Node
    op: Any
    args: tuple[Any, ...]
    bytes_removed: int        # predicted saved-activation bytes per step
    needs_neighbour: bool     # saves its output: worth it only if a neighbour keeps it
    # under autocast: (low dtype, the users given the op's output ``index``, its value in
    # that dtype, ``index``); the other users get output 0 (see match_layer_norm,
    # _rms_norm_site)
    cast: tuple[torch.dtype, list[fx.Node], int] | None = None


def _close(value: float | None, expected: float) -> bool:
    return value is not None and math.isclose(value, expected, rel_tol=1e-6)


def _gelu_bytes(x: fx.Node) -> int:
    """x replaced by 1 bit per element. A lower bound for GPT-2's formula, whose autograd
    also keeps tanh's output and the products (measured: about 3.5x more)."""
    value = example_tensor(x)
    return 0 if value is None else nbytes(value) - packed_size(numel(value))


def match_gelu(node: fx.Node) -> Site | str | None:
    """``F.gelu(x)`` / ``nn.GELU`` in either form."""
    if not is_call(node, "gelu"):
        return None
    approximate = arg(node, 1, "approximate", "none")
    if approximate not in ("none", "tanh"):
        return f"gelu approximate={approximate!r}"
    x = node.args[0]
    return Site("gelu", [node], node, node, fxopt_ops.tempo_gelu.default, (x, approximate),
                _gelu_bytes(x), needs_neighbour=True)


def match_gelu_tanh_formula(node: fx.Node) -> Site | str | None:
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3))), as GPT-2 code writes it
    (transformers' NewGELUActivation); matched from its tanh."""
    if not is_call(node, "tanh"):
        return None
    scale, inner = constant_operand(node.args[0]) if is_call(node.args[0], "mul") else (None,
                                                                                        None)
    if not _close(scale, math.sqrt(2 / math.pi)) or not is_call(inner, "add"):
        return None
    cube_term, x = _split_cube_term(inner)
    one_plus = only_user(node)
    final = only_user(one_plus) if one_plus is not None else None
    if cube_term is None or final is None or not is_call(one_plus, "add") or not _close(
            constant_operand(one_plus)[0], 1.0) or not is_call(final, "mul"):
        return None
    half = next((a for a in final.args if a is not one_plus), None)
    if not is_call(half, "mul") or constant_operand(half) != (0.5, x):
        return None
    cube = cube_term.args[0] if is_call(cube_term.args[0], "pow") else cube_term.args[1]
    replaced = [half, cube, cube_term, inner, node.args[0], node, one_plus, final]
    return Site("gelu", replaced, final, final, fxopt_ops.tempo_gelu.default, (x, "tanh"),
                _gelu_bytes(x), needs_neighbour=True)


def _split_cube_term(inner: fx.Node) -> tuple[fx.Node | None, Any]:
    """For ``x + 0.044715 * x**3``: (the product node, x)."""
    for term, x in ((inner.args[1], inner.args[0]), (inner.args[0], inner.args[1])):
        if not is_call(term, "mul"):
            continue
        coefficient, cube = constant_operand(term)
        if _close(coefficient, 0.044715) and is_call(cube, "pow") and cube.args[0] is x and \
                _close(constant_operand(cube)[0], 3.0):
            return term, x
    return None, None


def _norm_bytes(x: fx.Node, n: int, extra_per_row: int) -> int:
    """Eager keeps x (and LayerNorm its mean); tempo keeps rstd and the guarded columns."""
    value = example_tensor(x)
    if value is None:
        return 0
    rows = numel(value) // n
    capacity = guard_capacity(n)
    return nbytes(value) + extra_per_row * rows - 4 * rows * capacity - 8 * capacity


def _normalized_numel(shape: Any) -> int | None:
    if isinstance(shape, int):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)) or not all(isinstance(s, int) for s in shape):
        return None
    return math.prod(shape)


def match_layer_norm(node: fx.Node) -> Site | str | None:
    """``F.layer_norm`` / ``nn.LayerNorm``."""
    if not is_call(node, "layer_norm"):
        return None
    x, n = node.args[0], _normalized_numel(arg(node, 1, "normalized_shape"))
    weight, bias, eps = arg(node, 2, "weight"), arg(node, 3, "bias"), arg(node, 4, "eps", 1e-5)
    out = example_tensor(node)
    if n is None or out is None or not (isinstance(eps, float) or symbolic_float(eps)):
        return "layer_norm with symbolic shape or an eps that is not a float"
    if guard_capacity(n) * 4 > n:
        return "norm over fewer than 8 elements"
    return _layer_norm_site([node], node, (x, n, weight, bias, eps), out.dtype,
                            _norm_bytes(x, n, 4))


def _layer_norm_site(replaced: list[fx.Node], result: fx.Node, args: tuple[Any, ...],
                     out_dtype: torch.dtype, removed: int) -> Site:
    """A LayerNorm site computing ``args`` (x, n, weight, bias, eps) into ``result``. Under
    autocast the fp32 output's users that keep it keep their own low-precision cast: tempo
    makes that cast and keeps it (with rstd) in place of the input. With no other user, the
    op's only output is the cast (``fxopt::tempo_layer_norm`` in that dtype); otherwise it
    returns both (``fxopt::tempo_layer_norm_cast``)."""
    cast = None if kept_by_neighbour(result) else cast_by_savers(result)
    if cast is None:
        return Site("layer_norm", replaced, result, result,
                    fxopt_ops.tempo_layer_norm.default, (*args, out_dtype), removed, True)
    dtype, users = cast
    if set(users) == set(result.users):
        return Site("layer_norm", replaced, result, result,
                    fxopt_ops.tempo_layer_norm.default, (*args, dtype), removed, False,
                    (dtype, users, 0))
    return Site("layer_norm", replaced, result, result,
                fxopt_ops.tempo_layer_norm_cast.default, (*args, out_dtype, dtype), removed,
                False, (dtype, users, 1))


def _mean_of_last_dim(node: Any) -> fx.Node | None:
    """``t`` where ``node`` is ``t.mean(-1, keepdim=True)``, else None."""
    if not is_call(node, "mean") or arg(node, 1, "dim") not in (-1, [-1], (-1,)) or \
            arg(node, 2, "keepdim", False) is not True:
        return None
    return node.args[0]


def _centers(node: Any, h: fx.Node, mean: fx.Node) -> bool:
    return is_call(node, "sub") and len(node.args) == 2 and tuple(node.args) == (h, mean)


def match_layer_norm_formula(node: fx.Node) -> Site | str | None:
    """Cohere's hand-written LayerNorm, matched from its rsqrt:
    ``weight * ((h - m) * rsqrt((h - m).pow(2).mean(-1, keepdim=True) + eps))`` with
    ``m = h.mean(-1, keepdim=True)`` and ``h = x.to(float32)``, cast back to x's dtype. The
    casts and the (1-d) weight are optional; the two ``h - m`` may be one node or two. It
    computes what ``F.layer_norm(x, (n,), weight, None, eps)`` computes: in fp32, rounded
    once to the output's dtype."""
    if not is_call(node, "rsqrt") or not is_call(node.args[0], "add"):
        return None
    eps, variance = scalar_operand(node.args[0])
    square = _mean_of_last_dim(variance)
    if eps is None or not is_call(square, "pow") or constant_operand(square)[0] != 2.0:
        return None
    centered = square.args[0]
    if not is_call(centered, "sub") or len(centered.args) != 2:
        return None
    h, mean = centered.args
    scaled = only_user(node)
    if _mean_of_last_dim(mean) is not h or not is_call(scaled, "mul") or \
            node not in scaled.args:
        return None
    other = next((a for a in scaled.args if a is not node), node)
    if other is not centered and not _centers(other, h, mean):
        return None
    h_value = example_tensor(h)
    if h_value is None or h_value.dtype != torch.float32:
        return "LayerNorm formula computing in another dtype than fp32"
    replaced = {mean, centered, square, variance, node.args[0], node, other, scaled}
    x = h
    if is_call(h, "cast"):
        x = h.args[0]
        if set(h.users) <= replaced:
            replaced.add(h)
    result, weight, weighted = scaled, None, 0
    final = only_user(scaled)
    if is_call(final, "mul") and len(final.args) == 2 and scaled in final.args:
        w = final.args[1] if final.args[0] is scaled else final.args[0]
        w_value = example_tensor(w)
        if w_value is not None and tuple(w_value.shape) == (h_value.shape[-1],):
            weight, result = w, final
            replaced.add(final)
            if is_call(w, "cast") and only_user(w) is final and \
                    example_tensor(w.args[0]) is not None:
                weight = w.args[0]  # weight.to(float32): the op upcasts it itself
                replaced.add(w)
            # the product keeps the normalized input for the weight's gradient
            weighted = 1 if example_tensor(weight).requires_grad else 0
    cast = only_user(result)
    x_value = example_tensor(x)
    if is_call(cast, "cast") and example_tensor(cast) is not None and x_value is not None:
        if example_tensor(cast).dtype != x_value.dtype:
            return "LayerNorm formula casting to another dtype than its input's"
        result = cast
        replaced.add(cast)
    out = example_tensor(result)
    if x_value is None or out is None or not isinstance(h_value.shape[-1], int):
        return "LayerNorm formula with symbolic sizes"
    n = h_value.shape[-1]
    if guard_capacity(n) * 4 > n:
        return "norm over fewer than 8 elements"
    # eager keeps both centerings (one where they are one node), the normalized input for
    # the weight's gradient, and rstd (as tempo does: no mean, unlike F.layer_norm)
    kept = 1 + (other is not centered) + weighted
    removed = _norm_bytes(h, n, 0) + (kept - 1) * nbytes(h_value)
    order = {g: i for i, g in enumerate(node.graph.nodes)}
    return _layer_norm_site(sorted(replaced, key=order.__getitem__), result,
                            (x, n, weight, None, eps), out.dtype, removed)


def match_rms_norm(node: fx.Node) -> Site | str | None:
    """``F.rms_norm`` / ``nn.RMSNorm``."""
    if not is_call(node, "rms_norm"):
        return None
    x, n = node.args[0], _normalized_numel(arg(node, 1, "normalized_shape"))
    weight, eps, out = arg(node, 2, "weight"), arg(node, 3, "eps"), example_tensor(node)
    if n is None or out is None or example_tensor(x) is None:
        return "rms_norm with symbolic shape"
    if guard_capacity(n) * 4 > n:
        return "norm over fewer than 8 elements"
    if eps is None:
        eps = torch.finfo(example_tensor(x).dtype).eps
    elif not symbolic_float(eps):
        eps = float(eps)
    return _rms_norm_site([node], node, (x, n, weight, eps, False), out.dtype,
                          _norm_bytes(x, n, 0))


def _rms_norm_site(replaced: list[fx.Node], result: fx.Node, args: tuple[Any, ...],
                   out_dtype: torch.dtype, removed: int) -> Site:
    """An RMSNorm site computing ``args`` (x, n, weight, eps, round_before_weight) into
    ``result``. Under autocast, as for LayerNorm (:func:`match_layer_norm`), the users that
    keep their own low-precision cast of the fp32 output are given the op's cast, which it
    keeps in place of x: the op's only output where they are all the users
    (``fxopt::tempo_rms_norm`` in that dtype), else beside the fp32 one
    (``fxopt::tempo_rms_norm_cast``)."""
    cast = None if kept_by_neighbour(result) else cast_by_savers(result)
    if cast is None:
        return Site("rms_norm", replaced, result, result, fxopt_ops.tempo_rms_norm.default,
                    (*args, out_dtype), removed, True)
    dtype, users = cast
    if set(users) == set(result.users):
        return Site("rms_norm", replaced, result, result, fxopt_ops.tempo_rms_norm.default,
                    (*args, dtype), removed, False, (dtype, users, 0))
    return Site("rms_norm", replaced, result, result, fxopt_ops.tempo_rms_norm_cast.default,
                (*args, out_dtype, dtype), removed, False, (dtype, users, 1))


def match_rms_norm_formula(node: fx.Node) -> Site | str | None:
    """Llama's hand-written RMSNorm, matched from its rsqrt:
    ``weight * (h * rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)`` with
    ``h = x.to(float32)``; the casts and the weight are optional, and T5's
    ``x * rsqrt(...)`` is the same where ``x`` is already fp32."""
    if not is_call(node, "rsqrt") or not is_call(node.args[0], "add"):
        return None
    eps, mean = scalar_operand(node.args[0])
    if eps is None or not is_call(mean, "mean") or not is_call(mean.args[0], "pow"):
        return None
    square, h = mean.args[0], mean.args[0].args[0]
    if constant_operand(square)[0] != 2.0 or arg(mean, 1, "dim") not in (-1, [-1], (-1,)) \
            or arg(mean, 2, "keepdim", False) is not True:
        return None
    scaled = only_user(node)
    if not is_call(scaled, "mul") or node not in scaled.args:
        return None
    normalized = next((a for a in scaled.args if a is not node), node)
    # T5 normalizes the uncast input: the same value where the fp32 cast is a no-op
    if normalized is not h and not (isinstance(normalized, fx.Node) and
                                    is_noop_cast(h, normalized)):
        return None
    replaced = [square, mean, node.args[0], node, scaled]
    x = h
    cast_value = example_tensor(h) if is_call(h, "cast") else None
    if cast_value is not None and cast_value.dtype == torch.float32:
        x = h.args[0]
        if set(h.users) <= {square, scaled}:
            replaced.insert(0, h)
    result, round_before_weight = scaled, False
    cast = only_user(scaled)
    cast_value = example_tensor(cast) if is_call(cast, "cast") else None
    if cast_value is not None and example_tensor(x) is not None:
        if cast_value.dtype != example_tensor(x).dtype:
            return "RMSNorm formula casting to another dtype than its input's"
        result, round_before_weight = cast, True
        replaced.append(cast)
    weight, final, normalized = None, only_user(result), 0
    if is_call(final, "mul") and len(final.args) == 2 and result in final.args:
        other = final.args[1] if final.args[0] is result else final.args[0]
        value, unweighted = example_tensor(other), example_tensor(result)
        if value is not None and value.dim() == 1:
            # the product keeps the normalized input for the weight's gradient too
            normalized = nbytes(unweighted) if unweighted is not None and \
                value.requires_grad else 0
            weight, result = other, final
            replaced.append(final)
    value, out = example_tensor(x), example_tensor(result)
    if value is None or out is None or not isinstance(value.shape[-1], int):
        return "RMSNorm formula with symbolic sizes"
    n = value.shape[-1]
    if guard_capacity(n) * 4 > n:
        return "norm over fewer than 8 elements"
    return _rms_norm_site(replaced, result, (x, n, weight, eps, round_before_weight),
                          out.dtype, _norm_bytes(x, n, 0) + normalized)


def match_attention(node: fx.Node) -> Site | str | None:
    """``dropout(softmax(scores, dim)[.to(dtype)]) @ v``, matched from its dropout."""
    if not is_call(node, "dropout"):
        return None
    probs, p = node.args[0], arg(node, 1, "p", 0.5)
    training, inplace = arg(node, 2, "training", True), arg(node, 3, "inplace", False)
    cast, softmax = (probs, probs.args[0]) if is_call(probs, "cast") else (None, probs)
    if not is_call(softmax, "softmax"):
        return None
    matmul = only_user(node)
    if not is_call(matmul, "matmul") or matmul.args[0] is not node:
        return "dropout of softmax not consumed by one matmul"
    if symbolic_float(p):
        return "attention dropout rate that changes between calls (a symbolic float)"
    if not isinstance(p, float) or training is not True or inplace:
        return "attention dropout not in training mode, or in place"
    dim, scores, v = arg(softmax, 1, "dim"), softmax.args[0], matmul.args[1]
    values = [example_tensor(n) for n in (softmax, probs, matmul, v)]
    if not isinstance(dim, int) or any(t is None for t in values):
        return "attention softmax without a dim"
    s, probs_value, out, v_value = values
    if s.dim() < 2 or v_value.dim() != s.dim() or s.shape[:-2] != v_value.shape[:-2]:
        return "attention matmul that broadcasts"
    if any(len(n.users) != 1 for n in (softmax, probs)):
        return "attention probabilities used elsewhere"
    removed = nbytes(probs_value) + (numel(s) - packed_size(numel(s)) if p > 0 else 0)
    replaced = [softmax, *([cast] if cast is not None else []), node, matmul]
    return Site("attention", replaced, matmul, node,
                fxopt_ops.tempo_softmax_dropout_matmul.default,
                (scores, v, dim, p, s.dtype, probs_value.dtype, out.dtype), removed, False)


MATCHERS: tuple[Callable[[fx.Node], Site | str | None], ...] = (
    match_gelu, match_gelu_tanh_formula, match_layer_norm, match_layer_norm_formula,
    match_rms_norm, match_rms_norm_formula, match_attention)
