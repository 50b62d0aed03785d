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
- In the graph, the Linear (or matmul) is computed from detached operands, and so is what
  models apply to its output before returning it (its tail: Cohere's and Granite's logit
  scale, BART's added bias, Gemma 2's soft-cap ``cap * tanh(z / cap)``). The returned
  logits then need no gradient input, and the Linear's input ``h`` becomes one more output
  of the graph (unless ``h`` is an input of it).
- :class:`WithReturnedLogits` gives the caller the logits attached to ``h``, ``W``, ``b``
  and the tail's bias by :class:`LogitsGrad`, an autograd function that does not fill a
  missing gradient. A gradient the caller sends flows on: through the tail (its numbers, a
  tanh's slope from the returned logits), then ``g @ W`` to ``h`` (through the compiled
  backward), ``g^T h`` to ``W``, its sum to ``b``. With none, nothing runs.

What it costs:

- ``h`` (tokens x hidden) lives as long as the logits do.
- A caller whose own loss reads the logits besides the fused one (a distillation term with
  labels given) runs the head's two backward GEMMs outside the graph, as the graph ran them.

Where: returned logits the pass marked with :data:`RETURNED` (:func:`returned_node`): the
product or the end of its tail is one of the graph's outputs and nothing else reads them,
they need a gradient, and the weight and the biases are inputs or attributes of the graph.
"""

from __future__ import annotations

import builtins
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from fxopt import _compat
from fxopt.passes.torch_calls import arg, constant_operand, example_tensor, is_call

__all__ = ["RETURNED", "LogitsGrad", "ReturnedLogits", "WithReturnedLogits", "returned_node",
           "scaled_logits", "split_returned_logits", "tail_of", "weight_of"]

# node meta key: the logits fuse_linear_cross_entropy leaves only for the graph's output
# (its product, or the end of the product's tail)
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


def scaled_logits(node: fx.Node) -> tuple[fx.Node, float] | None:
    """(the logits, the factor) of ``logits * c``, ``c * logits`` or ``logits / c`` for a
    number ``c`` (Cohere's ``logit_scale``, Granite's ``logits_scaling``); else None."""
    if len(node.args) != 2 or node.kwargs:
        return None
    number, logits = constant_operand(node)
    if number is None or not isinstance(logits, fx.Node):
        return None
    if is_call(node, "mul"):
        return logits, number
    if is_call(node, "truediv") and logits is node.args[0] and number != 0:
        return logits, 1.0 / number
    return None


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


def _tail_step(node: fx.Node, source: fx.Node, vocab: Any) -> tuple[Any, ...] | None:
    """What ``node`` does to the logits ``source`` where it is a step a returned tail may take
    (module doc): ("mul", c) for ``source * c``, ``c * source`` or ``source / c`` with a
    constant ``c``; ("bias", b, node, operand) for ``source + operand``, the operand ``b``
    (or ``b.to(...)``), a graph input or attribute of one value per vocabulary entry;
    ("tanh",); else None."""
    if is_call(node, "tanh") and node.args == (source,) and not node.kwargs:
        return ("tanh",)
    if len(node.args) != 2 or node.kwargs or source not in node.args:
        return None
    if (scaled := scaled_logits(node)) is not None:
        logits, factor = scaled
        return ("mul", factor) if logits is source else None
    if constant_operand(node)[0] is not None:
        return None
    operand = node.args[1] if node.args[0] is source else node.args[0]
    # BART's bias moved to the logits' device first: final_logits_bias.to(logits.device)
    bias = _moved_source(operand) or operand
    value = example_tensor(bias)
    if is_call(node, "add") and _is_source(bias) and value is not None and \
            value.numel() == vocab and value.shape[-1] == vocab:
        return ("bias", bias, node, operand)
    return None


_MAX_TAIL = 8  # steps a returned tail may take (Gemma 2's soft-cap: 3)


def _moved_source(node: Any) -> fx.Node | None:
    """The graph input or attribute that ``node`` casts or moves (``b.to(device)``), else
    None."""
    return node.args[0] if is_call(node, "cast") and node.args and \
        _is_source(node.args[0]) else None


def _logits_operand(node: fx.Node) -> fx.Node | None:
    """The operand of a tail step that carries the logits: a computed value (the bias is a
    graph input or attribute, or one moved to the logits' device; a number is no node);
    None where both or neither are."""
    computed = [a for a in node.args if isinstance(a, fx.Node) and not _is_source(a)
                and _moved_source(a) is None]
    return computed[0] if len(computed) == 1 else None


def tail_of(returned: fx.Node) -> tuple[fx.Node, list[tuple[Any, ...]]] | None:
    """(the product, the steps from it to ``returned`` in order) where ``returned`` is a
    Linear's or matmul's output, or one reached from it by tail steps (:func:`_tail_step`):
    a tanh at most, only numbers after it, one bias at most; else None."""
    value = example_tensor(returned)
    if value is None or value.dim() < 1:
        return None
    steps, node = [], returned
    for _ in range(_MAX_TAIL + 1):
        if _operands(node) is not None:
            kinds = [step[0] for step in steps]
            if kinds.count("tanh") > 1 or kinds.count("bias") > 1 or ("tanh" in kinds and any(
                    k != "mul" for k in kinds[kinds.index("tanh") + 1:])):
                return None
            return node, steps
        source = _logits_operand(node)
        step = None if source is None else _tail_step(node, source, value.shape[-1])
        if step is None:
            return None
        steps.insert(0, step)
        node = source
    return None


def returned_node(product: fx.Node) -> fx.Node | None:
    """The node :func:`split_returned_logits` can take out of the graph's autograd with
    ``product`` (module doc), once the pass replaced the loss: ``product`` itself or the end
    of its tail (a logit scale, a bias, a soft-cap: :func:`tail_of`), one of the values of
    the graph's output, where nothing but the output and the tail reads them, the logits
    need a gradient and their operands are reachable (:func:`_operands`); else None."""
    value = example_tensor(product)
    if value is None or not value.requires_grad or _operands(product) is None:
        return None
    node = product
    for _ in range(_MAX_TAIL + 1):
        users = list(node.users)
        if any(u.op == "output" for u in users):
            break
        # a step between: read by nothing but the next step (its gradient would be lost)
        if len(users) != 1 or _tail_step(users[0], node, value.shape[-1]) is None:
            return None
        node = users[0]
    if len(users) != 1 or users[0].op != "output":
        return None
    values = users[0].args[0]
    if not isinstance(values, (tuple, list)) or node not in values:
        return None
    found = tail_of(node)
    return node if found is not None and found[0] is product else None


@dataclass(frozen=True)
class ReturnedLogits:
    """Where the wrapper finds one product's returned logits and operands: ``output`` their
    position among the graph's outputs; ``h`` ("input" or "output", position); ``weight``,
    ``bias`` and ``tail_bias`` an input's position, or the attribute's tensor."""
    output: int
    h: tuple[str, int]
    weight: int | torch.Tensor
    bias: int | torch.Tensor | None
    vocab_major: bool
    # the steps from the product to the returned logits ("mul", c), ("bias",), ("tanh",),
    # the tail's bias (as ``bias``), and the product's dtype (its gradient's)
    steps: tuple[tuple[Any, ...], ...] = ()
    tail_bias: int | torch.Tensor | None = None
    product_dtype: torch.dtype | None = None


def split_returned_logits(gm: fx.GraphModule) -> tuple[fx.GraphModule, list[ReturnedLogits]]:
    """``gm`` with each returned logits marked :data:`RETURNED` computed from detached
    operands (the product's, and its tail's bias) and the product's ``h`` appended to the
    outputs (a copy; ``gm`` itself is unchanged), and where the wrapper finds them; ``gm``
    and [] where none is marked."""
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
    for position, returned in enumerate(values):
        if not isinstance(returned, fx.Node) or not returned.meta.get(RETURNED) or \
                values.index(returned) != position or (found := tail_of(returned)) is None:
            continue
        product, steps = found
        operands = _operands(product)
        with gm.graph.inserting_before(product):
            for operand in operands.detach:
                product.replace_input_with(
                    operand, gm.graph.call_method("detach", (operand,)))
        tail_bias = None
        for step in steps:
            if step[0] == "bias":
                tail_bias, add, operand = step[1:]
                with gm.graph.inserting_before(add):
                    add.replace_input_with(operand, gm.graph.call_method("detach", (operand,)))
        if operands.h.op == "placeholder":
            h = ("input", placeholders.index(operands.h))
        else:
            h = ("output", len(values) + len(extra))
            extra.append(operands.h)
        sites.append(ReturnedLogits(
            position, h, _source(gm, placeholders, operands.weight),
            _source(gm, placeholders, operands.bias), operands.vocab_major,
            tuple(step[:1] if step[0] == "bias" else step for step in steps),
            _source(gm, placeholders, tail_bias), example_tensor(product).dtype))
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
    """``logits`` (computed without autograd from ``h``, ``weight``, ``bias``, then the
    tail's ``steps``: module doc) attached to them: the backward of ``h @ W.T + b`` (``W``
    vocabulary x hidden where ``vocab_major``, else hidden x vocabulary) and of the tail,
    run only for a gradient the caller sends. A tanh's slope comes from the returned logits
    themselves (``1 - t**2``, ``t`` the logits over the numbers after it); the gradient
    reaches the product in its dtype (``product_dtype``), as autograd casts it in eager.
    Each GEMM runs in that dtype and is cast to its operand's, as autocast's Linear and its
    casts' backward run in eager."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, h: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None, tail_bias: torch.Tensor | None, vocab_major: bool,
                steps: tuple[tuple[Any, ...], ...] = (),
                product_dtype: torch.dtype | None = None) -> torch.Tensor:
        ctx.set_materialize_grads(False)
        ctx.vocab_major, ctx.steps = vocab_major, steps
        ctx.product_dtype = product_dtype or logits.dtype
        ctx.layouts = [None if b is None else (b.shape, b.dtype) for b in (bias, tail_bias)]
        ctx.save_for_backward(h, weight, logits if ("tanh",) in steps else None)
        return logits.view_as(logits)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        if grad is None:
            return (None,) * 8
        h, weight, returned = ctx.saved_tensors
        grad_tail_bias, after = None, 1.0  # after: the numbers the steps after this multiply
        for step in reversed(ctx.steps):
            if step[0] == "mul":
                grad, after = grad * step[1], after * step[1]
            elif step[0] == "tanh":
                tanh = returned / after
                grad = grad * (1 - tanh * tanh)
            elif ctx.needs_input_grad[4]:
                grad_tail_bias = _reduced(grad, *ctx.layouts[1])
        grad = grad.to(ctx.product_dtype)
        vocab_by_hidden = (weight if ctx.vocab_major else weight.t()).to(grad.dtype)
        grad_h = grad_weight = grad_bias = None
        if ctx.needs_input_grad[1]:
            grad_h = (grad @ vocab_by_hidden).to(h.dtype)
        rows = grad.reshape(-1, grad.shape[-1])
        if ctx.needs_input_grad[2]:
            product = rows.t() @ h.reshape(-1, h.shape[-1]).to(grad.dtype)
            grad_weight = (product if ctx.vocab_major else product.t()).to(weight.dtype)
        if ctx.layouts[0] is not None and ctx.needs_input_grad[3]:
            grad_bias = _reduced(grad, *ctx.layouts[0])
        return None, grad_h, grad_weight, grad_bias, grad_tail_bias, None, None, None


