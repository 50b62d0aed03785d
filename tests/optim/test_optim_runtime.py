"""fxopt.optim.offload on a CPU device: the host path runs (a forced split) and after N steps
parameters and optimizer state equal the plain optimizer's, with weight decay, gradient
clipping and an LR scheduler; checkpoints load across the two and resume identically; bf16
parameters get fp32 master weights; bad arguments raise clearly."""

import copy

import pytest
import torch
from models import MLP
from torch import nn

import fxopt
from fxopt.optim import OffloadedOptimizer, OffloadPlan, offload

OPTIMIZERS = {
    "adam": lambda params: torch.optim.Adam(params, lr=1e-2, weight_decay=0.05),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, amsgrad=True),
    "sgd": lambda params: torch.optim.SGD(params, lr=5e-2, momentum=0.9, nesterov=True,
                                          weight_decay=0.01),
}


def _train(model, optimizer, scheduler, steps, seed=0):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(5, 13, generator=generator)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05)  # in place
        optimizer.step()
        scheduler.step()


def _assert_same_state(actual, expected):
    assert actual["param_groups"] == expected["param_groups"]
    assert actual["state"].keys() == expected["state"].keys()
    for index, state in expected["state"].items():
        assert actual["state"][index].keys() == state.keys()
        for key, value in state.items():
            torch.testing.assert_close(actual["state"][index][key].float(), value.float(),
                                       rtol=1e-5, atol=1e-7, msg=f"state {index} {key}")


def _assert_same_params(actual, expected):
    for (name, a), b in zip(actual.named_parameters(), expected.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def _pair(name, cpu_fraction, subgroups=4):
    torch.manual_seed(0)
    model = MLP()
    plain_model = copy.deepcopy(model)
    plain = OPTIMIZERS[name](plain_model.parameters())
    wrapped = offload(OPTIMIZERS[name](model.parameters()), model, cpu_fraction=cpu_fraction,
                      subgroups=subgroups)
    return model, wrapped, plain_model, plain


@pytest.mark.parametrize("cpu_fraction", [0.5, 1.0])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_same_trajectory_as_the_plain_optimizer(name, cpu_fraction):
    model, wrapped, plain_model, plain = _pair(name, cpu_fraction)
    assert "cpu" in wrapped.placements()
    assert wrapped.plan.cpu_share == pytest.approx(cpu_fraction, abs=0.3)
    schedulers = [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5)
                  for o in (wrapped, plain)]
    _train(model, wrapped, schedulers[0], steps=5)
    _train(plain_model, plain, schedulers[1], steps=5)
    initial = OPTIMIZERS[name]([nn.Parameter(torch.zeros(1))]).param_groups[0]["lr"]
    assert wrapped.param_groups[0]["lr"] == plain.param_groups[0]["lr"] == initial / 4
    _assert_same_params(model, plain_model)
    _assert_same_state(wrapped.state_dict(), plain.state_dict())


def test_gradients_are_copied_while_the_backward_runs():
    model, wrapped, _, _ = _pair("adam", 1.0)
    model(torch.randn(3, 13)).sum().backward()
    host = [hp for sg in wrapped._subgroups for hp in sg.host]
    assert host and all(hp.fresh_grad is hp.param.grad for hp in host)
    for hp in host:
        torch.testing.assert_close(hp.staging, hp.param.grad, rtol=0, atol=0)


def test_removed_hooks_copy_nothing_and_step_still_copies_the_gradients():
    model, wrapped, plain_model, plain = _pair("adam", 1.0)
    wrapped.remove_hooks()
    x = torch.randn(3, 13)
    model(x).sum().backward()
    assert all(hp.fresh_grad is None for sg in wrapped._subgroups for hp in sg.host)
    wrapped.step()  # copies each gradient itself
    plain_model(x).sum().backward()
    plain.step()
    _assert_same_params(model, plain_model)


