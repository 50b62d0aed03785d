"""Where each optimizer subgroup updates: the performance model and the plan, on plain data.

Deep Optimizer States splits the parameters into subgroups (contiguous in gradient-ready
order, size-balanced) and decides per subgroup whether its optimizer state lives and updates
on the host CPU or on the GPU, so that CPU updates run while the GPU updates other subgroups.
This module is that decision as pure functions on plain data (no tensors, no fx graphs), so
the offload pass, the runtime and the planner (which may fold it into its solver) share it:

- :func:`split_subgroups` cuts parameters (in gradient-ready order) into subgroups;
- :func:`simulate` predicts the optimizer phase of a step for one placement per subgroup;
- :func:`plan_offload` chooses the placements: the fastest one whose resident GPU state fits
  ``gpu_state_budget_bytes``, or the fastest with a forced CPU share (``cpu_fraction``);
- :func:`offload_frontier`: the placements no other beats on both resident state and time,
  which the shared-budget search (:mod:`fxopt.optim.shared_budget`) pairs with activation plans.

The model, with t=0 at the end of the backward (when ``optimizer.step()`` may start) and the
rates of a :class:`~fxopt.planner.HardwareProfile`:

- a "gpu" subgroup keeps its state on the device; its update streams parameters, gradients
  and state once: ``numel * itemsize * (3 + 2 * states) / memory_bandwidth``, one after
  another on the device from t=0;
- a "cpu" subgroup keeps fp32 master weights and state in host memory: its gradients go to
  the host as soon as they are ready (one device->host link, in ready order, during the
  backward), its update runs on the CPU from t=0 (the runtime updates in ``step()``, after
  any gradient clipping) at ``cpu_update_params_per_second``, one subgroup after another,
  and its parameters go back on the host->device link once updated;
- when both kinds run in one step, CPU updates and copies are slowed by ``contention``
  (host memory and PCIe shared with the device's traffic; DOS models it, its formula is not
  published, so the default is a guess to calibrate, not a measured number);
- on a CPU device there is no link and the "device" updates share the same cores: the two
  kinds run one after the other.

The predicted time of the optimizer phase is when the last update (or copy back) ends.

Whether the host keeps up. The runtime updates the host subgroups in ``step()`` (after any
gradient clipping), so their updates and copies back add ``host_overhead_seconds`` (the
predicted phase minus all-on-the-device) to the step, and only the gradients' copies hide in
the backward. The plan compares that overhead with the backward's length (the largest
subgroup ``ready_seconds``: the first subgroup's last gradient, a lower bound of the
backward and so of the step): within ``MAX_SLOWDOWN - 1`` of it, the step stays within
``MAX_SLOWDOWN`` times the plain one; beyond it the host cannot keep up at this CPU Adam
rate, and :meth:`OffloadPlan.keeps_up` says so.

The bytes are the runtime's buffers, exactly (``tests/optim/test_optim_accounting.py`` holds
them to the profiler's categories). A "gpu" subgroup keeps ``states`` tensors of each
parameter's size and dtype on the device; a "cpu" one keeps on the host, per element, an
fp32 master, its fp32 gradient, ``states`` fp32 tensors and a staging buffer in the
parameter's dtype (gradient in, parameter out), and on the device nothing beyond the
parameter and its gradient, which every placement has. ``counter_bytes`` adds per-parameter
scalar state (Adam's ``step``) where it lives. Parameters that never get a gradient have no
state; the prediction counts them all.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from fxopt.planner.hardware import HardwareProfile

__all__ = [
    "MAX_SLOWDOWN", "PLACEMENTS", "ParamInfo", "Subgroup", "SubgroupPlan", "OffloadPlan",
    "Prediction",
    "split_subgroups", "simulate", "plan_offload", "offload_frontier",
]

PLACEMENTS = ("gpu", "cpu")
DEFAULT_CONTENTION = 1.1
# The step-time target for offloading: at most this many times the plain step (issue 30).
MAX_SLOWDOWN = 1.3
# Up to this many subgroups every placement is evaluated (2**12 simulations, ~50 ms).
EXHAUSTIVE_LIMIT = 12


@dataclass(frozen=True)
class ParamInfo:
    """One parameter as the model needs it: a key the runtime resolves (its index in the
    optimizer's parameter order), its size, its dtype's itemsize, and how long before the
    end of the backward its gradient is ready (0.0 when unknown: all ready at the end)."""

    key: int
    numel: int
    itemsize: int = 4
    ready_seconds: float = 0.0


@dataclass(frozen=True)
class Subgroup:
    """Consecutive parameters in gradient-ready order, updated together."""

    params: tuple[int, ...]
    numel: int
    itemsize: int
    ready_seconds: float  # when its last gradient is ready, seconds before backward's end

    def grad_bytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(frozen=True)
class Prediction:
    """What :func:`simulate` predicts for one placement."""

    seconds: float                  # the optimizer phase: t=0 to the last update or copy
    finish_seconds: tuple[float, ...]  # per subgroup
    gpu_state_bytes: int            # optimizer state resident on the device
    host_bytes: int                 # fp32 master weights, state, gradient and staging buffers


@dataclass(frozen=True)
class SubgroupPlan:
    index: int
    params: tuple[int, ...]
    numel: int
    placement: str
    gpu_state_bytes: int
    finish_seconds: float


@dataclass(frozen=True)
class OffloadPlan:
    """The chosen placement per subgroup, in update order, with its predicted cost.

    JSON-serialisable through :meth:`to_dict`/:meth:`from_dict`. ``params`` of a subgroup
    are keys of :class:`ParamInfo` (the runtime: indices into the optimizer's parameters in
    ``state_dict`` order).
    """

    subgroups: tuple[SubgroupPlan, ...]
    predicted_seconds: float
    all_gpu_seconds: float
    all_cpu_seconds: float
    gpu_state_bytes: int
    all_gpu_state_bytes: int
    host_bytes: int
    hardware: str
    gpu_state_budget_bytes: int | None = None
    cpu_fraction: float | None = None
    states_per_param: int = 2
    contention: float = DEFAULT_CONTENTION
    counter_bytes: tuple[int, int] = (0, 0)
    backward_seconds: float = 0.0  # the backward's predicted length (0: unknown)

    @property
    def host_overhead_seconds(self) -> float:
        """What the host subgroups add to the step: the predicted optimizer phase beyond
        the all-on-the-device one."""
        return max(0.0, self.predicted_seconds - self.all_gpu_seconds)

    def keeps_up(self, limit: float = MAX_SLOWDOWN) -> bool | None:
        """Whether the host's overhead is within ``limit - 1`` of the backward's length,
        which keeps the step within ``limit`` times the plain one; None when the backward's
        length is unknown (no recorded gradient order)."""
        if self.host_overhead_seconds == 0.0:
            return True
        if self.backward_seconds <= 0.0:
            return None
        return self.host_overhead_seconds <= (limit - 1.0) * self.backward_seconds

    def summary(self) -> str:
        """One line: the share on the host, the device bytes it frees, the host's overhead
        against the backward."""
        freed = self.all_gpu_state_bytes - self.gpu_state_bytes
        line = (f"{self.cpu_share:.0%} of parameters update on the host, freeing "
                f"{freed / 2**20:.1f} MiB of device state; the host adds "
                f"{self.host_overhead_seconds * 1e3:.3g} ms to the step")
        verdict = self.keeps_up()
        if verdict is None:
            return line + " (the backward's length is unknown)"
        return line + (f" against a backward of {self.backward_seconds * 1e3:.3g} ms: "
                       + ("the host keeps up" if verdict else
                          f"the host cannot keep up (more than {MAX_SLOWDOWN - 1:.0%} of it)"))

    @property
    def cpu_share(self) -> float:
        total = sum(s.numel for s in self.subgroups)
        cpu = sum(s.numel for s in self.subgroups if s.placement == "cpu")
        return cpu / total if total else 0.0

    def placement_of(self) -> dict[int, str]:
        return {key: s.placement for s in self.subgroups for key in s.params}

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["cpu_share"] = self.cpu_share
        out["subgroups"] = [{**asdict(s), "params": list(s.params)} for s in self.subgroups]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OffloadPlan:
        data = {k: v for k, v in data.items() if k != "cpu_share"}
        if "counter_bytes" in data:  # a list in JSON
            data["counter_bytes"] = tuple(data["counter_bytes"])
        subgroups = tuple(SubgroupPlan(**{**s, "params": tuple(s["params"])})
                          for s in data.pop("subgroups"))
        return cls(subgroups=subgroups, **data)


def split_subgroups(params: Sequence[ParamInfo], count: int) -> list[Subgroup]:
    """Cut ``params`` (in gradient-ready order) into at most ``count`` contiguous subgroups
    of about equal numel; a parameter is never split. Mixed itemsizes start a new subgroup
    (a subgroup is copied and downcast as one)."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"fxopt.optim: subgroup count must be an int >= 1, got {count!r}")
    for p in params:
        if p.numel < 0 or p.itemsize <= 0:
            raise ValueError(f"fxopt.optim: invalid parameter size {p}")
    total = sum(p.numel for p in params)
    groups: list[list[ParamInfo]] = []
    done = 0
    for p in params:
        end = total * len(groups) / count  # where the current subgroup should end
        # A parameter whose middle lies past that end starts the next subgroup.
        if (not groups or groups[-1][-1].itemsize != p.itemsize
                or (done + p.numel / 2 > end and len(groups) < count)):
            groups.append([])
        groups[-1].append(p)
        done += p.numel
    return [Subgroup(params=tuple(p.key for p in g), numel=sum(p.numel for p in g),
                     itemsize=g[0].itemsize, ready_seconds=min(p.ready_seconds for p in g))
            for g in groups]


def _gpu_update_seconds(s: Subgroup, hw: HardwareProfile, states: int) -> float:
    return s.numel * s.itemsize * (3 + 2 * states) / hw.memory_bandwidth


def _cpu_update_seconds(s: Subgroup, hw: HardwareProfile) -> float:
    return s.numel / hw.cpu_update_params_per_second


def _device_bytes(s: Subgroup, states: int, counter: int) -> int:
    return s.numel * s.itemsize * states + len(s.params) * counter


def _host_bytes(s: Subgroup, states: int, counter: int) -> int:
    # fp32 master, its fp32 gradient and fp32 state; the staging buffer in the param's dtype
    return s.numel * (4 * (2 + states) + s.itemsize) + len(s.params) * counter


def _check_counters(counter_bytes: Any) -> tuple[int, int]:
    if (not isinstance(counter_bytes, (tuple, list)) or len(counter_bytes) != 2
            or any(isinstance(c, bool) or not isinstance(c, int) or c < 0
                   for c in counter_bytes)):
        raise ValueError(f"fxopt.optim: counter_bytes must be two ints >= 0 (device, host), "
                         f"got {counter_bytes!r}")
    return tuple(counter_bytes)


def simulate(subgroups: Sequence[Subgroup], placements: Sequence[str], hardware: HardwareProfile,
             *, states_per_param: int = 2, contention: float = DEFAULT_CONTENTION,
             counter_bytes: tuple[int, int] = (0, 0)) -> Prediction:
    """The predicted optimizer phase of one step for ``placements`` (one per subgroup).

    ``counter_bytes``: the bytes of scalar state per parameter that a "gpu" subgroup keeps
    on the device and a "cpu" one on the host (Adam's fp32 ``step``: (4, 4) on a CPU
    device or with ``fused``/``capturable``, else (0, 4): on CUDA it stays on the host)."""
    device_counter, host_counter = _check_counters(counter_bytes)
    if len(placements) != len(subgroups):
        raise ValueError(f"fxopt.optim: {len(placements)} placements for "
                         f"{len(subgroups)} subgroups")
    bad = [p for p in placements if p not in PLACEMENTS]
    if bad:
        raise ValueError(f"fxopt.optim: unknown placement {bad[0]!r}; valid: {PLACEMENTS}")
    mixed = len(set(placements)) > 1
    slow = contention if mixed else 1.0
    link = hardware.host_device_bandwidth
    finish = [0.0] * len(subgroups)
    gpu_free = cpu_free = h2d_free = 0.0
    d2h_free = -math.inf  # gradients leave during the backward, before t=0
    for i, (s, where) in enumerate(zip(subgroups, placements)):
        if where == "gpu":
            gpu_free += _gpu_update_seconds(s, hardware, states_per_param)
            finish[i] = gpu_free
            continue
        copied = 0.0
        if link is not None:
            d2h_free = max(d2h_free, -s.ready_seconds) + s.grad_bytes() * slow / link
            copied = d2h_free
        cpu_free = max(cpu_free, copied, 0.0) + _cpu_update_seconds(s, hardware) * slow
        finish[i] = cpu_free
        if link is not None:
            h2d_free = max(h2d_free, cpu_free) + s.grad_bytes() * slow / link
            finish[i] = h2d_free
    if link is None:  # a CPU device: the device's updates and the host's share the cores
        seconds = gpu_free + cpu_free
    else:
        seconds = max([gpu_free, 0.0] + finish)
    return Prediction(
        seconds=seconds, finish_seconds=tuple(finish),
        gpu_state_bytes=sum(_device_bytes(s, states_per_param, device_counter)
                            for s, w in zip(subgroups, placements) if w == "gpu"),
        host_bytes=sum(_host_bytes(s, states_per_param, host_counter)
                       for s, w in zip(subgroups, placements) if w == "cpu"))


def _candidates(n: int) -> Iterable[tuple[str, ...]]:
    """Placements to evaluate: all of them for small n; otherwise DOS's interleavings
    (every g-th subgroup on one side, each offset), prefixes and suffixes."""
    if n <= EXHAUSTIVE_LIMIT:
        yield from itertools.product(PLACEMENTS, repeat=n)
        return
    seen: set[tuple[str, ...]] = set()
    for gap in range(1, n + 1):
        for offset in range(gap):
            for on, off in (("gpu", "cpu"), ("cpu", "gpu")):
                every = tuple(on if i % gap == offset else off for i in range(n))
                seen.add(every)
    for k in range(n + 1):
        seen.add(("cpu",) * k + ("gpu",) * (n - k))
        seen.add(("gpu",) * k + ("cpu",) * (n - k))
        if 0 < k < n:  # k CPU subgroups spread evenly
            seen.add(tuple("cpu" if math.floor((i + 1) * k / n) > math.floor(i * k / n)
                           else "gpu" for i in range(n)))
    yield from sorted(seen)


def _closest_share(subgroups: Sequence[Subgroup], candidates: Iterable[tuple[str, ...]],
                   fraction: float) -> list[tuple[str, ...]]:
    """The candidates whose share of parameters on the CPU is closest to ``fraction``."""
    total = sum(s.numel for s in subgroups) or 1
    distance = {c: abs(sum(s.numel for s, w in zip(subgroups, c) if w == "cpu") / total
                       - fraction) for c in candidates}
    closest = min(distance.values())
    return [c for c, d in distance.items() if d <= closest + 1e-12]


def plan_offload(subgroups: Sequence[Subgroup], hardware: HardwareProfile, *,
                 gpu_state_budget_bytes: int | None = None, cpu_fraction: float | None = None,
                 states_per_param: int = 2, contention: float = DEFAULT_CONTENTION,
                 counter_bytes: tuple[int, int] = (0, 0)) -> OffloadPlan:
    """Choose a placement per subgroup.

    Among the placements whose resident GPU state fits ``gpu_state_budget_bytes`` (None: no
    limit), and, when ``cpu_fraction`` is given, whose share of parameters on the CPU is
    the closest possible to it, the one with the least predicted time; ties go to less GPU
    state, then to the placement that comes first with "cpu" < "gpu" in subgroup order
    (the earliest-ready subgroups offloaded first). On a CPU device the host subgroups'
    bytes count in the budget too (the same memory), so a budget never moves state to the
    host there; ``cpu_fraction`` still forces it (for tests). Raises ``ValueError`` on bad
    arguments and when no placement fits (a forced ``cpu_fraction``, or a CPU device).
    """
    if gpu_state_budget_bytes is not None and (
            isinstance(gpu_state_budget_bytes, bool) or not isinstance(gpu_state_budget_bytes, int)
            or gpu_state_budget_bytes < 0):
        raise ValueError("fxopt.optim: gpu_state_budget_bytes must be an int >= 0 or None, "
                         f"got {gpu_state_budget_bytes!r}")
    if cpu_fraction is not None and (isinstance(cpu_fraction, bool) or not isinstance(
            cpu_fraction, (int, float)) or not 0.0 <= cpu_fraction <= 1.0):
        raise ValueError(f"fxopt.optim: cpu_fraction must be in [0, 1] or None, "
                         f"got {cpu_fraction!r}")
    if isinstance(states_per_param, bool) or not isinstance(states_per_param, int) \
            or states_per_param < 0:
        raise ValueError(f"fxopt.optim: states_per_param must be an int >= 0, "
                         f"got {states_per_param!r}")
    if not isinstance(contention, (int, float)) or contention < 1.0:
        raise ValueError(f"fxopt.optim: contention must be a number >= 1, got {contention!r}")
    counter_bytes = _check_counters(counter_bytes)
    n = len(subgroups)
    candidates: Iterable[tuple[str, ...]] = _candidates(n)
    if cpu_fraction is not None:
        candidates = _closest_share(subgroups, candidates, cpu_fraction)

    def predict(placement: Sequence[str]) -> Prediction:
        return simulate(subgroups, placement, hardware, states_per_param=states_per_param,
                        contention=contention, counter_bytes=counter_bytes)

    best: tuple[tuple[float, int, tuple[str, ...]], Prediction] | None = None
    for placement in candidates:
        prediction = predict(placement)
        if (gpu_state_budget_bytes is not None
                and _resident(prediction, hardware) > gpu_state_budget_bytes):
            continue
        # Times equal up to rounding are a tie (a sum in another order differs in ulps).
        rank = (round(prediction.seconds, 12), prediction.gpu_state_bytes, placement)
        if best is None or rank < best[0]:
            best = (rank, prediction)
    if best is None and hardware.device_type == "cpu" and cpu_fraction is None:
        raise ValueError(
            f"fxopt.optim: on a CPU device the host is the device's memory: a host subgroup "
            f"frees nothing (it adds an fp32 master, gradient and staging buffer to its "
            f"state), so no placement keeps the optimizer within gpu_state_budget_bytes="
            f"{gpu_state_budget_bytes}; raise it, or force host updates with cpu_fraction")
    if best is None:
        raise ValueError(
            f"fxopt.optim: no placement with the CPU share closest to "
            f"cpu_fraction={cpu_fraction} keeps the GPU optimizer state within "
            f"gpu_state_budget_bytes={gpu_state_budget_bytes}; raise the budget or the "
            "CPU fraction")
    (_, _, placement), prediction = best
    return _offload_plan(subgroups, placement, prediction, hardware, gpu_state_budget_bytes,
                         cpu_fraction, states_per_param, contention, counter_bytes)


def _resident(prediction: Prediction, hardware: HardwareProfile) -> int:
    """The optimizer's bytes in the device's memory: its device state, and on a CPU device
    the host subgroups' bytes too (the same memory; moving state there costs more than it
    frees)."""
    return prediction.gpu_state_bytes + (prediction.host_bytes
                                         if hardware.device_type == "cpu" else 0)


def _offload_plan(subgroups: Sequence[Subgroup], placement: Sequence[str],
                  prediction: Prediction, hardware: HardwareProfile,
                  gpu_state_budget_bytes: int | None, cpu_fraction: float | None,
                  states_per_param: int, contention: float,
                  counter_bytes: tuple[int, int] = (0, 0)) -> OffloadPlan:
    n = len(subgroups)

    def predict(placement: Sequence[str]) -> Prediction:
        return simulate(subgroups, placement, hardware, states_per_param=states_per_param,
                        contention=contention, counter_bytes=counter_bytes)

    all_gpu, all_cpu = predict(("gpu",) * n), predict(("cpu",) * n)
    return OffloadPlan(
        subgroups=tuple(
            SubgroupPlan(index=i, params=s.params, numel=s.numel, placement=where,
                         gpu_state_bytes=(_device_bytes(s, states_per_param, counter_bytes[0])
                                          if where == "gpu" else 0),
                         finish_seconds=prediction.finish_seconds[i])
            for i, (s, where) in enumerate(zip(subgroups, placement))),
        predicted_seconds=prediction.seconds, all_gpu_seconds=all_gpu.seconds,
        all_cpu_seconds=all_cpu.seconds, gpu_state_bytes=prediction.gpu_state_bytes,
        all_gpu_state_bytes=all_gpu.gpu_state_bytes, host_bytes=prediction.host_bytes,
        hardware=hardware.name, gpu_state_budget_bytes=gpu_state_budget_bytes,
        cpu_fraction=cpu_fraction, states_per_param=states_per_param, contention=contention,
        counter_bytes=tuple(counter_bytes),
        backward_seconds=max((s.ready_seconds for s in subgroups), default=0.0))


def offload_frontier(subgroups: Sequence[Subgroup], hardware: HardwareProfile, *,
                     states_per_param: int = 2, contention: float = DEFAULT_CONTENTION
                     ) -> list[OffloadPlan]:
    """The non-dominated placements, least resident bytes first: resident bytes (the device
    state; on a CPU device the host subgroups' bytes too, the same memory) against the
    predicted optimizer time. Ties go as in :func:`plan_offload`."""
    points = []
    for placement in _candidates(len(subgroups)):
        p = simulate(subgroups, placement, hardware, states_per_param=states_per_param,
                     contention=contention)
        resident = _resident(p, hardware)
        points.append((resident, round(p.seconds, 12), p.gpu_state_bytes, placement, p))
    frontier: list[OffloadPlan] = []
    fastest = math.inf
    for _, seconds, _, placement, prediction in sorted(points, key=lambda q: q[:4]):
        if seconds < fastest:  # least resident first: keep each that is faster
            frontier.append(_offload_plan(subgroups, placement, prediction, hardware, None,
                                          None, states_per_param, contention))
            fastest = seconds
    return frontier
