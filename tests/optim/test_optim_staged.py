"""Staged device updates (Deep Optimizer States) on a CPU device, where ``staged=`` forces
them: the state lives on the host between steps, goes through the two staging buffers for
its update by the plain optimizer's own kernel and comes back. Parameters and state after N
steps equal the plain optimizer's bit for bit (the same kernel on the same device), fp32 and
bf16, with an LR scheduler and gradient clipping; the buffers carry the state; a bad plan
is refused. On CUDA (``gpu``): equal to plain AdamW, and the device saves what the plan
says."""

import copy
import gc

import pytest
import torch
from models import MLP
from optim_resume_worker import train
from torch import nn

from fxopt.devices import indexed
from fxopt.optim import offload

OPTIMIZERS = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1),
    "adam-amsgrad": lambda params: torch.optim.Adam(params, lr=1e-2, amsgrad=True,
                                                    weight_decay=0.05),
    # dampening: a first momentum buffer is the gradient (torch's lazy init), not a blend
    "sgd": lambda params: torch.optim.SGD(params, lr=5e-2, momentum=0.9, dampening=0.1),
}


def _model(dtype, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(13, 37), nn.GELU(), nn.Linear(37, 21), nn.GELU(),
                         nn.Linear(21, 5)).to(dtype)


def _train(model, optimizer, steps, seed=0):
    """The resume tests' recipe (a StepLR schedule, in-place clipping) on a fresh schedule."""
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    train(model, optimizer, scheduler, steps, seed)


def _assert_bitwise(actual, expected):
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, dict):
            _assert_bitwise(actual[key], value)
        elif isinstance(value, torch.Tensor):
            assert actual[key].dtype == value.dtype and torch.equal(actual[key], value), key
        else:
            assert actual[key] == value, key


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_staged_updates_are_the_plain_optimizers_bit_for_bit(name, dtype):
    model, plain_model = _model(dtype), _model(dtype)
    optimizer = offload(OPTIMIZERS[name](model.parameters()), model, cpu_fraction=1.0,
                        staged=True, subgroups=4)
    plain = OPTIMIZERS[name](plain_model.parameters())
    assert set(optimizer.placements()) == {"staged"} and len(optimizer._staging.buffers) == 2
    _train(model, optimizer, steps=5)
    _train(plain_model, plain, steps=5)
    for a, b in zip(model.parameters(), plain_model.parameters()):
        assert a.dtype == dtype and torch.equal(a, b)
    _assert_bitwise(optimizer.state_dict(), plain.state_dict())
    # between steps the state is on the host, apart from the buffers
    buffers = {b.untyped_storage().data_ptr() for b in optimizer.state_tensors("gpu")}
    host = optimizer.state_tensors("cpu")
    assert host and buffers.isdisjoint(t.untyped_storage().data_ptr() for t in host)


def _assert_the_buffers_carry_the_state(optimizer):
    """Each buffer holds the state of the last subgroup staged through it in the last
    step, at its layout (widest dtypes first, then subgroup order), byte for byte."""
    staged = [sg for sg in optimizer._subgroups if sg.placement == "staged"]
    buffers = optimizer._staging.buffers
    for position in range(max(0, len(staged) - len(buffers)), len(staged)):
        sg, buffer = staged[position], buffers[position % len(buffers)]
        entries = [sg.optimizer.state[t][k] for t, keys in zip(sg.tensors, sg.parked)
                   for k in sorted(keys)]
        entries.sort(key=lambda h: -h.element_size())
        laid_out = torch.cat([h.reshape(-1).view(torch.uint8) for h in entries])
        assert 0 < laid_out.numel() <= buffer.numel()
        assert torch.equal(buffer[:laid_out.numel()], laid_out)


def test_the_buffers_alternate_and_carry_each_subgroups_state():
    """With four staged subgroups the last two went through different buffers."""
    model = _model(torch.float32)
    optimizer = offload(torch.optim.Adam(model.parameters(), lr=1e-2), model, cpu_fraction=1.0,
                        staged=True, subgroups=4)
    _train(model, optimizer, steps=2)
    assert [sg.placement for sg in optimizer._subgroups] == ["staged"] * 4
    _assert_the_buffers_carry_the_state(optimizer)