def test_param_groups_unused_parameters_and_group_settings():
    torch.manual_seed(0)
    model = nn.ModuleDict({"a": nn.Linear(7, 7), "b": nn.Linear(7, 3), "unused": nn.Linear(2, 2)})
    reference = copy.deepcopy(model)

    def groups(m):
        return [{"params": m["a"].parameters(), "lr": 1e-3},
                {"params": list(m["b"].parameters()) + list(m["unused"].parameters()),
                 "weight_decay": 0.5}]

    plain = torch.optim.AdamW(groups(reference), lr=1e-2)
    wrapped = offload(torch.optim.AdamW(groups(model), lr=1e-2), cpu_fraction=0.5, subgroups=6)
    for _ in range(3):
        x = torch.randn(4, 7)
        for m, opt in ((model, wrapped), (reference, plain)):
            opt.zero_grad()
            m["b"](torch.relu(m["a"](x))).sum().backward()
            opt.step()
    _assert_same_params(model, reference)
    _assert_same_state(wrapped.state_dict(), plain.state_dict())
    assert 4 not in wrapped.state_dict()["state"]  # the unused parameters have no state


def test_checkpoints_load_across_plain_and_offloaded():
    model, wrapped, plain_model, plain = _pair("adam", 0.5)
    _train(model, wrapped, torch.optim.lr_scheduler.LambdaLR(wrapped, lambda s: 1.0), 2)
    # offloaded -> plain: the plain optimizer continues as the offloaded one does
    plain_model.load_state_dict(model.state_dict())
    plain.load_state_dict(copy.deepcopy(wrapped.state_dict()))
    _train(model, wrapped, torch.optim.lr_scheduler.LambdaLR(wrapped, lambda s: 1.0), 2, 1)
    _train(plain_model, plain, torch.optim.lr_scheduler.LambdaLR(plain, lambda s: 1.0), 2, 1)
    _assert_same_params(model, plain_model)
    # plain -> offloaded, and a state_dict round trip
    again = offload(torch.optim.Adam(model.parameters()), model, cpu_fraction=1.0)
    again.load_state_dict(plain.state_dict())
    _assert_same_state(again.state_dict(), plain.state_dict())


