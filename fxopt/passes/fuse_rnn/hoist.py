"""fuse_rnn's hoisting of input projections (EcoRNN): when the cells of an unrolled loop
project time steps of one known sequence ``X`` (``X[t]``, ``X[:, t]``) with the same weight
and bias, the projections of all steps become one GEMM ``linear(X, W, b)`` up front and each
step reads its slice: one large, efficient GEMM instead of one small GEMM per step.

Only the projections that feed fused cells are considered (the pass never touches other
linears), and only groups of two or more, in one autocast region, that use at least half
of the sequence's steps (projecting all of a long sequence for a few steps would cost more
than it saves).
"""

from __future__ import annotations

import operator
from typing import Any

import torch.fx as fx

from fxopt import _compat
from fxopt.passes.fuse_rnn.graph import Rewrite
from fxopt.passes.torch_calls import example_tensor

LINEAR = _compat.NN_LINEAR  # the spelling of F.linear this pass emits and hoists
_FULL = slice(None, None, None)


def leading_index(x: Any) -> tuple[fx.Node, Any] | None:
    """(X, index) when ``x`` is ``X[index]`` taking leading dimensions only (ints and full
    slices, at least one int, none on the last dimension): then ``linear(X, W)[index]`` is
    ``linear(x, W)``."""
    if not (isinstance(x, fx.Node) and x.op == "call_function"
            and x.target is operator.getitem):
        return None
    base, index = x.args
    base_value = example_tensor(base)
    if base_value is None or base_value.dim() < 3:
        return None
    parts = index if isinstance(index, tuple) else (index,)
    if (len(parts) >= base_value.dim()
            or not all(isinstance(p, int) or p == _FULL for p in parts)
            or not any(isinstance(p, int) for p in parts)):
        return None
    return base, index


def _steps(sequence: fx.Node, index: Any) -> float:
    """How many slices ``index``'s kind of indexing can take from ``sequence`` (inf when a
    size is symbolic)."""
    parts = index if isinstance(index, tuple) else (index,)
    count = 1
    for size, part in zip(example_tensor(sequence).shape, parts):
        if isinstance(part, int):
            if not isinstance(size, int):
                return float("inf")
            count *= size
    return count


def _key(rw: Rewrite, node: fx.Node) -> tuple | None:
    if not (node.op == "call_function" and node.target is LINEAR and not node.kwargs
            and len(node.args) in (2, 3)):
        return None
    found = leading_index(node.args[0])
    if found is None:
        return None
    bias = node.args[2] if len(node.args) == 3 else None
    region = tuple(sorted(rw.autocast.get(node, {}).items()))
    return found[0], node.args[1], bias, region


def hoist_input_projections(rw: Rewrite, projections: list[fx.Node]) -> None:
    """Replace each group of per-step projections of one sequence by one GEMM's slices."""
    groups: dict[tuple, list[fx.Node]] = {}
    for node in projections:
        key = _key(rw, node)
        if key is not None and node not in groups.get(key, []):
            groups.setdefault(key, []).append(node)
    order = {node: i for i, node in enumerate(rw.graph.nodes)}
    for (sequence, weight, bias, _), nodes in groups.items():
        if len(nodes) < 2 or 2 * len(nodes) < _steps(sequence, nodes[0].args[0].args[1]):
            continue
        nodes.sort(key=order.__getitem__)
        replaces = [n.name for n in nodes]
        with rw.graph.inserting_before(nodes[0]):
            whole = rw.emit(LINEAR, sequence, weight, bias, replaces=replaces)
        for node in nodes:
            with rw.graph.inserting_before(node):
                step = rw.emit(operator.getitem, whole, node.args[0].args[1],
                               replaces=[node.name], like=node)
            node.replace_all_uses_with(step)
            rw.graph.erase_node(node)
        rw.hoisted_projections += 1
