"""``fxopt calibrate``: measure a device's rates once and cache them as a hardware profile.

Short measurements (about a second each at the default sizes), each the best of a few
repeats after a warm-up:

- matmul FLOP rate per dtype (float32, bfloat16, and float16 on a GPU): ``a @ b`` of
  square matrices, ``2 n^3`` FLOPs per product;
- memory bandwidth: a device-to-device ``copy_`` of a large tensor (bytes read + written);
- host<->device bandwidth (GPU only): pinned host tensor to the device and back;
- CPU optimizer throughput: ``torch.optim.AdamW(fused=True)`` steps on a CPU tensor,
  parameters updated per second (the figure the optimizer-offload model needs; the
  offloaded optimizer's host kernel, :func:`fxopt.optim.host_rate.measure_update_rate`);
- on a CPU, special functions (exp, erf, tanh, sigmoid, GELU; the median of their
  elements per second) and random draws (``bernoulli_``, dropout's mask), which run far
  below the memory bandwidth there (on a GPU they are memory-bound: not measured);
- per-node overhead, the fixed cost every executed node pays on top of its roofline: on
  the CPU, a compiled training step of a tiny network (fxopt, fx code generation; rooflines
  negligible) divided by its nodes, so generated code, dispatch, allocation and
  AOTAutograd's runtime are in it (about 2 s, most of it compiling); on a GPU, the median
  time of an aten op on a one-element tensor (the launch cost the host pays).

``threads`` (``fxopt calibrate --threads N``) measures with that many CPU threads (torch's
intra-op threads), for a profile of runs that use that many; the profile's notes record it.
With one thread on the CPU, times are the process's CPU time, not the wall clock's.

The profile is written as JSON to :func:`fxopt.planner.hardware.cache_path`
(``$XDG_CACHE_HOME/fxopt/hardware/<device>.json``, by default ``~/.cache/fxopt/hardware/``),
and :func:`fxopt.planner.profile_for` uses it from then on (``source="calibrated"``); delete
the file to go back to the documented defaults.

A measurement can be badly off: tiny sizes (``--quick``) where overheads dominate, or a
machine busy with other work (``--quick`` once measured fp32 matmul at 0.001 TFLOP/s where
the full run gave 0.057). :func:`implausible` compares each rate with the device's
documented default and names those more than ``PLAUSIBLE_FACTOR`` times off; the command
refuses to cache such a profile unless told to (``--force``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from fxopt.devices import indexed
from fxopt.optim.host_rate import measure_update_rate
from fxopt.planner.hardware import HardwareProfile, default_profile

__all__ = ["PLAUSIBLE_FACTOR", "calibrate", "implausible"]

log = logging.getLogger(__name__)

PLAUSIBLE_FACTOR = 10.0  # a rate this many times off the documented default is suspect


def calibrate(device: torch.device | str, *, size: int = 2048, copy_mib: int = 256,
              adam_params: int = 1 << 22, repeats: int = 3,
              threads: int | None = None) -> HardwareProfile:
    """Measure ``device`` (see the module doc); the default profile supplies the name and
    capacity. Smaller sizes make it faster and less accurate (tests use tiny ones).
    ``threads``: measure with that many CPU threads (None: torch's current setting)."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("fxopt: cannot calibrate a CUDA device: CUDA is not available")
    if threads is not None and threads < 1:
        raise ValueError(f"fxopt: calibrate threads must be >= 1, not {threads}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        return _calibrate(device, size, copy_mib, adam_params, repeats)
    finally:
        torch.set_num_threads(before)


def _calibrate(device: torch.device, size: int, copy_mib: int, adam_params: int,
               repeats: int) -> HardwareProfile:
    base = default_profile(device)
    dtypes = ["float32", "bfloat16"] + (["float16"] if device.type == "cuda" else [])
    flops = {name: _matmul_rate(device, getattr(torch, name), size, repeats) for name in dtypes}
    elements = copy_mib * 2**20 // 4
    src = torch.empty(elements, device=device)
    dst = torch.empty_like(src)
    bandwidth = 2 * src.nbytes / _best(lambda: dst.copy_(src), device, repeats)
    host = None
    if device.type == "cuda":
        pinned = torch.empty(elements, pin_memory=True)
        up = _best(lambda: dst.copy_(pinned, non_blocking=True), device, repeats)
        down = _best(lambda: pinned.copy_(dst, non_blocking=True), device, repeats)
        host = src.nbytes / max(up, down)
    profile = HardwareProfile(
        name=base.name, device_type=device.type, flops=flops, memory_bandwidth=bandwidth,
        host_device_bandwidth=host, cpu_update_params_per_second=measure_update_rate(
            torch.optim.AdamW, adam_params, repeats),
        memory_capacity=base.memory_capacity, source="calibrated",
        node_overhead_seconds=_node_overhead(device),
        transcendental_per_second=(_elementwise_rate(device, _TRANSCENDENTAL, repeats)
                                   if device.type == "cpu" else None),
        random_per_second=(_elementwise_rate(device, _RANDOM, repeats)
                           if device.type == "cpu" else None),
        notes=f"fxopt calibrate, torch {torch.__version__}, {torch.get_num_threads()} "
              f"threads, {time.strftime('%Y-%m-%d')}")
    log.info("calibrated %s: %s", device, profile)
    return profile


def implausible(profile: HardwareProfile, reference: HardwareProfile,
                factor: float = PLAUSIBLE_FACTOR) -> list[str]:
    """One line per rate of ``profile`` more than ``factor`` times above or below the
    same rate of ``reference`` (the device's documented default): what not to cache."""
    rates = [(f"matmul {name}", rate, reference.flops.get(name), 1e12, "TFLOP/s")
             for name, rate in profile.flops.items()]
    rates += [("memory bandwidth", profile.memory_bandwidth, reference.memory_bandwidth,
               1e9, "GB/s"),
              ("host<->device bandwidth", profile.host_device_bandwidth,
               reference.host_device_bandwidth, 1e9, "GB/s"),
              ("CPU Adam", profile.cpu_update_params_per_second,
               reference.cpu_update_params_per_second, 1e6, "Mparams/s"),
              ("per-node overhead", profile.node_overhead_seconds,
               reference.node_overhead_seconds, 1e-6, "us")]
    problems = []
    for what, measured, expected, scale, unit in rates:
        if measured is None or not expected:
            continue
        off = max(measured / expected, expected / measured) if measured > 0 else float("inf")
        if off > factor:
            problems.append(f"{what}: measured {measured / scale:.3g} {unit}, "
                            f"{off:.0f}x {'below' if measured < expected else 'above'} "
                            f"the default {expected / scale:.3g} {unit} for {reference.name}")
    return problems


def _best(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Seconds of the fastest of ``repeats`` runs of ``fn`` after one warm-up."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(indexed(device))

    # One CPU thread: the process's CPU time, which a machine busy with other work does not
    # stretch (its wall-clock time does: a loaded 2-core machine halved the rates measured)
    clock = (time.process_time if device.type == "cpu" and torch.get_num_threads() == 1
             else time.perf_counter)
    fn()
    sync()
    best = float("inf")
    for _ in range(max(1, repeats)):
        began = clock()
        fn()
        sync()
        best = min(best, clock() - began)
    return max(best, 1e-9)


def _matmul_rate(device: torch.device, dtype: torch.dtype, n: int, repeats: int) -> float:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return 2 * n**3 / _best(lambda: a @ b, device, repeats)


_TRANSCENDENTAL = (torch.exp, torch.erf, torch.tanh, torch.sigmoid,
                   torch.nn.functional.gelu)
_RANDOM = (lambda x: torch.empty_like(x).bernoulli_(0.9),)


def _elementwise_rate(device: torch.device, functions: tuple[Callable, ...], repeats: int,
                      elements: int = 1 << 20) -> float:
    """Elements per second of ``functions`` on one tensor, the median over them."""
    x = torch.randn(elements, device=device)
    rates = sorted(elements / _best(lambda f=f: f(x), device, repeats) for f in functions)
    return rates[len(rates) // 2]


def _node_overhead(device: torch.device, calls: int = 200, rounds: int = 15) -> float:
    """Seconds per executed node beyond its roofline. On the CPU: a compiled training step
    (fxopt, fx code generation) of a tiny network whose nodes' rooflines are negligible,
    the median step time over its forward and backward nodes: what generated code, the
    dispatcher, allocation and AOTAutograd's runtime cost per node. Elsewhere: the median
    time of one tiny aten op called as generated fx code calls it."""
    if device.type == "cpu":
        return _compiled_step_overhead(rounds)
    add = torch.ops.aten.add.Tensor
    x = torch.ones(1, device=device)
    per_call = []
    for _ in range(rounds):
        per_call.append(_best(lambda: [add(x, x) for _ in range(calls)], device, 1) / calls)
    return sorted(per_call)[len(per_call) // 2]


def _compiled_step_overhead(rounds: int) -> float:
    from fxopt.compiler import Backend

    blocks = [m for _ in range(6) for m in (torch.nn.Linear(8, 8), torch.nn.GELU(),
                                            torch.nn.LayerNorm(8))]
    model = torch.nn.Sequential(*blocks)
    backend = Backend({"codegen": "fx"})
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(4, 8)

    def step() -> None:
        compiled(x).sum().backward()

    times = sorted(_best(step, torch.device("cpu"), 1) for _ in range(rounds))
    nodes = sum(1 for record in backend.graphs for kind in ("forward", "backward")
                for n in record.graphs[kind].graph.nodes if n.op == "call_function")
    return times[len(times) // 2] / max(nodes, 1)


