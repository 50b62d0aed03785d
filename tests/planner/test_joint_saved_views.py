"""A saved tensor that is a ``detach`` of an op's output the planner may not run again (a
custom op whose autograd saves its output, as fxopt's sequence ops and fused loss do):
"recomputing" the detach reads the very storage it was to free. The fraction budget's
problem once counted that storage freed, so ``strict`` passed a plan that kept it (an
LSTM LM with fuse_rnn's sequence ops, not yet recomputable, measured 0.364 of eager's
bytes at ``memory_budget=0.3``); now the output is kept in every plan and the floor says
so."""

import pytest
import torch
from torch import nn

import fxopt
from fxopt.analysis import measure_saved_bytes


@torch.library.custom_op("fxopt_test::exp_keeping_output", mutates_args=())
def exp_keeping_output(x: torch.Tensor) -> torch.Tensor:
    return x.exp()


@exp_keeping_output.register_fake
def _(x):
    return torch.empty_like(x)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _backward(ctx, grad):
    (output,) = ctx.saved_tensors
    return grad * output


exp_keeping_output.register_autograd(_backward, setup_context=_setup)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x):
        return exp_keeping_output(self.linear(x)).sum()


def _compiled(**options):
    torch._dynamo.reset()
    model = Model()
    return model, torch.compile(model, backend=fxopt.backend(codegen="fx", **options))


def test_the_output_of_an_op_that_cannot_be_recomputed_is_the_floor():
    x = torch.randn(8, 16, requires_grad=True)
    model, compiled = _compiled(memory_budget=0.3, strict=True)
    with pytest.raises(Exception, match=r"InfeasibleBudget.*the floor.* is 1\.000"):
        compiled(x).backward()


def test_without_strict_what_the_plan_keeps_is_what_it_predicted():
    x = torch.randn(8, 16, requires_grad=True)
    model, compiled = _compiled()
    compiled(x).backward()
    plain = measure_saved_bytes(lambda: compiled(x), exclude=[*model.parameters(), x]).bytes
    assert plain == 8 * 16 * 4   # the op's output, nothing else
    with pytest.warns(UserWarning, match="memory_budget 0.3"):
        model, compiled = _compiled(memory_budget=0.3)
        compiled(x).backward()
    kept = measure_saved_bytes(lambda: compiled(x), exclude=[*model.parameters(), x]).bytes
    assert kept == plain
