"""Per-node FLOPs and bytes moved: the cost model's raw data.

Each call is classified into one kind, and its cost follows the kind:

- ``matmul``, ``conv``, ``attention``: FLOPs from ``torch.utils.flop_counter.flop_registry``
  (the formulas ``FlopCounterMode`` uses: 2*M*N*K for a matmul, forward and backward convs,
  SDPA variants), so fxopt and torch agree on them.
- ``pointwise`` (op tag ``torch.Tag.pointwise``, e.g. relu, add, gelu): 1 FLOP per output
  element. Transcendental ops (exp, tanh, erf in gelu) count 1 as well: on every device
  fxopt targets they are memory-bound, and their bytes, not their FLOPs, set their time.
- ``reduction`` (tag ``torch.Tag.reduction``, plus the normalizations in
  :data:`REDUCTION_OPS`): 1 FLOP per element of the largest input.
- ``view`` (schema returns alias an argument and nothing is written, ``_unsafe_view``,
  ``operator.getitem``): no FLOPs and no bytes; they allocate and move nothing.
- ``other``: bytes only (copies, cat, embedding, index ops, constructors), and
  placeholders/outputs/get_attr with zero cost.

Bytes read are the logical sizes of the distinct tensor inputs, bytes written those of the
outputs (in-place ops write their output too). This is a roofline view, not a timing: it
ignores caching, fusion and kernels that read an input twice.

Two counts price what neither FLOPs nor bytes see: ``transcendental``, the elements an op
evaluates a special function on (exp, log, tanh, erf, sigmoid, GELU and SiLU and their
backwards, softmax and log-softmax; :data:`TRANSCENDENTAL_OPS`), and ``random``, the
numbers a random op draws (dropout's mask, ``rand``; ops tagged
``nondeterministic_seeded``). On one CPU thread they run at about 1.5 ns and 7 ns per
element, 15-70x slower than a memory-bound copy of the same tensor (measured with torch
2.13), so a CPU profile prices them at their own calibrated rates
(:class:`fxopt.planner.HardwareProfile`).

Private torch APIs: schema alias sets through ``_compat.op_alias_sets`` (alias sets,
list returns included), ``OpOverload``, the pytree utilities.

Costs read ``node.meta["val"]`` (see :mod:`fxopt.analysis.shapes`); symbolic sizes are
resolved with their hints. Registry formulas are run on meta tensors with the hinted sizes,
so no guard is ever added to a dynamic graph's shape environment.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.utils.flop_counter import flop_registry

from fxopt import _compat
from fxopt.analysis.shapes import nbytes, numel, size_hint, tensor_values

__all__ = [
    "KINDS",
    "TRANSCENDENTAL_OPS",
    "GraphCost",
    "NodeCost",
    "graph_cost",
    "is_view_op",
    "node_cost",
    "return_aliases",
    "storage_root",
]

KINDS = ("matmul", "conv", "attention", "pointwise", "reduction", "view", "other")

aten = torch.ops.aten

# Not tagged as reductions, but each reads its whole input to normalize it.
REDUCTION_OPS = frozenset({
    aten._softmax, aten._log_softmax, aten._softmax_backward_data,
    aten._log_softmax_backward_data, aten.native_layer_norm, aten.native_layer_norm_backward,
    aten.native_batch_norm, aten._native_batch_norm_legit,
    aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit_no_training,
    aten.native_batch_norm_backward, aten.native_group_norm, aten.native_group_norm_backward,
    aten._fused_rms_norm, aten.cumsum, aten.logsumexp,
})

# Pointwise or normalising ops that evaluate a special function per element.
TRANSCENDENTAL_OPS = frozenset({
    aten.exp, aten.exp2, aten.expm1, aten.log, aten.log1p, aten.log2, aten.log10,
    aten.tanh, aten.sigmoid, aten.erf, aten.erfc, aten.erfinv, aten.gelu,
    aten.gelu_backward, aten.silu, aten.silu_backward, aten.sin, aten.cos, aten._softmax,
    aten._safe_softmax, aten._log_softmax, aten._log_softmax_backward_data, aten.logsumexp,
})

# Schema says "returns a new tensor", but at run time it is a view of its (freshly made)
# input: AOTAutograd emits it after clone/bmm to reshape without a copy.
UNSAFE_VIEW_OPS = frozenset({aten._unsafe_view.default})


@dataclass(frozen=True)
class NodeCost:
    kind: str
    flops: int
    bytes_read: int
    bytes_written: int
    transcendental: int = 0   # elements a special function is evaluated on
    random: int = 0           # random numbers drawn

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written


@dataclass(frozen=True)
class GraphCost:
    """Costs of every node by name, and the totals."""

    nodes: Mapping[str, NodeCost]
    flops: int
    bytes_read: int
    bytes_written: int

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    def by_kind(self) -> dict[str, NodeCost]:
        """Summed cost per kind (kinds with no node left out)."""
        sums: dict[str, list[int]] = {}
        for c in self.nodes.values():
            s = sums.setdefault(c.kind, [0, 0, 0])
            s[0] += c.flops
            s[1] += c.bytes_read
            s[2] += c.bytes_written
        return {k: NodeCost(k, *v) for k, v in sums.items()}


_ZERO = {kind: NodeCost(kind, 0, 0, 0) for kind in KINDS}


def is_view_op(target: Any) -> bool:
    """True when the op's outputs alias an input without writing it (view, t, expand,
    split, detach, ..., and ``_unsafe_view``); in-place and out= ops are not views."""
    if target is operator.getitem or target in UNSAFE_VIEW_OPS:
        return True
    if not _compat.is_op_overload(target):
        return False
    args, outs = _compat.op_alias_sets(target)
    aliased = any(outs)
    writes = any(written for _, _, written in args)
    return aliased and not writes


def return_aliases(node: fx.Node) -> list[Any]:
    """Per schema return of an op node, the argument (an fx.Node or other value) whose
    storage it shares, or None where the return is a new tensor. ``_unsafe_view`` returns
    its input's storage. Non-op targets (getitem, higher-order ops) give []."""
    target = node.target
    if target in UNSAFE_VIEW_OPS:
        return [node.args[0]]
    if node.op != "call_function" or not _compat.is_op_overload(target):
        return []
    # torch's schema parser: unlike FunctionSchema.returns[i].alias_info, it also reads the
    # alias set of a list return such as split's ``Tensor(a)[]``.
    args, outs = _compat.op_alias_sets(target)
    sources: list[Any] = []
    for out_set in outs:
        source = None
        for i, (name, arg_set, _) in enumerate(args):
            if out_set & arg_set:
                source = node.args[i] if i < len(node.args) else node.kwargs.get(name)
                break
        sources.append(source)
    return sources


