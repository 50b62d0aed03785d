"""fuse_linear_cross_entropy: an LM head and its loss that never store the logits, before
autograd.

In Dynamo's torch-level graph it finds ``F.cross_entropy(logits, labels)`` whose logits are
a Linear's or a matmul's output, reached through what transformers' ``ForCausalLMLoss`` and
hand-written losses put between them (the upcast ``.float()`` / ``.to(torch.float32)``,
``view``/``reshape``/``flatten`` to (tokens, vocabulary), ``contiguous``, the old shift's
``logits[..., :-1, :]``): ``F.linear(h, W, b)``, ``h @ W.T`` / ``h @ W.t()`` /
``torch.matmul(h, W.transpose(0, 1))``, then optionally a bias added (one value per
vocabulary entry: BART's ``final_logits_bias``) and numbers multiplied or divided by (Cohere's
``logit_scale``, Granite's ``logits_scaling``), folded into the op's h and bias:
``(h @ W.T + b) * s == (h * s) @ W.T + b * s``; and one ``tanh`` between such numbers
(Gemma 2's final-logit soft-capping, ``cap * tanh(logits / cap)``), which the op applies to
each block of logits (its ``softcap``: the number after the tanh; the numbers before it times
that one are folded as above). It replaces the loss by a custom op (one of
the two forms below), given h with the same token slicing and flattened to (tokens, hidden),
so the graph never makes the logits (unless something else uses them: the Linear then stays
for that user) nor keeps their log-probabilities for backward. Covered: ``ignore_index``,
``label_smoothing``, ``mean`` and ``sum`` reductions, a bias, tied embeddings (W a parameter
used elsewhere too: autograd adds the gradients), autocast (the op computes the logits in
the Linear's dtype and the loss in fp32, as eager does).

Two forms of the op (``fxopt.kernels``): where the loss needs gradients and the ones it
needs (of h, W, b, from the example values' ``requires_grad``) are at most
:data:`GRADS_IN_FORWARD_SHARE` of the logits' fp32 bytes (many tokens against the hidden
size: a real batch), and the cost model (:func:`predicted_ms`, on the device's hardware
profile) predicts it faster, ``linear_cross_entropy_with_grads`` computes them in the
forward and keeps them: three vocabulary-wide matmuls, as plain autograd runs. Elsewhere
(few tokens, no gradient wanted, or slower: each of its chunks adds to W's fp32 gradient)
``linear_cross_entropy`` keeps one float per token and recomputes the logits in the
backward: four matmuls, or one without a backward.

Declined, with the reason in its verdicts: class weights, ``reduction='none'`` and
the deprecated ``size_average``/``reduce``, arguments that are not constants (and a
logit scale Dynamo made a symbolic float because it changed between calls), probability
targets, logits that are not (tokens, vocabulary) at the loss (class dim 1), logits that
come from something other than a Linear or matmul (or reach the loss through another op;
a second tanh, or a bias added after it; or a bias added to a Linear's own),
a cast to another dtype than fp32 on the way, and fp64 (the op's reductions run in fp32).

Verdicts: matched per product and form (``linear`` / ``matmul``, then :data:`FORMS`'s
words; "(its logits still made for another user)" where the Linear stays for another node,
"(its logits still made for the graph's output; ...)" where it stays only for the graph's
output, whose gradient then comes from the caller alone:
:mod:`fxopt.passes.fuse_linear_cross_entropy_returned`), with the
plain saved bytes each removes (the log-probabilities, a lower bound of what eager keeps;
also ``stats[REMOVED_SAVED_BYTES]``); declined per loss, with the reason. Default: on under
``memory_budget`` (or a replayed ``plan``), and under its own flag. The ops' pieces are
sized after the partition, by :mod:`fxopt.passes.fuse_linear_cross_entropy_chunks`.
"""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

import torch
import torch.fx as fx

from fxopt import _compat
from fxopt.kernels import fuse_linear_cross_entropy as _ops  # registers the ops
from fxopt.kernels import fuse_linear_cross_entropy_with_grads as _with_grads
from fxopt.passes.base import REMOVED_SAVED_BYTES, PassContext, PassResult, Verdicts
from fxopt.passes.fuse_linear_cross_entropy_returned import (
    RETURNED,
    returned_node,
    scaled_logits,
    weight_of,
)
from fxopt.passes.torch_calls import (
    arg,
    example_tensor,
    is_call,
    scalar_operand,
    symbolic_float,
)
from fxopt.planner import forms
from fxopt.planner.hardware import CPU_DEFAULT, HardwareProfile, profile_for

