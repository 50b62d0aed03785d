"""SizeWatch: a byte memory_budget planned at the sizes Dynamo traced warns, once, at a
larger call whose predicted peak passes it; a fraction budget is not watched.

An MLP whose activations outweigh its weights at the traced batch (256 rows), compiled
with ``dynamic=True``, so one graph serves every batch size."""

import warnings

import pytest
import torch
from torch import nn

import fxopt
from fxopt.planner.size_watch import traced_sizes


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                         nn.Linear(256, 4))


def _steps(compiled, batches):
    """Training steps at these batch sizes; the fxopt warnings they raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in batches:
            compiled(torch.randn(batch, 16)).sum().backward()
    return [str(w.message) for w in caught if str(w.message).startswith("fxopt")]


def _compiled(budget):
    backend = fxopt.backend(codegen="fx", memory_budget=budget)
    return backend, torch.compile(_mlp(), backend=backend, dynamic=True)


def test_a_larger_call_whose_predicted_peak_passes_the_byte_budget_warns_once():
    backend, compiled = _compiled("1GiB")
    _steps(compiled, [256])
    planned = backend.graphs[0].pass_records("swap_recompute")[0].stats["peak_after"]

    backend, compiled = _compiled(int(planned * 1.3))  # room for 30% more at 256 rows
    assert _steps(compiled, [256, 100, 270]) == []  # within the budget as predicted
    (message,) = _steps(compiled, [2048, 4096])     # 8x the rows: above it, said once
    assert "planned for graph g" in message
    assert "at the sizes Dynamo traced (args[0].size(0)=256, a predicted peak of" in message
    assert "this call has args[0].size(0)=2048, where the same plan is predicted" in message
    assert "dynamic=True with the largest batch first" in message
    assert len(backend.graphs) == 1  # one compile served every size


def test_a_fraction_budget_is_not_watched():
    _, compiled = _compiled(0.5)
    assert _steps(compiled, [256, 4096]) == []


@pytest.mark.parametrize("source, readable", [
    ("L['kwargs']['input_ids'].size()[1]", "input_ids.size(1)"),
    ("L['x'].size()[0]", "x.size(0)"),
    (None, "u0"),  # Dynamo did not say whose size: the symbol
])
def test_sizes_are_named_by_whose_size_they_are(source, readable, monkeypatch):
    from fxopt import _compat

    symbol = torch.fx.experimental.symbolic_shapes.ShapeEnv().create_unbacked_symint()
    monkeypatch.setattr(_compat, "dynamo_input_sources", lambda gm: [source])
    ((name, symbol_name, _),) = traced_sizes(None, [symbol]).values()
    assert name == readable and symbol_name == str(symbol) == "u0"
