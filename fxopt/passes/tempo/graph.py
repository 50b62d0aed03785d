"""What tempo's matchers ask of Dynamo's torch-level graph: which call a node is (the same
operation appears as a function, an operator or a method), its arguments by position or
name, its example value, and whether its value is kept for backward by a neighbour."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

__all__ = ["arg", "example", "is_call", "kept_by_neighbour", "only_user", "constant_operand"]

# One operation, its spellings in a Dynamo graph: call_function targets and method names.
CALLS: dict[str, tuple[tuple[Any, ...], tuple[str, ...]]] = {
    "gelu": ((torch._C._nn.gelu, F.gelu), ()),
    "layer_norm": ((F.layer_norm, torch.layer_norm), ()),
    "rms_norm": ((F.rms_norm, torch.rms_norm), ()),
    "softmax": ((F.softmax, torch.softmax), ("softmax",)),
    "dropout": ((F.dropout, torch.dropout), ()),
    "matmul": ((torch.matmul, operator.matmul), ("matmul",)),
    "mul": ((operator.mul, torch.mul), ("mul",)),
    "add": ((operator.add, torch.add), ("add",)),
    "pow": ((operator.pow, torch.pow), ("pow",)),
    "tanh": ((torch.tanh,), ("tanh",)),
    "rsqrt": ((torch.rsqrt,), ("rsqrt",)),
    "mean": ((torch.mean,), ("mean",)),
    "cast": ((), ("to", "type")),
}

# Ops that keep an input for backward when the other operand needs a gradient: a Linear
# keeps its input for dW, a matmul each operand for the other's gradient. (position of
# the kept argument)
_SAVERS: tuple[tuple[tuple[Any, ...], tuple[str, ...], tuple[int, ...]], ...] = (
    ((torch._C._nn.linear, F.linear), (), (0,)),
    ((torch.addmm,), ("addmm",), (1, 2)),
    ((torch.matmul, operator.matmul, torch.bmm, torch.mm), ("matmul", "bmm", "mm"), (0, 1)),
    ((torch.baddbmm,), ("baddbmm",), (1, 2)),
)

# Ops whose output shares its input's memory (a saver of the view keeps the same tensor).
_VIEWS = ((torch.reshape, torch.transpose, torch.permute, torch.flatten, torch.unsqueeze,
           torch.squeeze, torch.t),
          ("view", "reshape", "transpose", "permute", "flatten", "unsqueeze", "squeeze",
           "view_as", "t", "expand"))


def _matches(node: fx.Node, functions: tuple[Any, ...], methods: tuple[str, ...]) -> bool:
    if node.op == "call_function":
        return node.target in functions
    return node.op == "call_method" and node.target in methods


def is_call(node: Any, name: str) -> bool:
    """Whether ``node`` is the operation ``name`` of :data:`CALLS`."""
    return isinstance(node, fx.Node) and _matches(node, *CALLS[name])


def arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    """An argument by position or keyword (a method's ``self`` is position 0)."""
    if index < len(node.args):
        return node.args[index]
    return node.kwargs.get(name, default)


def example(node: Any) -> torch.Tensor | None:
    """The fake value Dynamo recorded for ``node`` (None if not a tensor)."""
    value = node.meta.get("example_value") if isinstance(node, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def constant_operand(node: fx.Node) -> tuple[float | None, Any]:
    """For a binary op with one number operand: (the number, the other operand)."""
    a, b = node.args[0], node.args[1] if len(node.args) > 1 else None
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return float(a), b
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        return float(b), a
    return None, None


def kept_by_neighbour(node: fx.Node) -> bool:
    """Whether some consumer of ``node``'s value (through views) keeps that very tensor for
    backward: a Linear or matmul that computes in its dtype (under autocast a Linear keeps
    its own low-precision copy instead, which does not count)."""
    value = example(node)
    pending, seen = [node], set()
    while pending:
        current = pending.pop()
        for user in current.users:
            if user in seen:
                continue
            seen.add(user)
            if _matches(user, *_VIEWS) or _is_basic_indexing(user):
                if user.args and user.args[0] is current:
                    pending.append(user)
                continue
            for functions, methods, positions in _SAVERS:
                if not _matches(user, functions, methods):
                    continue
                kept = any(i < len(user.args) and user.args[i] is current for i in positions)
                out = example(user)
                if kept and (value is None or out is None or out.dtype == value.dtype):
                    return True
    return False


def _is_basic_indexing(node: fx.Node) -> bool:
    """``t[:, i:j, ...]``: indexing by ints, slices, None and Ellipsis returns a view."""
    if node.op != "call_function" or node.target is not operator.getitem:
        return False
    index = node.args[1]
    items = index if isinstance(index, tuple) else (index,)
    return all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in items)
