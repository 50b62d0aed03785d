"""Replaying a saved plan (the ``plan`` option) is the user's explicit choice: it replays
even where it misses its budget (``strict`` included), only on the graph it was made for
(shapes and dtypes included), and a file that is not a plan is an error at compile time,
never a warning and a fallback."""

import json

import pytest
import torch
from torch import nn

import fxopt
from fxopt.config import OptionError
from fxopt.testing import assert_same_as_eager
from tests.models import deep_mlp


def _error_chain(call):
    """The exceptions ``call`` raises, outermost first (Dynamo wraps a backend's error)."""
    try:
        call()
    except Exception as error:  # noqa: BLE001 - the chain is inspected below
        chain = []
        while error is not None:
            chain.append(error)
            error = error.__cause__ or error.__context__
        return chain
    pytest.fail("nothing was raised")


def _swap_recompute_stats(comparison):
    (record,) = [r for r in comparison.passes if r.name == "swap_recompute"]
    return record.stats


def _dumped_plan(tmp_path, x, budget, model=deep_mlp):
    assert_same_as_eager(model(), (x,), {"codegen": "fx", "memory_budget": budget,
                                          "debug_dir": str(tmp_path)})
    (plan_file,) = tmp_path.glob("*/*swap_recompute.plan.json")
    return plan_file


def _dropout_mlp():
    """Dropout's RNG state is kept whatever is recomputed, so its floor is above 0.3."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 64), nn.GELU(), nn.Dropout(0.5), nn.Linear(64, 8))


def test_a_plan_that_misses_its_budget_replays_under_strict(tmp_path):
    x = torch.randn(4, 8)
    with pytest.warns(UserWarning, match="swap_recompute cannot keep .* the floor"):
        plan_file = _dumped_plan(tmp_path, x, 0.3, _dropout_mlp)
    assert json.loads(plan_file.read_text())["feasible"] is False
    replayed = assert_same_as_eager(_dropout_mlp(), (x,), {"plan": str(plan_file),
                                                           "strict": True})
    stats = _swap_recompute_stats(replayed)
    assert replayed.fired("swap_recompute") and not stats["feasible"]
    assert stats["plan"]["actions"] == json.loads(plan_file.read_text())["actions"]


@pytest.mark.parametrize("model, x, differs", [
    (deep_mlp, torch.randn(32, 48), "primals_"),  # same structure, other batch
    (deep_mlp, torch.randn(64, 48, dtype=torch.float64), "primals_"),  # other dtype
    (lambda: nn.Sequential(nn.Linear(48, 48), nn.ReLU(), nn.Linear(48, 5)),
     torch.randn(64, 48), ""),  # another model
])
def test_a_plan_for_another_graph_is_refused_naming_the_node(tmp_path, model, x, differs):
    plan_file = _dumped_plan(tmp_path, torch.randn(64, 48), 0.5)
    module = model().to(x.dtype)
    compiled = torch.compile(module, backend=fxopt.backend(plan=str(plan_file)))
    chain = _error_chain(lambda: compiled(x).sum().backward())
    (error,) = [e for e in chain if isinstance(e, OptionError)]
    assert "was made for another graph: node" in str(error) and "plan this model again" in str(
        error)
    assert differs in str(error)


@pytest.mark.parametrize("text, words", [
    ("{not json", "bad JSON"),
    (json.dumps({"actions": {}}), "lacks the fields"),
    (json.dumps({"hardware": {}, "budget_bytes": 1, "actions": [], "predictions": {},
                 "solver": "s", "status": "", "planning_seconds": 0.0}), "'actions' must"),
    (json.dumps({"hardware": {}, "budget_bytes": 1, "actions": {}, "predictions": {},
                 "solver": "s", "status": "", "planning_seconds": 0.0, "version": 1}),
     "plan version 1"),
])
def test_a_file_that_is_not_a_plan_is_an_error_when_compiling(tmp_path, text, words):
    path = tmp_path / "plan.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=words) as info:
        fxopt.backend(plan=str(path))
    assert str(path) in str(info.value)
    compiled = torch.compile(deep_mlp(), backend="fxopt", options={"plan": str(path)})
    chain = _error_chain(lambda: compiled(torch.randn(4, 48)))
    assert any(isinstance(e, ValueError) and words in str(e) for e in chain)


def test_a_folder_as_plan_says_it_is_a_folder(tmp_path):
    with pytest.raises(ValueError, match="is a folder"):
        fxopt.backend(plan=str(tmp_path))
