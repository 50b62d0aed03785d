"""The offload runtime: a standard optimizer whose subgroups update where a plan says.

:class:`OffloadedOptimizer` wraps a ``torch.optim.Adam``, ``AdamW`` or ``SGD`` and executes
an :class:`~fxopt.optim.model.OffloadPlan`:

- a "gpu" subgroup is updated on the parameters' device by an optimizer of the user's class
  and settings, its state resident there;
- a "staged" subgroup is updated the same way, but its state lives in (pinned) host memory
  between steps and is copied through two device staging buffers for its update
  (:mod:`fxopt.optim.staging`, Deep Optimizer States' staged device updates);
- a "cpu" subgroup keeps fp32 master weights and the optimizer state in (pinned) host
  memory. Each gradient is copied to the host (on a side stream on CUDA) where the compiled
  backward produces it, or else when autograd has accumulated it, so the copies overlap the
  backward (:mod:`fxopt.optim.host_grads`). The update is one
  vectorised call per subgroup (the optimizer's own ``fused=True`` CPU kernel, all threads),
  then the parameters are downcast on the host (bf16/fp16 models) and copied back.

The CPU subgroups update on a worker thread (:mod:`fxopt.optim.worker`), in plan order; on
CUDA the main thread launches the device subgroups' updates meanwhile, then queues the
staged ones (copies on their own streams), and the next forward waits for the copies back
on the device, never on the host. On a CPU device the same path
runs one update after another (the main thread waits for each), which is what makes it
testable here. ``close()`` or the end of a ``with`` block stops the thread, removes the
gradient hooks and frees the state; dropping the optimizer does the same, since neither the
hooks nor the thread hold it.

The parameter is the source of truth, the master only adds precision: ``step()`` first
looks for parameters changed outside it (``model.load_state_dict``, an in-place init, an EMA
copy-back, ``param.data = ...``), by the parameter's version counter and storage address,
and refreshes their masters from them, unless the parameter still equals its master rounded
to its dtype (a checkpoint's fp32 master loaded beside its bf16 weights stays exact).

It is a ``torch.optim.Optimizer``: the wrapped optimizer's ``param_groups`` (the same dicts)
are its own, so LR schedulers and ``zero_grad`` work on it, and ``state_dict()`` has the
plain optimizer's format (parameter indices, state per index): a checkpoint of one loads
into the other. A bf16/fp16 parameter updated on the host also saves its fp32 master there,
under ``MASTER_KEY``, so a resume is bit-exact; a plain optimizer ignores that entry. The
wrapped optimizer's state is moved in at wrapping and freed there; step the wrapper, not the
wrapped optimizer.
"""

from __future__ import annotations

import logging
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fxopt.optim.host_grads import GradientCopies, HostParam
from fxopt.optim.model import OffloadPlan
from fxopt.optim.staging import Staging
from fxopt.optim.worker import HostWorker, release

__all__ = [
    "MASTER_KEY",
    "SUPPORTED",
    "OffloadedOptimizer",
    "check_optimizer",
    "counter_bytes",
    "states_per_param",
]

log = logging.getLogger(__name__)

SUPPORTED = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)
# Settings the runtime owns on the host side: the fused CPU kernel is the vectorised update.
_HOST_OVERRIDES = {"fused": True, "foreach": False}
# The per-parameter state entry holding a low-precision parameter's fp32 master weights.
MASTER_KEY = "fxopt_master_fp32"


def states_per_param(optimizer: torch.optim.Optimizer) -> int:
    """Optimizer state tensors per parameter (the model's ``states_per_param``)."""
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    if isinstance(optimizer, torch.optim.SGD):
        return 1 if any(g.get("momentum", 0) for g in optimizer.param_groups) else 0
    return 3 if group.get("amsgrad") else 2


