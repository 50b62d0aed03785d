"""fuse_elementwise: connected pointwise aten ops become one generated Triton kernel.

At the FORWARD and BACKWARD stages, maximal connected sets of pointwise ops of one shape
(inputs may broadcast to it) are grouped into regions; each region becomes one call of a
:class:`~fxopt.kernels.fuse_elementwise.FusedPointwise` whose kernel is generated from the
region's ops (:mod:`fxopt.kernels.fuse_elementwise`). Every value used outside the region is
written, nothing else: the intermediates never reach memory, and a chain of N ops costs one
launch and one pass over memory instead of N.

Rules it relies on (passes/README.md): it fuses only functional ops, so each written value
was a fresh tensor and stays one, allocated with the strides its node recorded; the fused
call sits where the region's last op was, and a region only grows where no outside user of
its values comes earlier and no in-place op lies in between (so nothing reads a value
before it exists or sees a mutation in another order). Regions are one shape, with
concrete sizes, on the graph's device: anything else (dynamic shapes, a CPU scalar tensor
in a CUDA graph, an op or argument the generator does not know) is left alone, a decline
with its site and reason in the verdicts.

It declines the whole graph where Triton cannot run (a CPU without ``TRITON_INTERPRET=1``)
and with ``codegen="inductor"``, which fuses pointwise ops itself.

Private torch APIs, through :mod:`fxopt._compat`: ``OpOverload`` (which calls are aten ops)
and schema alias sets (which calls write an argument), as the analyses do.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from fxopt import _compat
from fxopt.kernels import triton_runs_on
from fxopt.kernels.fuse_elementwise import FusedPointwise, Instr, Op, Program, Unsupported, lower
from fxopt.kernels.fuse_elementwise.fused import broadcast_strides, layout_for
from fxopt.kernels.fuse_elementwise.ops import SUPPORTED_DTYPES
from fxopt.kernels.fuse_elementwise.triton_source import get_kernel, register_dtype
from fxopt.passes.base import PassContext, PassResult, Verdicts

__all__ = ["fuse_elementwise"]

log = logging.getLogger(__name__)

_names = itertools.count()


@dataclass(eq=False)
class _Region:
    nodes: list[fx.Node]
    shape: tuple[int, ...]
    deferred: list[fx.Node] = field(default_factory=list)  # moved after the fused call


@dataclass
class _Stats:
    """The verdicts (regions fused; each op or region left alone, and why) and the pass's
    own counts."""

    verdicts: Verdicts = field(default_factory=Verdicts)
    regions_found: int = 0
    ops_fused: int = 0
    kernels_generated: int = 0
    kernels_reused: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"regions_found": self.regions_found, "ops_fused": self.ops_fused,
                "kernels_generated": self.kernels_generated,
                "kernels_reused": self.kernels_reused,
                "launches_saved": self.ops_fused - self.verdicts.count}


def fuse_elementwise(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    """Replace each region of connected pointwise ops by one generated kernel call."""
    if ctx.codegen.fuses_pointwise:
        return PassResult.declined_graph(gm, f"codegen='{ctx.codegen}' fuses pointwise ops")
    if not triton_runs_on(ctx.device):
        return PassResult.declined_graph(gm, f"Triton cannot run on {ctx.device} (CPU "
                                             "without TRITON_INTERPRET=1)")
    stats = _Stats()
    candidates = _candidates(gm.graph, ctx.device, stats)
    for region in _regions(gm.graph, candidates):
        if len(region.nodes) < 2:
            stats.verdicts.decline(region.nodes[0].name, "single pointwise op")
            continue
        stats.regions_found += 1
        try:
            program, inputs, outputs = _program(region)
        except Unsupported as exc:
            stats.verdicts.decline(region.nodes[0].name, str(exc))
            continue
        if not ctx.rewrites.allow():
            continue
        _rewrite(gm.graph, region, program, inputs, outputs, stats)
    return PassResult(gm, bool(stats.verdicts.matched), stats.verdicts, stats.as_dict())


# ---------------------------------------------------------------------------- candidates


def _concrete_shape(val: torch.Tensor) -> tuple[int, ...] | None:
    if any(_compat.is_symbolic(s) for s in (*val.shape, *val.stride())):
        return None
    return tuple(int(s) for s in val.shape)


def _check_tensor(val: Any, shape: tuple[int, ...], device: torch.device) -> None:
    if not isinstance(val, torch.Tensor):
        raise Unsupported("an operand without a fake tensor value")
    own = _concrete_shape(val)
    if own is None:
        raise Unsupported("dynamic shape")
    if val.dtype not in SUPPORTED_DTYPES:
        raise Unsupported(f"dtype {val.dtype}")
    if val.device != device:
        raise Unsupported(f"a {val.device} tensor in a {device} graph")
    if len(own) > len(shape) or any(
            s not in (1, full) for s, full in zip(own, shape[len(shape) - len(own):])):
        raise Unsupported("an operand that does not broadcast to the op's shape")


def _candidate(node: fx.Node, device: torch.device) -> Op:
    op = lower(node)
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise Unsupported("no fake tensor value")
    shape = _concrete_shape(val)
    if shape is None:
        raise Unsupported("dynamic shape")
    _check_tensor(val, shape, device)
    if val.dtype == torch.bool and op.compute == "out" and op.name not in ("identity", "where"):
        raise Unsupported(f"{op.name} on bool")
    for operand in op.operands:
        if isinstance(operand, fx.Node):
            _check_tensor(operand.meta.get("val"), shape, device)
        elif isinstance(operand, bool) or not isinstance(operand, (int, float)):
            raise Unsupported(f"a {type(operand).__name__} operand")
    return op


def _candidates(graph: fx.Graph, device: torch.device, stats: _Stats) -> dict[fx.Node, Op]:
    """The fusable pointwise calls; pointwise-tagged ops that are not are counted."""
    found = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        try:
            found[node] = _candidate(node, device)
        except Unsupported as exc:
            if torch.Tag.pointwise in getattr(node.target, "tags", ()):
                stats.verdicts.decline(node.name, str(exc))
    return found


# ---------------------------------------------------------------------------- regions


def _mutates(node: fx.Node) -> bool:
    if node.op != "call_function" or not _compat.is_op_overload(node.target):
        return False
    args, _ = _compat.op_alias_sets(node.target)
    return any(written for _, _, written in args)


def _pure(node: fx.Node) -> bool:
    """A call that may run later without changing any result: no random numbers (moving
    one would change which values it draws), no side effects, nothing unknown."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    return (_compat.is_op_overload(node.target)
            and torch.Tag.nondeterministic_seeded not in node.target.tags
            and not _mutates(node))


