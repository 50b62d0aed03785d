"""From a joint forward+backward graph to the planner's plain data.

:func:`activation_problem` reads a joint graph (as AOTAutograd hands it to the partitioner)
and builds the :class:`~fxopt.planner.activations.ActivationProblem` the solver decides:
the live bytes per step from the memory simulation (:func:`fxopt.analysis.estimate_joint_memory`,
the same timeline the rest of fxopt predicts), and per saved tensor its choices:

- **recompute**, when the tensor is one deterministic op whose tensor inputs are the
  step's inputs (parameters, user inputs) or other saved tensors, which must then be kept
  (``requires``). Its bytes are free from the step after its last forward use to its first
  backward use; it costs its roofline time on the hardware profile.
- **swap**, on a device with separate memory: the copy to the host starts after the last
  forward use and the prefetch must be back by the first backward use. Compute between
  those steps hides the copies (Mist's overlap-aware cost): the bytes are free from the
  step at which the offload has finished behind compute to the step at which the prefetch
  must start, and the step pays only the copy time that compute in the gap cannot hide.

The unit is a *storage*: saved views (and getitems of split) count as uses of the tensor
they view, named after the node that allocated it. A storage is left out (always kept)
when a value sharing it is a graph output (freeing it would free nothing) or when it has
no choice. This builder is deliberately conservative; the ``swap_recompute`` pass builds a
richer problem from the same graph (recompute chains) and the solver takes either.

:func:`step_seconds` is the roofline time of the whole joint graph on a profile: the
predicted step time with everything kept, which the added seconds of a plan add to.
"""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass

import torch
from torch import fx

from fxopt.analysis.cost import is_view_op, node_cost, return_aliases
from fxopt.analysis.memory import MemoryEstimate, estimate_joint_memory
from fxopt.analysis.shapes import storage_nbytes
from fxopt.planner.activations import ActivationChoice, ActivationProblem, SavedActivation
from fxopt.planner.hardware import HardwareProfile