def counter_bytes(optimizer: torch.optim.Optimizer) -> tuple[int, int]:
    """Bytes of per-parameter scalar state (Adam's ``step``) a device subgroup keeps on the
    device and a host subgroup on the host (the model's ``counter_bytes``). torch keeps
    ``step`` on the host unless the update is fused or capturable; the host subgroups'
    fused CPU update keeps an fp32 one."""
    if isinstance(optimizer, torch.optim.SGD):
        return 0, 0
    params = [p for g in optimizer.param_groups for p in g["params"]]
    on_device = (not params or params[0].device.type == "cpu"
                 or any(g.get("fused") or g.get("capturable") for g in optimizer.param_groups))
    fused = any(g.get("fused") for g in optimizer.param_groups)
    # an unfused step counter has the default dtype when that is float64, else fp32
    scalar = 8 if torch.get_default_dtype() == torch.float64 and not fused else 4
    return (scalar if on_device else 0), 4


@dataclass
class _Subgroup:
    placement: str
    indices: list[int]                       # flat parameter indices (state_dict order)
    user_groups: list[int]                   # the user group of each internal group
    optimizer: torch.optim.Optimizer
    tensors: list[torch.Tensor]              # what the internal optimizer updates, per index
    host: list[HostParam] = field(default_factory=list)
    copied: Any = None                       # CUDA event: the copies back have been queued
    parked: list[set[str]] = field(default_factory=list)  # "staged": keys on the host