__all__ = ["fuse_linear_cross_entropy", "fuse_linear_cross_entropies", "fused_accumulate",
           "grads_in_forward", "predicted_ms"]

PASS = "fuse_linear_cross_entropy"
# The with-grads form is taken where the gradients it keeps are at most this share of the
# logits' fp32 bytes (the issue's bar for what the loss may keep, plain's being the logits)
GRADS_IN_FORWARD_SHARE = 1 / 8
_RESHAPES = ("view", "reshape", "flatten", "contiguous")


FORMS = {False: "logits recomputed in the backward", True: "gradients in the forward"}
# the verdict's words for a Linear that stays (_rewrite)
_STAYS = {"used": " (its logits still made for another user)",
          "returned": " (its logits still made for the graph's output; their gradient only "
                      "for a caller that uses them)"}


class _Decline(Exception):
    pass


class _Site(NamedTuple):
    ce: fx.Node
    product: fx.Node           # the Linear or matmul whose output the logits are
    chain: list[fx.Node]       # the nodes from the product's consumer to the loss's input
    h: fx.Node
    weight: fx.Node
    transpose_weight: bool     # the matmul's right operand is W.T, not a view of W: use .t()
    bias: fx.Node | None
    token_indices: list[Any]   # the logits' basic indexing on token dims, in order
    arguments: tuple[Any, ...]  # labels, ignore_index, label_smoothing, reduction
    compute_dtype: torch.dtype
    out_dtype: torch.dtype
    removed_bytes: int
    wanted_grads: tuple[bool, bool, bool]  # of h, W, b: whose example values need one
    grads_in_forward: bool     # the with-grads form (module doc), else logits recomputed
    scale: float               # a number the logits are multiplied by: folded into h
    bias_scale: float          # the part of it applied after the bias: folded into b
    softcap: float             # cap of ``cap * tanh(logits / cap)``; 0: none


def _constant_arguments(ce: fx.Node) -> tuple[fx.Node, int, float, str]:
    weight = arg(ce, 2, "weight")
    if weight is not None:
        raise _Decline("class weights")
    if arg(ce, 3, "size_average") is not None or arg(ce, 5, "reduce") is not None:
        raise _Decline("deprecated size_average/reduce arguments")
    ignore_index, reduction = arg(ce, 4, "ignore_index", -100), arg(ce, 6, "reduction", "mean")
    smoothing = arg(ce, 7, "label_smoothing", 0.0)
    if type(ignore_index) is not int or not isinstance(reduction, str) or \
            not isinstance(smoothing, (int, float)) or isinstance(smoothing, bool):
        raise _Decline("an argument that is not a constant")
    if reduction not in _ops.REDUCTIONS:
        raise _Decline(f"reduction={reduction!r}")
    return arg(ce, 1, "target"), ignore_index, float(smoothing), reduction


def _token_index(node: fx.Node, vocab: Any) -> Any:
    """The index of ``logits[index]`` when it slices token dims only (basic indexing that
    leaves the last dim whole), else None."""
    if node.op != "call_function" or node.target is not operator.getitem:
        return None
    index = node.args[1]
    items = index if isinstance(index, tuple) else (index,)
    if not all(i is None or i is Ellipsis or type(i) is int or (
            isinstance(i, slice) and all(v is None or type(v) is int
                                         for v in (i.start, i.stop, i.step))) for i in items):
        return None
    source, out = example_tensor(node.args[0]), example_tensor(node)
    if source is None or out is None or out.shape[-1] != vocab:
        return None
    consuming = [i for i in items if i is not None]
    last = consuming[-1] if consuming else Ellipsis
    touches_last = Ellipsis not in consuming and len(consuming) == source.dim()
    if Ellipsis in consuming and last is not Ellipsis:
        touches_last = True
    if touches_last and last != slice(None, None, None):
        return None
    return index


