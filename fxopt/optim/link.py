"""From what the user has (a plan, a compiled model's backend, a model) to an offload plan.

:func:`offload` is the one entry point. The parameters' gradient-ready order comes from:

1. an :class:`OffloadPlan` (or its ``to_dict()``): used as it is, its keys being indices
   into the optimizer's parameters in ``state_dict`` order;
2. an :class:`fxopt.Backend` that compiled the model with ``offload_optimizer=True``: the
   ``offload_optimizer`` pass recorded, per compiled graph, which backward output each
   gradient is and when it is produced; outputs are matched to parameters through the names
   Dynamo gives its inputs (``l_self_modules_fc1_parameters_weight_`` is ``fc1.weight``), so
   the model is needed as well (``model=``, compiled or not). Graphs' backwards run last
   graph first; parameters no graph recorded (unused, or not matched) come last. The same
   records name the ``fxopt::grad_ready`` calls that announce each gradient
   (:func:`gradient_sources`), which the runtime listens to;
3. a model, or nothing: the optimizer's parameters in reverse order, as DDP assumes (a
   model's last layers get their gradients first).

Then :func:`~fxopt.optim.model.plan_offload` decides with the options given, or the ones the
pass used when none are given.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from fxopt.optim.host_rate import on_this_host
from fxopt.optim.model import OffloadPlan, ParamInfo, plan_offload, split_subgroups
from fxopt.optim.runtime import (
    OffloadedOptimizer,
    check_optimizer,
    counter_bytes,
    states_per_param,
)
from fxopt.planner.hardware import HardwareProfile, profile_for

__all__ = ["offload", "gradient_order", "gradient_sources", "match_graph_inputs"]

log = logging.getLogger(__name__)

DEFAULT_SUBGROUPS = 8


def _dynamo_name(parameter_name: str) -> str:
    """The suffix of Dynamo's placeholder for ``model.<parameter_name>``."""
    *modules, leaf = parameter_name.split(".")
    parts = [f"modules_{m}" for m in modules] + [f"parameters_{leaf}"]
    return re.sub(r"[^0-9a-zA-Z_]", "_", "_".join(parts)).lower() + "_"


def match_graph_inputs(names: list[str], model: torch.nn.Module) -> dict[int, torch.Tensor]:
    """Graph input position -> parameter, by Dynamo's placeholder names (unique matches)."""
    suffixes = {_dynamo_name(n): p for n, p in model.named_parameters()}
    matched: dict[int, torch.Tensor] = {}
    for position, name in enumerate(names):
        hits = [s for s in suffixes if name.lower().endswith("_" + s)]
        if hits:
            matched[position] = suffixes[max(hits, key=len)]
    return matched


def _recorded_gradients(backend: Any, model: torch.nn.Module, params: list[torch.Tensor]
                        ) -> Iterator[tuple[int, dict[str, Any], int | None]]:
    """(optimizer index, the pass's gradient record, the graph's id for ``grad_ready``) of
    each gradient the ``offload_optimizer`` pass recorded on ``backend``'s compiled graphs,
    last graph first (its backward runs first); a parameter used by two graphs comes
    twice."""
    model = getattr(model, "_orig_mod", model)  # a torch.compile'd module wraps it
    index = {id(p): i for i, p in enumerate(params)}
    for record in reversed(backend.graphs):
        fired = [r for r in record.pass_records("offload_optimizer") if "gradients" in r.stats]
        dynamo = record.graphs.get("dynamo")
        if not fired or dynamo is None:
            continue
        names = [n.name for n in dynamo.graph.find_nodes(op="placeholder")]
        inputs = match_graph_inputs(names, model)
        for grad in fired[-1].stats["gradients"]:
            p = inputs.get(grad["input"])
            if p is not None and id(p) in index:
                yield index[id(p)], grad, fired[-1].stats.get("graph_id")


def gradient_sources(backend: Any, model: torch.nn.Module,
                     params: list[torch.Tensor]) -> dict[int, list[tuple[int, int]]]:
    """Optimizer index -> the (graph id, input) pairs whose ``fxopt::grad_ready`` calls
    announce its gradient (:mod:`fxopt.optim.grad_ready`)."""
    sources: dict[int, list[tuple[int, int]]] = {}
    for i, grad, graph_id in _recorded_gradients(backend, model, params):
        if graph_id is not None:
            sources.setdefault(i, []).append((graph_id, grad["input"]))
    return sources


def gradient_order(backend: Any, model: torch.nn.Module,
                   params: list[torch.Tensor]) -> list[tuple[int, float]]:
    """(optimizer index, seconds before its backward ends) in gradient-ready order, from the
    records the ``offload_optimizer`` pass left on ``backend``'s compiled graphs."""
    order: list[tuple[int, float]] = []
    seen: set[int] = set()
    for i, grad, _ in _recorded_gradients(backend, model, params):
        if i not in seen:
            seen.add(i)
            order.append((i, grad["ready_seconds"]))
    missing = [i for i in reversed(range(len(params))) if i not in seen]
    if missing:
        log.info("fxopt.optim: %d of %d parameters have no recorded gradient order (unused "
                 "or unnamed); they come last", len(missing), len(params))
    return order + [(i, 0.0) for i in missing]


