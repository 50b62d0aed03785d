"""The bytes a compiled forward keeps for backward, measured (saved-tensor hooks around the
compiled call) against fxopt's prediction: the measurement later passes' tests rely on."""

import pytest
import torch
from models import Block, ConvNet

import fxopt
from fxopt.analysis import measure_saved_bytes


def _compiled_saved_bytes(model, *inputs):
    backend = fxopt.backend()
    compiled = torch.compile(model, backend=backend)
    compiled(*inputs).sum().backward()  # compile forward and backward first
    caller_owned = [*model.parameters(), *model.buffers(), *inputs]
    measured = measure_saved_bytes(lambda: compiled(*inputs), exclude=caller_owned)
    (graph,) = backend.graphs
    return measured, graph.memory["fxopt"].activation_bytes


@pytest.mark.parametrize("build, shape", [
    (lambda: Block(dim=64), (4, 33, 64)),
    (lambda: ConvNet().train(), (4, 3, 24, 24)),
], ids=["transformer_block", "convnet"])
def test_measured_saved_bytes_equal_the_prediction(build, shape):
    torch.manual_seed(0)
    measured, predicted = _compiled_saved_bytes(build(), torch.randn(*shape))
    assert measured.tensors > 0
    assert measured.bytes == predicted


def test_excluded_tensors_are_not_counted():
    x = torch.randn(64, 64, requires_grad=True)
    w = torch.randn(64, 64, requires_grad=True)
    everything = measure_saved_bytes(lambda: (x @ w).tanh())
    without_inputs = measure_saved_bytes(lambda: (x @ w).tanh(), exclude=[x, w])
    assert everything.bytes == 3 * 64 * 64 * 4  # x, w and tanh's output
    assert without_inputs.bytes == 64 * 64 * 4
