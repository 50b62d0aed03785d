"""Where each optimizer subgroup updates: the performance model and the plan, on plain data.

Deep Optimizer States splits the parameters into subgroups (contiguous in gradient-ready
order, size-balanced) and decides per subgroup whether its optimizer state lives on the
device or on the host, and where a host-resident subgroup updates: on the host CPU, or on
the device after its state is copied in (and written back after), so that the CPU, the
device and both directions of the link work at once. This module is that decision as pure
functions on plain data (no tensors, no fx graphs), so the offload pass, the runtime and the
planner (which may fold it into its solver) share it:

- :func:`split_subgroups` cuts parameters (in gradient-ready order) into subgroups;
- :func:`simulate` predicts the optimizer phase of a step for one placement per subgroup;
- :func:`plan_offload` chooses the placements: the fastest one whose device bytes fit
  ``gpu_state_budget_bytes``, or the fastest with a forced share of state on the host
  (``cpu_fraction``); ``staged`` forces or forbids staged updates;
- :func:`offload_frontier`: the placements no other beats on both resident state and time,
  which the shared-budget search (:mod:`fxopt.optim.shared_budget`) pairs with activation
  plans (without staged updates: the search does not consider them yet).

Three placements (:data:`PLACEMENTS`). The model, with t=0 at the end of the backward (when
``optimizer.step()`` may start) and the rates of a :class:`~fxopt.planner.HardwareProfile`:

- "gpu": the state stays on the device; the update streams parameters, gradients and state
  once: ``numel * itemsize * (3 + 2 * states) / memory_bandwidth``, one subgroup after
  another on the device from t=0 (the runtime launches these first);
- "cpu": fp32 master weights and state in host memory: its gradients go to the host as soon
  as they are ready (one device->host link, in ready order, during the backward), its
  update runs on the CPU from t=0 (the runtime updates in ``step()``, after any gradient
  clipping) at ``cpu_update_params_per_second``, one subgroup after another, and its
  parameters go back on the host->device link once updated;
- "staged" (Deep Optimizer States' staged device update): the state lives in host memory in
  the optimizer's own dtypes (no master: the device update is the plain optimizer's); in
  ``step()`` it is copied host->device into one of two staging buffers (each as large as the
  largest staged subgroup's state), updated there by the same kernel a "gpu" subgroup uses,
  after the "gpu" subgroups, and written back device->host. Double-buffered: subgroup k+1's
  copy in and k-1's write-back overlap k's update; a buffer is refilled once its last
  write-back is done;
- when more than one kind runs in one step, CPU updates and copies are slowed by
  ``contention`` (host memory and PCIe shared with the device's traffic; DOS models it, its
  formula is not published, so the default is a guess to calibrate, not a measured number),
  and the copies of both host kinds share each direction of the link: the phase is at least
  each direction's bytes at the link's rate;
- on a CPU device there is no link and the "device" updates share the same cores: every
  kind runs one after the other (staged copies at ``memory_bandwidth``).

The predicted time of the optimizer phase is when the last update or copy ends.

Whether the host keeps up. The host work adds ``host_overhead_seconds`` (the predicted phase
minus all-on-the-device) to the step, and only the gradients' copies hide in the backward.
The plan compares that overhead with the backward's length (the largest subgroup
``ready_seconds``: the first subgroup's last gradient, a lower bound of the backward and so
of the step): within ``MAX_SLOWDOWN - 1`` of it, the step stays within ``MAX_SLOWDOWN``
times the plain one; beyond it the host cannot keep up, and :meth:`OffloadPlan.keeps_up`
says so.

The bytes are the runtime's buffers, exactly (``tests/optim/test_optim_accounting.py`` holds
them to the profiler's categories). A "gpu" subgroup keeps ``states`` tensors of each
parameter's size and dtype on the device; a "cpu" one keeps on the host, per element, an
fp32 master, its fp32 gradient, ``states`` fp32 tensors and a staging buffer in the
parameter's dtype (gradient in, parameter out), and on the device nothing beyond the
parameter and its gradient, which every placement has. A "staged" one keeps its ``states``
tensors on the host, and the device holds the two staging buffers, shared by all staged
subgroups (one when a single subgroup is staged). ``counter_bytes`` adds per-parameter
scalar state (Adam's ``step``) where it lives (a staged subgroup's device counters are
staged with its state). Parameters that never get a gradient have no state; the prediction
counts them all.

Staging costs device memory, so a plan stages only what pays: left to choose (``staged``
None), it stages only where the device saving stays at least ``MIN_SAVING`` of the state
placed on the host (issue 30's goal; with size-balanced subgroups, two buffers are within
10% of the state only from about 20 host-resident subgroups), only where the device has
memory of its own, and always within the budget.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fxopt.optim.offload_plan import DEFAULT_CONTENTION, MAX_SLOWDOWN, OffloadPlan, SubgroupPlan
from fxopt.planner.hardware import HardwareProfile

__all__ = [
    "MAX_SLOWDOWN", "MIN_SAVING", "PLACEMENTS", "ParamInfo", "Subgroup", "SubgroupPlan",
    "OffloadPlan", "Prediction",
    "split_subgroups", "simulate", "plan_offload", "offload_frontier",
]

# Where a subgroup's state lives and updates: on the device; on the host, updated there;
# on the host, updated on the device through the staging buffers.
PLACEMENTS = ("gpu", "cpu", "staged")
RESIDENCIES = ("gpu", "cpu")  # where the state lives ("cpu": the host), for the search
# Issue 30's goal: the device saves at least this share of the state placed on the host.
# A plan left to choose stages only within it (staging buffers are device memory).
MIN_SAVING = 0.9
# Up to this many subgroups every residency is evaluated (2**12 simulations, ~50 ms) ...
EXHAUSTIVE_LIMIT = 12
# ... and up to this many every split of the host-resident ones into host and staged
# updates too (3**7 simulations); beyond, the k smallest host-resident subgroups are staged
# (the buffers are as large as the largest staged subgroup), for up to STAGED_COUNTS values
# of k, on the structured residencies (n = 64 under a budget: ~1 s).
STAGED_EXHAUSTIVE_LIMIT = 7
STAGED_COUNTS = 16


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
    gpu_state_bytes: int            # optimizer bytes on the device: resident state, staging
    host_bytes: int                 # fp32 master weights, state, gradient and staging buffers
    staging_bytes: int = 0          # the staging buffers (part of gpu_state_bytes)


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


def _staged_host_bytes(s: Subgroup, states: int, counters: tuple[int, int]) -> int:
    """A staged subgroup's state on the host: its device state, with the counters the
    device would keep, or where torch keeps them on the host (CUDA, unfused Adam), those."""
    return _device_bytes(s, states, counters[0] or counters[1])


@dataclass(frozen=True)
class _Bytes:
    device: int    # on the device: the "gpu" subgroups' state and the staging buffers
    host: int      # on the host: the "cpu" and "staged" subgroups' buffers
    staging: int   # the staging buffers: two (one for a single staged subgroup), each
                   # the largest staged subgroup's device state
    moved: int     # the device state the host-resident subgroups would have had


def _placement_bytes(subgroups: Sequence[Subgroup], placements: Sequence[str], states: int,
                     counters: tuple[int, int]) -> _Bytes:
    device = [_device_bytes(s, states, counters[0]) for s in subgroups]
    staged = [b for b, w in zip(device, placements) if w == "staged"]
    staging = min(2, len(staged)) * max(staged, default=0)
    return _Bytes(
        device=sum(b for b, w in zip(device, placements) if w == "gpu") + staging,
        host=sum(_host_bytes(s, states, counters[1]) if w == "cpu"
                 else _staged_host_bytes(s, states, counters)
                 for s, w in zip(subgroups, placements) if w != "gpu"),
        staging=staging, moved=sum(b for b, w in zip(device, placements) if w != "gpu"))


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
    counters = _check_counters(counter_bytes)
    if len(placements) != len(subgroups):
        raise ValueError(f"fxopt.optim: {len(placements)} placements for "
                         f"{len(subgroups)} subgroups")
    bad = [p for p in placements if p not in PLACEMENTS]
    if bad:
        raise ValueError(f"fxopt.optim: unknown placement {bad[0]!r}; valid: {PLACEMENTS}")
    states = states_per_param
    slow = contention if len(set(placements)) > 1 else 1.0
    link = hardware.host_device_bandwidth
    finish = [0.0] * len(subgroups)
    gpu_free = cpu_free = h2d_free = 0.0
    d2h_free = -math.inf  # gradients leave during the backward, before t=0
    h2d_bytes = 0
    for i, (s, where) in enumerate(zip(subgroups, placements)):
        if where == "gpu":  # launched first
            gpu_free += _gpu_update_seconds(s, hardware, states)
            finish[i] = gpu_free
        elif where == "cpu":
            copied = 0.0
            if link is not None:
                d2h_free = max(d2h_free, -s.ready_seconds) + s.grad_bytes() * slow / link
                copied = d2h_free
            cpu_free = max(cpu_free, copied, 0.0) + _cpu_update_seconds(s, hardware) * slow
            finish[i] = cpu_free
            if link is not None:
                h2d_free = max(h2d_free, cpu_free) + s.grad_bytes() * slow / link
                h2d_bytes += s.grad_bytes()
                finish[i] = h2d_free
    staged = [i for i, where in enumerate(placements) if where == "staged"]
    staged_bytes = [_device_bytes(subgroups[i], states, counters[0]) for i in staged]
    if link is None:  # a CPU device: every kind on the same cores, one after another
        seconds = gpu_free + cpu_free
        for i, b in zip(staged, staged_bytes):
            seconds += (_gpu_update_seconds(subgroups[i], hardware, states)
                        + 2 * b / hardware.memory_bandwidth)
            finish[i] = seconds
    else:
        # Staged: in, update (after the "gpu" ones), back; a buffer refills after its
        # last write-back.
        up_free = back_free = 0.0
        buffer_free = [0.0, 0.0]
        for j, (i, b) in enumerate(zip(staged, staged_bytes)):
            up_free = max(up_free, buffer_free[j % 2]) + b * slow / link
            gpu_free = max(gpu_free, up_free) + _gpu_update_seconds(subgroups[i], hardware,
                                                                    states)
            back_free = max(back_free, gpu_free) + b * slow / link
            buffer_free[j % 2] = finish[i] = back_free
        # both host kinds' copies share each direction of the link
        shared = max((h2d_bytes + sum(staged_bytes)) * slow / link,
                     max(d2h_free, 0.0) + sum(staged_bytes) * slow / link if staged else 0.0)
        seconds = max([gpu_free, shared, 0.0] + finish)
    size = _placement_bytes(subgroups, placements, states, counters)
    return Prediction(seconds=seconds, finish_seconds=tuple(finish),
                      gpu_state_bytes=size.device, host_bytes=size.host,
                      staging_bytes=size.staging)


def _structured(n: int, offsets: bool = False) -> set[tuple[str, ...]]:
    """DOS's interleavings (every g-th subgroup on one side; with ``offsets`` each offset,
    else the first), prefixes, suffixes and k host subgroups spread evenly."""
    seen: set[tuple[str, ...]] = set()
    for gap in range(1, n + 1):
        for offset in range(gap if offsets else 1):
            for on, off in (("gpu", "cpu"), ("cpu", "gpu")):
                seen.add(tuple(on if i % gap == offset else off for i in range(n)))
    for k in range(n + 1):
        seen.add(("cpu",) * k + ("gpu",) * (n - k))
        seen.add(("gpu",) * k + ("cpu",) * (n - k))
        if 0 < k < n:  # k CPU subgroups spread evenly
            seen.add(tuple("cpu" if math.floor((i + 1) * k / n) > math.floor(i * k / n)
                           else "gpu" for i in range(n)))
    return seen


def _candidates(n: int) -> Iterable[tuple[str, ...]]:
    """Residencies ("gpu" or "cpu": the host) to evaluate: all of them for small n,
    otherwise the structured ones with every offset."""
    if n <= EXHAUSTIVE_LIMIT:
        yield from itertools.product(RESIDENCIES, repeat=n)
    else:
        yield from sorted(_structured(n, offsets=True))


def _closest_share(subgroups: Sequence[Subgroup], candidates: Iterable[tuple[str, ...]],
                   fraction: float) -> list[tuple[str, ...]]:
    """The candidates whose share of parameters on the CPU is closest to ``fraction``."""
    total = sum(s.numel for s in subgroups) or 1
    distance = {c: abs(sum(s.numel for s, w in zip(subgroups, c) if w == "cpu") / total
                       - fraction) for c in candidates}
    closest = min(distance.values())
    return [c for c, d in distance.items() if d <= closest + 1e-12]


def _check_staged(staged: Any) -> bool | float | None:
    if staged is None or isinstance(staged, bool):
        return staged
    if isinstance(staged, (int, float)) and 0.0 <= staged <= 1.0:
        return float(staged)
    raise ValueError(f"fxopt.optim: staged must be None (the plan chooses), True, False or a "
                     f"share in [0, 1], got {staged!r}")


def _staged_splits(subgroups: Sequence[Subgroup], residency: tuple[str, ...],
                   staged: bool | float | None, may_stage: bool) -> Iterable[tuple[str, ...]]:
    """The placements that stage some of ``residency``'s host-resident subgroups: every
    split for few subgroups when the plan chooses, else the k smallest (the buffers are as
    large as the largest staged one; ties: the latest-ready, so the host gets the
    gradients that arrive first), for each k or for the share ``staged`` forces."""
    hosted = [i for i, w in enumerate(residency) if w == "cpu"]
    if not may_stage or not hosted:
        yield residency
        return

    def placement(chosen: Iterable[int]) -> tuple[str, ...]:
        chosen = set(chosen)
        return tuple("staged" if i in chosen else w for i, w in enumerate(residency))

    if staged is None and len(residency) <= STAGED_EXHAUSTIVE_LIMIT:
        for k in range(len(hosted) + 1):
            yield from map(placement, itertools.combinations(hosted, k))
        return
    order = sorted(hosted, key=lambda i: (subgroups[i].numel, -i))
    if staged is None:  # every k up to STAGED_COUNTS, beyond a grid of that many steps
        step = max(1, math.ceil(len(order) / STAGED_COUNTS))
        counts: Iterable[int] = sorted({*range(0, len(order), step), len(order)})
    elif staged is True:
        counts = [len(order)]
    else:  # the share of the host-resident parameters closest to ``staged``
        prefix = list(itertools.accumulate([subgroups[i].numel for i in order], initial=0))
        total = prefix[-1] or 1
        counts = [min(range(len(prefix)), key=lambda k: (abs(prefix[k] / total - staged), k))]
    for k in counts:
        yield placement(order[:k])


def plan_offload(subgroups: Sequence[Subgroup], hardware: HardwareProfile, *,
                 gpu_state_budget_bytes: int | None = None, cpu_fraction: float | None = None,
                 staged: bool | float | None = None, states_per_param: int = 2,
                 contention: float = DEFAULT_CONTENTION,
                 counter_bytes: tuple[int, int] = (0, 0)) -> OffloadPlan:
    """Choose a placement per subgroup.

    Among the placements whose device bytes (resident state and staging buffers) fit
    ``gpu_state_budget_bytes`` (None: no limit), and, when ``cpu_fraction`` is given, whose
    share of parameters with their state on the host is the closest possible to it, the
    one with the least predicted time; ties go to fewer device bytes, then to the
    placement that comes first with "cpu" < "gpu" < "staged" in subgroup order (the
    earliest-ready subgroups offloaded first, updated on the host).

    ``staged``: None, the plan chooses which host-resident subgroups update on the device
    (where the device has memory of its own, and only while the device saving stays at
    least ``MIN_SAVING`` of the state placed on the host); True: all of them; False: none;
    a share in [0, 1]: that share of the host-resident parameters (the smallest subgroups
    first). Forcing it works on a CPU device too, which is how the tests run the path.

    On a CPU device the host subgroups' bytes count in the budget too (the same memory), so
    a budget never moves state to the host there; ``cpu_fraction`` still forces it (for
    tests). Raises ``ValueError`` on bad arguments and when no placement fits (a forced
    ``cpu_fraction`` or ``staged``, or a CPU device).
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
    staged = _check_staged(staged)
    may_stage = staged is not False and (staged is not None
                                         or hardware.host_device_bandwidth is not None)
    residencies: Iterable[tuple[str, ...]] = _candidates(len(subgroups))
    if cpu_fraction is not None:
        residencies = _closest_share(subgroups, residencies, cpu_fraction)
    # Staging splits each residency in many ways: beyond STAGED_EXHAUSTIVE_LIMIT subgroups,
    # and unless a forced share leaves few residencies, only the structured ones are split.
    structured = (None if cpu_fraction is not None or staged is not None
                  or len(subgroups) <= STAGED_EXHAUSTIVE_LIMIT
                  else _structured(len(subgroups)))

    def predict(placement: Sequence[str]) -> Prediction:
        return simulate(subgroups, placement, hardware, states_per_param=states_per_param,
                        contention=contention, counter_bytes=counter_bytes)

    def allowed(placement: tuple[str, ...]) -> bool:
        """Within the budget, and (staging left to the plan) saving enough."""
        size = _placement_bytes(subgroups, placement, states_per_param, counter_bytes)
        if gpu_state_budget_bytes is not None and size.device + (
                size.host if hardware.device_type == "cpu" else 0) > gpu_state_budget_bytes:
            return False
        return staged is not None or size.staging <= (1.0 - MIN_SAVING) * size.moved

    best: tuple[tuple[float, int, tuple[str, ...]], Prediction] | None = None
    for residency in residencies:
        here = may_stage and (structured is None or residency in structured)
        for placement in filter(allowed, _staged_splits(subgroups, residency, staged, here)):
            prediction = predict(placement)
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
        forced = f" and staged={staged}" if staged is not None else ""
        raise ValueError(
            f"fxopt.optim: no placement with the CPU share closest to "
            f"cpu_fraction={cpu_fraction}{forced} keeps the GPU optimizer state within "
            f"gpu_state_budget_bytes={gpu_state_budget_bytes}; raise the budget or the "
            "CPU fraction")
    (_, _, placement), prediction = best
    if "cpu" in placement and may_stage and staged is None:  # what staging would do
        residency = tuple("cpu" if w == "staged" else w for w in placement)
        fastest = min(((round(p.seconds, 12), p.gpu_state_bytes, c), p) for c in
                      _staged_splits(subgroups, residency, staged, may_stage)
                      for p in [predict(c)])
        passed_over = None if allowed(fastest[0][2]) else fastest
    else:
        passed_over = None
    note = _staging_note(subgroups, placement, prediction, hardware, staged, may_stage,
                         passed_over, states_per_param, counter_bytes[0],
                         gpu_state_budget_bytes)
    return _offload_plan(subgroups, placement, prediction, hardware, gpu_state_budget_bytes,
                         cpu_fraction, states_per_param, contention, counter_bytes,
                         staged=staged, note=note)


