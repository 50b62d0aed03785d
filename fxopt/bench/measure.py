"""Measure one workload under one configuration: step time, throughput, peak memory,
compile time, and the largest batch under a memory cap.

Step time is the median over timed steps after warm-up (CUDA events on a GPU, the wall
clock on the CPU, where the whole measurement runs on one thread: torch's thread pool on
shared cores is what made tiny CPU medians differ 50x between runs); its spread is
(slowest - fastest) / median, and a step time from fewer than ``RELIABLE_STEPS`` steps or
with a spread above ``RELIABLE_SPREAD`` is marked unreliable (``timing_reliable``), which
the report carries into every ratio made from it. Compile time is the first step's time
less the median. Peak memory is
``torch.cuda.max_memory_allocated`` over the timed steps on CUDA; on the CPU, where the
allocator keeps no such count, it is `fxopt.profile_memory`'s total (allocation records),
which also gives the activations kept for backward on both. The largest batch is a
doubling-then-bisection search (:func:`largest_batch`) over whether a step fits: on CUDA
under ``torch.cuda.set_per_process_memory_fraction`` (an out-of-memory error means no), on
the CPU by the measured peak against the cap.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from fxopt.bench.configs import Config
from fxopt.bench.workloads import Workload
from fxopt.devices import indexed
from fxopt.profile import default_loss, profile_memory

__all__ = ["Measurement", "Settings", "largest_batch", "measure", "timing_spread"]

log = logging.getLogger(__name__)

RELIABLE_STEPS = 5      # fewer timed steps: no median worth comparing
RELIABLE_SPREAD = 0.10  # (slowest - fastest) / median above this: too noisy to compare


@dataclass(frozen=True)
class Settings:
    """How to measure. ``warmup`` untimed steps (the first, which compiles, always is
    one), then ``steps`` timed ones; ``memory_cap`` None skips the largest-batch search,
    which tries batches up to ``max_batch``."""

    smoke: bool
    device: torch.device
    warmup: int = 2
    steps: int = 5
    memory_cap: int | None = None   # bytes; None: no largest-batch search
    max_batch: int = 1024

    def __post_init__(self) -> None:
        # torch.cuda is given indexed devices only (fxopt.devices)
        object.__setattr__(self, "device", indexed(self.device))


@dataclass
class Measurement:
    workload: str
    config: str
    kind: str
    status: str                       # "ok" or "failed"
    batch: int
    error: str | None = None
    step_ms: float | None = None
    step_spread: float | None = None  # (slowest - fastest) / median of the timed steps
    timing_reliable: bool = False
    throughput: float | None = None   # items (tokens, images) per second
    unit: str = ""
    peak_bytes: int | None = None
    activation_bytes: int | None = None
    compile_s: float | None = None
    max_batch: int | None = None


def timing_spread(times: list[float]) -> tuple[float | None, bool]:
    """(spread, reliable) of step times: (slowest - fastest) / median (None for a zero
    median), and whether there are at least ``RELIABLE_STEPS`` of them with a spread of at
    most ``RELIABLE_SPREAD``."""
    median = statistics.median(times)
    spread = (max(times) - min(times)) / median if median > 0 else None
    return spread, (len(times) >= RELIABLE_STEPS and spread is not None
                    and spread <= RELIABLE_SPREAD)


def largest_batch(fits: Callable[[int], bool], start: int, limit: int) -> int:
    """The largest batch in [1, limit] for which ``fits`` holds, assuming it holds up to
    some size and not beyond: double from ``start`` until it fails, then bisect. 0 if not
    even a batch of 1 fits."""
    batch = max(1, min(start, limit))
    lo, hi = 0, batch  # lo fits (0: nothing known to), hi does not
    if fits(batch):
        lo = batch
        while lo < limit:
            hi = min(2 * lo, limit)
            if not fits(hi):
                break
            lo = hi
        else:
            return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(indexed(device))


class _Trainer:
    """A model prepared under a configuration, its optimizer, and a step on any batch."""

    def __init__(self, workload: Workload, config: Config, settings: Settings) -> None:
        torch.manual_seed(0)
        self.workload, self.config, self.settings = workload, config, settings
        self.raw = workload.build(settings.smoke).to(settings.device)
        self.model = config.prepare(self.raw, workload)
        self.optimizer = config.optimizer(torch.optim.AdamW(self.raw.parameters(), lr=1e-4),
                                          self.raw)

    def inputs(self, batch: int) -> Any:
        return self.workload.inputs(self.raw, batch, self.settings.smoke, self.settings.device)

    def step(self, inputs: Any) -> None:
        with self.config.context():
            args, kwargs = ((), inputs) if isinstance(inputs, dict) else (inputs, {})
            default_loss(self.model(*args, **kwargs)).backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def timed_step(self, inputs: Any) -> float:
        """One step's time in seconds (CUDA events on a GPU)."""
        device = self.settings.device
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.step(inputs)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        begin = time.perf_counter()
        self.step(inputs)
        return time.perf_counter() - begin

    def peak(self, inputs: Any) -> tuple[int, int]:
        """(peak bytes, activation bytes at the peak) of one step."""
        with self.config.context():
            profile = profile_memory(self.model, inputs, self.optimizer, steps=1, warmup=0)
        peak = profile.measured_peak_bytes or profile.peak_bytes
        return peak, profile.peak_categories["activations"]