def check_optimizer(optimizer: Any) -> None:
    """Raise a clear error for an optimizer the runtime cannot wrap."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"fxopt.optim.offload: expected a torch.optim optimizer, got "
                        f"{type(optimizer).__name__}")
    if isinstance(optimizer, OffloadedOptimizer):
        raise TypeError("fxopt.optim.offload: this optimizer is already offloaded")
    if type(optimizer) not in SUPPORTED:
        raise TypeError(f"fxopt.optim.offload: {type(optimizer).__name__} is not supported; "
                        f"supported: {', '.join(c.__name__ for c in SUPPORTED)}")
    for group in optimizer.param_groups:
        if group.get("differentiable"):
            raise ValueError("fxopt.optim.offload: differentiable=True is not supported")
        for p in group["params"]:
            if not p.is_floating_point() or p.is_sparse:
                raise ValueError(f"fxopt.optim.offload: parameters must be dense floating "
                                 f"tensors, got {p.dtype} {p.layout}")


def _fingerprint(param: torch.Tensor) -> tuple[int, int]:
    """What changes when a parameter's data does: its version counter (in-place writes,
    ``load_state_dict``) and its storage address (``param.data = ...``, which keeps the
    version)."""
    return param._version, param.data_ptr()


def _warn_if_rounded_by_plain_load(saved: dict[str, Any],
                                   flat: list[tuple[int, torch.Tensor]]) -> None:
    """Warn when an offloaded optimizer's checkpoint went through the plain optimizer's
    ``load_state_dict``, which rounds every state tensor to its low-precision parameter's
    dtype: the resume can no longer be bit-exact."""
    rounded = {str(flat[i][1].dtype) for i, entry in saved["state"].items()
               if MASTER_KEY in entry and flat[i][1].dtype != torch.float32}
    if rounded:
        warnings.warn(
            f"fxopt.optim.offload: this optimizer's state comes from an offloaded optimizer's "
            f"checkpoint loaded into the plain optimizer, which rounded its fp32 state to "
            f"{', '.join(sorted(rounded))}; for a bit-exact resume, wrap first and call "
            f"load_state_dict on the offloaded optimizer", stacklevel=3)


@torch.no_grad()
def _master_differs(hp: HostParam) -> bool:
    """Whether the master holds more than its parameter (fp32 bits the parameter's dtype
    rounded away)."""
    return not torch.equal(hp.master, hp.param.detach().to(hp.master.device, torch.float32))


def _flat_params(optimizer: torch.optim.Optimizer) -> list[tuple[int, torch.Tensor]]:
    return [(g, p) for g, group in enumerate(optimizer.param_groups) for p in group["params"]]


class OffloadedOptimizer(torch.optim.Optimizer):
    """``optimizer`` with the subgroups of ``plan`` updated on the host or on the device.

    Build it with :func:`fxopt.optim.offload`. ``plan`` keys are indices into the
    optimizer's parameters in ``state_dict`` order; every parameter is in one subgroup.
    ``find_sources()``: per index, the (graph id, input) pairs whose ``fxopt::grad_ready``
    calls announce that parameter's gradient (:func:`fxopt.optim.link.gradient_sources`),
    asked again when a graph compiled later first runs.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, plan: OffloadPlan,
                 find_sources: Callable[[], Mapping[int, Sequence[tuple[int, int]]]] | None
                 = None) -> None:
        check_optimizer(optimizer)
        flat = _flat_params(optimizer)
        keys = [k for s in plan.subgroups for k in s.params]
        if sorted(keys) != list(range(len(flat))):
            raise ValueError(
                f"fxopt.optim.offload: the plan covers parameters {sorted(keys)} but the "
                f"optimizer has {len(flat)} (indices 0..{len(flat) - 1}, each once)")
        saved = optimizer.state_dict()
        _warn_if_rounded_by_plain_load(saved, flat)
        # The same group dicts: schedulers and users changing lr see one set of groups.
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self.plan = plan
        self._cls = type(optimizer)
        self._flat = flat
        cuda = [p.device for _, p in flat if p.is_cuda]
        self._cuda = bool(cuda)
        self._pin = self._cuda and torch.cuda.is_available()
        # (gradients to the host, parameters back) on the parameters' device
        self._streams = ((torch.cuda.Stream(cuda[0]), torch.cuda.Stream(cuda[0]))
                         if self._cuda else None)
        self._closed = False
        self._worker = HostWorker()
        self._subgroups = [self._build(s.placement, list(s.params)) for s in plan.subgroups]
        self._staging = self._staging_buffers(optimizer)
        self._host = {i: hp for sg in self._subgroups for i, hp in zip(sg.indices, sg.host)}
        self._grads = GradientCopies(self._host, self._streams[0] if self._streams else None,
                                     find_sources)
        self._hooks = self._grads.handles
        # Neither the hooks nor the worker hold this optimizer (see fxopt.optim.worker):
        # when it is collected, this removes the hooks and stops the thread.
        self._release = weakref.finalize(self, release, self._hooks, self._worker)
        optimizer.state.clear()  # its state now lives in the subgroups
        self.load_state_dict(saved)
        log.info("fxopt.optim: %d subgroups, %d with their state on the host (%.0f%% of "
                 "parameters), %d of them staged", len(plan.subgroups),
                 sum(s.on_host for s in plan.subgroups), 100 * plan.cpu_share,
                 sum(s.placement == "staged" for s in plan.subgroups))

    # ---------------------------------------------------------------- building

    def _build(self, placement: str, indices: list[int]) -> _Subgroup:
        by_group: dict[int, list[int]] = {}
        for i in indices:
            by_group.setdefault(self._flat[i][0], []).append(i)
        host: list[HostParam] = []
        tensors: dict[int, torch.Tensor] = {}  # what the internal optimizer updates
        groups = []
        for g, members in by_group.items():
            params = []
            for i in members:
                p = self._flat[i][1]
                if placement == "cpu":
                    hp = self._host_param(p)
                    host.append(hp)
                    tensors[i] = hp.master
                else:
                    tensors[i] = p
                params.append(tensors[i])
            groups.append({**self._hyperparameters(g, placement), "params": params})
        # The internal optimizer's parameter order: group by group.
        ordered = [i for members in by_group.values() for i in members]
        return _Subgroup(placement, ordered, list(by_group), self._cls(groups),
                         [tensors[i] for i in ordered], host,
                         parked=[set() for _ in ordered] if placement == "staged" else [])

    def _staging_buffers(self, optimizer: torch.optim.Optimizer) -> Staging | None:
        """The staging buffers of the plan's staged subgroups (None without any), sized as
        the plan sizes them: two (one for a single staged subgroup), each the largest
        staged subgroup's device state."""
        staged = [sg for sg in self._subgroups if sg.placement == "staged"]
        if not staged:
            return None
        described = (states_per_param(optimizer), counter_bytes(optimizer))
        if (self.plan.states_per_param, self.plan.counter_bytes) != described:
            raise ValueError(
                f"fxopt.optim.offload: the plan stages subgroups for an optimizer with "
                f"states_per_param={self.plan.states_per_param} and counter_bytes="
                f"{self.plan.counter_bytes}, but this one has {described[0]} and "
                f"{described[1]}: plan it for this optimizer")
        states, counter = described[0], described[1][0]
        largest = max(sum(t.numel() * t.element_size() * states + counter for t in sg.tensors)
                      for sg in staged)
        device = staged[0].tensors[0].device
        return Staging(device, largest, min(2, len(staged)), self._pin)

    def _host_param(self, p: torch.Tensor) -> HostParam:
        master = torch.empty(p.shape, dtype=torch.float32, pin_memory=self._pin)
        master.copy_(p.detach())
        staging = torch.empty(p.shape, dtype=p.dtype, pin_memory=self._pin)
        return HostParam(param=p, master=master, staging=staging, synced=_fingerprint(p))

    def _hyperparameters(self, g: int, placement: str) -> dict[str, Any]:
        settings = {k: v for k, v in self.param_groups[g].items() if k != "params"}
        if placement == "cpu":
            settings.update(_HOST_OVERRIDES)
            settings = {k: v.to("cpu") if isinstance(v, torch.Tensor) else v
                        for k, v in settings.items()}
        return settings

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "_subgroups", None) is not None:  # not while __init__ builds
            raise NotImplementedError(
                "fxopt.optim: an offloaded optimizer's parameters are fixed by its plan; add "
                "the group to the plain optimizer and call fxopt.optim.offload again")
        super().add_param_group(param_group)

    # ---------------------------------------------------------------- gradients

    def _host_grads_ready(self, sg: _Subgroup) -> None:
        """Make each master's ``.grad`` the device gradient (None where that is None)."""
        self._grads.wait()
        for hp in sg.host:
            if hp.param.grad is None:
                hp.master.grad = None
            else:
                if hp.master.grad is None:
                    hp.master.grad = torch.empty_like(hp.master)
                hp.master.grad.copy_(hp.staging)
            hp.fresh_grad = None  # the staging buffer is reused for the parameter below

    # ---------------------------------------------------------------- masters

    def _follow_parameters(self, sg: _Subgroup) -> None:
        """Refresh the master of every parameter changed since it last agreed with it.

        A parameter that still equals its master rounded to its own dtype keeps the master
        (its extra fp32 bits are the point of having one); any other change came from
        outside ``step()`` and wins.
        """
        for hp in sg.host:
            self._follow_one(hp)

    @staticmethod
    @torch.no_grad()
    def _follow_one(hp: HostParam) -> None:
        now = _fingerprint(hp.param)
        if hp.synced == now:
            return
        # compared on the host: a device-side copy of the master would be a full-size
        # temporary on the device the offload is meant to relieve
        current = hp.param.detach().to(hp.master.device)
        if not torch.equal(current, hp.master.to(current.dtype)):
            hp.master.copy_(current)
            log.debug("fxopt.optim: a %s parameter changed outside step(); its master "
                      "weights follow it", tuple(current.shape))
        hp.synced = now

    # ---------------------------------------------------------------- step

    def _sync_hyperparameters(self) -> None:
        """Carry the user's groups' settings (lr from a scheduler, ...) to the subgroups."""
        for sg in self._subgroups:
            for internal, g in zip(sg.optimizer.param_groups, sg.user_groups):
                internal.update(self._hyperparameters(g, sg.placement))

    @torch.no_grad()  # runs on the worker thread, where the caller's no_grad does not hold
    def _update_on_host(self, sg: _Subgroup, backward_done: Any = None) -> None:
        """``backward_done``: a CUDA event after everything queued before ``step()`` (the
        backward still reads the parameters the copies back overwrite)."""
        if sg.copied is not None:
            sg.copied.synchronize()  # last step's copies back have left the staging buffers
        self._host_grads_ready(sg)
        sg.optimizer.step()
        with torch.no_grad():
            for hp in sg.host:
                hp.staging.copy_(hp.master)  # downcast on the host
            if self._streams is None:
                for hp in sg.host:
                    hp.param.copy_(hp.staging)
                    hp.synced = _fingerprint(hp.param)
                return
            h2d = self._streams[1]
            h2d.wait_event(backward_done)
            with torch.cuda.stream(h2d):
                for hp in sg.host:
                    hp.param.copy_(hp.staging, non_blocking=True)
                    hp.synced = _fingerprint(hp.param)
                sg.copied = torch.cuda.Event()
                sg.copied.record(h2d)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        self._check_open("step()")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync_hyperparameters()
        host = [sg for sg in self._subgroups if sg.placement == "cpu"]
        device = [sg for sg in self._subgroups if sg.placement == "gpu"]
        staged = [sg for sg in self._subgroups if sg.placement == "staged"]
        for sg in host:
            self._follow_parameters(sg)
            self._grads.refresh(sg.host)
        if self._streams is None:  # a CPU device: one update after another, on its cores
            for sg in self._subgroups:
                if sg.placement == "cpu":
                    self._worker.submit(self._update_on_host, sg).result()
                elif sg.placement == "gpu":
                    sg.optimizer.step()
                else:
                    self._staging.update(sg, staged.index(sg))
            return loss
        # CUDA: the host updates in the worker thread (torch releases the GIL in its
        # kernels) while this thread queues the device updates.
        backward_done = torch.cuda.current_stream(self._streams[1].device).record_event()
        futures = [self._worker.submit(self._update_on_host, sg, backward_done)
                   for sg in host]
        for sg in device:
            sg.optimizer.step()
        for position, sg in enumerate(staged):  # queued: copies on the staging streams
            self._staging.update(sg, position)
        for future in futures:
            future.result()
        torch.cuda.current_stream(self._streams[1].device).wait_stream(self._streams[1])
        return loss

    # ---------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The plain optimizer's format: state per parameter index, groups with indices; a
        bf16/fp16 parameter updated on the host adds its fp32 master under ``MASTER_KEY``."""
        self._check_open("state_dict()")
        if self._staging is not None:
            self._staging.wait()  # the staged state's write-backs have landed
        state: dict[int, dict[str, Any]] = {}
        for sg in self._subgroups:
            for i, tensor in zip(sg.indices, sg.tensors):
                if sg.optimizer.state.get(tensor):
                    state[i] = dict(sg.optimizer.state[tensor])
            for i, hp in zip(sg.indices, sg.host):
                if hp.param.dtype == torch.float32:
                    continue  # its master is the parameter itself
                self._follow_one(hp)  # a parameter changed since the last step wins
                if i in state or _master_differs(hp):
                    state.setdefault(i, {})[MASTER_KEY] = hp.master.clone()
        state = dict(sorted(state.items()))
        groups, start = [], 0
        for group in self.param_groups:
            count = len(group["params"])
            groups.append({**{k: v for k, v in group.items() if k != "params"},
                           "params": list(range(start, start + count))})
            start += count
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a checkpoint of this optimizer or of the plain one (bit-exact, masters too)."""
        self._check_open("load_state_dict()")
        saved_groups = state_dict["param_groups"]
        sizes = [len(g["params"]) for g in self.param_groups]
        if [len(g["params"]) for g in saved_groups] != sizes:
            raise ValueError(f"fxopt.optim: the state_dict's parameter groups have sizes "
                             f"{[len(g['params']) for g in saved_groups]}, the optimizer's "
                             f"{sizes}")
        saved_ids = [i for g in saved_groups for i in g["params"]]
        if self._staging is not None:
            self._staging.wait()  # no write-back lands on state about to be replaced
        for group, saved in zip(self.param_groups, saved_groups):
            group.update({k: v for k, v in saved.items() if k != "params"})
        state = state_dict["state"]
        for sg in self._subgroups:
            host = dict(zip(sg.indices, sg.host))
            local = {}
            for position, i in enumerate(sg.indices):
                entry = dict(state.get(saved_ids[i], {}))
                master = entry.pop(MASTER_KEY, None)
                if master is not None and i in host:
                    self._load_master(host[i], master)
                if entry:
                    local[position] = entry
            groups, position = [], 0
            for internal, g in zip(sg.optimizer.param_groups, sg.user_groups):
                count = len(internal["params"])
                groups.append({**self._hyperparameters(g, sg.placement),
                               "params": list(range(position, position + count))})
                position += count
            sg.optimizer.load_state_dict({"state": local, "param_groups": groups})
            if sg.placement == "staged":  # loaded onto the device: to the host, now
                self._staging.settle(sg, reset=True)
                self._staging.wait()

    @staticmethod
    def _load_master(hp: HostParam, master: torch.Tensor) -> None:
        """Take a checkpoint's fp32 master; the next step checks it against the parameter
        (loaded before or after it), which wins where they disagree."""
        if master.dtype != torch.float32:
            log.debug("fxopt.optim: ignoring %s master weights (a plain optimizer's load "
                      "rounded them); the parameter is used", master.dtype)
            return
        with torch.no_grad():
            hp.master.copy_(master)
        hp.synced = None

    def remove_hooks(self) -> None:
        """Detach the gradient hooks from the parameters; ``step()`` then copies each host
        subgroup's gradients itself, without overlapping them with the backward."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()  # the same list the finalizer holds

    def state_tensors(self, placement: str) -> list[torch.Tensor]:
        """The live tensors the optimizer holds on ``placement`` ("cpu": the host, "gpu":
        the device), for memory accounting: on the device the "gpu" subgroups' state and
        the staging buffers; on the host the "cpu" subgroups' state, fp32 masters, their
        gradients and staging buffers, and the "staged" subgroups' state. No copies
        (unlike ``state_dict()``)."""
        self._check_open("state_tensors()")
        if placement not in ("cpu", "gpu"):
            raise ValueError(f"fxopt.optim: placement is 'cpu' or 'gpu', not {placement!r}")
        tensors: list[torch.Tensor] = []
        if placement == "gpu" and self._staging is not None:
            tensors += self._staging.buffers
        for sg in self._subgroups:
            if (sg.placement == "gpu") != (placement == "gpu"):
                continue
            for state in sg.optimizer.state.values():
                tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
            for hp in sg.host:
                tensors += [hp.master, hp.staging]
                if hp.master.grad is not None:
                    tensors.append(hp.master.grad)
        return tensors

    def placements(self) -> list[str]:
        """Each parameter's placement ("cpu", "gpu" or "staged"), in ``state_dict`` order."""
        where = self.plan.placement_of()
        return [where[i] for i in range(len(self._flat))]

    # ---------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Stop the worker thread (after its current update), remove the gradient hooks
        and free the state (host masters and buffers, device state, staging buffers, after
        their last write-back). Idempotent; the
        optimizer cannot be used after it. Dropping the optimizer does the same."""
        if self._closed:
            return
        self._closed = True
        self._worker.stop(wait=True)
        self._release()
        if self._staging is not None:
            self._staging.wait()
        self._subgroups, self._host, self._staging, self._grads = [], {}, None, None

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> OffloadedOptimizer:
        self._check_open("a with block")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(
                f"fxopt.optim: {what} on a closed offloaded optimizer (close() or the end of "
                f"its with block freed its state); build a new one with fxopt.optim.offload")
