"""One vocabulary of the torch-level calls in Dynamo's graphs, for the passes that match
patterns before autograd (tempo, fuse_rnn).

Dynamo records a call as the model wrote it, so one operation has several spellings in its
graph: a function (``torch.sigmoid(x)``, ``F.sigmoid(x)``, ``torch.special.expit(x)``), an
operator (``a * b``), a tensor method (``x.sigmoid()``), or the C binding a function
resolves to (``F.linear`` is recorded as ``torch._C._nn.linear``, named by
:mod:`fxopt._compat`). :data:`CALLS` names each operation once with all its spellings and
:func:`is_call` accepts any of them; :func:`arg` reads an argument by position or keyword,
:func:`constant_operand` a binary op's number operand (:func:`scalar_operand` also where
Dynamo made that number a symbolic float),
and :func:`example_value` / :func:`example_tensor` the fake value Dynamo recorded
(``node.meta["example_value"]``). A pass that needs more (fuse_rnn refuses extra keyword
arguments such as ``alpha=``) adds its rule on top.

Whole ``nn.LSTM`` / ``nn.GRU`` calls (:data:`RNN_CALLS`, Dynamo traces them under
``allow_rnn``) have one reading, :func:`rnn_call`, shared by fuse_rnn and recompute_rnn.
"""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

import torch
import torch.fx as fx
import torch.nn.functional as F

from fxopt import _compat

__all__ = ["CALLS", "RNN_CALLS", "RnnCall", "arg", "constant_operand", "example_tensor",
           "example_value", "is_call", "rnn_call", "scalar_operand", "symbolic_float"]

# operation -> (call_function targets, call_method names)
CALLS: dict[str, tuple[tuple[Any, ...], tuple[str, ...]]] = {
    # pointwise
    "gelu": ((_compat.NN_GELU, F.gelu), ()),
    "sigmoid": ((torch.sigmoid, F.sigmoid, torch.special.expit), ("sigmoid",)),
    "tanh": ((torch.tanh, F.tanh), ("tanh",)),
    "mul": ((operator.mul, torch.mul), ("mul",)),
    "add": ((operator.add, torch.add), ("add",)),
    "sub": ((operator.sub, torch.sub), ("sub",)),
    "truediv": ((operator.truediv, torch.div, torch.true_divide), ("div", "true_divide")),
    "pow": ((operator.pow, torch.pow), ("pow",)),
    "rsqrt": ((torch.rsqrt,), ("rsqrt",)),
    "cast": ((), ("to", "type")),
    "float_cast": ((), ("float", "double", "half", "bfloat16")),
    "type_as": ((), ("type_as",)),
    # reductions, norms, softmax, dropout
    "mean": ((torch.mean,), ("mean",)),
    "layer_norm": ((F.layer_norm, torch.layer_norm), ()),
    "rms_norm": ((F.rms_norm, torch.rms_norm), ()),
    "softmax": ((F.softmax, torch.softmax), ("softmax",)),
    "dropout": ((F.dropout, torch.dropout), ()),
    "cross_entropy": ((F.cross_entropy,), ()),
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
    "contiguous": ((), ("contiguous",)),
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


def constant_operand(node: fx.Node) -> tuple[float | None, Any]:
    """For a binary op with one number operand: (the number, the other operand)."""
    a, b = node.args[0], node.args[1] if len(node.args) > 1 else None
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return float(a), b
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        return float(b), a
    return None, None


def symbolic_float(value: Any) -> bool:
    """Whether ``value`` is a graph value that holds a Python float: a float Dynamo made
    symbolic because it changed between calls (``specialize_float=False``, torch's default:
    a module's ``eps`` that differs between two models sharing one forward, a dropout rate
    passed in on a schedule), read in the graph from a tensor's ``.item()``."""
    return isinstance(example_value(value), torch.SymFloat)


def scalar_operand(node: fx.Node) -> tuple[float | fx.Node | None, Any]:
    """:func:`constant_operand`, or where the number is a :func:`symbolic_float`, that
    graph value (the op then takes the node; at run time it is the float)."""
    number, other = constant_operand(node)
    if number is not None or len(node.args) != 2:
        return number, other
    a, b = node.args
    if symbolic_float(b):
        return b, a
    if symbolic_float(a):
        return a, b
    return None, None


def example_value(node: Any) -> Any:
    """The fake value Dynamo recorded for ``node`` (None for non-nodes or missing values)."""
    return node.meta.get("example_value") if isinstance(node, fx.Node) else None


def example_tensor(node: Any) -> torch.Tensor | None:
    """:func:`example_value` when it is a tensor, else None."""
    value = example_value(node)
    return value if isinstance(value, torch.Tensor) else None


# the calls nn.LSTM / nn.GRU make for a whole sequence (the input overload) -> their mode
RNN_CALLS = {torch.lstm: "lstm", torch.gru: "gru"}


class RnnCall(NamedTuple):
    """A ``torch.lstm`` / ``torch.gru`` call's arguments, read by :func:`rnn_call`."""

    mode: str                 # "lstm" or "gru"
    x: fx.Node
    states: list[fx.Node]     # [h0, c0] for an LSTM, [h0] for a GRU
    params: list[fx.Node]
    has_biases: bool
    layers: int
    dropout: float
    train: bool
    bidirectional: bool
    batch_first: bool


def rnn_call(node: fx.Node) -> RnnCall:
    """The arguments of a call in :data:`RNN_CALLS`, or ValueError with what cannot be read:
    unrecognised arguments, a packed sequence (``torch.lstm``'s data overload, whose weights
    are not the third argument), an unrecognised initial state, or a flag that is not a
    constant of its type. What a pass can rewrite beyond that is the pass's rule."""
    mode = RNN_CALLS[node.target]
    if node.kwargs or len(node.args) != 9:
        raise ValueError("unrecognised arguments")
    x, hx, params, has_biases, layers, dropout, train, bidirectional, batch_first = node.args
    if not isinstance(params, (list, tuple)) or not all(isinstance(p, fx.Node) for p in params):
        raise ValueError("packed sequence")
    states = list(hx) if isinstance(hx, (list, tuple)) else [hx]
    if len(states) != (2 if mode == "lstm" else 1) or any(example_tensor(s) is None
                                                         for s in states):
        raise ValueError("unrecognised initial state")
    flags = (has_biases, train, bidirectional, batch_first)
    if not (all(isinstance(f, bool) for f in flags) and type(layers) is int
            and isinstance(dropout, (int, float)) and not isinstance(dropout, bool)):
        raise ValueError("a flag that is not a constant of its type")
    return RnnCall(mode, x, states, list(params), has_biases, layers, float(dropout), train,
                   bidirectional, batch_first)