__all__ = ["JointAnalysis", "activation_problem", "node_seconds", "step_seconds"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JointAnalysis:
    """The problem, with what it was built from: the keep-all memory estimate and the
    step time with everything kept."""

    problem: ActivationProblem
    memory: MemoryEstimate
    step_seconds: float


def node_seconds(node: fx.Node, hardware: HardwareProfile) -> float:
    """Roofline time of one node (0 for placeholders, outputs and views)."""
    if node.op != "call_function":
        return 0.0
    cost = node_cost(node)
    return hardware.compute_seconds(cost.flops, cost.bytes, _dtype(node))


def step_seconds(gm: fx.GraphModule, hardware: HardwareProfile) -> float:
    """Roofline time of every node of ``gm``: the predicted time of one step of it."""
    return sum(node_seconds(n, hardware) for n in gm.graph.nodes)


def activation_problem(joint_gm: fx.GraphModule, num_fwd_outputs: int,
                       hardware: HardwareProfile, budget_bytes: int = 0) -> JointAnalysis:
    """The saved-activation problem of ``joint_gm`` on ``hardware`` (see the module doc)."""
    memory = estimate_joint_memory(joint_gm, num_fwd_outputs)
    labels = tuple(label for label, _ in memory.timeline)
    step_of = {label.split(":", 1)[1]: i for i, label in enumerate(labels)}
    nodes = {n.name: n for n in joint_gm.graph.nodes}
    is_bw = [label.startswith("bw:") for label in labels]
    seconds = [node_seconds(nodes[label.split(":", 1)[1]], hardware) for label in labels]
    prefix = [0.0]
    for s in seconds:
        prefix.append(prefix[-1] + s)

    roots = _storage_roots(joint_gm)
    group: dict[fx.Node, list[fx.Node]] = {}
    for node, root in roots.items():
        group.setdefault(root, []).append(node)
    saved_roots = {roots[nodes[label[3:]]] for label in labels if label.startswith("fw:")
                   and any(is_bw[step_of[u.name]] for u in nodes[label[3:]].users
                           if u.name in step_of)}
    saved_names = {r.name for r in saved_roots}
    outputs = _output_names(joint_gm)
    acts = []
    for root in sorted(saved_roots, key=lambda r: step_of.get(r.name, -1)):
        val = root.meta.get("val")
        members = group[root]
        if (root.name not in step_of or not isinstance(val, torch.Tensor)
                or any(m.name in outputs for m in members)):
            continue  # a step input, a non-tensor, or returned to the caller
        uses = [step_of[u.name] for m in members for u in m.users if u.name in step_of]
        last_fw = max([step_of[root.name], *(t for t in uses if not is_bw[t])])
        first_bw = min(t for t in uses if is_bw[t])
        nbytes = storage_nbytes(val)
        choices = [c for c in (
            _recompute(root, last_fw, first_bw, roots, saved_names, hardware),
            _swap(nbytes, last_fw, first_bw, prefix, hardware)) if c is not None]
        acts.append(SavedActivation(root.name, nbytes, tuple(choices) if nbytes else ()))
    # Keep in the problem the storages with a choice, and those a recompute reads (with no
    # choice: kept); a recompute reading a storage left out (returned) is dropped.
    names = {a.name for a in acts}
    acts = [SavedActivation(a.name, a.nbytes, tuple(
        c for c in a.choices if set(c.requires) <= names)) for a in acts]
    required = {dep for a in acts for c in a.choices for dep in c.requires}
    acts = [a for a in acts if a.choices or a.name in required]
    problem = ActivationProblem(tuple(v for _, v in memory.timeline), tuple(acts),
                                budget_bytes, labels)
    log.debug("activation problem: %d steps, %d of %d saved storages with choices",
              len(labels), len(acts), len(saved_roots))
    return JointAnalysis(problem, memory, prefix[-1])


def _recompute(node: fx.Node, last_fw: int, first_bw: int, roots: dict[fx.Node, fx.Node],
               saved: set[str], hardware: HardwareProfile) -> ActivationChoice | None:
    if node.op != "call_function" or first_bw <= last_fw + 1:
        return None
    target = node.target
    if (not isinstance(target, torch._ops.OpOverload) or target._schema.is_mutable
            or torch.Tag.nondeterministic_seeded in target.tags):
        return None
    requires = []
    for arg in node.all_input_nodes:
        root = roots[arg]
        if root.op == "placeholder" and not root.name.startswith("tangents"):
            continue  # parameters and inputs live through the step
        if root.name not in saved:
            return None  # an input freed after the forward: recomputing it is a chain
        requires.append(root.name)
    return ActivationChoice("recompute", (last_fw + 1, first_bw),
                            node_seconds(node, hardware), tuple(dict.fromkeys(requires)))


def _swap(nbytes: int, last_fw: int, first_bw: int, prefix: list[float],
          hardware: HardwareProfile) -> ActivationChoice | None:
    copy = hardware.copy_seconds(nbytes)
    if copy is None or first_bw <= last_fw + 1:
        return None
    gap = prefix[first_bw] - prefix[last_fw + 1]
    if gap >= 2 * copy:
        # Offload finished at the first step whose start is >= copy seconds into the gap;
        # the prefetch starts at the last step that leaves >= copy seconds before first_bw.
        start = next(t for t in range(last_fw + 1, first_bw + 1)
                     if prefix[t] - prefix[last_fw + 1] >= copy)
        end = next(t for t in range(first_bw, last_fw, -1)
                   if prefix[first_bw] - prefix[t] >= copy)
        return ActivationChoice("swap", (start, end), 0.0) if start < end else None
    # The copies do not fit behind compute: the step waits for what they leave unhidden.
    return ActivationChoice("swap", (last_fw + 1, first_bw), max(0.0, 2 * copy - gap))


def _output_names(gm: fx.GraphModule) -> set[str]:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    names: set[str] = set()
    fx.node.map_arg(out.args[0], lambda n: names.add(n.name) or n)
    return names


def _storage_roots(gm: fx.GraphModule) -> dict[fx.Node, fx.Node]:
    """Each node -> the node whose storage it uses: itself, or for a view (and getitem of
    a view-returning op such as split) the root of the tensor it views."""
    roots: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        source = None
        if node.op == "call_function" and node.target is operator.getitem:
            parent = node.args[0]
            aliases = return_aliases(parent) if isinstance(parent, fx.Node) else []
            source = aliases[0] if len(aliases) == 1 else None
        elif node.op == "call_function" and is_view_op(node.target):
            aliases = return_aliases(node)
            source = aliases[0] if aliases else None
        roots[node] = roots.get(source, node) if isinstance(source, fx.Node) else node
    return roots


def _dtype(node: fx.Node) -> torch.dtype:
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):
        val = next((v for v in val if isinstance(v, torch.Tensor)), None)
    return val.dtype if isinstance(val, torch.Tensor) else torch.float32
