"""Peak memory of one training step, predicted from the graphs by a liveness simulation.

What runs, and so what is simulated: AOTAutograd runs the forward graph, keeps its saved
outputs until the backward graph consumes them, then runs the backward. fx's generated code
drops each value right after its last use, and AOTAutograd's runtime hands saved tensors to
the backward so that they die at their last use there too (``steal_args``,
``maybe_clear_saved_tensors``). So walking the fw nodes then the bw nodes, allocating each
node's new storages and freeing a storage once every value that references it is dead,
reproduces the step's live bytes. Rules:

- Baseline: storages of the forward's (joint's ``primals_*``) placeholders: parameters,
  buffers and user inputs, owned by the caller and alive throughout. ``peak_bytes`` includes
  it; ``activation_bytes`` never counts it.
- Aliases share one storage: views (schema return with alias info, e.g. view, t, expand,
  split via getitem, slice, detach), in-place and out= ops (the storage of the argument they
  alias), ``operator.getitem`` (the storage of that element), and ``aten._unsafe_view``,
  whose schema says "new tensor" but which is a view at run time (checked:
  ``_unsafe_view(x).untyped_storage() is x.untyped_storage()``). Other ops (including
  higher-order ops) allocate one new storage per tensor output, sized by its strides.
- Forward outputs that are not saved for backward (user outputs, mutated-input values) are
  held by the caller to the end of the step (``loss`` while ``loss.backward()`` runs).
- Saved values: the backward's placeholders not named ``tangents*``, matched to forward
  outputs by name (positionally as a fallback); they die at their last backward use.
- Tangents are allocated as the backward starts and die at their last use, except a
  scalar's: that is the root gradient ``loss.backward()`` made (the loss computed in the
  graph), which ``torch.autograd.backward`` holds until the backward returns (4 bytes:
  the difference between BERT's predicted and measured peaks when it was not counted).
  Gradients the backward returns stay alive to the end (they become ``.grad``).
- Workspace: the temporaries fxopt's custom ops (tempo's, fuse_rnn's) allocate and free
  inside one call are live while that node runs (:mod:`fxopt.analysis.workspace`, measured
  once per op signature), e.g. tempo's CPU GELU backward beside its output. What
  ``fxopt::library_rnn`` keeps for its backward outside the graph (the library's autograd
  graph) is measured the same way and counted on the handle it returns, which lives until
  the backward op. Not modelled:
  aten kernels' own workspaces and allocator caching/fragmentation (this is bytes of live
  tensors, what ``torch.cuda.memory_allocated`` reports, not ``reserved``).
- ``codegen="inductor"``: Inductor's generated code does not store every node's value:
  pointwise values are computed inside the kernels that read them, and a kernel may write
  its output into an input that dies there (:func:`inductor_buffers`); node by node, the
  peak would be predicted too high (``tests/analysis/test_memory_plan_peak.py`` holds the
  prediction to the measurement). Inductor's own kernel order is not modelled, so a byte
  plan under Inductor keeps ``Codegen.peak_margin`` of its bound
  (benchmarks/results/inductor_budgets_cpu.md).

A plan is evaluated with the same simulation: :func:`estimate_partitioned_memory`
partitions a copy of the tagged joint graph as the compiler will and simulates the result,
so the peak a plan predicts is the one explain reports for the compiled step.

``timeline`` holds, per executed node, the live bytes while it runs (its outputs allocated,
its dead inputs not yet freed, its workspace), labelled ``fw:<name>`` / ``bw:<name>``;
``peak_bytes`` is its maximum (or the baseline for an empty graph). All functions are pure:
they read ``node.meta["val"]`` and never change the graph (a workspace is measured on
tensors of their own).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.utils.checkpoint import CheckpointPolicy

from fxopt import _compat
from fxopt.analysis.cost import is_view_op, node_cost, return_aliases
from fxopt.analysis.shapes import storage_nbytes
from fxopt.analysis.workspace import held_bytes, workspace_bytes
from fxopt.codegen import Codegen, as_codegen

__all__ = [
    "MemoryEstimate",
    "estimate_forward_memory",
    "estimate_joint_memory",
    "estimate_partitioned_memory",
    "estimate_step_memory",
    "inductor_buffers",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryEstimate:
    peak_bytes: int
    activation_bytes: int
    baseline_bytes: int
    peak_node: str
    timeline: tuple[tuple[str, int], ...]


def estimate_forward_memory(gm: fx.GraphModule) -> MemoryEstimate:
    """An inference (or lone forward) graph: every output is held by the caller."""
    sim = _Simulation()
    sim.add_placeholders(_placeholders(gm), caller_owned=True)
    sim.add_steps("fw", _compute_nodes(gm))
    sim.hold_to_end(_output_nodes(gm))
    return sim.result(saved=())


def estimate_step_memory(fw_gm: fx.GraphModule, bw_gm: fx.GraphModule, *,
                         codegen: Codegen | str = "fx") -> MemoryEstimate:
    """A training step: the partitioned forward, then the backward. ``codegen="inductor"``:
    as Inductor's generated code runs them (:func:`inductor_buffers`), not node by node."""
    codegen = as_codegen(codegen)
    saved_phs = [p for p in _placeholders(bw_gm) if not _is_tangent(p)]
    tangents = [p for p in _placeholders(bw_gm) if _is_tangent(p)]
    fw_outputs = _output_nodes(fw_gm)
    saved_src = _match_saved(saved_phs, fw_outputs)
    saved_set = set(saved_src.values())

    sim = _Simulation()
    if codegen.models_fused_buffers:
        for gm in (fw_gm, bw_gm):
            fused, reuses = inductor_buffers(gm)
            sim.unallocated |= fused
            sim.reuse.update(reuses)
    sim.add_placeholders(_placeholders(fw_gm), caller_owned=True)
    sim.add_steps("fw", _compute_nodes(fw_gm))
    sim.hold_to_end([n for n in fw_outputs if n not in saved_set])
    bw_start = len(sim.steps)
    for ph, src in saved_src.items():
        sim.alias(ph, src, alive_at=bw_start)  # dies at its last backward use
    sim.add_steps("bw", tangents + _compute_nodes(bw_gm))
    sim.hold_to_end(_output_nodes(bw_gm) + _root_gradients(tangents))
    return sim.result(saved=list(saved_src.values()))


