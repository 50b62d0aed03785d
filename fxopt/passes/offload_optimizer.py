"""offload_optimizer: record the gradient-ready order, plan where the optimizer updates, and
announce each gradient where the backward produces it.

The optimizer step is not in the captured graph. In the partitioned backward graph, output
``i`` is the gradient of forward input ``i`` (parameters among them), and the node that
produces it says when it becomes ready. The pass records, in ready order, each gradient's
input position, size and dtype, and the backward's remaining roofline time after it
(``ready_seconds``, on the device's :class:`~fxopt.planner.HardwareProfile`), then runs the
Deep Optimizer States model (:func:`fxopt.optim.plan_offload`) on size-balanced subgroups
and returns the plan as ``stats["plan"]`` (explain and the debug dump show it). On CUDA
the plan takes this host's measured AdamW update rate (:mod:`fxopt.optim.host_rate`) unless
the device's profile is calibrated.

It also puts ``fxopt::grad_ready(grad, graph id, input)`` right after each gradient's
producing node (:mod:`fxopt.optim.grad_ready`): a compiled backward hands its gradients to
autograd only when it ends, so without these calls an offloaded optimizer could start no
gradient's copy to the host before the whole graph's backward had run, and the overlap the
plan's ``ready_seconds`` count on would not exist. The call does nothing unless an
offloaded optimizer listens. The graph id is ``stats["graph_id"]``.

The runtime, ``fxopt.optim.offload(optimizer, backend, model=model)``, reads these records
to order the optimizer's parameters and to listen (keys here are graph input positions, not
yet parameters: which inputs are parameters is known where the model is). Budget: on a
device with a known capacity, what the predicted step peak leaves of 90% of it; otherwise
none (everything on the device, the fastest placement).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx as fx

from fxopt.analysis.cost import node_cost, storage_root
from fxopt.optim.grad_ready import GRAD_READY, new_graph_id
from fxopt.optim.host_rate import on_this_host
from fxopt.optim.link import DEFAULT_SUBGROUPS
from fxopt.optim.model import ParamInfo, plan_offload, split_subgroups
from fxopt.passes.base import PassContext, PassResult, Verdicts
from fxopt.planner.hardware import HardwareProfile, profile_for

__all__ = ["offload_optimizer", "gradient_outputs"]

log = logging.getLogger(__name__)

# Share of the device's capacity the plan lets the step use (the rest: allocator slack,
# workspaces, fragmentation).
USABLE_CAPACITY = 0.9
ADAM_STATES = 2  # the plan assumes Adam; the runtime re-plans for the actual optimizer


def _node_seconds(node: fx.Node, hardware: HardwareProfile) -> float:
    if node.op != "call_function":
        return 0.0
    try:
        cost = node_cost(node)
    except Exception:  # an op the cost model does not know costs nothing in the prediction
        return 0.0
    return hardware.compute_seconds(cost.flops, cost.bytes_read + cost.bytes_written)


def gradient_outputs(gm: fx.GraphModule, hardware: HardwareProfile) -> list[dict[str, Any]]:
    """The backward's gradient outputs in ready order: input position, numel, dtype, itemsize,
    ready rank, node, and the backward's predicted time left after it is produced."""
    (output,) = gm.graph.find_nodes(op="output")
    values = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    position = {node: i for i, node in enumerate(gm.graph.nodes)}
    after: dict[fx.Node, float] = {}
    remaining = 0.0
    for node in reversed(gm.graph.nodes):
        after[node] = remaining
        remaining += _node_seconds(node, hardware)
    found = []
    for i, value in enumerate(values):
        fake = value.meta.get("val") if isinstance(value, fx.Node) else None
        if not isinstance(fake, torch.Tensor) or not fake.is_floating_point():
            continue
        found.append({"input": i, "numel": fake.numel(), "dtype": str(fake.dtype),
                      "itemsize": fake.element_size(), "node": value.name,
                      "position": position[value], "ready_seconds": after[value]})
    found.sort(key=lambda g: (g["position"], g["input"]))
    for rank, grad in enumerate(found):
        grad["ready"] = rank
    return found


def _announce_gradients(gm: fx.GraphModule, gradients: list[dict[str, Any]],
                        graph_id: int) -> int:
    """Put ``fxopt::grad_ready(grad, graph_id, input)`` right after each gradient's
    producing node; returns how many. A gradient that is, or is a view of, a graph input
    (a tangent passed through) is ready when the backward starts and is not announced:
    declaring a mutation of a graph input would make Inductor copy it back."""
    nodes = {node.name: node for node in gm.graph.nodes}
    announced = 0
    for grad in gradients:
        node = nodes[grad["node"]]
        if storage_root(node).op == "placeholder":
            continue
        with gm.graph.inserting_after(node):
            call = gm.graph.call_function(GRAD_READY,
                                          (node, graph_id, grad["input"]))
        call.meta["val"] = None
        announced += 1
    if announced:
        gm.recompile()
    return announced


def _budget(gm: fx.GraphModule, ctx: PassContext, hardware: HardwareProfile) -> int | None:
    if hardware.memory_capacity is None or hardware.host_device_bandwidth is None:
        return None
    estimate = ctx.estimate_memory(gm)
    if estimate is None:
        return None
    return max(0, int(hardware.memory_capacity * USABLE_CAPACITY) - estimate.peak_bytes)


def offload_optimizer(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    hardware = profile_for(ctx.device)
    gradients = gradient_outputs(gm, hardware)
    if not gradients:
        return PassResult.declined_graph(gm, "no floating-point gradients")
    infos = [ParamInfo(key=g["input"], numel=g["numel"], itemsize=g["itemsize"],
                       ready_seconds=g["ready_seconds"]) for g in gradients]
    subgroups = split_subgroups(infos, DEFAULT_SUBGROUPS)
    host = on_this_host(hardware, torch.optim.AdamW, max(s.numel for s in subgroups))
    plan = plan_offload(subgroups, host, gpu_state_budget_bytes=_budget(gm, ctx, hardware),
                        states_per_param=ADAM_STATES)
    log.info("fxopt: offload_optimizer on %s: %d gradients, %d subgroups, %.0f%% on the CPU, "
             "predicted optimizer step %.3g ms", ctx.graph_name, len(gradients),
             len(plan.subgroups), 100 * plan.cpu_share, plan.predicted_seconds * 1e3)
    graph_id = new_graph_id()
    announced = _announce_gradients(gm, gradients, graph_id)
    verdicts = Verdicts()
    verdicts.match("gradient", count=len(gradients))  # each in the plan's subgroups
    return PassResult(gm, announced > 0, verdicts, {
        "gradients": gradients, "graph_id": graph_id, "announced": announced,
        "subgroups": len(plan.subgroups),
        "cpu_share": round(plan.cpu_share, 3),
        "predicted_ms": round(plan.predicted_seconds * 1e3, 4),
        "host_keeps_up": plan.keeps_up(), "plan": plan.to_dict()})
