"""``fxopt.profile_memory``: run training steps and break their memory down by category.

How. The steps run under ``torch.profiler.profile(profile_memory=True)``, whose allocation
records (address, size, time; CPU allocator and CUDA caching allocator) give the total over
time for eager and compiled models alike. Each step's phases are ``record_function`` ranges
(forward, backward, optimizer). What each allocation *is* comes from the tensors themselves:
parameters, buffers, inputs, gradients and optimizer state by their storages' addresses;
activations by ``torch.autograd.graph.saved_tensors_hooks``, which see every tensor saved
for backward — also the ones a compiled forward (AOTAutograd's ``save_for_backward``)
saves as one graph, where a dispatch mode (``MemTracker``, `fxopt.analysis.measure`) cannot
look because Dynamo runs no compiled code under one. Everything else is a temporary. The
matching is plain data (`fxopt.profile.attribute`).

Warm-up steps (default 1) run first, unrecorded: compilation, lazy optimizer state and the
allocator's first growth are not part of the steady-state step being profiled.

An optimizer wrapped by `fxopt.optim.offload` keeps its state in per-subgroup optimizers,
not in its own ``state``: its ``state_tensors(placement)`` gives the live tensors of the
subgroups updated on the device (``optimizer_state``) and of those updated on the host
(``optimizer_state_host``: their state, fp32 master weights, their gradients and the staging
buffers). On
the CPU both are in the recorded memory; on CUDA the host part is not device memory, so it
is reported beside the device total (``MemoryProfile.host_bytes``), not in it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from fxopt._compat import tree_leaves
from fxopt.devices import indexed
from fxopt.optim.runtime import OffloadedOptimizer
from fxopt.profile._torch import read_events
from fxopt.profile.attribute import Tag, apply_tags, build_timeline, intervals_of
from fxopt.profile.report import MemoryProfile

__all__ = ["default_loss", "profile_memory"]

log = logging.getLogger(__name__)

MARK = "fxopt.profile:"


def default_loss(output: Any) -> torch.Tensor:
    """The loss of a model's output: its ``.loss`` when it has one (Hugging Face models
    given labels), else the sum of its first floating-point tensor."""
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    for leaf in tree_leaves(output.to_tuple() if hasattr(output, "to_tuple") else output):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.requires_grad:
            return leaf.float().sum()
    raise TypeError("fxopt.profile_memory: the model's output has no .loss and no "
                    "floating-point tensor that requires grad; pass loss_fn=")


def profile_memory(model: torch.nn.Module, inputs: Any,
                   optimizer: torch.optim.Optimizer | None = None, steps: int = 2, *,
                   loss_fn: Callable[[Any], torch.Tensor] | None = None,
                   warmup: int = 1) -> MemoryProfile:
    """Run ``warmup`` then ``steps`` training steps of ``model`` (eager or compiled) and
    return their memory by category, at the peak and over time.

    ``inputs``: a tensor, a tuple/list of positional arguments or a dict of keyword
    arguments. A step is ``loss_fn(model(*inputs))`` (default :func:`default_loss`),
    ``backward``, then ``optimizer.step()`` and ``zero_grad(set_to_none=True)`` (without an
    optimizer, the gradients are dropped the same way)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"fxopt.profile_memory: model must be an nn.Module, not "
                        f"{type(model).__name__}")
    for name, value in (("steps", steps), ("warmup", warmup)):
        if not isinstance(value, int) or isinstance(value, bool) or value < (name == "steps"):
            raise ValueError(f"fxopt.profile_memory: {name} must be an int >= "
                             f"{int(name == 'steps')}, not {value!r}")
    args, kwargs = _split_inputs(inputs)
    device = _device_of(model, args, kwargs)
    loss_fn = loss_fn or default_loss
    for _ in range(warmup):
        _step(model, args, kwargs, optimizer, loss_fn, prefix=None, tags=None)
    _synchronize(device)
    baseline = _baseline(model, args, kwargs, optimizer, device)
    other = 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(indexed(device))
        other = max(0, torch.cuda.memory_allocated(indexed(device))
                    - sum(s for s, _ in baseline.values()))
    tags: list[tuple[str, int, str]] = []  # (mark, ptr, category), timed by the mark's end
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                           else [])
    with profile(activities=activities, profile_memory=True) as prof:
        with record_function(MARK + "start"):
            pass
        for i in range(steps):
            _step(model, args, kwargs, optimizer, loss_fn, prefix=f"{MARK}step{i}:", tags=tags)
        _synchronize(device)
    measured = (torch.cuda.max_memory_allocated(indexed(device)) if device.type == "cuda" else None)
    host = {} if device.type == "cpu" else {"optimizer_state_host": sum(
        t.untyped_storage().nbytes() for t in _optimizer_tensors(optimizer, host=True))}
    events, marks = read_events(prof, MARK)
    events = [e for e in events if _same_device(e.device, device)]
    start = next(m.start_ns for m in marks if m.name == MARK + "start")
    ends = {m.name: m.end_ns for m in marks}
    intervals = intervals_of(events, baseline, start)
    apply_tags(intervals, [Tag(ptr, ends[mark], category) for mark, ptr, category in tags])
    marks = [m for m in marks if m.name != MARK + "start"]
    timeline = build_timeline(intervals, marks, start, other)
    return MemoryProfile.from_timeline(timeline, device=str(device), steps=steps,
                                       measured_peak_bytes=measured, mark_prefix=MARK,
                                       host_bytes={k: v for k, v in host.items() if v})


