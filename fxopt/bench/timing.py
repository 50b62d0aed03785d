"""The one timing helper of fxopt's benchmarks: step times with their spread, taken the same
way by the suite, the GPU check (``benchmarks/gpu_check.py``) and the per-pass scripts.

On CUDA a step is timed by CUDA events recorded around it (the GPU's own clock, no host
sync inside the step); on the CPU by ``time.perf_counter``. The first call is always
untimed and its wall time (synchronized) is kept as the compile time; ``warmup`` more
calls follow, then ``steps`` timed ones. :func:`interleaved` times several candidates in
rounds (one step of each per round, the order rotated every round), so that a load that
comes and goes on a shared machine falls on all of them alike. :func:`peak_above` is
``torch.cuda.max_memory_allocated`` (on the device's index, `fxopt.devices.indexed`) less
what was resident before.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from fxopt import _compat
from fxopt.devices import indexed

__all__ = ["Timing", "interleaved", "one_thread", "peak_above", "release",
           "reset_peak", "resident_bytes", "sync", "time_steps"]


@dataclass
class Timing:
    """Seconds of the first (compiling) call and of each timed step."""

    first_s: float
    times_s: list[float] = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return 1e3 * statistics.median(self.times_s)

    @property
    def min_ms(self) -> float:
        return 1e3 * min(self.times_s)

    @property
    def max_ms(self) -> float:
        return 1e3 * max(self.times_s)

    @property
    def spread(self) -> float:
        """(slowest - fastest) / median."""
        median = statistics.median(self.times_s)
        return (max(self.times_s) - min(self.times_s)) / median if median > 0 else 0.0

    def text(self, digits: int = 1) -> str:
        """``median (min-max)`` in milliseconds, the shape of the GPU tables."""
        return (f"{self.median_ms:.{digits}f} ({self.min_ms:.{digits}f}-"
                f"{self.max_ms:.{digits}f})")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(indexed(device))


def _wall(step: Callable[[], object], device: torch.device) -> float:
    sync(device)
    begin = time.perf_counter()
    step()
    sync(device)
    return time.perf_counter() - begin


def _timed(step: Callable[[], object], device: torch.device) -> float:
    if device.type != "cuda":
        begin = time.perf_counter()
        step()
        return time.perf_counter() - begin
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    step()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def time_steps(step: Callable[[], object], device: torch.device | str, *, warmup: int = 2,
               steps: int = 10, before_timed: Callable[[], object] | None = None) -> Timing:
    """Time ``step``: one first call (its wall time kept), ``warmup`` untimed calls,
    ``before_timed()`` (e.g. resetting the peak memory statistics), then ``steps`` timed
    calls."""
    device = torch.device(device)
    timing = Timing(_wall(step, device))
    for _ in range(warmup):
        step()
    sync(device)
    if before_timed is not None:
        before_timed()
    timing.times_s = [_timed(step, device) for _ in range(steps)]
    return timing


def interleaved(steps: Mapping[str, Callable[[], object]], device: torch.device | str, *,
                warmup: int = 2, rounds: int = 10) -> dict[str, Timing]:
    """Time every candidate of ``steps`` in ``rounds`` rounds of one step each (first calls
    and warm-up first, each candidate in turn); the order within a round rotates."""
    device = torch.device(device)
    names = list(steps)
    timings = {name: Timing(_wall(steps[name], device)) for name in names}
    for name in names:
        for _ in range(warmup):
            steps[name]()
    sync(device)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            timings[name].times_s.append(_timed(steps[name], device))
    return timings


def peak_above(device: torch.device | str, resident: int) -> int | None:
    """Peak bytes allocated on a CUDA ``device`` since the last reset, less ``resident``;
    None on other devices (no allocator statistics)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(indexed(device)) - resident


def resident_bytes(device: torch.device | str) -> int | None:
    """Bytes allocated on a CUDA ``device`` now (None elsewhere)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return torch.cuda.memory_allocated(indexed(device))


def reset_peak(device: torch.device | str) -> None:
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(indexed(device))


def release(device: torch.device | str) -> None:
    """Drop what Dynamo and the allocator keep between two configurations."""
    _compat.dynamo_reset()
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


@contextmanager
def one_thread() -> Iterator[None]:
    """CPU timings on one thread (restored afterwards): torch's thread pool on shared cores
    is what made tiny CPU medians differ 50x between runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
