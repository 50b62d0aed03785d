"""noop_dropout: drop the dropout calls that return their input, before autograd.

``F.dropout(x, p=0.0)`` (transformers' ViT, BERT-likes with ``*_dropout_prob=0``, any
dropout with ``training=False``) returns ``x`` itself in eager: ``at::dropout`` returns
its input when ``p == 0`` or not training, on every device. AOTAutograd's decomposition
of ``aten.dropout`` returns ``input.clone()`` there instead, and where a matmul reads
that clone (``dropout(softmax) @ v`` in attention) the compiled forward saves it beside the
softmax output that softmax's backward saves: plain saved bytes above eager's (ViT: 3-7.5%),
which is also the base a fraction ``memory_budget`` is taken of. Replacing each such call by
its input is what eager computes (same tensor, same aliasing, an in-place dropout included),
so outputs and gradients are unchanged and autograd saves what eager saves.

It fires only on a call whose ``p`` is the constant ``0`` or whose ``training`` is the
constant ``False``; a symbolic or tensor argument, or ``p`` other than 0 while training,
leaves the call alone. It runs under the ``swap_recompute`` flag (on with a budget), first
in the pipeline, so tempo's attention matcher sees the graph eager would run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx

from fxopt.passes.base import PassContext, PassResult, Verdicts
from fxopt.passes.torch_calls import arg, is_call

__all__ = ["drop_noop_dropouts", "noop_dropout", "returns_input"]


def returns_input(node: fx.Node) -> bool:
    """Whether a dropout call returns its input as it is (``p`` 0 or not training)."""
    training_name = "train" if node.target is torch.dropout else "training"
    p, training = arg(node, 1, "p", 0.5), arg(node, 2, training_name, True)
    constant_p = isinstance(p, (int, float)) and not isinstance(p, bool)
    return (constant_p and p == 0) or training is False


def drop_noop_dropouts(gm: fx.GraphModule, allow: Callable[[], bool] = lambda: True) -> int:
    """Replace each dropout call that returns its input by that input (those ``allow``
    accepts); the number replaced. ``fxopt plan``'s capture calls it too, so the joint
    graphs it plans are those compilation under a budget builds."""
    removed = 0
    for node in list(gm.graph.nodes):
        if not is_call(node, "dropout") or not isinstance(node.args[0], fx.Node):
            continue
        if not returns_input(node) or not allow():
            continue
        node.replace_all_uses_with(node.args[0])
        gm.graph.erase_node(node)
        removed += 1
    return removed


def noop_dropout(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    removed = drop_noop_dropouts(gm, ctx.rewrites.allow)
    verdicts = Verdicts()
    if removed:
        verdicts.match("noop_dropout", count=removed)
    return PassResult(gm, removed > 0, verdicts)
