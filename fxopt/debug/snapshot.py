"""A graph as plain data: what the diff tool reads instead of re-parsing Python dumps.

Each dumped graph gets a ``.json`` twin holding, per node, its name, op, target, inputs
(by name, constants as written), shapes and dtypes of its tensor outputs, the bytes those
outputs take, whether it launches a kernel (views and ``getitem`` do not), the predicted
live bytes while it runs, and the provenance a pass recorded in ``node.meta["fxopt"]``
(passes README rule 5). The graph's predicted memory (peak, activations, the timeline) sits
beside the nodes. Everything is JSON: the diff works on dumps from another process, another
machine or another fxopt version.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.fx as fx

from fxopt.analysis.cost import is_view_op
from fxopt.analysis.memory import MemoryEstimate
from fxopt.analysis.shapes import nbytes, size_hint, tensor_values

__all__ = ["graph_snapshot", "memory_data", "target_name"]


def target_name(node: fx.Node) -> str:
    """A readable name of what a node calls: ``aten.mul.Tensor``, ``operator.getitem``."""
    target = node.target
    if isinstance(target, str):
        return target
    module = getattr(target, "__module__", None) or ""
    if module.startswith("torch._ops"):  # aten/custom ops print as ``aten.mul.Tensor``
        return str(target)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    module = "operator" if module == "_operator" else module
    return f"{module}.{name}" if module else name


def _plain(value: Any) -> Any:
    """JSON-safe copy of provenance data (names, strings, numbers; anything else as text)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if isinstance(value, fx.Node):
        return value.name
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def _inputs_text(node: fx.Node) -> str:
    args = fx.node.map_arg((node.args, node.kwargs), lambda n: _Name(n.name))
    positional = [repr(a) for a in args[0]]
    keywords = [f"{k}={v!r}" for k, v in args[1].items()]
    return ", ".join(positional + keywords)


class _Name(str):
    """An input node's name, printed bare (``mm``, not ``'mm'``) in the inputs text."""

    def __repr__(self) -> str:
        return str(self)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@functools.lru_cache(maxsize=1024)
def _launches_kernel(target: Any) -> bool:
    """Per op, not per node: reading an op's alias sets is slow (a GPT-2 backward graph
    has thousands of nodes but a few dozen distinct ops)."""
    return not is_view_op(target)


def _tensors(node: fx.Node) -> list[torch.Tensor]:
    """The tensors a node produces. An output node's value is its inputs' values: shown on
    them, not repeated here. Dynamo's (pre-autograd) graph keeps them under
    ``meta["example_value"]``, AOTAutograd's graphs under ``meta["val"]``."""
    if node.op == "output":
        return []
    return tensor_values(node, "val" if "val" in node.meta else "example_value")


def node_data(node: fx.Node, live: dict[str, int]) -> dict[str, Any]:
    """One node as plain data (see the module docstring)."""
    tensors = _tensors(node)
    kernel = node.op == "call_function" and _launches_kernel(node.target)
    return {
        "name": node.name,
        "op": node.op,
        "target": target_name(node),
        "inputs": _inputs_text(node),
        "uses": [n.name for n in node.all_input_nodes],
        "shapes": [[size_hint(s) for s in t.shape] for t in tensors],
        "dtypes": [_dtype_name(t.dtype) for t in tensors],
        "bytes": 0 if node.op == "call_function" and not kernel else sum(
            nbytes(t) for t in tensors),
        "kernel": kernel,
        "live": live.get(node.name),
        "fxopt": _plain(node.meta.get("fxopt")),
    }


def memory_data(estimate: MemoryEstimate | None, *, timeline: bool = False
                ) -> dict[str, Any] | None:
    """A memory prediction as plain data; the timeline only where asked (it is long)."""
    if estimate is None:
        return None
    data: dict[str, Any] = {"peak_bytes": estimate.peak_bytes,
                            "activation_bytes": estimate.activation_bytes,
                            "baseline_bytes": estimate.baseline_bytes,
                            "peak_node": estimate.peak_node}
    if timeline:
        data["timeline"] = [list(step) for step in estimate.timeline]
    return data


_PREFIX = {"forward": ("fw",), "inference": ("fw",), "backward": ("bw",),
           "joint": ("fw", "bw"), "dynamo": ()}


def graph_snapshot(gm: fx.GraphModule, kind: str,
                   estimate: MemoryEstimate | None) -> dict[str, Any]:
    """The graph ``gm`` (of graph kind ``kind``) and its predicted memory as plain data.

    A step estimate's timeline covers the forward then the backward graph; a node's live
    bytes are those of its own graph's steps (``fw:`` for a forward, ``bw:`` for a
    backward, both for the joint graph).
    """
    prefixes = _PREFIX.get(kind, ())
    live: dict[str, int] = {}
    for label, live_bytes in (estimate.timeline if estimate else ()):
        prefix, _, name = label.partition(":")
        if prefix in prefixes:
            live[name] = live_bytes
    return {"kind": kind,
            "nodes": [node_data(n, live) for n in gm.graph.nodes],
            "memory": memory_data(estimate, timeline=True)}


