"""reshape_lstm_states: on torch 2.11 and 2.12, whose decomposition returns ``nn.LSTM``'s
``h_n`` and ``c_n`` as (layers, 1, batch, hidden), the compiled model returns eager's
(layers, batch, hidden), and what it computes from them is eager's, outputs and gradients.

The tests run on every torch: a fixture puts 2.11's squeeze into the decomposition
(``one_layer_lstm``, which ``lstm_impl`` looks up at each call), and plain ``torch.compile``
is checked to misshape the states under it, so each test shows the pass repairing a real
failure. On the torch installed, without the fixture, the pass fires exactly where that
torch's own decomposition misshapes them."""

import warnings

import pytest
import torch
from torch import nn
from torch._decomp import decompositions

from fxopt import _compat
from fxopt.testing import assert_same_as_eager

PASS = "reshape_lstm_states"


@pytest.fixture
def misshaping_decomposition(monkeypatch):
    """torch 2.11's ``one_layer_lstm``: its final states keep the step's leading 1, except
    where the batch is 1 (the wrong squeeze then removes the batch dimension instead)."""
    original = decompositions.one_layer_lstm

    def one_layer_lstm(*args, **kwargs):
        out, (h, c) = original(*args, **kwargs)
        if h.shape[0] == 1:
            return out, (h, c)
        return out, (h.unsqueeze(0), c.unsqueeze(0))

    monkeypatch.setattr(decompositions, "one_layer_lstm", one_layer_lstm)
    _compat.decomposed_lstm_states_misshapen.cache_clear()
    yield
    _compat.decomposed_lstm_states_misshapen.cache_clear()


@pytest.fixture(autouse=True)
def traced_rnns():
    with _compat.dynamo_allow_rnn():
        yield


class Classifier(nn.Module):
    """An LSTM whose last layer's final state feeds a head, as sequence classifiers read it;
    the states are returned too."""

    def __init__(self, bidirectional=False, proj_size=0):
        super().__init__()
        self.lstm = nn.LSTM(5, 7, num_layers=2, bidirectional=bidirectional,
                            proj_size=proj_size)
        self.head = nn.Linear(proj_size or 7, 3)

    def forward(self, x):
        output, (h, c) = self.lstm(x)
        return output.sum(), self.head(h[-1]), h, c


def _x(batch=4):
    torch.manual_seed(0)
    return torch.randn(6, batch, 5, requires_grad=True)


def test_the_simulated_torch_misshapes_plain_compile(misshaping_decomposition):
    assert _compat.decomposed_lstm_states_misshapen()
    torch._dynamo.reset()
    _, _, h, c = torch.compile(Classifier(), backend="aot_eager")(_x())
    assert h.shape == c.shape == (2, 1, 4, 7)


@pytest.mark.parametrize("options", [{}, {"codegen": "fx"}, {"fuse_rnn": False},
                                     {"library_rnn": False}])
@pytest.mark.parametrize("bidirectional,proj_size", [(False, 0), (True, 0), (False, 2)])
def test_the_states_are_eagers(misshaping_decomposition, options, bidirectional, proj_size):
    comparison = assert_same_as_eager(Classifier(bidirectional, proj_size), (_x(),), options)
    assert comparison.fired(PASS)
    (record,) = [r for r in comparison.passes if r.name == PASS]
    assert record.verdicts.counts() == {"h_n": 1, "c_n": 1}


def test_calls_fxopts_rnn_passes_take_are_eagers_already(misshaping_decomposition):
    for options in ({"fuse_rnn": True}, {"library_rnn": True}, {"memory_budget": 0.5}):
        comparison = assert_same_as_eager(Classifier(), (_x(),), options)
        assert not comparison.fired(PASS), options


def test_a_batch_of_one_is_left_alone(misshaping_decomposition):
    comparison = assert_same_as_eager(Classifier(), (_x(batch=1),), {})
    assert not comparison.fired(PASS)


def test_on_this_torch_it_fires_where_its_decomposition_misshapes():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        comparison = assert_same_as_eager(Classifier(), (_x(),), {})
    assert comparison.fired(PASS) == _compat.decomposed_lstm_states_misshapen()
