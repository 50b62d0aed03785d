"""Logits that fuse_linear_cross_entropy leaves for the graph's output get their gradient
from the caller alone: none is made when the caller back-propagates the loss only.

Why: a transformers language model called with labels returns its loss and its logits
together. With the loss fused, the Linear stays to make that output. AOTAutograd gives every
differentiable output a gradient input (a tangent), and autograd fills the tangent of an
output that no loss reads with zeros. So the backward allocated a (tokens x vocabulary) zero
tensor and ran the head's two GEMMs on it. On a transformers Llama (vocabulary 32000,
4 x 128 tokens, fp32) that was 62.5 MiB at the backward's peak. On GPT-2 (4 x 512 tokens)
the fused loss's step was 1.24x plain Inductor's and is 0.77x now, and its peak with the
output held was 0.72 of Inductor's and is 0.41 (benchmarks/results/drop_logits_cpu.md).

How:

- :func:`split_returned_logits` runs after the pre-autograd passes and before AOTAutograd
  (:func:`fxopt.pipeline.capture_step`). It changes the graph's outputs, which no pass may
  do (README rule 4), so the compiled callable is wrapped to match.
- In the graph, the Linear (or matmul) is computed from detached operands. Its output then
  needs no gradient input, and its input ``h`` becomes one more output of the graph (unless
  ``h`` is an input of it).
- :class:`WithReturnedLogits` gives the caller the logits attached to ``h``, ``W`` and ``b``
  by :class:`LogitsGrad`, an autograd function that does not fill a missing gradient. A
  gradient the caller sends flows on: ``g @ W`` to ``h`` (through the compiled backward),
  ``g^T h`` to ``W``, its sum to ``b``. With none, nothing runs.

What it costs:

- ``h`` (tokens x hidden) lives as long as the logits do.
- A caller whose own loss reads the logits besides the fused one (a distillation term with
  labels given) runs the head's two backward GEMMs outside the graph, as the graph ran them.

Where: a product the pass marked with :data:`RETURNED` (:func:`returned_only`). Its one user
is the graph's output, it needs a gradient, and its weight and bias are inputs or attributes
of the graph.
"""

from __future__ import annotations

import builtins
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from fxopt import _compat
from fxopt.passes.torch_calls import arg, example_tensor, is_call

__all__ = ["RETURNED", "LogitsGrad", "ReturnedLogits", "WithReturnedLogits", "returned_only",
           "split_returned_logits", "weight_of"]

# node meta key: fuse_linear_cross_entropy's product that stays only for the graph's output
RETURNED = "fxopt_returned_logits"
_TRANSPOSES = ("t", "transpose", "permute")


def weight_of(right: Any) -> tuple[Any, bool]:
    """(W, whether W must be transposed to be vocabulary x hidden) for a matmul's right
    operand: ``W.T``, ``W.t()`` or a transpose of a 2-d W gives (W, False); anything else
    is itself hidden x vocabulary, (right, True)."""
    if isinstance(right, fx.Node) and right.op == "call_function" and \
            right.target is builtins.getattr and right.args[1] in ("T", "mT"):
        return right.args[0], False
    if is_call(right, *_TRANSPOSES) and example_tensor(right) is not None and \
            example_tensor(right).dim() == 2:
        dims = _flat(right.args[1:])
        if is_call(right, "t") or (all(type(d) is int for d in dims) and len(dims) == 2
                                   and {d % 2 for d in dims} == {0, 1}):
            return right.args[0], False
    return right, True


def _flat(items: Any) -> list[Any]:
    out = []
    for item in items:
        out.extend(_flat(item) if isinstance(item, (tuple, list)) else [item])
    return out


@dataclass(frozen=True)
class _Operands:
    h: fx.Node
    weight: fx.Node            # the graph's input or attribute
    vocab_major: bool          # weight is (vocabulary, hidden), as a Linear's
    bias: fx.Node | None
    detach: tuple[fx.Node, ...]  # the product's operands to detach


def _operands(product: fx.Node) -> _Operands | None:
    """The product's h, weight and bias where the weight and bias are sources (placeholders
    or attributes) that a wrapper outside the graph can reach, else None."""
    if is_call(product, "linear"):
        h, weight, bias = product.args[0], arg(product, 1, "weight"), arg(product, 2, "bias")
        operands = _Operands(h, weight, True, bias, (h, weight) + ((bias,) if bias else ()))
    elif is_call(product, "matmul", "mm") and len(product.args) == 2:
        h, right = product.args
        weight, transposed = weight_of(right)
        operands = _Operands(h, weight, not transposed, None, (h, right))
    else:
        return None
    if not isinstance(operands.h, fx.Node) or not _is_source(operands.weight) or (
            operands.bias is not None and not _is_source(operands.bias)):
        return None
    return operands


def _is_source(node: Any) -> bool:
    return isinstance(node, fx.Node) and node.op in ("placeholder", "get_attr")


def returned_only(product: fx.Node) -> bool:
    """Whether :func:`split_returned_logits` can take ``product`` out of the graph's autograd
    (module doc): its one user is the graph's output, which holds it as one of its values,
    it needs a gradient, and its operands are reachable (:func:`_operands`)."""
    users = list(product.users)
    value = example_tensor(product)
    if len(users) != 1 or users[0].op != "output" or value is None or not value.requires_grad:
        return False
    outputs = users[0].args[0]
    return isinstance(outputs, (tuple, list)) and product in outputs and \
        _operands(product) is not None


