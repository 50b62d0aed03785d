"""Hardware profiles: roofline times, copies, defaults per device, round trip to plain data."""

import pytest
import torch

from fxopt.planner import HardwareProfile, profile_for
from fxopt.planner.hardware import KNOWN_GPUS


def test_cpu_profile_has_no_separate_device_memory():
    cpu = profile_for("cpu")
    assert cpu.device_type == "cpu" and cpu.copy_seconds(1e9) is None


def test_roofline_is_bound_by_flops_or_bytes():
    gpu = KNOWN_GPUS["H100"]
    matmul = gpu.compute_seconds(flops=2 * 4096**3, bytes_moved=3 * 4096**2 * 2, dtype="bfloat16")
    assert matmul == pytest.approx(2 * 4096**3 / gpu.flop_rate(torch.bfloat16))
    copy = gpu.compute_seconds(flops=1e6, bytes_moved=1e9)
    assert copy == pytest.approx(1e9 / gpu.memory_bandwidth)
    assert gpu.flop_rate("int64") == gpu.flop_rate("float32")
    assert gpu.copy_seconds(50e9) == pytest.approx(1.0)


def test_profiles_round_trip_and_refuse_unknown_fields():
    profile = KNOWN_GPUS["A100"]
    assert HardwareProfile.from_dict(profile.to_dict()) == profile
    with pytest.raises(ValueError, match="unknown hardware profile fields"):
        HardwareProfile.from_dict({**profile.to_dict(), "bogus": 1})
