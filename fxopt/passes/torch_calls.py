"""One vocabulary of the torch-level calls in Dynamo's graphs, for the passes that match
patterns before autograd (tempo, fuse_rnn).

Dynamo records a call as the model wrote it, so one operation has several spellings in its
graph: a function (``torch.sigmoid(x)``, ``F.sigmoid(x)``, ``torch.special.expit(x)``), an
operator (``a * b``), a tensor method (``x.sigmoid()``), or the C binding a function
resolves to (``F.linear`` is recorded as ``torch._C._nn.linear``, named by
:mod:`fxopt._compat`). :data:`CALLS` names each operation once with all its spellings and
:func:`is_call` accepts any of them; :func:`arg` reads an argument by position or keyword,
and :func:`example_value` / :func:`example_tensor` the fake value Dynamo recorded
(``node.meta["example_value"]``). A pass that needs more (fuse_rnn refuses extra keyword
arguments such as ``alpha=``) adds its rule on top.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

from fxopt import _compat

__all__ = ["CALLS", "arg", "example_tensor", "example_value", "is_call"]

# operation -> (call_function targets, call_method names)
CALLS: dict[str, tuple[tuple[Any, ...], tuple[str, ...]]] = {
    # pointwise
    "gelu": ((_compat.NN_GELU, F.gelu), ()),
    "sigmoid": ((torch.sigmoid, F.sigmoid, torch.special.expit), ("sigmoid",)),
    "tanh": ((torch.tanh, F.tanh), ("tanh",)),
    "mul": ((operator.mul, torch.mul), ("mul",)),
    "add": ((operator.add, torch.add), ("add",)),
    "sub": ((operator.sub, torch.sub), ("sub",)),
    "pow": ((operator.pow, torch.pow), ("pow",)),
    "rsqrt": ((torch.rsqrt,), ("rsqrt",)),
    "cast": ((), ("to", "type")),
    # reductions, norms, softmax, dropout
    "mean": ((torch.mean,), ("mean",)),
    "layer_norm": ((F.layer_norm, torch.layer_norm), ()),
    "rms_norm": ((F.rms_norm, torch.rms_norm), ()),
    "softmax": ((F.softmax, torch.softmax), ("softmax",)),
    "dropout": ((F.dropout, torch.dropout), ()),
    # products
    "linear": ((_compat.NN_LINEAR, F.linear), ()),
    "matmul": ((torch.matmul, operator.matmul), ("matmul",)),
    "mm": ((torch.mm,), ("mm",)),
    "bmm": ((torch.bmm,), ("bmm",)),
    "addmm": ((torch.addmm,), ("addmm",)),
    "baddbmm": ((torch.baddbmm,), ("baddbmm",)),
    # splits and views
    "chunk": ((torch.chunk,), ("chunk",)),
    "reshape": ((torch.reshape,), ("reshape",)),
    "view": ((), ("view",)),
    "view_as": ((), ("view_as",)),
    "transpose": ((torch.transpose,), ("transpose",)),
    "permute": ((torch.permute,), ("permute",)),
    "flatten": ((torch.flatten,), ("flatten",)),
    "unsqueeze": ((torch.unsqueeze,), ("unsqueeze",)),
    "squeeze": ((torch.squeeze,), ("squeeze",)),
    "t": ((torch.t,), ("t",)),
    "expand": ((), ("expand",)),
}


def is_call(node: Any, *names: str) -> bool:
    """Whether ``node`` calls one of the operations ``names`` of :data:`CALLS`, in any
    spelling."""
    if not isinstance(node, fx.Node):
        return False
    for name in names:
        functions, methods = CALLS[name]
        if node.op == "call_function" and node.target in functions:
            return True
        if node.op == "call_method" and node.target in methods:
            return True
    return False


def arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    """An argument by position or keyword (a method's ``self`` is position 0)."""
    if index < len(node.args):
        return node.args[index]
    return node.kwargs.get(name, default)


def example_value(node: Any) -> Any:
    """The fake value Dynamo recorded for ``node`` (None for non-nodes or missing values)."""
    return node.meta.get("example_value") if isinstance(node, fx.Node) else None


def example_tensor(node: Any) -> torch.Tensor | None:
    """:func:`example_value` when it is a tensor, else None."""
    value = example_value(node)
    return value if isinstance(value, torch.Tensor) else None