def estimate_partitioned_memory(joint_gm: fx.GraphModule, num_fwd_outputs: int, *,
                                codegen: Codegen | str = "fx",
                                recompute: Iterable[str] = ()) -> MemoryEstimate:
    """The step a joint graph compiles to: a copy of it partitioned as fxopt's compiler
    partitions it (AOTAutograd's default partitioner for fx code generation, Inductor's
    for ``codegen="inductor"``; both read the recompute tags a plan put on the graph),
    then :func:`estimate_step_memory` of the two graphs. This is the simulation explain
    reports once the step is compiled, so a plan evaluated with it predicts what explain
    shows. ``recompute``: names of nodes tagged ``MUST_RECOMPUTE`` on the copy (a plan
    not applied yet). The graph itself is not changed."""
    copy = fx.GraphModule(joint_gm, _compat.copy_graph(joint_gm.graph))
    by_name = {n.name: n for n in copy.graph.nodes}
    for name in recompute:
        by_name[name].meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
    codegen = as_codegen(codegen)
    forward, backward = codegen.partitioner(copy, None, num_fwd_outputs=num_fwd_outputs)
    return estimate_step_memory(forward, backward, codegen=codegen)


def estimate_joint_memory(joint_gm: fx.GraphModule, num_fwd_outputs: int) -> MemoryEstimate:
    """The joint graph, run as the default partition would: the forward region first, then
    the backward region. A forward value is saved when a backward node uses it.

    The regions are the default partitioner's: AOTAutograd tags each joint node
    ``partitioner_tag`` ``is_forward``, ``is_backward`` or ``must_be_in_forward`` (a
    buffer's ``copy_``), and the partitioner places it by its tag. A backward node that reads
    no tangent (``rsqrt(v) ** 3`` in RMSNorm's gradient) is tagged ``is_backward`` and
    computed in the backward from the saved input; counting it as saved overstated Llama's
    plain saved bytes by 11%. Untagged nodes (graphs built by hand) are backward when they
    depend on a tangent."""
    phs = _placeholders(joint_gm)
    tangents = [p for p in phs if _is_tangent(p)]
    backward: set[fx.Node] = set(tangents)
    for node in joint_gm.graph.nodes:
        if node.op != "output" and (node.meta.get("partitioner_tag") == "is_backward" or any(
                i in backward for i in node.all_input_nodes)):
            backward.add(node)
    compute = _compute_nodes(joint_gm)
    fw_nodes = [n for n in compute if n not in backward]
    bw_nodes = [n for n in compute if n in backward]
    saved = [n for n in fw_nodes if any(u in backward for u in n.users)]
    returned = next(n for n in reversed(joint_gm.graph.nodes) if n.op == "output").args[0]
    if not isinstance(returned, (tuple, list)) or len(returned) < num_fwd_outputs:
        raise ValueError(f"joint graph does not return num_fwd_outputs={num_fwd_outputs} "
                         "forward outputs before its gradients")
    outputs = _output_nodes(joint_gm)

    sim = _Simulation()
    sim.add_placeholders([p for p in phs if not _is_tangent(p)], caller_owned=True)
    sim.add_steps("fw", fw_nodes)
    sim.add_steps("bw", tangents + bw_nodes)
    # The first num_fwd_outputs outputs (held by the caller) and the gradients after them
    # (held as .grad) both live to the end of the step, so they need no distinction here;
    # so does the root gradient of a scalar loss.
    sim.hold_to_end(outputs + _root_gradients(tangents))
    return sim.result(saved=saved)


