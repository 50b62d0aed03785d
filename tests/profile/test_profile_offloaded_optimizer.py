"""fxopt.profile_memory with an optimizer wrapped by fxopt.optim.offload: its state,
kept by the wrapper's subgroups, is counted, the device part and the host part each in
its own category; the host part includes the fp32 master weights, their gradients and the
staging buffers."""

import pytest
import torch
from models import MLP

import fxopt
from fxopt.profile import profile_memory


def state_bytes(states):
    return sum(t.untyped_storage().nbytes() for s in states for t in s.values()
               if isinstance(t, torch.Tensor))


def host_buffer_bytes(params, where):
    """Per host-updated parameter: its fp32 master, the master's fp32 gradient and a
    staging buffer in the parameter's dtype."""
    return sum(p.numel() * (4 + 4 + p.element_size())
               for p, placement in zip(params, where) if placement == "cpu")


def test_offloaded_state_is_split_into_device_and_host_categories():
    torch.manual_seed(0)
    model, x = MLP(d_in=64, hidden=256, d_out=32), torch.randn(8, 64)
    plain = torch.optim.Adam(model.parameters())
    before = profile_memory(model, x, plain, steps=1)
    total_state = state_bytes(plain.state.values())
    assert before.peak_categories["optimizer_state"] == total_state > 0

    offloaded = fxopt.optim.offload(plain, model=model, cpu_fraction=0.5)
    where = offloaded.placements()
    assert {"cpu", "gpu"} == set(where)  # both kinds of subgroup, so both categories
    states = offloaded.state_dict()["state"]
    host_state = state_bytes(s for i, s in states.items() if where[i] == "cpu")
    host = host_state + host_buffer_bytes(list(model.parameters()), where)
    after = profile_memory(model, x, offloaded, steps=1)
    assert after.peak_categories["optimizer_state"] == total_state - host_state > 0
    assert after.peak_categories["optimizer_state_host"] == host > host_state > 0
    assert after.host_bytes == {}  # on the CPU the host part is in the recorded memory
    assert "optimizer_state_host" in after.table()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_host_part_is_reported_beside_the_device_total():
    torch.manual_seed(0)
    model = MLP(d_in=64, hidden=256, d_out=32).cuda()
    x = torch.randn(8, 64, device="cuda")
    offloaded = fxopt.optim.offload(torch.optim.Adam(model.parameters()), model=model,
                                    cpu_fraction=0.5)
    profile_memory(model, x, offloaded, steps=1)  # creates the state
    where = offloaded.placements()
    states = offloaded.state_dict()["state"]
    host = state_bytes(s for i, s in states.items() if where[i] == "cpu")
    host += host_buffer_bytes(list(model.parameters()), where)
    device = state_bytes(s for i, s in states.items() if where[i] != "cpu")
    profile = profile_memory(model, x, offloaded, steps=1)
    assert profile.host_bytes == {"optimizer_state_host": host} and host > 0
    assert profile.peak_categories["optimizer_state_host"] == 0
    # Adam's per-parameter "step" counters stay on the host for a device subgroup, so
    # the device category holds the moments only
    assert 0 < profile.peak_categories["optimizer_state"] <= device
    assert "on the host, not in the cuda:0 total" in profile.table()