def _regions(graph: fx.Graph, candidates: dict[fx.Node, Op]) -> list[_Region]:
    """Grow regions greedily in graph order; a node joins (and merges) its producers'
    regions of its shape when the fused call, placed at the node, breaks no dependency."""
    position = {node: i for i, node in enumerate(graph.nodes)}
    mutating = {n for n in graph.nodes if _mutates(n)}
    mutations = sorted(position[n] for n in mutating)
    unmovable = {n for n in graph.nodes if n in candidates or not _pure(n)}
    region_of: dict[fx.Node, _Region] = {}
    regions: list[_Region] = []
    for node, op in candidates.items():
        shape = tuple(node.meta["val"].shape)
        producers: list[_Region] = []
        for operand in op.operands:
            region = region_of.get(operand) if isinstance(operand, fx.Node) else None
            if region is not None and region.shape == shape and region not in producers:
                producers.append(region)
        chosen: list[_Region] = []
        deferred: list[fx.Node] = []
        for region in producers:
            joined = _can_join([*chosen, region], node, position, mutations, unmovable)
            if joined is not None:
                chosen.append(region)
                deferred = joined
        members = sorted((n for r in chosen for n in r.nodes), key=position.__getitem__)
        merged = _Region([*members, node], shape, deferred)
        regions = [r for r in regions if r not in chosen] + [merged]
        for member in merged.nodes:
            region_of[member] = merged
    return regions


def _can_join(regions: list[_Region], node: fx.Node, position: dict[fx.Node, int],
              mutations: list[int], unmovable: set[fx.Node]) -> list[fx.Node] | None:
    """Whether ``regions`` and ``node`` can be one region whose call sits at ``node``.

    Returns None if not, else the outside nodes to move after the call: users of a
    member that come before ``node`` (e.g. the ``detach`` AOTAutograd puts after a saved
    value) with everything they feed up to ``node``, provided none of it is a member,
    another pointwise op, or a call that is not pure (random, in-place, unknown).
    """
    members = {n for r in regions for n in r.nodes} | {node}
    at = position[node]
    start = min(position[n] for n in members)
    if bisect.bisect_left(mutations, start) != bisect.bisect_left(mutations, at):
        return None  # an in-place op between the region's first op and this one
    stack = [user for member in members if member is not node for user in member.users
             if user not in members and position[user] < at]
    deferred: set[fx.Node] = set()
    while stack:
        user = stack.pop()
        if user in deferred:
            continue
        if user in members or user in unmovable:
            return None
        deferred.add(user)
        stack.extend(u for u in user.users if position[u] <= at)
    return sorted(deferred, key=position.__getitem__)