def _root_gradients(tangents: list[fx.Node]) -> list[fx.Node]:
    """The tangents ``torch.autograd.backward`` holds to the end of the backward: a scalar
    output's (the loss's root gradient; see the module doc)."""
    return [t for t in tangents
            if isinstance(t.meta.get("val"), torch.Tensor) and t.meta["val"].dim() == 0]


# Inductor inlines a pointwise value into the kernels that read it unless this many read it
# (``torch._inductor.config.realize_reads_threshold``).
_INDUCTOR_REALIZE_READS = 4


def inductor_buffers(gm: fx.GraphModule) -> tuple[set[fx.Node], dict[fx.Node, fx.Node]]:
    """How Inductor's generated code holds a graph's values, from the graph alone.

    Returns (fused, reuses). *fused*: values Inductor computes inside the kernels that read
    them and never stores: a pointwise op or Inductor's seeded random numbers (and the
    views of them) whose every reader is a kernel Inductor generates (pointwise,
    reduction, copies, indexing; not a matmul, convolution, attention, a custom op or the
    graph's output), read by fewer than :data:`_INDUCTOR_REALIZE_READS` kernels.
    *reuses*: value -> the input whose storage its kernel writes in place (Inductor's
    in-place buffer reuse): a generated kernel's output takes the storage of an input of
    the same size that is not a graph input or output and dies at that kernel (neither it
    nor a view of it is read after it).

    Not modelled: the order Inductor's scheduler gives its fused kernels (fusion groups,
    ``reorder_for_peak_memory``), which can hold a buffer longer or shorter than the
    graph's order does; with recompute plans the measured peak was found both below and
    above this prediction, which is why a byte plan under Inductor keeps
    :attr:`fxopt.codegen.Codegen.peak_margin` of its bound free
    (benchmarks/results/inductor_budgets_cpu.md)."""
    nodes = list(gm.graph.nodes)
    position = {n: i for i, n in enumerate(nodes)}
    outputs = set(_output_nodes(gm))
    fused: set[fx.Node] = set()
    for node in reversed(nodes):
        if node in outputs or node.op != "call_function" or not node.users:
            continue
        if _is_view(node):
            if all(_generated(u) or u in fused for u in node.users) and all(
                    u not in outputs for u in node.users):
                fused.add(node)
            continue
        if (_inlined(node)
                and all(_generated(u) or (u in fused and _is_view(u)) for u in node.users)
                and len(node.users) < _INDUCTOR_REALIZE_READS):
            fused.add(node)
    read_at: dict[fx.Node, int] = {}   # the last kernel that reads a value or a view of it
    for node in reversed(nodes):
        read_at[node] = max((read_at[u] if u in fused or _is_view(u) else position[u]
                             for u in node.users), default=position[node])
    reuses: dict[fx.Node, fx.Node] = {}
    taken: set[fx.Node] = set()
    for node in nodes:
        if node in fused or not _generated(node) or _is_view(node) \
                or not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        size = storage_nbytes(node.meta["val"])
        for source in _kernel_inputs(node, fused):
            val = source.meta.get("val")
            if (source.op == "call_function" and source not in outputs and source not in taken
                    and not _is_view(source) and isinstance(val, torch.Tensor)
                    and storage_nbytes(val) == size and read_at[source] == position[node]):
                reuses[node] = source
                taken.add(source)
                break
    return fused, reuses