def _match(ce: fx.Node, hardware: HardwareProfile, fused_accumulate: bool) -> _Site:
    labels, ignore_index, smoothing, reduction = _constant_arguments(ce)
    logits, out = ce.args[0], example_tensor(ce)
    value = example_tensor(logits)
    if value is None or out is None or value.dim() != 2:
        raise _Decline("logits that are not (tokens, vocabulary) at the loss")
    targets = example_tensor(labels)
    if targets is None or targets.dtype != torch.int64 or targets.dim() != 1:
        raise _Decline("targets that are not int64 class indices of one dim")
    vocab = value.shape[-1]
    chain, indices, node, added, scale, bias_scale = [], [], logits, None, 1.0, None
    softcap = 0.0
    while True:
        current = example_tensor(node)
        if is_call(node, "linear"):
            h, weight, bias = node.args[0], arg(node, 1, "weight"), arg(node, 2, "bias")
            transpose = False
            break
        if is_call(node, "matmul", "mm"):
            h, (weight, transpose), bias = node.args[0], weight_of(node.args[1]), None
            break
        if current is None or current.shape[-1] != vocab:
            raise _Decline(f"logits reach the loss through {_name(node)}")
        source = node.args[0] if node.args else None  # a placeholder has none
        if is_call(node, "add"):
            if added is not None:
                raise _Decline("logits reach the loss through two additions")
            source, added = _bias_add(node, vocab)
            bias_scale = scale  # the part of the scale applied after the bias
        elif (scaled := scaled_logits(node)) is not None:
            source, factor = scaled
            scale *= factor
        elif is_call(node, "mul", "truediv") and symbolic_float(scalar_operand(node)[0]):
            raise _Decline("logits scaled by a number that changes between calls (a "
                           "symbolic float; the op folds only constants)")
        elif is_call(node, "tanh") and len(node.args) == 1 and not node.kwargs:
            # P * tanh(A * z) == cap * tanh(z' / cap) with cap = P and z' = A * P * z: the
            # numbers after the tanh (so far) are the cap, all of them are folded into h
            if softcap:
                raise _Decline("logits reach the loss through two tanh")
            if added is not None:
                raise _Decline("a bias added to the logits after their tanh")
            softcap = scale
        elif is_call(node, "float_cast", "cast"):
            source_value = example_tensor(source)
            if current.dtype != torch.float32:
                raise _Decline(f"the logits are cast to {current.dtype} before the loss")
            if source_value is None or source_value.device != current.device:
                raise _Decline("the logits move to another device before the loss")
        elif is_call(node, *_RESHAPES):
            source_value = example_tensor(source)
            if source_value is None or source_value.shape[-1] != vocab:
                raise _Decline("a view of the logits that mixes their last dim")
        elif (index := _token_index(node, vocab)) is not None:
            indices.insert(0, index)
        else:
            raise _Decline(f"logits come from {_name(node)}, not a Linear or matmul")
        chain.append(node)
        node = source
    if added is not None and bias is not None:
        raise _Decline("a bias added to the logits of a Linear with its own bias")
    if added is not None:
        bias = added
    else:
        bias_scale = scale
    product = example_tensor(node)
    h_value, w_value = example_tensor(h), example_tensor(weight)
    if product is None or h_value is None or w_value is None or w_value.dim() != 2 or \
            h_value.dim() < 2:
        raise _Decline("a product whose operands are not (..., hidden) and a 2-d weight")
    rows, columns = reversed(w_value.shape) if transpose else w_value.shape
    b_value = example_tensor(bias) if bias is not None else None
    if rows != vocab or columns != h_value.shape[-1] or (bias is not None and (
            b_value is None or b_value.numel() != vocab or b_value.shape[-1] != vocab)):
        raise _Decline("a weight or bias whose shape is not the vocabulary's")
    if torch.float64 in (product.dtype, out.dtype):
        raise _Decline("fp64 (the op's reductions run in fp32)")
    tokens, hidden = (_compat.size_hint(d, 1) for d in (value.shape[0], columns))
    removed = tokens * vocab * value.element_size()
    wanted = (out.requires_grad and h_value.requires_grad, out.requires_grad and
              w_value.requires_grad, out.requires_grad and b_value is not None and
              b_value.requires_grad)
    in_forward = grads_in_forward(tokens, hidden, vocab, wanted, product.dtype, hardware,
                                  fused_accumulate)
    return _Site(ce, node, chain, h, weight, transpose, bias, indices,
                 (labels, ignore_index, smoothing, reduction), product.dtype, out.dtype,
                 removed, wanted, in_forward, scale, bias_scale, softcap)