def test_resume_mid_training_gives_the_same_trajectory():
    model, wrapped, _, _ = _pair("adamw", 0.5)
    scheduler = torch.optim.lr_scheduler.StepLR(wrapped, step_size=2, gamma=0.5)
    _train(model, wrapped, scheduler, 3)
    checkpoint = copy.deepcopy({"model": model.state_dict(), "optim": wrapped.state_dict(),
                                "sched": scheduler.state_dict()})
    _train(model, wrapped, scheduler, 3, seed=1)

    resumed = MLP()
    resumed.load_state_dict(checkpoint["model"])
    optimizer = offload(OPTIMIZERS["adamw"](resumed.parameters()), resumed, cpu_fraction=0.5,
                        subgroups=4)  # the same plan: bitwise the same updates
    optimizer.load_state_dict(checkpoint["optim"])
    resumed_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    resumed_scheduler.load_state_dict(checkpoint["sched"])
    _train(resumed, optimizer, resumed_scheduler, 3, seed=1)
    for a, b in zip(resumed.parameters(), model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_wrapping_an_optimizer_with_state_moves_it():
    model, _, plain_model, plain = _pair("sgd", 0.5)
    _train(plain_model, plain, torch.optim.lr_scheduler.LambdaLR(plain, lambda s: 1.0), 2)
    expected = copy.deepcopy(plain.state_dict())
    wrapped = offload(plain, plain_model, cpu_fraction=0.5)
    assert not plain.state  # freed where it was
    _assert_same_state(wrapped.state_dict(), expected)


def test_bf16_parameters_get_fp32_master_weights_on_the_host():
    torch.manual_seed(0)
    layer = nn.Linear(9, 6).to(torch.bfloat16)
    reference = [p.detach().float().clone().requires_grad_() for p in layer.parameters()]
    wrapped = offload(torch.optim.Adam(layer.parameters(), lr=1e-3), cpu_fraction=1.0)
    plain = torch.optim.Adam(reference, lr=1e-3)
    for _ in range(4):
        for p, r in zip(layer.parameters(), reference):
            grad = torch.randn(p.shape).to(torch.bfloat16)
            p.grad, r.grad = grad, grad.float()
        wrapped.step()
        plain.step()
    masters = [hp.master for sg in wrapped._subgroups for hp in sg.host]
    assert {m.dtype for m in masters} == {torch.float32}
    by_shape = {tuple(m.shape): m for m in masters}
    for p, r in zip(layer.parameters(), reference):
        torch.testing.assert_close(by_shape[tuple(p.shape)], r.detach(), rtol=1e-6, atol=1e-7)
        assert p.dtype == torch.bfloat16
        torch.testing.assert_close(p.detach(), r.detach().to(torch.bfloat16), rtol=0, atol=0)


def test_a_plan_given_as_data():
    model = MLP()
    params = list(model.parameters())
    plan = fxopt.optim.plan_offload(
        fxopt.optim.split_subgroups([fxopt.optim.ParamInfo(i, p.numel())
                                     for i, p in enumerate(params)], 2),
        fxopt.planner.profile_for("cpu"), cpu_fraction=0.5)
    wrapped = offload(torch.optim.Adam(params), plan.to_dict())
    assert isinstance(wrapped, OffloadedOptimizer) and wrapped.plan == plan


@pytest.mark.parametrize("build, error, message", [
    (lambda m: offload(torch.optim.RMSprop(m.parameters()), m), TypeError, "RMSprop"),
    (lambda m: offload("adam", m), TypeError, "torch.optim optimizer"),
    (lambda m: offload(torch.optim.Adam(m.parameters()), 3), TypeError, "source must be"),
    (lambda m: offload(torch.optim.Adam(m.parameters()), fxopt.backend()), TypeError,
     "model=..."),
    (lambda m: offload(torch.optim.Adam(m.parameters()), m, cpu_fraction=2.0), ValueError,
     "cpu_fraction"),
    (lambda m: offload(torch.optim.Adam(m.parameters(), differentiable=True), m), ValueError,
     "differentiable"),
    (lambda m: offload(offload(torch.optim.Adam(m.parameters()), m, cpu_fraction=1), m),
     TypeError, "already offloaded"),
    (lambda m: OffloadedOptimizer(torch.optim.Adam(m.parameters()), OffloadPlan(
        (), 0.0, 0.0, 0.0, 0, 0, 0, "cpu")), ValueError, "the plan covers"),
])
def test_bad_arguments_raise_clearly(build, error, message):
    with pytest.raises(error, match=message):
        build(MLP())


def test_plan_and_planning_options_together_raise():
    model = MLP()
    with pytest.warns(UserWarning, match="keeps all optimizer state on the device"):
        plan = offload(torch.optim.Adam(model.parameters()), model).plan
    assert set(plan.placement_of().values()) == {"gpu"}
    with pytest.raises(ValueError, match="either a plan or planning options"):
        offload(torch.optim.Adam(model.parameters()), plan, cpu_fraction=0.5)


def test_adding_a_param_group_later_raises():
    wrapped = offload(torch.optim.Adam(MLP().parameters()), cpu_fraction=1.0)
    with pytest.raises(NotImplementedError, match="fixed by its plan"):
        wrapped.add_param_group({"params": [nn.Parameter(torch.zeros(2))]})


def test_loading_a_state_dict_of_another_model_raises():
    wrapped = offload(torch.optim.Adam(MLP().parameters()), cpu_fraction=1.0)
    other = torch.optim.Adam(nn.Linear(2, 2).parameters()).state_dict()
    with pytest.raises(ValueError, match="parameter groups have sizes"):
        wrapped.load_state_dict(other)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_split_matches_the_plain_optimizer(dtype):
    torch.manual_seed(0)
    model = MLP().cuda().to(dtype)
    plain_model = copy.deepcopy(model)
    initial = [p.detach().clone() for p in model.parameters()]
    # lr 1e-2: four steps move parameters by ~4e-2, far beyond the bf16 tolerance below
    wrapped = offload(torch.optim.AdamW(model.parameters(), lr=1e-2), model, cpu_fraction=0.5)
    plain = torch.optim.AdamW(plain_model.parameters(), lr=1e-2)
    for _ in range(4):
        x = torch.randn(5, 13, device="cuda", dtype=dtype)
        for m, opt in ((model, wrapped), (plain_model, plain)):
            opt.zero_grad()
            m(x).float().pow(2).mean().backward()
            opt.step()
    # bf16: the offloaded half keeps fp32 masters, the plain optimizer rounds every step
    rtol, atol = (1e-5, 1e-6) if dtype == torch.float32 else (2e-2, 2e-3)
    for a, b, before in zip(model.parameters(), plain_model.parameters(), initial):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
        assert (a.float() - before.float()).abs().max() > 1e-2
