"""fxopt.optim.host_rate: the offload plan judges the host by the update this host runs,
measured, where a GPU's profile cannot know it."""

import dataclasses

import pytest
import torch

import fxopt.optim.host_rate as host_rate
from fxopt.optim import ParamInfo, offload, plan_offload, split_subgroups
from fxopt.planner.hardware import CPU_DEFAULT, KNOWN_GPUS

H100 = KNOWN_GPUS["H100"]


class _RecordingAdamW(torch.optim.AdamW):
    made: list[dict] = []

    def __init__(self, params, **kwargs):
        type(self).made.append(kwargs)
        super().__init__(params, **kwargs)


def test_the_measured_update_is_the_runtimes_fused_kernel():
    _RecordingAdamW.made.clear()
    rate = host_rate.measure_update_rate(_RecordingAdamW, params=1 << 16, repeats=2)
    assert rate > 0
    assert [kwargs.get("fused") for kwargs in _RecordingAdamW.made] == [True]


@pytest.fixture
def measurements(monkeypatch):
    """host_rate's measurements replaced by a record of (class, size); rate 2.5e8."""
    taken = []

    def fake(optimizer_class, params, repeats=3):
        taken.append((optimizer_class, params))
        return 2.5e8

    monkeypatch.setattr(host_rate, "measure_update_rate", fake)
    monkeypatch.setattr(host_rate, "_cache", {})
    return taken


def test_each_class_thread_count_and_size_is_measured_once(measurements):
    for params in (3_000_000, 4_000_000, 10, 2**30):
        host_rate.host_update_rate(torch.optim.AdamW, params)
    host_rate.host_update_rate(torch.optim.SGD, 3_000_000)
    # sizes rounded up to a power of two within [2**20, 2**25]; 4e6 reuses 3e6's 2**22
    assert measurements == [(torch.optim.AdamW, 2**22), (torch.optim.AdamW, 2**20),
                            (torch.optim.AdamW, 2**25), (torch.optim.SGD, 2**22)]


def test_a_gpu_profile_takes_this_hosts_rate_and_says_so(measurements):
    here = host_rate.on_this_host(H100, torch.optim.Adam, 5_000_000)
    assert here.cpu_update_params_per_second == 2.5e8 != H100.cpu_update_params_per_second
    assert host_rate.MEASURED_NOTE in here.notes and "Adam(fused=True)" in here.notes
    assert host_rate.on_this_host(here) is here  # measured once, noted once
    calibrated = dataclasses.replace(H100, source="calibrated")
    assert host_rate.on_this_host(calibrated) is calibrated
    assert host_rate.on_this_host(CPU_DEFAULT) is CPU_DEFAULT
    assert measurements == [(torch.optim.Adam, 2**23)]


def test_whether_the_host_keeps_up_follows_the_rate_it_was_given(measurements):
    """Four 2M-parameter subgroups, a 10 ms backward, half the parameters on the host: at
    the H100 profile's 1.5e9 parameters/s the host keeps up; at the measured 2.5e8 it
    cannot, and the summary names the rate it assumed."""
    infos = [ParamInfo(key=i, numel=2_000_000, itemsize=2, ready_seconds=0.01 - i * 1e-3)
             for i in range(4)]
    groups = split_subgroups(infos, 4)
    fast = plan_offload(groups, H100, cpu_fraction=0.5)
    slow = plan_offload(groups, host_rate.on_this_host(H100), cpu_fraction=0.5)
    assert fast.keeps_up() is True and slow.keeps_up() is False
    assert slow.host_update_rate == 2.5e8 and "its update at 0.25e9 parameters/s" in (
        slow.summary())


def test_offload_plans_a_gpu_with_the_optimizers_own_rate(measurements, monkeypatch):
    """The optimizer's class and the largest subgroup are what is measured (the GPU's
    profile stands in for the CPU parameters' here)."""
    monkeypatch.setattr("fxopt.optim.link.profile_for", lambda device: H100)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    with offload(torch.optim.SGD(model.parameters(), lr=0.1), model, cpu_fraction=1.0,
                 subgroups=2) as optimizer:
        assert optimizer.plan.host_update_rate == 2.5e8
    assert measurements == [(torch.optim.SGD, 2**20)]