def _bias_add(node: fx.Node, vocab: Any) -> tuple[fx.Node, fx.Node]:
    """(the logits, the bias) of ``logits + bias``, a bias being one value per vocabulary
    entry (shape (vocab,), or (1, ..., vocab) as BART's ``final_logits_bias``)."""
    if len(node.args) != 2 or node.kwargs or not all(isinstance(a, fx.Node)
                                                      for a in node.args):
        raise _Decline("logits reach the loss through an add that is not a bias")
    shape = tuple(example_tensor(node).shape)
    for logits, bias in (node.args, reversed(node.args)):
        values = example_tensor(logits), example_tensor(bias)
        if None in values:
            continue
        logits_value, bias_value = values
        if tuple(logits_value.shape) == shape and bias_value.shape[-1] == vocab and \
                bias_value.numel() == vocab:
            return logits, bias
    raise _Decline("logits reach the loss through an add that is not a bias")


def _name(node: Any) -> str:
    if not isinstance(node, fx.Node):
        return repr(node)
    target = node.target if isinstance(node.target, str) else getattr(
        node.target, "__name__", str(node.target))
    return f"{node.op} {target}"


def _rewrite(graph: fx.Graph, site: _Site) -> str | None:
    """Put the op in place of the loss; erase what no one else uses. Returns None where the
    product goes, "returned" where it stays only for the graph's output, itself or through a
    tail (the returned logits marked for
    :mod:`fxopt.passes.fuse_linear_cross_entropy_returned`), "used" where something else in
    the graph uses its logits."""
    labels, ignore_index, smoothing, reduction = site.arguments
    with graph.inserting_before(site.ce):
        h = site.h
        for index in site.token_indices:
            h = graph.call_function(operator.getitem, (h, index))
        rank = example_tensor(site.h).dim()
        for index in site.token_indices:
            items = index if isinstance(index, tuple) else (index,)
            rank += sum(i is None for i in items) - sum(type(i) is int for i in items)
        if rank > 2:
            h = graph.call_method("flatten", (h, 0, -2))
        if site.scale != 1.0:  # (h @ W.T + b) * s == (h * s) @ W.T + b * s
            h = graph.call_function(operator.mul, (h, site.scale))
        bias = site.bias
        if bias is not None and example_tensor(bias).dim() != 1:  # (1, ..., vocab)
            bias = graph.call_method("reshape", (bias, -1))
        if bias is not None and site.bias_scale != 1.0:
            bias = graph.call_function(operator.mul, (bias, site.bias_scale))
        weight = graph.call_function(torch.t, (site.weight,)) if site.transpose_weight \
            else site.weight
        arguments = (h, weight, bias, labels, ignore_index, smoothing, reduction,
                     site.compute_dtype, site.out_dtype, 0)
        softcap = (site.softcap,) if site.softcap else ()  # the ops' default: none
        op = graph.call_function(
            torch.ops.fxopt.linear_cross_entropy_with_grads.default,
            (*arguments, *site.wanted_grads, *softcap)) if site.grads_in_forward else \
            graph.call_function(torch.ops.fxopt.linear_cross_entropy.default,
                                (*arguments, *softcap))
        loss = graph.call_function(operator.getitem, (op, 0))
    replaced = [site.ce, *site.chain, site.product]
    op.meta["fxopt"] = {"pass": PASS, "replaces": [n.name for n in replaced]}
    loss.meta["fxopt"] = {"pass": PASS, "replaces": [site.ce.name]}
    loss.meta["example_value"] = site.ce.meta.get("example_value")
    site.ce.replace_all_uses_with(loss)
    for node in replaced:
        if not node.users:
            graph.erase_node(node)
    if site.product.graph is not graph or not site.product.users:
        return None
    if (returned := returned_node(site.product)) is not None:
        returned.meta[RETURNED] = True
        return "returned"
    return "used"