def _staging_note(subgroups: Sequence[Subgroup], placement: Sequence[str],
                  prediction: Prediction, hardware: HardwareProfile,
                  staged: bool | float | None, may_stage: bool, passed_over: Any,
                  states: int, device_counter: int,
                  gpu_state_budget_bytes: int | None = None) -> str:
    """Which subgroups are staged and why, or why none is (for :meth:`OffloadPlan.summary`)."""
    chosen = [i for i, w in enumerate(placement) if w == "staged"]
    buffers = f"{prediction.staging_bytes / 2**20:.3g} MiB of staging buffers"
    if chosen:
        rate = hardware.host_device_bandwidth or hardware.memory_bandwidth
        copies = sum(_device_bytes(subgroups[i], states, device_counter) for i in chosen) / rate
        host = sum(_cpu_update_seconds(subgroups[i], hardware) for i in chosen)
        why = (f"forced (staged={staged})" if staged is not None else
               f"the host's Adam would take {host * 1e3:.3g} ms for them, their state's "
               f"copies {copies * 1e3:.3g} ms each way, overlapping the host's updates")
        return f"subgroups {chosen} update on the device through {buffers}: {why}"
    if "cpu" not in placement:
        return ""
    if staged is not None:
        return f"no staged updates (staged={staged})"
    if not may_stage:
        return "no staged updates: on a CPU device the host is the device's memory"
    if passed_over is not None and passed_over[0][0] < round(prediction.seconds, 12):
        (seconds, _, _), faster = passed_over
        over = (gpu_state_budget_bytes is not None
                and _resident(faster, hardware) > gpu_state_budget_bytes)
        text = ("would not fit gpu_state_budget_bytes" if over else
                f"would cost more than {1 - MIN_SAVING:.0%} of the state placed on the host "
                f"(more subgroups make them smaller)")
        return (f"no subgroup is staged: staging would take the optimizer phase to "
                f"{seconds * 1e3:.3g} ms, but its {faster.staging_bytes / 2**20:.3g} MiB of "
                f"buffers {text}")
    return "no subgroup is staged: it is not predicted faster here"


def _resident(prediction: Prediction, hardware: HardwareProfile) -> int:
    """The optimizer's bytes in the device's memory: its device state and staging buffers,
    and on a CPU device the host subgroups' bytes too (the same memory; moving state
    there costs more than it frees)."""
    return prediction.gpu_state_bytes + (prediction.host_bytes
                                         if hardware.device_type == "cpu" else 0)


def _offload_plan(subgroups: Sequence[Subgroup], placement: Sequence[str],
                  prediction: Prediction, hardware: HardwareProfile,
                  gpu_state_budget_bytes: int | None, cpu_fraction: float | None,
                  states_per_param: int, contention: float,
                  counter_bytes: tuple[int, int] = (0, 0), *,
                  staged: bool | float | None = None, note: str = "") -> OffloadPlan:
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
        backward_seconds=max((s.ready_seconds for s in subgroups), default=0.0),
        staged=staged, staging_bytes=prediction.staging_bytes, staging_note=note,
        host_update_rate=hardware.cpu_update_params_per_second)


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