def measure(workload: Workload, config: Config, settings: Settings) -> Measurement:
    """Everything the suite reports for one workload and configuration; a failure is
    returned as a failed measurement with its error, never raised."""
    batch = workload.smoke_batch if settings.smoke else workload.batch
    result = Measurement(workload.name, config.name, config.kind, "failed", batch,
                         unit=workload.unit + "/s")
    trainer = None
    try:
        with _one_thread_on_cpu(settings.device):
            trainer = _Trainer(workload, config, settings)
            _measure_with(trainer, result, batch, settings)
        result.status = "ok"
    except Exception as exc:  # a failing workload is reported and the suite goes on
        log.warning("bench: %s / %s failed: %s", workload.name, config.name, exc,
                    exc_info=log.isEnabledFor(logging.DEBUG))
        result.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}" \
            if str(exc).strip() else type(exc).__name__
    finally:
        del trainer
        _release(settings.device)
    return result


@contextlib.contextmanager
def _one_thread_on_cpu(device: torch.device) -> Iterator[None]:
    """CPU timings on one thread (restored afterwards)."""
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _measure_with(trainer: _Trainer, result: Measurement, batch: int,
                  settings: Settings) -> None:
    """Time, memory and the largest batch of ``trainer`` into ``result``."""
    workload = trainer.workload
    inputs = trainer.inputs(batch)
    first = trainer.timed_step(inputs)
    for _ in range(settings.warmup - 1):
        trainer.timed_step(inputs)
    if settings.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(settings.device)
    times = [trainer.timed_step(inputs) for _ in range(settings.steps)]
    median = statistics.median(times)
    result.step_ms = 1e3 * median
    result.step_spread, result.timing_reliable = timing_spread(times)
    result.throughput = batch * workload.items(settings.smoke) / median
    result.compile_s = max(0.0, first - median)
    result.peak_bytes, result.activation_bytes = trainer.peak(inputs)
    if settings.device.type == "cuda":
        result.peak_bytes = max(result.peak_bytes,
                                torch.cuda.max_memory_allocated(settings.device))
    if settings.memory_cap is not None:
        fits = functools.partial(_fits, trainer, settings=settings)
        result.max_batch = largest_batch(fits, batch, settings.max_batch)


def _fits(trainer: _Trainer, batch: int, settings: Settings) -> bool:
    """Whether a training step at ``batch`` stays under the memory cap."""
    cap, device = settings.memory_cap, settings.device
    inputs = trainer.inputs(batch)
    if device.type != "cuda":
        peak, _ = trainer.peak(inputs)
        return peak <= cap
    total = torch.cuda.get_device_properties(indexed(device)).total_memory
    _release(device)
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), indexed(device))
    try:
        torch.cuda.reset_peak_memory_stats(indexed(device))
        trainer.step(inputs)
        _sync(device)
        return torch.cuda.max_memory_allocated(indexed(device)) <= cap
    except torch.cuda.OutOfMemoryError:
        trainer.optimizer.zero_grad(set_to_none=True)
        return False
    finally:
        del inputs
        torch.cuda.set_per_process_memory_fraction(1.0, indexed(device))
        _release(device)


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()