def grads_in_forward(tokens: int, hidden: int, vocab: int, wanted: tuple[bool, bool, bool],
                     dtype: torch.dtype, hardware: HardwareProfile,
                     fused_accumulate: bool = True) -> bool:
    """Whether the with-grads form is taken (module doc): some gradient is wanted, those
    kept are at most :data:`GRADS_IN_FORWARD_SHARE` of the logits' fp32 bytes, and the cost
    model predicts it faster than the recompute form on ``hardware`` (where the rule's first
    two parts hold it nearly always does; not always: an A100 at 2048 tokens and Llama 3's
    vocabulary in bf16, its GEMMs unable to add to an fp32 accumulator)."""
    if not any(wanted) or _with_grads.kept_bytes(tokens, hidden, vocab, *wanted) > \
            4 * tokens * vocab * GRADS_IN_FORWARD_SHARE:
        return False
    return predicted_ms("with_grads", tokens, hidden, vocab, wanted, dtype, hardware,
                        fused_accumulate) < \
        predicted_ms("recompute", tokens, hidden, vocab, wanted, dtype, hardware,
                     fused_accumulate)


def predicted_ms(form: str, tokens: int, hidden: int, vocab: int,
                 wanted: tuple[bool, bool, bool], dtype: torch.dtype,
                 hardware: HardwareProfile, fused_accumulate: bool = True, *,
                 pieces: int | None = None, backward_pieces: int | None = None) -> float:
    """The op's forward and backward in ``form`` ("recompute" or "with_grads") on
    ``hardware``, cut into ``pieces`` (the recompute form's backward op into
    ``backward_pieces``; by default as the op cuts them there, the Triton path on CUDA),
    priced by :func:`fxopt.planner.forms.linear_cross_entropy_work`."""
    itemsize = dtype.itemsize
    if pieces is None:
        temporaries = _ops.temporary_bytes(itemsize, triton=hardware.device_type == "cuda")
        pieces = -(-vocab // _ops.block_columns(tokens, vocab, logit_bytes=temporaries)) \
            if form == "recompute" else \
            -(-tokens // _with_grads.chunk_rows(tokens, vocab, logit_bytes=temporaries))
    work = forms.linear_cross_entropy_work(form, tokens, hidden, vocab, pieces, itemsize,
                                           grad_h=wanted[0], grad_weight=wanted[1],
                                           fused_accumulate=fused_accumulate,
                                           backward_pieces=backward_pieces)
    return forms.predict(work, hardware).ms


def fuse_linear_cross_entropies(gm: fx.GraphModule, allow=lambda: True,
                                hardware: HardwareProfile = CPU_DEFAULT,
                                fused_accumulate: bool = True) -> tuple[Verdicts, int]:
    """Rewrite every matching loss of ``gm`` (those ``allow`` accepts) in place, choosing
    each site's form for ``hardware`` (``fused_accumulate``: whether its half GEMMs add to an
    fp32 accumulator): the verdicts (per product kind and form the sites and the plain saved
    bytes removed; per loss left, the reason) and how many rewritten sites still make their
    logits for another user. The pass (which ``fxopt plan``'s capture runs too) calls it
    with the graph's device."""
    verdicts, kept = Verdicts(), 0
    for ce in [n for n in gm.graph.nodes if is_call(n, "cross_entropy")]:
        try:
            site = _match(ce, hardware, fused_accumulate)
        except _Decline as why:
            verdicts.decline(ce.name, str(why))
            continue
        if not allow():
            continue
        kind = "linear" if is_call(site.product, "linear") else "matmul"
        form = FORMS[site.grads_in_forward]
        stays = _rewrite(gm.graph, site)
        kept += stays is not None
        verdicts.match(f"{kind}, {form}" + _STAYS.get(stays, ""), bytes=site.removed_bytes)
    return verdicts, kept


def fused_accumulate(device: torch.device) -> bool:
    """Whether the ops' half GEMMs add to an fp32 accumulator on ``device`` (elsewhere than
    CUDA their operands are upcast, so the fp32 GEMM adds to it)."""
    return device.type != "cuda" or _ops.fused_fp32_accumulate(device)


def fuse_linear_cross_entropy(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    verdicts, _ = fuse_linear_cross_entropies(gm, ctx.rewrites.allow, profile_for(ctx.device),
                                              fused_accumulate(ctx.device))
    removed = sum(m.bytes for m in verdicts.matched.values())
    return PassResult(gm, bool(verdicts.matched), verdicts, {REMOVED_SAVED_BYTES: removed})
