"""What a device can do, as the cost models need it: a :class:`HardwareProfile`.

Every time prediction in fxopt (a recompute's cost, whether a swap's copy hides behind
compute, where an optimizer subgroup should update) is a roofline against one profile:
``max(flops / flop_rate, bytes / memory_bandwidth)`` per node, plus a fixed
``node_overhead_seconds`` per executed node (dispatch and allocation: on the CPU, with
fx code generation, the larger part of a small model's step), copies at
``host_device_bandwidth``. The defaults below are *achievable* rates, not datasheet peaks:
about 70% of the dense datasheet FLOP rate and 80% of the memory bandwidth, and the pinned
host<->device copy rate typically measured on each platform's PCIe generation. A measured
profile (``fxopt calibrate``, :mod:`fxopt.cli.calibrate`, cached on disk at
:func:`cache_path`) replaces them in :func:`profile_for`; ``source`` says which one a
report is using.

On a CPU device there is no separate device memory: ``host_device_bandwidth`` is None and
swapping to host memory frees nothing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fxopt.devices import indexed

__all__ = ["HardwareProfile", "profile_for", "default_profile", "device_key", "KNOWN_GPUS",
           "CPU_DEFAULT", "cache_path", "load_calibrated", "save_calibrated"]

log = logging.getLogger(__name__)

_TERA = 1e12
_GIGA = 1e9


@dataclass(frozen=True)
class HardwareProfile:
    """Rates of one device (all per second) and its memory capacity (bytes, None: unknown).

    ``flops`` maps a dtype name ("float32", "bfloat16", "float16") to FLOP/s of matmul-class
    work; other dtypes use the float32 rate. Where a kernel family's rate is documented for
    the device it has its own key, which :mod:`fxopt.planner.forms` prices with (falling
    back to the bfloat16 rate where a profile, a calibrated one say, lacks it):
    "bfloat16_unaligned" (a bf16 GEMM with an operand's row stride not a multiple of 16
    bytes), "flash_attention_forward" and "flash_attention_backward" (FLOPs counted as
    FlashAttention's benchmarks count them: causal work halved, the backward 2.5x the
    forward). ``multiprocessors``: the SM count, for the wave quantization of GEMM tiles
    (None: not priced). ``cpu_update_params_per_second`` is the host's fused Adam
    throughput (parameters updated per second with all threads), which the
    optimizer-offload model needs whatever the device is.
    """

    name: str
    device_type: str
    flops: Mapping[str, float]
    memory_bandwidth: float
    host_device_bandwidth: float | None
    cpu_update_params_per_second: float
    memory_capacity: int | None = None
    source: str = "default"
    notes: str = field(default="", compare=False)
    # fixed seconds per executed node (dispatch, allocation, a Python call in fx code):
    # what a roofline misses for small tensors; measured by ``fxopt calibrate``
    node_overhead_seconds: float = 0.0
    # elements per second of special functions (exp, erf, tanh, ...) and of random draws,
    # where they are slower than the bytes they move (a CPU); None: memory-bound there
    transcendental_per_second: float | None = None
    random_per_second: float | None = None
    # host seconds per launch, by who launches (fxopt.planner.forms): compiled code
    # (Inductor's wrapper, a library's C++ loop), an eager op (dispatch and autograd's
    # recording, or an autograd node), a Python custom op launching a Triton kernel
    kernel_launch_seconds: float = 0.0
    eager_op_seconds: float = 0.0
    python_op_seconds: float = 0.0
    # the device's least time for a kernel that waits on the previous one (a recurrence)
    kernel_latency_seconds: float = 0.0
    multiprocessors: int | None = None

    def flop_rate(self, dtype: torch.dtype | str) -> float:
        key = str(dtype).removeprefix("torch.")
        return self.flops.get(key, self.flops["float32"])

    def compute_seconds(self, flops: float, bytes_moved: float,
                        dtype: torch.dtype | str = "float32") -> float:
        """Roofline time of one kernel: bound by its FLOPs or by the bytes it moves."""
        return max(flops / self.flop_rate(dtype), bytes_moved / self.memory_bandwidth)

    def node_seconds(self, flops: float, bytes_moved: float,
                     dtype: torch.dtype | str = "float32", *, transcendental: float = 0,
                     random: float = 0) -> float:
        """Time of one executed node: the fixed per-node overhead plus the slowest of its
        roofline and its special-function and random-number work (``NodeCost``'s
        ``transcendental`` and ``random`` elements), where the profile prices those."""
        special = ((transcendental / self.transcendental_per_second
                    if self.transcendental_per_second else 0.0)
                   + (random / self.random_per_second if self.random_per_second else 0.0))
        return self.node_overhead_seconds + max(
            self.compute_seconds(flops, bytes_moved, dtype), special)

    def copy_seconds(self, nbytes: float) -> float | None:
        """One host<->device copy of ``nbytes`` (None where there is no separate memory)."""
        if self.host_device_bandwidth is None:
            return None
        return nbytes / self.host_device_bandwidth

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["flops"] = dict(self.flops)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HardwareProfile:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"fxopt: unknown hardware profile fields {sorted(unknown)}; "
                             f"valid: {sorted(names)}")
        return cls(**{**data, "flops": dict(data["flops"])})


# A 2-core x86 container like fxopt's CI: measured with torch 2.13 (fp32 GEMM ~60 GFLOP/s,
# copy ~8 GB/s, torch._fused_adam on CPU tensors ~1.5e8 params/s; one thread: ~8 us per
# node of a compiled fx step, special functions ~1.2e9 and random draws ~1.7e8 elements/s).
CPU_DEFAULT = HardwareProfile(
    name="cpu", device_type="cpu", flops={"float32": 60 * _GIGA, "bfloat16": 30 * _GIGA},
    memory_bandwidth=8 * _GIGA, host_device_bandwidth=None,
    cpu_update_params_per_second=1.5e8, node_overhead_seconds=8e-6,
    transcendental_per_second=1.2e9, random_per_second=1.7e8,
    notes="generic CPU default; calibrate for a real figure")

# Datasheet dense rates x0.7, HBM x0.8, pinned copies as typically measured per PCIe gen.
# H100 SXM5 datasheet: dense bf16/fp16 989 TFLOP/s, TF32 495 (cuDNN's RNNs use it for fp32
# by default; torch's matmuls do not), fp32 67; HBM3 3.35 TB/s; PCIe Gen5 x16 64 GB/s.
# Host costs per launch (fxopt.planner.forms): a CUDA launch from compiled code is a few
# microseconds, an eager op with autograd's recording (or an autograd node) some 10-20;
# a Python custom op launching a Triton kernel (fuse_rnn's cells as the H100 table measured
# them under Inductor; now fx's form) is what that table implies
# (benchmarks/results/gpu_h100_2026-11-26.md); a kernel waiting on the previous one takes
# at least the device's launch latency. tests/planner/test_gpu_forms.py checks
# the step times these predict against that table.
_GPU_HOST_COSTS = dict(kernel_launch_seconds=6e-6, eager_op_seconds=20e-6,
                       python_op_seconds=170e-6, kernel_latency_seconds=7e-6)
# Kernel families whose rates were measured on an H200 (benchmarks/results/
# gpu_check_h200_2026-11-27.md; the H100 has the same SMs and tensor cores at a lower memory
# bandwidth, so they stand for both):
# - a bf16 GEMM whose operand has a row stride that is not a multiple of 16 bytes (GPT-2's
#   vocabulary, 50257) cannot be described by a TMA descriptor (CUDA Driver API,
#   cuTensorMapEncodeTiled: "globalStrides" must be multiples of 16 bytes), so cuBLAS runs
#   it on pre-Hopper align1 CUTLASS kernels (cutlass_75_tensorop_bf16_s1688gemm_*_align1 in
#   the profile): the head's three GEMMs at 8192 x 768 x 50257 took 15.58 ms, 122 TFLOP/s,
#   against 2.57 ms at 50264 (the GEMM rows). The first estimate here, 0.63 x peak (the
#   mma.sync ceiling), was 5x too fast;
# - causal attention at head dim 64, sequence 1024, batch 8 x 12 heads (GPT-2's step;
#   torch 2.11 runs cuDNN's SDPA kernels there): forward 1.35 ms and backward 1.92 ms over
#   6 layers, 57 and 100 TFLOP/s in FlashAttention's count (causal work halved, the
#   backward 2.5x the forward). The first estimate, FlashAttention-2's published rates at
#   that shape (229 and 238), was 2-4x too fast.
# 132 SMs: the H100 SXM5 (NVIDIA H100 Tensor Core GPU datasheet / Hopper whitepaper).
_H100 = HardwareProfile(
    name="H100", device_type="cuda",
    flops={"float32": 0.7 * 67 * _TERA, "tf32": 0.7 * 495 * _TERA,
           "bfloat16": 0.7 * 989 * _TERA, "float16": 0.7 * 989 * _TERA,
           "bfloat16_unaligned": 122 * _TERA,
           "flash_attention_forward": 57 * _TERA, "flash_attention_backward": 100 * _TERA},
    memory_bandwidth=0.8 * 3.35 * _TERA, host_device_bandwidth=50 * _GIGA,
    cpu_update_params_per_second=1.5e9, memory_capacity=80 * 10**9, multiprocessors=132,
    **_GPU_HOST_COSTS)
KNOWN_GPUS: dict[str, HardwareProfile] = {
    # H100's compute with more and faster HBM (HBM3e, 4.8 TB/s, 141 GB)
    "H200": dataclasses.replace(_H100, name="H200", memory_bandwidth=0.8 * 4.8 * _TERA,
                                memory_capacity=141 * 10**9),
    "H100": _H100,
    "A100": HardwareProfile(
        name="A100", device_type="cuda",
        flops={"float32": 0.7 * 19.5 * _TERA, "tf32": 0.7 * 156 * _TERA,
               "bfloat16": 0.7 * 312 * _TERA, "float16": 0.7 * 312 * _TERA},
        memory_bandwidth=0.8 * 2.0 * _TERA, host_device_bandwidth=24 * _GIGA,
        cpu_update_params_per_second=1.0e9, memory_capacity=80 * 10**9,
        multiprocessors=108, **_GPU_HOST_COSTS),
}

# Any other CUDA GPU: a mid-range figure, capacity read from the device.
_GENERIC_GPU = HardwareProfile(
    name="cuda", device_type="cuda",
    flops={"float32": 10 * _TERA, "bfloat16": 80 * _TERA, "float16": 80 * _TERA},
    memory_bandwidth=0.8 * 1.0 * _TERA, host_device_bandwidth=12 * _GIGA,
    cpu_update_params_per_second=5e8, notes="unknown GPU: generic default; calibrate",
    **_GPU_HOST_COSTS)


def device_key(device: torch.device) -> str:
    """The name a device's calibration is cached under: ``cpu`` or the GPU's name."""
    if device.type != "cuda":
        return device.type
    return torch.cuda.get_device_name(indexed(device))


def default_profile(device: torch.device | str) -> HardwareProfile:
    """The documented default profile of ``device``: a known GPU by name, a generic GPU, or
    the CPU (never the calibration cache)."""
    device = torch.device(device)
    if device.type != "cuda":
        return CPU_DEFAULT
    name = torch.cuda.get_device_name(indexed(device))
    capacity = torch.cuda.get_device_properties(indexed(device)).total_memory
    for key, profile in KNOWN_GPUS.items():
        if key in name:
            return dataclasses.replace(profile, memory_capacity=capacity)
    return dataclasses.replace(_GENERIC_GPU, name=name, memory_capacity=capacity)


def profile_for(device: torch.device | str, *, calibrated: bool = True) -> HardwareProfile:
    """The profile of ``device``: its ``fxopt calibrate`` measurement when one is cached
    (and ``calibrated``), else :func:`default_profile`."""
    if calibrated:
        measured = load_calibrated(device)
        if measured is not None:
            return measured
    return default_profile(device)


def cache_path(device: torch.device | str) -> Path:
    """Where the calibrated profile of ``device`` is cached."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = re.sub(r"[^A-Za-z0-9_.-]+", "_", device_key(torch.device(device)))
    return root / "fxopt" / "hardware" / f"{key}.json"


def load_calibrated(device: torch.device | str) -> HardwareProfile | None:
    """The cached profile of ``device``, or None (no cache, or an unreadable one: logged)."""
    path = cache_path(device)
    if not path.is_file():
        return None
    try:
        return HardwareProfile.from_dict(json.loads(path.read_text()))
    except (ValueError, TypeError, KeyError) as error:
        log.warning("fxopt: ignoring the unreadable hardware profile %s (%s); run "
                    "`fxopt calibrate` again", path, error)
        return None


def save_calibrated(profile: HardwareProfile, device: torch.device | str) -> Path:
    path = cache_path(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_dict(), indent=1, sort_keys=True) + "\n")
    return path