def storage_root(node: fx.Node) -> fx.Node:
    """The node whose storage ``node``'s value lives in: ``node`` itself where its op returns
    a new tensor (or aliases more than one input), else the root of the one input it
    aliases (a view, an in-place op, ``_unsafe_view``, and an element of a view op's list
    or tuple: ``getitem(split(x), i)``, as ``chunk`` and ``unbind`` trace, lives in x)."""
    while True:
        if node.target is operator.getitem:
            source = _element_source(node)
        else:
            sources = return_aliases(node)
            source = sources[0] if len(sources) == 1 else None
        if not isinstance(source, fx.Node):
            return node
        node = source


def _element_source(node: fx.Node) -> Any:
    """The argument whose storage ``getitem(parent, i)`` shares: the one a list return
    aliases (split's ``Tensor(a)[]``: every element), or the one return ``i`` aliases;
    None where the element is a new tensor."""
    parent, index = node.args[0], node.args[1]
    if not isinstance(parent, fx.Node) or not isinstance(index, int):
        return None
    sources = return_aliases(parent)
    if len(sources) == 1 and isinstance(parent.meta.get("val"), (list, tuple)):
        return sources[0]
    return sources[index] if len(sources) > 1 and index < len(sources) else None


def node_cost(node: fx.Node) -> NodeCost:
    """FLOPs and bytes of one node (see the module docstring for the rules). An RNG wrapper
    (a random op the partitioner replays in the backward, e.g. SDPA or dropout inside
    ``torch.utils.checkpoint``) costs what the op it runs costs, plus its RNG state's
    bytes."""
    if node.op != "call_function":
        return _ZERO["other"]
    if is_view_op(node.target):
        return _ZERO["view"]
    if "val" not in node.meta:
        raise ValueError(f"node {node.name} has no meta['val']; run ensure_fake_values first")
    target, args, kwargs, value = _compat.rng_wrapped_call(node) or (
        node.target, node.args, node.kwargs, node.meta["val"])
    kind = _kind(target)
    inputs = node.all_input_nodes
    bytes_read = sum(nbytes(t) for n in inputs for t in tensor_values(n))
    outputs = tensor_values(node)
    bytes_written = sum(nbytes(t) for t in outputs)
    values = [v for v in _compat.tree_leaves(value) if isinstance(v, torch.Tensor)]
    if kind in ("matmul", "conv", "attention"):
        flops = _registry_flops(target, args, kwargs, value)
    elif kind == "pointwise":
        flops = sum(numel(t) for t in values)
    elif kind == "reduction":
        flops = max((numel(t) for n in inputs for t in tensor_values(n)), default=0)
    else:
        flops = 0
    packet = getattr(target, "overloadpacket", target)
    largest = max((numel(t) for t in values), default=0)
    transcendental = (max(largest, *(numel(t) for n in inputs for t in tensor_values(n)))
                      if packet in TRANSCENDENTAL_OPS else 0)
    random = (numel(values[0]) if values and torch.Tag.nondeterministic_seeded
              in getattr(target, "tags", ()) else 0)
    return NodeCost(kind, flops, bytes_read, bytes_written, transcendental, random)