@dataclass(frozen=True)
class ReturnedLogits:
    """Where the wrapper finds one product's logits and operands: ``output`` its position
    among the graph's outputs; ``h`` ("input" or "output", position); ``weight`` and
    ``bias`` an input's position, or the attribute's tensor."""
    output: int
    h: tuple[str, int]
    weight: int | torch.Tensor
    bias: int | torch.Tensor | None
    vocab_major: bool


def split_returned_logits(gm: fx.GraphModule) -> tuple[fx.GraphModule, list[ReturnedLogits]]:
    """``gm`` with each product marked :data:`RETURNED` computed from detached operands and
    its ``h`` appended to the outputs (a copy; ``gm`` itself is unchanged), and where the
    wrapper finds them; ``gm`` and [] where none is marked."""
    output = next(iter(gm.graph.find_nodes(op="output")))
    values = output.args[0]
    if not isinstance(values, (tuple, list)) or not any(
            isinstance(v, fx.Node) and v.meta.get(RETURNED) for v in values):
        return gm, []
    gm = _compat.copy_graph_module(gm)
    output = next(iter(gm.graph.find_nodes(op="output")))
    values = list(output.args[0])
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    sites, extra = [], []
    for position, product in enumerate(values):
        if not isinstance(product, fx.Node) or not product.meta.get(RETURNED) or \
                values.index(product) != position:
            continue
        operands = _operands(product)
        if operands is None:
            continue
        with gm.graph.inserting_before(product):
            for operand in operands.detach:
                product.replace_input_with(
                    operand, gm.graph.call_method("detach", (operand,)))
        if operands.h.op == "placeholder":
            h = ("input", placeholders.index(operands.h))
        else:
            h = ("output", len(values) + len(extra))
            extra.append(operands.h)
        sites.append(ReturnedLogits(position, h, _source(gm, placeholders, operands.weight),
                                    _source(gm, placeholders, operands.bias),
                                    operands.vocab_major))
    output.args = (type(output.args[0])(values + extra),)
    gm.graph.lint()
    gm.recompile()
    return gm, sites


def _source(gm: fx.GraphModule, placeholders: list[fx.Node], node: fx.Node | None
            ) -> int | torch.Tensor | None:
    """An input's position, an attribute's tensor, or None for no node."""
    if node is None:
        return None
    if node.op == "placeholder":
        return placeholders.index(node)
    return operator.attrgetter(node.target)(gm)


class LogitsGrad(torch.autograd.Function):
    """``logits`` (computed without autograd from ``h``, ``weight``, ``bias``) attached to
    them: the backward of ``h @ W.T + b`` (``W`` vocabulary x hidden where ``vocab_major``,
    else hidden x vocabulary), run only for a gradient the caller sends. Each product runs in
    the gradient's dtype and is cast to its operand's, as autocast's Linear and its casts'
    backward run in eager."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, h: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None, vocab_major: bool) -> torch.Tensor:
        ctx.set_materialize_grads(False)
        ctx.vocab_major = vocab_major
        ctx.bias_layout = None if bias is None else (bias.shape, bias.dtype)
        ctx.save_for_backward(h, weight)
        return logits.view_as(logits)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        if grad is None:
            return None, None, None, None, None
        h, weight = ctx.saved_tensors
        vocab_by_hidden = (weight if ctx.vocab_major else weight.t()).to(grad.dtype)
        grad_h = grad_weight = grad_bias = None
        if ctx.needs_input_grad[1]:
            grad_h = (grad @ vocab_by_hidden).to(h.dtype)
        rows = grad.reshape(-1, grad.shape[-1])
        if ctx.needs_input_grad[2]:
            product = rows.t() @ h.reshape(-1, h.shape[-1]).to(grad.dtype)
            grad_weight = (product if ctx.vocab_major else product.t()).to(weight.dtype)
        if ctx.bias_layout is not None and ctx.needs_input_grad[3]:
            shape, dtype = ctx.bias_layout
            grad_bias = rows.sum(0).to(dtype).reshape(shape)
        return None, grad_h, grad_weight, grad_bias, None


class WithReturnedLogits:
    """The compiled graph of :func:`split_returned_logits`, called as Dynamo calls what a
    backend returns: its outputs without the appended ``h``, each product's logits attached
    by :class:`LogitsGrad`."""

    def __init__(self, compiled: Any, sites: list[ReturnedLogits], outputs: int) -> None:
        self.compiled = compiled
        self.sites = sites
        self.outputs = outputs

    def __call__(self, *args: Any) -> Any:
        values = self.compiled(*args)
        kept = list(values[:self.outputs])

        def find(where: int | torch.Tensor | None) -> torch.Tensor | None:
            return args[where] if isinstance(where, int) else where

        for site in self.sites:
            kind, position = site.h
            h = args[position] if kind == "input" else values[position]
            kept[site.output] = LogitsGrad.apply(kept[site.output], h, find(site.weight),
                                                 find(site.bias), site.vocab_major)
        return tuple(kept) if isinstance(values, tuple) else kept
