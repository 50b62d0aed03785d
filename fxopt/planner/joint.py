"""Build the saved-activation decision problem (:class:`fxopt.planner.ActivationProblem`)
from AOTAutograd's joint graph: the one builder (:func:`step_problem`), used by the
``swap_recompute`` pass (which then applies the plan) and by ``fxopt plan``.

The timeline and the live bytes with everything kept are the memory simulation's
(:func:`fxopt.analysis.estimate_joint_memory`): forward nodes, then tangents and backward
nodes. A *saved* tensor is a forward node that a backward node reads. Each saved tensor that
owns its memory gets one :class:`~fxopt.planner.SavedActivation`; its bytes are those of the
storage it lives in (a view's base); saved tensors that share one storage (``tanh`` and
the ``detach`` of it that ``tanh_backward`` reads) form one activation, named after the
first, recomputed together and swapped only when it is a single tensor. Saved tensors are
left out (always kept) when freeing them could not free memory:

- they alias a placeholder (parameters, inputs: caller-owned);
- a forward output shares their storage (held by the caller to the end of the step).

Choices, each with a window of timeline steps during which the bytes are not resident:

- ``recompute``: the chain of forward nodes that rebuilds the tensor from placeholders and
  other saved tensors, which it ``requires`` (kept). Stopping at every saved tensor keeps
  the window exact: the partitioner rebuilds a recomputed node once, at its first backward
  use, so a chain through another recomputed tensor would rebuild that one early (measured
  on a 3-layer MLP: the partitioned step's peak then exceeded the plan's by 5%). Random
  ops (dropout) are never recomputed: their outputs are saved, so a chain reads them.
  Window: from after the last forward use of the storage to its first backward use.
  Seconds: the chain's roofline time.
- ``swap`` (on CUDA, or when forced): the offload copy runs from the last forward use and
  the bytes are free once compute of the following forward steps has covered the copy
  time (the offload's finish waits there for the copy, at the forward's end at the latest,
  under either code generator); the prefetch is issued as many backward steps ahead of the
  first use as it takes compute to cover the copy (never before the backward starts).
  Seconds: the copy time that compute does not hide, both ways. A tensor must be dense and
  fill its storage to be swapped.

Step times are rooflines of :func:`fxopt.analysis.node_cost` on a
:class:`fxopt.planner.HardwareProfile`. On a forced swap on a CPU device (no host-device
link) copies are timed at the profile's memory bandwidth.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.fx as fx

from fxopt.analysis.cost import node_cost, storage_root
from fxopt.analysis.memory import (
    MemoryEstimate,
    estimate_joint_memory,
    estimate_partitioned_memory,
)
from fxopt.analysis.shapes import nbytes, storage_nbytes, tensor_values
from fxopt.codegen import Codegen, as_codegen
from fxopt.planner.activations import (
    ActivationChoice,
    ActivationProblem,
    SavedActivation,
)
from fxopt.planner.hardware import HardwareProfile
from fxopt.planner.plan import graph_fingerprint
from fxopt.planner.solvers.fraction import RecomputeOption, SavedBytesProblem, rng_state_bytes
from fxopt.planner.step import StepProblem

__all__ = ["RECOMPUTABLE_CUSTOM_OPS", "JointAnalysis", "activation_placeholders",
           "analyse_joint", "build_problem",
           "group_chain", "is_random", "recomputable", "recompute_chain",
           "saved_bytes_problem", "step_problem"]


@dataclass
class JointAnalysis:
    """What the pass needs from the joint graph to build a problem and to apply a decision."""

    estimate: MemoryEstimate
    step_of: dict[fx.Node, int]        # executed node -> timeline step
    bw_start: int                      # first backward step
    saved: list[fx.Node]               # every saved forward node, graph order
    candidates: dict[str, list[fx.Node]]  # name -> the saved nodes of one storage
    group_of: dict[fx.Node, str]       # saved node -> its candidate's name
    base: dict[fx.Node, fx.Node]       # node -> the node owning its storage
    aliases: dict[fx.Node, list[fx.Node]]  # storage-owning node -> nodes viewing it
    step_seconds: list[float]


def is_random(node: fx.Node) -> bool:
    """A node whose values come from the RNG (or a getitem of one)."""
    if node.op == "call_function" and node.target is operator.getitem:
        return is_random(node.args[0])
    tags = getattr(node.target, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


# fxopt's own ops that run at the joint stage (tempo's and fuse_rnn's forwards): pure
# functions of their inputs, so a recompute calls them again, like an aten op. Their
# random one (tempo's softmax-dropout) is recomputed only where random ops are (below).
# fuse_elementwise's fused kernels run after the partition and never meet a recompute.
RECOMPUTABLE_CUSTOM_OPS = frozenset({
    "fxopt::tempo_gelu", "fxopt::tempo_layer_norm", "fxopt::tempo_rms_norm",
    "fxopt::tempo_layer_norm_cast", "fxopt::tempo_rms_norm_cast",
    "fxopt::tempo_softmax_dropout_matmul", "fxopt::lstm_cell", "fxopt::gru_cell",
    "fxopt::lstm_sequence", "fxopt::gru_sequence"})


# Namespaces whose functional (non-mutating) ops a recompute may run again: aten, and the
# prims Inductor's decompositions leave in its joint graph (``prims.convert_element_type``
# is how a decomposed ``logits.float()`` reads: a chain that stopped there kept its fp32
# copy, and a loss graph's floor was its plain bytes).
_FUNCTIONAL_NAMESPACES = frozenset({"aten", "prims"})


def recomputable(node: fx.Node, *, random_ok: bool = False) -> bool:
    """Whether a recompute may rebuild ``node`` by running it again: a functional aten or
    prims op or one of :data:`RECOMPUTABLE_CUSTOM_OPS`; a random one only with ``random_ok`` (the
    partitioner then replays its forward's RNG state, see :mod:`fxopt.planner.solvers.fraction`)."""
    if node.op != "call_function" or (is_random(node) and not random_ok):
        return False
    if node.target is operator.getitem:
        return (recomputable(node.args[0], random_ok=random_ok)
                if isinstance(node.args[0], fx.Node) else False)
    schema = getattr(node.target, "_schema", None)
    if schema is None or schema.is_mutable:
        return False
    return (getattr(node.target, "namespace", "") in _FUNCTIONAL_NAMESPACES
            or schema.name in RECOMPUTABLE_CUSTOM_OPS)


def recompute_chain(node: fx.Node, stop: set[fx.Node], *, random_ok: bool = False,
                    frontier: bool = False) -> tuple[list[fx.Node], set[fx.Node]]:
    """Nodes that rebuild ``node``, walking back until placeholders or ``stop`` nodes.

    Returns (chain, inputs it reads from ``stop``). A node it may not recompute (random
    unless ``random_ok``, mutating, not aten nor a recomputable fxopt op) that is not in
    ``stop`` raises ValueError, or with ``frontier`` ends the walk there like a ``stop``
    node (it is then among the inputs returned: the partitioner saves it).
    """
    chain: list[fx.Node] = []
    reads: set[fx.Node] = set()
    seen: set[fx.Node] = set()
    todo = [node]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder":
            continue
        if n is not node and n in stop:
            reads.add(n)
            continue
        if not recomputable(n, random_ok=random_ok):
            if frontier and n is not node:
                reads.add(n)
                continue
            raise ValueError(f"{n.name} ({n.target}) cannot be recomputed")
        chain.append(n)
        todo.extend(n.all_input_nodes)
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    return sorted(chain, key=order.__getitem__), reads


def analyse_joint(gm: fx.GraphModule, num_fwd_outputs: int,
                  profile: HardwareProfile) -> JointAnalysis:
    estimate = estimate_joint_memory(gm, num_fwd_outputs)
    by_name = {n.name: n for n in gm.graph.nodes}
    step_of = {by_name[label.split(":", 1)[1]]: i
               for i, (label, _) in enumerate(estimate.timeline)}
    bw_start = next((i for i, (label, _) in enumerate(estimate.timeline)
                     if label.startswith("bw:")), len(estimate.timeline))
    forward = {n for n, s in step_of.items() if s < bw_start}
    saved = [n for n in gm.graph.nodes if n in forward and n.op != "placeholder"
             and isinstance(n.meta.get("val"), torch.Tensor)
             and any(u in step_of and step_of[u] >= bw_start for u in n.users)]
    base = {n: storage_root(n) for n in gm.graph.nodes}
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    held = {base[n] for n in output.all_input_nodes}
    aliases: dict[fx.Node, list[fx.Node]] = {}
    for n, b in base.items():
        aliases.setdefault(b, []).append(n)
    by_base: dict[fx.Node, list[fx.Node]] = {}
    for n in saved:
        by_base.setdefault(base[n], []).append(n)
    candidates = {group[0].name: group for b, group in by_base.items()
                  if b.op != "placeholder" and b not in held}
    group_of = {n: name for name, group in candidates.items() for n in group}
    step_seconds = [0.0] * len(estimate.timeline)
    for n, s in step_of.items():
        if n.op == "call_function" and tensor_values(n):  # not SymInt arithmetic
            cost = node_cost(n)
            val = n.meta.get("val")
            dtype = val.dtype if isinstance(val, torch.Tensor) else torch.float32
            step_seconds[s] = profile.node_seconds(
                cost.flops, cost.bytes_read + cost.bytes_written, dtype,
                transcendental=cost.transcendental, random=cost.random)
    return JointAnalysis(estimate, step_of, bw_start, saved, candidates, group_of, base,
                         aliases, step_seconds)


def _last_forward_use(a: JointAnalysis, node: fx.Node) -> int:
    aliases = a.aliases[a.base[node]]
    steps = [a.step_of[n] for n in aliases if n in a.step_of and a.step_of[n] < a.bw_start]
    steps += [a.step_of[u] for n in aliases for u in n.users
              if u in a.step_of and a.step_of[u] < a.bw_start]
    return max(steps)


def _first_backward_use(a: JointAnalysis, group: list[fx.Node]) -> int:
    return min(a.step_of[u] for node in group for u in node.users
               if u in a.step_of and a.step_of[u] >= a.bw_start)


def group_chain(a: JointAnalysis, name: str, *, random_ok: bool = False,
                frontier: bool = False) -> tuple[list[fx.Node], set[fx.Node]]:
    """The recompute chain of a candidate (all its saved nodes) and the other saved
    nodes it reads; ValueError when it cannot be recomputed (``recompute_chain``'s
    ``random_ok`` and ``frontier``). With ``frontier`` the walk also stops at the storage
    owners of other saved tensors (a view is saved, its base is not): tagging the base
    would rebuild a storage the plan keeps. A walk whose frontier is the candidate's own
    storage (a ``detach`` or view of an output that cannot be recomputed, as a custom op's
    autograd saves its outputs) frees nothing: ValueError, as for any candidate that cannot
    be recomputed (such a chain once counted the storage freed, and a budget's plan
    predicted bytes it kept)."""
    group = a.candidates[name]
    stop = set(a.saved) - set(group)
    own = {a.base[n] for n in group}
    if frontier:
        stop |= {a.base[n] for n in a.saved} - own
    chain: dict[fx.Node, None] = {}
    reads: set[fx.Node] = set()
    for node in group:
        nodes, read = recompute_chain(node, stop, random_ok=random_ok, frontier=frontier)
        chain.update(dict.fromkeys(nodes))
        reads |= read
    if own & {a.base.get(r, r) for r in reads}:
        raise ValueError(f"{name} is a view of a value that cannot be recomputed")
    order = {n: i for i, n in enumerate(group[0].graph.nodes)}
    return sorted(chain, key=order.__getitem__), reads


def _chains(a: JointAnalysis) -> dict[str, tuple[list[fx.Node], set[fx.Node]]]:
    """Each candidate's recompute chain and the saved values it reads (no entry: it cannot
    be recomputed)."""
    chains = {}
    for name in a.candidates:
        try:
            chains[name] = group_chain(a, name)
        except ValueError:
            continue
    return chains


def _recompute_choice(a: JointAnalysis, chain: list[fx.Node], reads: set[fx.Node],
                      last_fw: int, end: int) -> ActivationChoice | None:
    if end <= last_fw + 1:
        return None
    seconds = sum(a.step_seconds[a.step_of[n]] for n in chain if n in a.step_of)
    requires = tuple(sorted({a.group_of[n] for n in reads if n in a.group_of}))
    return ActivationChoice("recompute", (last_fw + 1, end), seconds, requires)


def _swap_choice(a: JointAnalysis, node: fx.Node, size: int, last_fw: int, first_bw: int,
                 profile: HardwareProfile) -> ActivationChoice | None:
    val = node.meta["val"]
    dense = val.is_contiguous() or (
        val.dim() == 4 and val.is_contiguous(memory_format=torch.channels_last))
    if not dense or nbytes(val) != size:
        return None
    copy = profile.copy_seconds(size)
    if copy is None:  # forced on a device without a host link: a memory-speed copy
        copy = size / profile.memory_bandwidth
    steps = len(a.step_seconds)
    start, hidden_out = last_fw + 1, 0.0
    while hidden_out < copy and start < min(steps, a.bw_start):
        hidden_out += a.step_seconds[start]
        start += 1
    end, hidden_in = first_bw, 0.0
    while hidden_in < copy and end > a.bw_start:
        end -= 1
        hidden_in += a.step_seconds[end]
    if start >= end:
        return None
    seconds = max(0.0, copy - hidden_out) + max(0.0, copy - hidden_in)
    return ActivationChoice("swap", (start, end), seconds, copy_seconds=copy,
                            offload_step=last_fw + 1, use_step=first_bw)


def build_problem(a: JointAnalysis, budget_bytes: int, profile: HardwareProfile, *,
                  recompute: bool = True, swap: bool = False) -> ActivationProblem:
    """The decision problem: one SavedActivation per candidate, with the allowed choices."""
    chains = _chains(a) if recompute else {}
    activations = []
    for name, group in a.candidates.items():
        node = group[0]
        size = storage_nbytes(a.base[node].meta["val"])
        last_fw, first_bw = _last_forward_use(a, node), _first_backward_use(a, group)
        choices = []
        if name in chains and (c := _recompute_choice(a, *chains[name], last_fw, first_bw)):
            choices.append(c)
        if swap and len(group) == 1 and (
                c := _swap_choice(a, node, size, last_fw, first_bw, profile)):
            choices.append(c)
        activations.append(SavedActivation(name, size, tuple(choices)))
    return ActivationProblem(
        live_bytes=tuple(b for _, b in a.estimate.timeline), activations=tuple(activations),
        budget_bytes=budget_bytes, labels=tuple(label for label, _ in a.estimate.timeline),
        step_seconds=tuple(a.step_seconds))


def activation_placeholders(gm: fx.GraphModule, positions: tuple[int, ...],
                            num_inputs: int) -> frozenset[str]:
    """Names of the joint graph's ``primals_*`` placeholders at ``positions`` of the
    ``num_inputs`` inputs Dynamo gave (AOTAutograd puts the graph module's own parameters
    and buffers first, so the inputs are the last primals). Where AOTAutograd changed
    their number (duplicate inputs merged) none is named: the graph's inputs then stay out
    of the accounting, as the user's."""
    primals = [n for n in gm.graph.find_nodes(op="placeholder")
               if n.name.startswith("primals")]
    offset = len(primals) - num_inputs
    if not positions or offset < 0:
        return frozenset()
    return frozenset(primals[offset + i].name for i in positions)


def step_problem(gm: fx.GraphModule, num_fwd_outputs: int, hardware: HardwareProfile, *,
                 codegen: Codegen | str = "fx", force_swap: bool = False, name: str = "",
                 removed_bytes: int = 0, activation_inputs: frozenset[str] = frozenset()
                 ) -> tuple[JointAnalysis, StepProblem]:
    """The one builder of :func:`fxopt.planner.step.plan_step`'s input from a joint graph,
    for the pass and ``fxopt plan`` alike: recompute choices (none under ``force_swap``),
    swap choices on CUDA or under ``force_swap``, random
    ops recomputed with their RNG state replayed (both partitioners replay a tagged random
    op: torch's ``functionalize_rng_ops``). ``removed_bytes``: plain autograd's saved bytes
    that rewrites before autograd took out of the graph (a fraction's base keeps them);
    ``activation_inputs``: placeholders that are activations (:func:`saved_bytes_problem`)."""
    codegen = as_codegen(codegen)
    analysis = analyse_joint(gm, num_fwd_outputs, hardware)
    estimate = analysis.estimate
    activations = build_problem(analysis, estimate.peak_bytes, hardware,
                                recompute=not force_swap,
                                swap=hardware.device_type == "cuda" or force_swap)
    saved = dataclasses.replace(
        saved_bytes_problem(analysis, random_ok=True,
                            rng_state_bytes=rng_state_bytes(hardware.device_type),
                            activation_inputs=activation_inputs),
        removed_bytes=removed_bytes)
    return analysis, StepProblem(
        graph=name, fingerprint=tuple(graph_fingerprint(gm)), activations=activations,
        saved_bytes=saved, keep_all_peak_bytes=estimate.peak_bytes,
        baseline_bytes=estimate.baseline_bytes, activation_bytes=estimate.activation_bytes,
        step_seconds=sum(analysis.step_seconds), fraction_bounds_peak=force_swap,
        peak_margin=codegen.peak_margin, codegen=codegen.name,
        held_output_bytes=held_output_bytes(gm, num_fwd_outputs),
        simulate=None if force_swap else _simulator(gm, analysis, num_fwd_outputs, codegen),
        # a fraction under Inductor is partitioned by BudgetedMinCut, which predicts each
        # partition's peak itself: its min-cut simulations would cost seconds each here
        simulate_tagged=None if force_swap or codegen.partitions_by_min_cut
        else _tagged_simulator(gm, num_fwd_outputs, codegen))


def held_output_bytes(gm: fx.GraphModule, num_fwd_outputs: int) -> int:
    """Bytes of the storages the joint graph's forward outputs live in, the caller's inputs'
    left out (a mutated input's new value, an output that is a view of an input)."""
    outputs = next(iter(gm.graph.find_nodes(op="output"))).args[0][:num_fwd_outputs]
    roots = {storage_root(n) for n in outputs if isinstance(n, fx.Node)}
    return sum(storage_nbytes(root.meta.get("val")) for root in roots
               if root.op != "placeholder")


def _simulator(gm: fx.GraphModule, analysis: JointAnalysis, num_fwd_outputs: int,
               codegen: Codegen) -> Callable[[Mapping[str, str]], int]:
    """Actions -> the peak of the step they compile to: their recompute chains' nodes
    simulated by :func:`_tagged_simulator`."""
    simulate_tagged = _tagged_simulator(gm, num_fwd_outputs, codegen)

    def simulate(actions: Mapping[str, str]) -> int:
        return simulate_tagged([n.name for name in actions
                                for n in group_chain(analysis, name)[0]])
    return simulate


def _tagged_simulator(gm: fx.GraphModule, num_fwd_outputs: int, codegen: Codegen
                      ) -> Callable[[Sequence[str]], int]:
    """Names of nodes to tag ``MUST_RECOMPUTE`` (a fraction plan's chains) -> the peak of
    the step they compile to: a copy of ``gm`` with them tagged, partitioned as the
    compiler will and simulated (:func:`~fxopt.analysis.memory.
    estimate_partitioned_memory`, what explain shows)."""
    def simulate(tagged: Sequence[str]) -> int:
        return estimate_partitioned_memory(gm, num_fwd_outputs, codegen=codegen,
                                           recompute=tagged).peak_bytes
    return simulate


def saved_bytes_problem(a: JointAnalysis, *, random_ok: bool, rng_state_bytes: int,
                        activation_inputs: frozenset[str] = frozenset()) -> SavedBytesProblem:
    """The fraction budget's problem (:mod:`fxopt.planner.solvers.fraction`): per saved tensor its
    storage and, where it can be recomputed, its one-level chain and stops. ``random_ok``:
    random ops may be recomputed (replaying their RNG state, ``rng_state_bytes`` kept per
    random op).

    ``activation_inputs``: placeholders that are activations, another graph's outputs
    across a graph break (:data:`fxopt.passes.base.ACTIVATION_INPUTS`). Such an input is
    kept for backward like any activation when a saved tensor is it or views it (counted
    in the plain bytes and in every plan's), and it is a stop of every chain that reads it
    (a recompute from it keeps it). Other placeholders (parameters, buffers, the user's
    inputs) are the caller's and never counted."""
    sizes: dict[str, int] = {}

    def key(node: fx.Node) -> str:
        base = a.base[node]
        sizes.setdefault(base.name, storage_nbytes(base.meta["val"]))
        return base.name

    def counted(node: fx.Node) -> bool:  # a storage the fraction counts when it is kept
        return a.base[node].op != "placeholder" or a.base[node].name in activation_inputs

    saved = set(a.saved)
    kept_storages = {a.base[n] for n in a.saved}
    always = {key(n) for n in a.saved if n not in a.group_of and counted(n)}
    groups: list[tuple[list[str], set[fx.Node], set[str]]] = []  # names, chain, stops
    seconds: dict[str, float] = {}
    for name, group in a.candidates.items():
        try:
            chain, reads = group_chain(a, name, random_ok=random_ok, frontier=True)
        except ValueError:
            always.add(key(group[0]))
            continue
        stops = {key(r) for r in reads if r not in saved and r not in kept_storages
                 and a.base[r].op != "placeholder"}
        stops |= {key(i) for n in chain for i in n.all_input_nodes
                  if i.op == "placeholder" and i.name in activation_inputs}
        for n in chain:
            seconds[n.name] = a.step_seconds[a.step_of[n]] if n in a.step_of else 0.0
            if is_random(n) and n.target is not operator.getitem:
                sizes[f"rng:{n.name}"] = rng_state_bytes
                stops.add(f"rng:{n.name}")
        # tensors whose chains replay one RNG state (a dropout's output and mask) are
        # recomputed together: one alone would keep the state and free little
        rng = {s for s in stops if s.startswith("rng:")}
        joined = ([name], set(chain), stops)
        for other in [g for g in groups if rng & g[2]]:
            groups.remove(other)
            joined = (other[0] + joined[0], other[1] | joined[1], other[2] | joined[2])
        groups.append(joined)
    options = tuple(RecomputeOption(
        "+".join(names), tuple(key(a.candidates[n][0]) for n in names),
        tuple(sorted(n.name for n in chain)), tuple(sorted(stops)))
        for names, chain, stops in groups)
    return SavedBytesProblem(sizes, tuple(sorted(always)), options, seconds,
                             input_storages=tuple(sorted(activation_inputs & sizes.keys())))