def graph_cost(gm: fx.GraphModule) -> GraphCost:
    """Per-node costs (by node name) and totals of a graph whose nodes carry fake values."""
    nodes = {n.name: node_cost(n) for n in gm.graph.nodes}
    return GraphCost(
        nodes=nodes,
        flops=sum(c.flops for c in nodes.values()),
        bytes_read=sum(c.bytes_read for c in nodes.values()),
        bytes_written=sum(c.bytes_written for c in nodes.values()),
    )


def _kind(target: Any) -> str:
    packet = getattr(target, "overloadpacket", target)
    if packet in flop_registry:
        name = str(packet)
        if "attention" in name:
            return "attention"
        return "conv" if "conv" in name else "matmul"
    if packet in REDUCTION_OPS:
        return "reduction"
    tags = getattr(target, "tags", ())
    if torch.Tag.reduction in tags:
        return "reduction"
    if torch.Tag.pointwise in tags:
        return "pointwise"
    return "other"


def _registry_flops(target: Any, args: Any, kwargs: Any, value: Any) -> int:
    """Run the registry's formula on meta tensors with hinted (concrete) sizes: the formulas
    compare sizes, which on SymInts would add guards to the graph's shape environment."""
    def concrete(x: Any) -> Any:
        if isinstance(x, fx.Node):
            x = x.meta.get("val")
        if isinstance(x, torch.Tensor):
            return torch.empty([size_hint(s) for s in x.shape], dtype=x.dtype, device="meta")
        if isinstance(x, torch.SymInt):
            return size_hint(x)
        return x

    args, kwargs, out = _compat.tree_map(concrete, (args, kwargs, value))
    packet = getattr(target, "overloadpacket", target)
    return int(flop_registry[packet](*args, **kwargs, out_val=out))
