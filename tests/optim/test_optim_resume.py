"""Nothing lost with the offloaded optimizer: weights changed outside ``step()`` are kept
(load_state_dict, in-place init, ``param.data = ...``, no_grad copies), and a checkpoint
resumes bit-exactly in either order, fp32 and bf16 (the fp32 masters are saved), in another
process, with an LR scheduler and gradient clipping; with staged device updates too."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from optim_resume_worker import MODES, ORDERS, STEPS, build_model, build_optimizer, train
from torch import nn

import fxopt
from fxopt.optim.runtime import MASTER_KEY

WORKER = Path(__file__).with_name("optim_resume_worker.py")
REPO = Path(__file__).resolve().parents[2]


def _load_sevens(model):
    model.load_state_dict({k: torch.full_like(v, 7.0) for k, v in model.state_dict().items()})


def _init_sevens(model):
    for p in model.parameters():
        nn.init.constant_(p, 7.0)


def _assign_data_sevens(model):
    for p in model.parameters():
        p.data = torch.full_like(p, 7.0)


def _no_grad_copy_sevens(model):  # an EMA copy-back does this
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.full_like(p, 7.0))


CHANGES = {"load_state_dict": _load_sevens, "nn.init": _init_sevens,
           "param.data": _assign_data_sevens, "no_grad copy": _no_grad_copy_sevens}


def _step(model, optimizer):
    optimizer.zero_grad()
    model(torch.ones(2, 4, dtype=next(model.parameters()).dtype)).sum().backward()
    optimizer.step()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("after_a_step", [False, True])
@pytest.mark.parametrize("change", list(CHANGES))
def test_weights_changed_outside_step_are_kept(change, after_a_step, dtype):
    model = nn.Linear(4, 4).to(dtype)
    optimizer = fxopt.optim.offload(torch.optim.SGD(model.parameters(), lr=0.0), model,
                                    cpu_fraction=1.0)
    if after_a_step:
        _step(model, optimizer)
    CHANGES[change](model)
    _step(model, optimizer)  # lr 0: the step must leave the weights as they are
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), torch.full_like(p, 7.0)), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_reinitialised_model_trains_like_the_plain_optimizer(dtype):
    model, plain_model = build_model(dtype, seed=0), build_model(dtype, seed=0)
    optimizer = fxopt.optim.offload(torch.optim.SGD(model.parameters(), lr=0.1), model,
                                    cpu_fraction=1.0)
    plain = torch.optim.SGD(plain_model.parameters(), lr=0.1)
    for m, opt in ((model, optimizer), (plain_model, plain)):
        train(m, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), 2, seed=0)
        m.load_state_dict(build_model(dtype, seed=7).state_dict())
        train(m, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), 2, seed=1)
    for (name, a), b in zip(model.named_parameters(), plain_model.parameters()):
        # SGD's host update is fp32 then rounded: bf16 parameters match exactly only in fp32
        assert torch.equal(a, b) if dtype == torch.float32 else torch.allclose(
            a.float(), b.float(), rtol=0, atol=2 ** -7), name


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """Per mode and dtype: the uninterrupted run's final state, and per order the resumed
    one."""
    folder = tmp_path_factory.mktemp("resume")
    jobs, results, arguments = [], {}, []
    for mode in MODES:
        for dtype in (torch.float32, torch.bfloat16):
            model = build_model(dtype, seed=0)
            optimizer, scheduler = build_optimizer(model, mode)
            train(model, optimizer, scheduler, STEPS, seed=0)
            checkpoint = folder / f"{mode}-{dtype}.pt"
            torch.save({"model": model.state_dict(), "optim": optimizer.state_dict(),
                        "sched": scheduler.state_dict()}, checkpoint)
            train(model, optimizer, scheduler, STEPS, seed=1)
            results[mode, dtype] = {"uninterrupted": {"model": model.state_dict(),
                                                      "optim": optimizer.state_dict()}}
            for order in ORDERS:
                out = folder / f"{mode}-{dtype}-{order}.pt"
                jobs.append((mode, dtype, order, out))
                arguments += [str(checkpoint), str(dtype).split(".")[1], order, mode, str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(WORKER), *arguments], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    for mode, dtype, order, out in jobs:
        results[mode, dtype][order] = torch.load(out)
    return results


def _assert_bitwise(actual, expected, where=""):
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and torch.equal(actual, expected), where
    elif isinstance(expected, dict):
        assert actual.keys() == expected.keys(), where
        for key in expected:
            _assert_bitwise(actual[key], expected[key], f"{where}/{key}")
    else:
        assert actual == expected, where


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", list(MODES))
def test_resume_in_another_process_is_bit_exact(resumed, mode, dtype, order):
    expected = resumed[mode, dtype]["uninterrupted"]
    _assert_bitwise(resumed[mode, dtype][order]["model"], expected["model"], "model")
    _assert_bitwise(resumed[mode, dtype][order]["optim"]["state"],
                    expected["optim"]["state"], "optimizer state")


def test_the_staged_mode_stages():
    model = build_model(torch.float32, seed=0)
    optimizer, _ = build_optimizer(model, "staged")
    assert set(optimizer.placements()) == {"cpu", "staged"}


def test_bf16_checkpoints_carry_the_fp32_masters():
    model = build_model(torch.bfloat16, seed=0)
    optimizer, scheduler = build_optimizer(model)
    train(model, optimizer, scheduler, 2, seed=0)
    state = optimizer.state_dict()["state"]
    masters = {i: hp.master for sg in optimizer._subgroups
               for i, hp in zip(sg.indices, sg.host)}
    assert masters, "the forced split put no parameter on the host"
    for i, master in masters.items():
        assert state[i][MASTER_KEY].dtype == torch.float32
        assert torch.equal(state[i][MASTER_KEY], master)
    device_side = set(range(len(list(model.parameters())))) - masters.keys()
    assert all(MASTER_KEY not in state[i] for i in device_side)


def test_a_bf16_checkpoint_moves_to_the_plain_optimizer_and_back():
    model = build_model(torch.bfloat16, seed=0)
    optimizer, scheduler = build_optimizer(model)
    train(model, optimizer, scheduler, 2, seed=0)
    plain = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    plain.load_state_dict(optimizer.state_dict())
    train(model, plain, torch.optim.lr_scheduler.StepLR(plain, step_size=2), 2, seed=1)
    # the plain optimizer rounded the masters to bf16: wrapping it says the resume is lossy
    with pytest.warns(UserWarning, match="rounded its fp32 state to torch.bfloat16"):
        again = fxopt.optim.offload(plain, model, cpu_fraction=0.5, subgroups=4)
    before = [p.detach().clone() for p in model.parameters()]
    for group in again.param_groups:
        group["lr"], group["weight_decay"] = 0.0, 0.0
    again.zero_grad()
    model(torch.zeros(1, 13, dtype=torch.bfloat16)).float().sum().backward()
    again.step()  # lr 0: the plain optimizer's weights are kept, not the stale masters
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.detach(), b)