def _inlined(node: fx.Node) -> bool:
    """A value Inductor can compute inside the kernel that reads it: a pointwise op, or the
    random numbers of its seeded RNG (dropout's mask under Inductor)."""
    return (torch.Tag.pointwise in getattr(node.target, "tags", ())
            or str(node.target) == "prims.inductor_random.default")


def _is_view(node: fx.Node) -> bool:
    return node.op == "call_function" and is_view_op(node.target)


def _generated(node: fx.Node) -> bool:
    """A node Inductor lowers into a generated kernel (not an extern call or the output)."""
    if node.op != "call_function" or _is_view(node):
        return False
    if getattr(node.target, "namespace", None) not in ("aten", "prims"):
        return False
    return node_cost(node).kind not in ("matmul", "conv", "attention")


def _kernel_inputs(node: fx.Node, fused: set[fx.Node]) -> list[fx.Node]:
    """The stored values a node's kernel reads: its inputs, through the fused ones."""
    found: dict[fx.Node, None] = {}
    todo = list(node.all_input_nodes)
    while todo:
        n = todo.pop()
        if n in fused:
            todo.extend(n.all_input_nodes)
        else:
            found.setdefault(n)
    return list(found)


class _Simulation:
    """Storages as ints; each node's value as a tree of storage ids (None for non-tensors)
    mirroring ``meta["val"]``. A storage lives from the step that allocates it to the last
    step at which any value referencing it is still needed."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.birth: list[int] = []
        self.caller_owned: set[int] = set()
        self.trees: dict[fx.Node, Any] = {}
        self.steps: list[tuple[str, fx.Node]] = []
        self.step_of: dict[fx.Node, int] = {}
        self.extra_death: dict[fx.Node, int] = {}   # value -> held at least to this step
        self.held: list[fx.Node] = []
        self.unallocated: set[fx.Node] = set()      # values that never get a storage
        self.reuse: dict[fx.Node, fx.Node] = {}     # value -> the input whose storage it takes
        self.workspace: dict[int, int] = {}         # step -> bytes its op holds inside its call

    def add_placeholders(self, nodes: list[fx.Node], *, caller_owned: bool) -> None:
        for n in nodes:
            self.trees[n] = self._fresh(n.meta.get("val"), step=-1, caller_owned=caller_owned)

    def alias(self, node: fx.Node, source: fx.Node, *, alive_at: int) -> None:
        self.trees[node] = self.trees[source]
        self.extra_death[node] = alive_at

    def add_steps(self, prefix: str, nodes: list[fx.Node]) -> None:
        for n in nodes:
            index = len(self.steps)
            self.steps.append((f"{prefix}:{n.name}", n))
            self.step_of[n] = index
            self.trees[n] = self._value_tree(n, index)
            if extra := workspace_bytes(n):
                self.workspace[index] = extra
            if (held := held_bytes(n)) and isinstance(self.trees[n], tuple):
                self.sizes[self.trees[n][-1]] += held  # on the handle (workspace module doc)

    def hold_to_end(self, nodes: list[fx.Node]) -> None:
        self.held.extend(nodes)

    def result(self, *, saved: list[fx.Node] | tuple[()]) -> MemoryEstimate:
        end = len(self.steps)
        # A value computed inside its readers' kernels: its inputs are read there.
        read: dict[fx.Node, int] = {}
        for node in sorted(self.unallocated, key=self.step_of.__getitem__, reverse=True):
            read[node] = max((read.get(u, self.step_of.get(u, -1)) for u in node.users),
                             default=-1)
            for i in node.all_input_nodes:
                self.extra_death[i] = max(self.extra_death.get(i, -1), read[node])
        death = list(self.birth)  # a storage nobody uses dies where it was born
        for node, tree in self.trees.items():
            last = max([self.step_of.get(node, -1), self.extra_death.get(node, -1)]
                       + [self.step_of[u] for u in node.users if u in self.step_of])
            for sid in _leaves(tree):
                death[sid] = max(death[sid], last)
        for node in self.held:
            for sid in _leaves(self.trees[node]):
                death[sid] = end
        baseline = sum(self.sizes[s] for s in self.caller_owned)
        delta = [0] * (end + 2)
        for sid, size in enumerate(self.sizes):
            if sid not in self.caller_owned:
                delta[self.birth[sid]] += size
                delta[death[sid] + 1] -= size
        timeline, live = [], baseline
        for i, (label, _) in enumerate(self.steps):
            live += delta[i]
            timeline.append((label, live + self.workspace.get(i, 0)))
        peak_node, peak = max(timeline, key=lambda t: t[1], default=("", baseline))
        activations = {s for n in saved for s in _leaves(self.trees[n])} - self.caller_owned
        estimate = MemoryEstimate(
            peak_bytes=peak, activation_bytes=sum(self.sizes[s] for s in activations),
            baseline_bytes=baseline, peak_node=peak_node, timeline=tuple(timeline))
        log.debug("memory estimate: peak %d at %s, activations %d, baseline %d",
                  estimate.peak_bytes, peak_node, estimate.activation_bytes, baseline)
        return estimate

    def _fresh(self, val: Any, *, step: int, caller_owned: bool = False) -> Any:
        if isinstance(val, (tuple, list)):
            return tuple(self._fresh(v, step=step, caller_owned=caller_owned) for v in val)
        if not isinstance(val, torch.Tensor):
            return None
        self.sizes.append(storage_nbytes(val))
        self.birth.append(step)
        sid = len(self.sizes) - 1
        if caller_owned:
            self.caller_owned.add(sid)
        return sid

    def _value_tree(self, node: fx.Node, step: int) -> Any:
        val = node.meta.get("val")
        if node in self.unallocated:
            return None
        if node in self.reuse and isinstance(self.trees.get(self.reuse[node]), int):
            return self.trees[self.reuse[node]]
        if node.op == "call_function" and node.target is operator.getitem:
            parent = self.trees.get(node.args[0])
            if isinstance(parent, tuple):
                return parent[node.args[1]]
        sources = return_aliases(node)
        if sources:
            vals = val if len(sources) > 1 and isinstance(val, (tuple, list)) else (val,)
            trees = []
            for source, v in zip(sources, vals):
                base = self._tree_of(source)
                if source is None or base is None:
                    trees.append(self._fresh(v, step=step))
                elif isinstance(v, (tuple, list)):
                    trees.append(tuple(base for _ in v))  # split's Tensor(a)[]: all are base
                else:
                    trees.append(base)
            return tuple(trees) if len(sources) > 1 else trees[0]
        return self._fresh(val, step=step)

    def _tree_of(self, arg: Any) -> Any:
        if isinstance(arg, fx.Node):
            return self.trees.get(arg)
        return None


def _leaves(tree: Any) -> list[int]:
    if isinstance(tree, tuple):
        return [s for t in tree for s in _leaves(t)]
    return [] if tree is None else [tree]


def _is_tangent(node: fx.Node) -> bool:
    return node.op == "placeholder" and node.name.startswith("tangents")


def _placeholders(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _compute_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_module",
                                                  "call_method", "get_attr")]


def _output_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    """The nodes the graph returns, in order (None outputs skipped)."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    result: list[fx.Node] = []
    fx.node.map_arg(out.args[0], lambda n: result.append(n) or n)
    return result


def _match_saved(saved_phs: list[fx.Node], fw_outputs: list[fx.Node]) -> dict[fx.Node, fx.Node]:
    """Backward placeholder -> the forward output it receives. By name first (the
    partitioner names a saved placeholder after the forward node); else positionally: the
    forward's trailing outputs are the saved tensors then the saved SymInts, while the
    backward lists the SymInts first."""
    by_name = {n.name: n for n in fw_outputs}
    if all(p.name in by_name for p in saved_phs):
        return {p: by_name[p.name] for p in saved_phs}
    log.debug("saved values matched by position: backward placeholder names differ")
    trailing = fw_outputs[len(fw_outputs) - len(saved_phs):] if saved_phs else []
    if len(trailing) != len(saved_phs):
        raise ValueError(f"backward expects {len(saved_phs)} saved values, forward returns "
                         f"{len(fw_outputs)} outputs")

    def is_tensor(n: fx.Node) -> bool:
        return isinstance(n.meta.get("val"), torch.Tensor)

    tensors = iter([n for n in trailing if is_tensor(n)])
    others = iter([n for n in trailing if not is_tensor(n)])
    return {p: next(tensors) if is_tensor(p) else next(others) for p in saved_phs}