def _recorded_options(backend: Any) -> dict[str, Any]:
    for record in backend.graphs:
        for r in record.pass_records("offload_optimizer"):
            if "plan" in r.stats:
                plan = r.stats["plan"]
                return {"gpu_state_budget_bytes": plan["gpu_state_budget_bytes"],
                        "cpu_fraction": plan["cpu_fraction"]}
    return {}


def offload(optimizer: torch.optim.Optimizer, source: Any = None, *,
            model: torch.nn.Module | None = None, cpu_fraction: float | None = None,
            gpu_state_budget_bytes: int | None = None, subgroups: int = DEFAULT_SUBGROUPS,
            staged: bool | float | None = None,
            hardware: HardwareProfile | None = None) -> OffloadedOptimizer:
    """Wrap ``optimizer`` (Adam, AdamW or SGD) so that some subgroups update on the CPU.

    ``source``: an :class:`OffloadPlan` (or its dict), an :class:`fxopt.Backend` that
    compiled ``model`` with ``offload_optimizer=True``, a model, or None (see the module
    docstring). ``cpu_fraction`` forces the share of subgroups on the CPU (0: none, 1: all,
    like DeepSpeed's ratio); otherwise the fastest plan whose resident optimizer state fits
    ``gpu_state_budget_bytes`` is chosen (None: no limit, which keeps everything on the
    device since that is fastest). ``subgroups``: how many size-balanced subgroups.
    ``staged``: whether host-resident subgroups update on the device through staging
    buffers (Deep Optimizer States): None lets the plan choose (never on a CPU device, and
    only while the device saving stays 90% of the state on the host, which takes about 20
    host-resident subgroups or more); True or False forces it, a share in [0, 1] stages that
    share of the host-resident parameters (how the tests run the path on the CPU).
    """
    check_optimizer(optimizer)
    planning = {"cpu_fraction": cpu_fraction, "gpu_state_budget_bytes": gpu_state_budget_bytes}
    if isinstance(source, Mapping):
        source = OffloadPlan.from_dict(dict(source))
    if isinstance(source, OffloadPlan):
        if any(v is not None for v in planning.values()) or staged is not None:
            raise ValueError("fxopt.optim.offload: give either a plan or planning options "
                             "(cpu_fraction, gpu_state_budget_bytes, staged), not both")
        return OffloadedOptimizer(optimizer, source)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not params:
        raise ValueError("fxopt.optim.offload: the optimizer has no parameters")
    find_sources = None
    if source is None or isinstance(source, torch.nn.Module):
        order = [(i, 0.0) for i in reversed(range(len(params)))]
    elif hasattr(source, "graphs") and callable(source):  # an fxopt.Backend
        if model is None:
            raise TypeError("fxopt.optim.offload: with a Backend, pass the model too "
                            "(model=...), to name the compiled graphs' inputs")
        order = gradient_order(source, model, params)
        backend = source

        def find_sources() -> dict[int, list[tuple[int, int]]]:
            return gradient_sources(backend, model, params)
        if all(v is None for v in planning.values()):
            planning = _recorded_options(source) or planning
    else:
        raise TypeError(f"fxopt.optim.offload: source must be an OffloadPlan, an "
                        f"fxopt.Backend, a model or None, got {type(source).__name__}")
    if all(v is None for v in planning.values()):
        warnings.warn("fxopt.optim.offload: no gpu_state_budget_bytes or cpu_fraction given "
                      "(nor recorded by the offload_optimizer pass): the fastest plan keeps "
                      "all optimizer state on the device", stacklevel=2)
    infos = [ParamInfo(key=i, numel=params[i].numel(), itemsize=params[i].element_size(),
                       ready_seconds=ready) for i, ready in order]
    groups = split_subgroups(infos, subgroups)
    if hardware is None:  # a GPU's profile with this host's measured update rate
        hardware = on_this_host(profile_for(params[0].device), type(optimizer),
                                max(s.numel for s in groups))
    plan = plan_offload(groups, hardware, staged=staged,
                        states_per_param=states_per_param(optimizer),
                        counter_bytes=counter_bytes(optimizer), **planning)
    if plan.gpu_state_bytes > plan.all_gpu_state_bytes:  # only a forced staged= can
        warnings.warn(f"fxopt.optim.offload: staged={staged} costs more device memory "
                      f"({plan.gpu_state_bytes} bytes of staging buffers and state) than "
                      f"it frees (all state on the device: {plan.all_gpu_state_bytes}); use "
                      f"more subgroups, or let the plan choose (staged=None)", stacklevel=2)
    if plan.keeps_up() is False:
        log.warning("fxopt.optim.offload: %s", plan.summary())
    else:
        log.info("fxopt.optim.offload: %s", plan.summary())
    return OffloadedOptimizer(optimizer, plan, find_sources)