def test_host_and_staged_updates_together_follow_the_plain_optimizer():
    """Both host-resident kinds in one step (the plan's interleave), with resident ones."""
    model, plain_model = _model(torch.float32), _model(torch.float32)
    optimizer = offload(OPTIMIZERS["adamw"](model.parameters()), model, cpu_fraction=0.75,
                        staged=0.5, subgroups=4)
    assert {"gpu", "cpu", "staged"} <= set(optimizer.plan.placement_of().values())
    plain = OPTIMIZERS["adamw"](plain_model.parameters())
    _train(model, optimizer, steps=5)
    _train(plain_model, plain, steps=5)
    # the host subgroups' fused CPU kernel rounds differently from the plain single-tensor
    # one (fp32 ulps per step), and every gradient then differs through the loss
    for a, b in zip(model.parameters(), plain_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_plain_checkpoint_loads_into_the_staged_state_and_back():
    model, plain_model = _model(torch.float32), _model(torch.float32)
    plain = OPTIMIZERS["adam-amsgrad"](plain_model.parameters())
    _train(plain_model, plain, steps=2)
    model.load_state_dict(plain_model.state_dict())
    optimizer = offload(OPTIMIZERS["adam-amsgrad"](model.parameters()), model,
                        cpu_fraction=1.0, staged=True, subgroups=3)
    optimizer.load_state_dict(copy.deepcopy(plain.state_dict()))
    _assert_bitwise(optimizer.state_dict(), plain.state_dict())
    for sg in optimizer._subgroups:  # loaded, then at once on the host, to be staged
        assert [set(sg.optimizer.state[t]) for t in sg.tensors] == sg.parked
    _train(model, optimizer, steps=3, seed=1)
    _train(plain_model, plain, steps=3, seed=1)
    for a, b in zip(model.parameters(), plain_model.parameters()):
        assert torch.equal(a, b)
    _assert_the_buffers_carry_the_state(optimizer)  # the loaded state went to the host


def test_a_plan_for_another_optimizer_is_refused():
    """The buffers are sized by the plan's states and counters: a plan made for Adam cannot
    stage an amsgrad Adam's third moment."""
    model = MLP()
    plan = offload(torch.optim.Adam(model.parameters()), model, cpu_fraction=1.0,
                   staged=True).plan
    with pytest.raises(ValueError, match="plan it for this optimizer"):
        offload(torch.optim.Adam(model.parameters(), amsgrad=True), plan.to_dict())
    with pytest.raises(ValueError, match="either a plan or planning options"):
        offload(torch.optim.Adam(model.parameters()), plan, staged=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_staged_updates_equal_adamw_and_save_what_the_plan_says(dtype):
    """Eight 1024 x 1024 layers, all state on the host and staged: parameters equal plain
    AdamW's bit for bit (the same foreach kernel on the same device; every view in the
    buffers is 4 KiB-aligned, so the kernel takes its vectorised path as for the plain
    state); the forward+backward peak falls by the plan's predicted saving (the state
    minus the two buffers) within 5%, the whole step by at least 95% of it."""
    device = indexed("cuda")

    def run(make):
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(8)]).to(device, dtype)
        optimizer = make(model)
        generator = torch.Generator(device).manual_seed(0)
        for _ in range(3):  # the last step is measured: state, buffers and pools exist
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            x = torch.randn(64, 1024, device=device, dtype=dtype, generator=generator)
            model(x).float().pow(2).mean().backward()
            torch.cuda.synchronize(device)
            backward = torch.cuda.max_memory_allocated(device)
            optimizer.step()
            torch.cuda.synchronize(device)
            whole = torch.cuda.max_memory_allocated(device)
        params = [p.detach().clone() for p in model.parameters()]
        plan = getattr(optimizer, "plan", None)
        if plan is not None:
            optimizer.close()
        del model, optimizer
        gc.collect()
        return params, backward, whole, plan

    plain, plain_backward, plain_whole, _ = run(
        lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2))
    params, backward, whole, plan = run(
        lambda m: offload(torch.optim.AdamW(m.parameters(), lr=1e-2), m, cpu_fraction=1.0,
                          staged=True, subgroups=16))
    assert {s.placement for s in plan.subgroups} == {"staged"} and plan.staging_bytes > 0
    for a, b in zip(params, plain):
        assert torch.equal(a, b)
    if dtype == torch.float32:
        predicted = plan.all_gpu_state_bytes - plan.gpu_state_bytes
        assert predicted > 0.5 * plan.all_gpu_state_bytes  # 8+ subgroups, two buffers
        assert plain_backward - backward == pytest.approx(predicted, rel=0.05)
        assert plain_whole - whole >= 0.95 * predicted


def test_forced_staging_that_costs_more_than_it_frees_warns():
    """Two subgroups, the larger one's state twice in the buffers: more than all of it."""
    model = MLP()
    with pytest.warns(UserWarning, match="costs more device memory"):
        offload(torch.optim.Adam(model.parameters()), model, cpu_fraction=1.0, staged=True,
                subgroups=2)