def _reduced(grad: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """A bias's gradient: ``grad`` summed over every dim but the vocabulary's."""
    return grad.reshape(-1, grad.shape[-1]).sum(0).to(dtype).reshape(shape)


class WithReturnedLogits:
    """The compiled graph of :func:`split_returned_logits`, called as Dynamo calls what a
    backend returns: its outputs without the appended ``h`` (the last ones, one for each
    site whose ``h`` is an output), each product's logits attached by :class:`LogitsGrad`."""

    def __init__(self, compiled: Any, sites: list[ReturnedLogits]) -> None:
        self.compiled = compiled
        self.sites = sites
        self.appended = sum(site.h[0] == "output" for site in sites)

    def __call__(self, *args: Any) -> Any:
        values = self.compiled(*args)
        kept = list(values[:len(values) - self.appended])

        def find(where: int | torch.Tensor | None) -> torch.Tensor | None:
            return args[where] if isinstance(where, int) else where

        for site in self.sites:
            kind, position = site.h
            h = args[position] if kind == "input" else values[position]
            kept[site.output] = LogitsGrad.apply(kept[site.output], h, find(site.weight),
                                                 find(site.bias), find(site.tail_bias),
                                                 site.vocab_major, site.steps,
                                                 site.product_dtype)
        return tuple(kept) if isinstance(values, tuple) else kept
