"""SizeWatch: a byte memory_budget planned at the sizes Dynamo traced is planned again at
a larger call whose predicted peak passes it, and the step there keeps within the budget
(under fx and Inductor code generation);
where even the new sizes' lowest peak is above the budget, the planner warns and the watch
stops; a fraction budget is not watched.

An MLP whose activations outweigh its weights at the traced batch (256 rows), compiled
with ``dynamic=True``, so one graph serves every batch size."""

import functools
import logging
import warnings

import pytest
import torch
from models import wide_mlp

import fxopt
from fxopt.pipeline import PassFailure
from fxopt.planner.size_watch import traced_sizes
from fxopt.profile import profile_memory

LARGE = 2048  # rows: 8x the traced batch


def _steps(compiled, batches):
    """Training steps at these batch sizes; the fxopt warnings they raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in batches:
            compiled(torch.randn(batch, 16)).sum().backward()
    return [str(w.message) for w in caught if str(w.message).startswith("fxopt")]


def _compiled(budget, dynamic=True, strict=False, codegen="fx"):
    torch.compiler.reset()
    backend = fxopt.backend(codegen=codegen, memory_budget=budget, strict=strict)
    return backend, torch.compile(wide_mlp(), backend=backend, dynamic=dynamic)


def _replans(caplog):
    """SizeWatch's log lines: one per graph planned again."""
    return [r.getMessage() for r in caplog.records if r.name == "fxopt.planner.size_watch"]


def _planned_peak(backend):
    (graph,) = backend.graphs
    return graph.pass_records("swap_recompute")[0].stats["peak_after"]


@functools.cache
def _keep_all_and_floor(codegen):
    """The predicted peaks at LARGE rows, compiled there, of the plan that keeps everything
    and of the lowest one reachable (a budget below it warns)."""
    backend, compiled = _compiled("1GiB", dynamic=False, codegen=codegen)
    _steps(compiled, [LARGE])
    keep_all = _planned_peak(backend)
    backend, compiled = _compiled("1MiB", dynamic=False, codegen=codegen)
    (said,) = _steps(compiled, [LARGE])
    assert "the lowest predicted peak reachable is" in said
    return keep_all, _planned_peak(backend)


@pytest.fixture
def keep_all_and_floor():
    return _keep_all_and_floor("fx")


@pytest.mark.parametrize("codegen", ["fx", "inductor"])
def test_a_larger_call_whose_predicted_peak_passes_the_byte_budget_is_planned_again(
        codegen, caplog):
    keep_all, floor = _keep_all_and_floor(codegen)
    budget = (keep_all + floor) // 2  # at 256 rows, room to keep everything; not at LARGE
    backend, compiled = _compiled(budget, codegen=codegen)
    assert _steps(compiled, [256, 100, 270]) == []
    (graph,) = backend.graphs
    assert graph.planned_at == {}  # planned at the sizes Dynamo traced, kept everything
    assert not graph.pass_records("swap_recompute")[0].verdicts.matched

    model = compiled._orig_mod
    with caplog.at_level(logging.INFO, logger="fxopt.planner.size_watch"):
        profile = profile_memory(compiled, (torch.randn(LARGE, 16),), steps=1, warmup=1)
    (message,) = _replans(caplog)
    assert "at args[0].size(0)=256" in message and f"this call has args[0].size(0)={LARGE}" \
        in message and f"planning it again at args[0].size(0)={LARGE}" in message
    (graph,) = backend.graphs
    (symbol,) = graph.planned_at
    assert graph.planned_at == {symbol: LARGE}
    record = graph.pass_records("swap_recompute")[0]
    assert record.verdicts.matched["recompute"].count > 0  # the new plan recomputes
    assert record.stats["peak_after"] <= budget < keep_all
    assert profile.peak_bytes <= budget  # measured: the step at LARGE keeps within it

    # smaller and equal calls run the new plan as it is; gradients are eager's
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fxopt.planner.size_watch"):
        assert _steps(compiled, [256, LARGE, 1000]) == []
    assert _replans(caplog) == [] and backend.graphs == [graph]
    x = torch.randn(LARGE + 3, 16)
    eager = wide_mlp()
    eager(x).sum().backward()
    model.zero_grad()
    compiled(x).sum().backward()
    for ours, theirs in zip(model.parameters(), eager.parameters(), strict=True):
        if codegen == "fx":
            torch.testing.assert_close(ours.grad, theirs.grad)
        else:  # Inductor's kernels sum the 2051 rows in another order than eager's: fp32
            # rounding of sums over <= 2**11 terms, relative to the largest entry
            limit = torch.finfo(torch.float32).eps * 2**11 * float(theirs.grad.abs().max())
            assert float((ours.grad - theirs.grad).abs().max()) <= limit


def test_a_larger_call_below_every_plan_warns_once_and_stops_watching(keep_all_and_floor):
    _, floor = keep_all_and_floor
    backend, compiled = _compiled(floor // 4)  # room at 256 rows; no plan's at LARGE
    assert _steps(compiled, [256]) == []
    (said,) = _steps(compiled, [LARGE, 2 * LARGE])
    assert "cannot fit" in said and "the lowest predicted peak reachable is" in said
    (graph,) = backend.graphs
    assert list(graph.planned_at.values()) == [LARGE]  # once, not again at 2 * LARGE


def test_under_strict_a_larger_call_below_every_plan_raises(keep_all_and_floor):
    _, floor = keep_all_and_floor
    backend, compiled = _compiled(floor // 4, strict=True)
    assert _steps(compiled, [256]) == []
    with pytest.raises(PassFailure, match="the lowest predicted peak reachable is") as error:
        _steps(compiled, [LARGE])
    assert error.value.__notes__ == [
        f"fxopt: graph {backend.graphs[0].name} was being planned again for a call with "
        f"args[0].size(0)={LARGE}, "
        "larger than the sizes it was planned at (args[0].size(0)=256)"]


def test_a_fraction_budget_is_not_watched():
    backend, compiled = _compiled(0.5)
    assert _steps(compiled, [256, 4096]) == []
    assert backend.graphs[0].planned_at == {}


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