# ---------------------------------------------------------------------------- rewrite


def _compute_dtype(op: Op, node: fx.Node) -> torch.dtype:
    if op.compute == "bool":
        return torch.bool
    if op.compute == "promote":
        def stand_in(x: Any) -> Any:
            if not isinstance(x, fx.Node):
                return x
            val = x.meta["val"]
            return torch.empty((1,) * min(val.dim(), 1), dtype=val.dtype, device="meta")

        a, b = (stand_in(x) for x in op.operands)
        return register_dtype(torch.result_type(a, b) if isinstance(a, torch.Tensor)
                              else torch.result_type(b, a))
    return register_dtype(node.meta["val"].dtype)


def _program(region: _Region) -> tuple[Program, list[fx.Node], list[fx.Node]]:
    index = {node: j for j, node in enumerate(region.nodes)}
    inputs: list[fx.Node] = []
    instrs = []
    for node in region.nodes:
        op = lower(node)  # again: an earlier rewrite may have replaced an operand
        refs = []
        for operand in op.operands:
            if not isinstance(operand, fx.Node):
                refs.append(("c", operand))
            elif operand in index:
                refs.append(("v", index[operand]))
            else:
                if operand not in inputs:
                    inputs.append(operand)
                refs.append(("in", inputs.index(operand)))
        instrs.append(Instr(op.name, tuple(refs), op.params, _compute_dtype(op, node),
                            node.meta["val"].dtype))
    outputs = [n for n in region.nodes if any(u not in index for u in n.users)]
    for out in outputs:
        if not _dense(out.meta["val"]):
            raise Unsupported("an output whose recorded strides are not dense")
    program = Program(inputs=tuple(n.meta["val"].dtype for n in inputs), instrs=tuple(instrs),
                      outputs=tuple(index[n] for n in outputs))
    return program, inputs, outputs


def _dense(val: torch.Tensor) -> bool:
    dims = sorted((s, n) for s, n in zip(val.stride(), val.shape) if n != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def _rewrite(graph: fx.Graph, region: _Region, program: Program, inputs: list[fx.Node],
             outputs: list[fx.Node], stats: _Stats) -> None:
    shape = region.shape
    out_strides = [tuple(o.meta["val"].stride()) for o in outputs]
    in_strides = [broadcast_strides(i.meta["val"].shape, i.meta["val"].stride(), shape)
                  for i in inputs]
    try:
        _, generated = get_kernel(program, layout_for(shape, in_strides, out_strides))
    except ValueError as exc:  # a number the generator cannot write in the op's dtype
        stats.verdicts.decline(region.nodes[0].name, str(exc))
        return
    stats.kernels_generated += generated
    stats.kernels_reused += not generated
    fused = FusedPointwise(program, shape, out_strides, f"fused_pointwise_{next(_names)}")
    members = set(region.nodes)
    with graph.inserting_after(region.nodes[-1]):
        call = graph.call_function(fused, tuple(inputs))
    call.meta["val"] = tuple(o.meta["val"] for o in outputs)
    call.meta["fxopt"] = {"pass": "fuse_elementwise",
                          "replaces": [n.name for n in region.nodes]}
    anchor = call
    for k, out in enumerate(outputs):
        with graph.inserting_after(anchor):
            anchor = graph.call_function(operator.getitem, (call, k))
        anchor.meta["val"] = out.meta["val"]
        anchor.meta["fxopt"] = {"pass": "fuse_elementwise", "replaces": [out.name]}
        out.replace_all_uses_with(anchor, delete_user_cb=lambda user: user not in members)
    for node in region.deferred:
        anchor.append(node)
        anchor = node
    for node in reversed(region.nodes):
        graph.erase_node(node)
    stats.verdicts.match("region")
    stats.ops_fused += len(region.nodes)
    log.debug("fuse_elementwise: %s replaces %d ops", fused.__name__, len(region.nodes))