def _split_inputs(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def _device_of(model: torch.nn.Module, args: Any, kwargs: Any) -> torch.device:
    tensors = [t for t in [*model.parameters(), *tree_leaves((args, kwargs))]
               if isinstance(t, torch.Tensor)]
    if not tensors:
        raise ValueError("fxopt.profile_memory: the model has no parameters and the inputs "
                         "no tensors; nothing to profile")
    devices = {t.device for t in tensors}
    accelerators = sorted((d for d in devices if d.type != "cpu"), key=str)
    device = indexed(accelerators[0]) if accelerators else torch.device("cpu")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"fxopt.profile_memory: device {device} is not supported "
                         "(CPU and CUDA are)")
    return device


def _same_device(event_device: str, device: torch.device) -> bool:
    return torch.device(event_device) == device


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(indexed(device))


def _step(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
          optimizer: torch.optim.Optimizer | None, loss_fn: Callable[[Any], torch.Tensor], *,
          prefix: str | None, tags: list[tuple[str, int, str]] | None) -> None:
    """One training step; with ``prefix``, its phases are marked and its tensors tagged."""
    saved: list[int] = []

    # Dynamo must not compile the hooks: a compiled model calls them from its forward, and
    # Dynamo would trace each as a frame, guard on len(saved) and the tensor's dtype, and
    # recompile them until its recompile_limit warning.
    @torch.compiler.disable
    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.untyped_storage().data_ptr())
        return t

    @torch.compiler.disable
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def phase(name: str) -> Any:
        return record_function(prefix + name) if prefix else contextlib.nullcontext()

    with phase("forward"):
        if tags is not None:
            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                loss = loss_fn(model(*args, **kwargs))
        else:
            loss = loss_fn(model(*args, **kwargs))
    if tags is not None:
        tags += [(prefix + "forward", p, "activations") for p in saved]
    with phase("backward"):
        loss.backward()
    del loss
    if tags is not None:
        tags += [(prefix + "backward", p, "gradients") for p in
                 _ptrs(p.grad for p in model.parameters())]
    with phase("optimizer"):
        if optimizer is not None:
            optimizer.step()
            if tags is not None:
                tags += [(prefix + "optimizer", p, category)
                         for category, host in (("optimizer_state", False),
                                                ("optimizer_state_host", True))
                         for p in _ptrs(_optimizer_tensors(optimizer, host=host))]
            optimizer.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)


def _optimizer_tensors(optimizer: torch.optim.Optimizer | None, *, host: bool = False
                       ) -> list[torch.Tensor]:
    """The optimizer's state tensors: with ``host``, those of an offloaded optimizer's
    host subgroups (none for a plain optimizer), else all the others."""
    if optimizer is None:
        return []
    if isinstance(optimizer, OffloadedOptimizer):
        return optimizer.state_tensors("cpu" if host else "gpu")
    states = [] if host else list(optimizer.state.values())
    return [t for state in states for t in tree_leaves(state) if isinstance(t, torch.Tensor)]


def _ptrs(tensors: Iterable[Any]) -> list[int]:
    return [t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor)]


def _baseline(model: torch.nn.Module, args: Any, kwargs: Any,
              optimizer: torch.optim.Optimizer | None,
              device: torch.device) -> dict[int, tuple[int, str]]:
    """The storages alive before recording, by address: (bytes, category). An address
    seen twice keeps its first (most specific) category."""
    groups = [("parameters", list(model.parameters())), ("buffers", list(model.buffers())),
              ("optimizer_state", _optimizer_tensors(optimizer)),
              ("optimizer_state_host", _optimizer_tensors(optimizer, host=True)),
              ("gradients", [p.grad for p in model.parameters() if p.grad is not None]),
              ("inputs", [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)])]
    baseline: dict[int, tuple[int, str]] = {}
    for category, tensors in groups:
        for t in tensors:
            if t.device != device or t.untyped_storage().nbytes() == 0:
                continue
            storage = t.untyped_storage()
            baseline.setdefault(storage.data_ptr(), (storage.nbytes(), category))
    return baseline
