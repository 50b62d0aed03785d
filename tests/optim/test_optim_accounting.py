"""The offload plan's bytes are the runtime's, exactly, by the profiler's placement
categories (issue 30, item 3). On the CPU the "device" is where the parameters live and the
profiler records every allocation, so for every placement (cpu_fraction 0, 0.5, 1.0):

- ``optimizer_state`` (the device subgroups' state) is the plan's ``gpu_state_bytes`` and
  ``optimizer_state_host`` (masters, their gradients, staging buffers, host state) its
  ``host_bytes``, to the byte;
- the device peak (everything but the host category) of the forward and of the backward
  falls from the plain optimizer's by the plan's predicted saving, to the byte: the
  offloaded path adds nothing on the device (no gradient staging, no full-size
  temporaries); in the update it falls by at least that (the plain update's temporaries go
  too), so a placement never costs more device memory than it frees.

With staged updates (``staged=``, forced here) ``optimizer_state`` is the two staging
buffers (and any resident state) and ``optimizer_state_host`` also holds the staged
subgroups' state: both the plan's, to the byte, and the device peaks fall by the plan's
saving, the state moved to the host minus the buffers, exactly as well.

On a GPU the same saving is checked with ``torch.cuda.max_memory_allocated`` (``gpu``)."""

import copy
import gc

import pytest
import torch
from models import MLP

from fxopt.devices import indexed
from fxopt.optim import offload
from fxopt.profile import profile_memory

FRACTIONS = (0.0, 0.5, 1.0)
OPTIMIZERS = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3),
    "adam-amsgrad": lambda params: torch.optim.Adam(params, lr=1e-3, amsgrad=True),
    "sgd-momentum": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9),
}


def _setup(dtype=torch.float32):
    torch.manual_seed(0)
    model = MLP(d_in=64, hidden=256, d_out=32).to(dtype)
    return model, torch.randn(8, 64).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_state_bytes_of_every_placement_are_the_plans(name, dtype):
    model, x = _setup(dtype)
    plain_model = copy.deepcopy(model)
    plain = profile_memory(plain_model, x, OPTIMIZERS[name](plain_model.parameters()), steps=1)
    for cpu_fraction in FRACTIONS:
        optimizer = offload(OPTIMIZERS[name](model.parameters()), model,
                            cpu_fraction=cpu_fraction, subgroups=4)
        plan = optimizer.plan
        assert plan.cpu_share == pytest.approx(cpu_fraction, abs=0.25)
        measured = profile_memory(model, x, optimizer, steps=1)
        categories = measured.peak_categories
        assert categories["optimizer_state"] == plan.gpu_state_bytes, cpu_fraction
        assert categories["optimizer_state_host"] == plan.host_bytes, cpu_fraction
        # the plain optimizer's state is what the plan says all of it would be
        assert plain.peak_categories["optimizer_state"] == plan.all_gpu_state_bytes
        saving = plan.all_gpu_state_bytes - plan.gpu_state_bytes
        assert (saving > 0) == (cpu_fraction > 0)
        for phase in ("forward", "backward"):  # the state resident, nothing else differs
            assert (plain.device_peak_bytes(phase) - measured.device_peak_bytes(phase)
                    == saving), (cpu_fraction, phase)
        # in the update the device also sheds the plain update's temporaries
        assert (plain.device_peak_bytes("optimizer") - measured.device_peak_bytes("optimizer")
                >= saving), cpu_fraction
        assert plain.device_peak_bytes() - measured.device_peak_bytes() >= saving
        optimizer.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("cpu_fraction, staged", [(1.0, True), (4 / 6, 0.5)])
def test_staging_buffers_and_staged_state_are_the_plans(name, dtype, cpu_fraction, staged):
    """Six equal layers, six subgroups: all staged (two buffers for six subgroups' state),
    or a mix of resident, host-updated and staged subgroups."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(6)]).to(dtype)
    x = torch.randn(8, 32).to(dtype)
    plain_model = copy.deepcopy(model)
    plain = profile_memory(plain_model, x, OPTIMIZERS[name](plain_model.parameters()), steps=1)
    optimizer = offload(OPTIMIZERS[name](model.parameters()), model, cpu_fraction=cpu_fraction,
                        staged=staged, subgroups=6)
    plan = optimizer.plan
    assert plan.staging_bytes > 0 and plan.cpu_share == pytest.approx(cpu_fraction)
    assert len(set(plan.placement_of().values())) == (1 if staged is True else 3)
    measured = profile_memory(model, x, optimizer, steps=1)
    categories = measured.peak_categories
    assert categories["optimizer_state"] == plan.gpu_state_bytes
    assert categories["optimizer_state_host"] == plan.host_bytes
    saving = plan.all_gpu_state_bytes - plan.gpu_state_bytes
    assert saving > 0  # the buffers cost less than the state they let go to the host
    for phase in ("forward", "backward"):
        assert plain.device_peak_bytes(phase) - measured.device_peak_bytes(phase) == saving
    # the staged update is the plain one, on views of the buffers: no more temporaries
    assert (plain.device_peak_bytes("optimizer") - measured.device_peak_bytes("optimizer")
            >= saving)
    optimizer.close()


def test_the_step_counters_are_counted_where_they_live():
    """Adam's scalar ``step`` per parameter: on a CPU device with the moments; a host
    subgroup's fused update keeps an fp32 one. Left out, the plan is off by 4 bytes per
    parameter on each side."""
    model, x = _setup()
    optimizer = offload(torch.optim.Adam(model.parameters()), model, cpu_fraction=0.5,
                        subgroups=4)
    assert optimizer.plan.counter_bytes == (4, 4)
    measured = profile_memory(model, x, optimizer, steps=1)
    assert measured.peak_categories["optimizer_state"] == optimizer.plan.gpu_state_bytes


@pytest.mark.gpu
@pytest.mark.parametrize("cpu_fraction", [0.5, 1.0])
def test_on_cuda_the_device_saving_is_the_state_placed_on_the_host(cpu_fraction):
    """max_memory_allocated, plain against offloaded on the same eager model, in a steady
    step (the state exists): over the forward and backward at least 90% of the state
    placed on the host leaves the device and the plan's predicted saving is within 5% of
    the measured one; over the whole step at least that much (the plain foreach update's
    full-size temporaries go too)."""
    device = indexed("cuda")

    def peaks(make):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)])
        model = model.to(device)
        optimizer = make(model)
        for _ in range(3):  # the last step is measured: state, workspaces, pools exist
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            model(torch.randn(64, 1024, device=device)).sum().backward()
            torch.cuda.synchronize(device)
            backward = torch.cuda.max_memory_allocated(device)
            optimizer.step()
            torch.cuda.synchronize(device)
            whole = torch.cuda.max_memory_allocated(device)
        plan = getattr(optimizer, "plan", None)
        if plan is not None:
            optimizer.close()
        del model, optimizer
        gc.collect()
        return backward, whole, plan

    plain_backward, plain_whole, _ = peaks(lambda m: torch.optim.AdamW(m.parameters()))
    backward, whole, plan = peaks(lambda m: offload(torch.optim.AdamW(m.parameters()), m,
                                                    cpu_fraction=cpu_fraction))
    predicted = plan.all_gpu_state_bytes - plan.gpu_state_bytes
    host_state = sum(s.numel * 4 * 2 for s in plan.subgroups if s.placement == "cpu")
    assert plain_backward - backward >= 0.9 * host_state
    assert plain_backward - backward == pytest.approx(predicted, rel=0.05)
    assert plain_whole - whole >= 0.95 * predicted
