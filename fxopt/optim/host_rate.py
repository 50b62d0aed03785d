"""This host's optimizer-update rate, measured: what the offload plan's "does the host keep
up" rests on.

A host-updated subgroup runs the optimizer's own fused CPU kernel with all of torch's
threads (:mod:`fxopt.optim.runtime`), so its time is ``numel / rate`` of *that* kernel on
*this* host. A GPU's hardware profile cannot know the rate: its figures are the GPU's
(datasheet rates, kernels measured on one machine), while the CPU it is plugged into
differs from machine to machine. So where a GPU's profile is not calibrated here
(``fxopt calibrate``), :func:`on_this_host` measures the rate and the plan uses it; a CPU
device's profile describes the host itself and is left to ``fxopt calibrate``.

What is measured: parameters updated per second by one ``step()`` of the optimizer class
with ``fused=True`` (the runtime's kernel; ``foreach`` ran 3x slower on this project's
2-core CPU: 0.56e9 against 1.68e9 parameters/s), on one fp32 tensor as large as the
plan's largest subgroup (within [2**20, 2**25] parameters): the rate falls once the state
outgrows the caches (the same CPU: 1.6e9 at 2**24 parameters, 1.07e9 at 2**25). The best of
a few steps after a warm-up, about 0.1-0.5 s once per process for each optimizer class,
thread count and size (cached).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from fxopt.planner.hardware import HardwareProfile

__all__ = ["measure_update_rate", "host_update_rate", "on_this_host", "MEASURED_NOTE"]

MIN_PARAMS, MAX_PARAMS = 1 << 20, 1 << 25
# how a profile whose host rate was measured here says so (in its notes)
MEASURED_NOTE = "host update rate measured here"
_cache: dict[tuple[type, int, int], float] = {}


def measure_update_rate(optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW,
                        params: int = 1 << 22, repeats: int = 3) -> float:
    """Parameters per second that one fused ``step()`` of ``optimizer_class`` updates on a
    CPU tensor of ``params`` elements (the best of ``repeats`` after a warm-up step that
    also creates the state), with torch's current threads."""
    weight = torch.full((params,), 0.01, requires_grad=True)
    weight.grad = torch.full((params,), 1e-3)
    optimizer = optimizer_class([weight], lr=1e-3, fused=True)
    optimizer.step()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        optimizer.step()
        best = min(best, time.perf_counter() - start)
    return params / best


def host_update_rate(optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW,
                     params: int = 1 << 22) -> float:
    """:func:`measure_update_rate` at ``params`` rounded up to a power of two within
    [2**20, 2**25], measured once per process for each class, thread count and size."""
    size = min(MAX_PARAMS, max(MIN_PARAMS, 1 << max(0, params - 1).bit_length()))
    key = (optimizer_class, torch.get_num_threads(), size)
    if key not in _cache:
        _cache[key] = measure_update_rate(optimizer_class, size)
    return _cache[key]


def on_this_host(hardware: HardwareProfile,
                 optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW,
                 params: int = 1 << 22) -> HardwareProfile:
    """``hardware`` with this host's measured update rate (:func:`host_update_rate`) where
    it is a GPU's profile neither calibrated nor measured here; otherwise ``hardware``
    itself."""
    if (hardware.device_type != "cuda" or hardware.source == "calibrated"
            or MEASURED_NOTE in hardware.notes):
        return hardware
    rate = host_update_rate(optimizer_class, params)
    note = (f"{MEASURED_NOTE}: {optimizer_class.__name__}(fused=True) "
            f"{rate / 1e9:.2f}e9 parameters/s with {torch.get_num_threads()} threads")
    return dataclasses.replace(hardware, cpu_update_params_per_second=rate,
                               notes="; ".join(n for n in (hardware.notes, note) if n))
