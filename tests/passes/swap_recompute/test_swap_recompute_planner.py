"""swap_recompute with the planner: the MILP decides by default under a budget, the
heuristic with planner=False, and a plan from the debug dump replays through `plan`."""

import pytest
import torch

from fxopt.testing import assert_same_as_eager
from tests.models import deep_mlp


def _stats(comparison):
    (record,) = [r for r in comparison.passes if r.name == "swap_recompute"]
    return record.stats


def _peak_budget(x):
    """A byte budget 12 KiB under deep_mlp's predicted peak with everything kept."""
    comparison = assert_same_as_eager(deep_mlp(), (x,), {"memory_budget": "6GiB"})
    return _stats(comparison)["peak_before"] - 12 * 1024


@pytest.mark.parametrize("planner, solver", [(None, "milp"), (False, "delta")])
def test_the_planner_decides_by_default_and_the_heuristic_without_it(planner, solver):
    x = torch.randn(64, 48)
    options = {"memory_budget": _peak_budget(x), "planner": planner, "strict": True}
    comparison = assert_same_as_eager(deep_mlp(), (x,), options)
    stats = _stats(comparison)
    (record,) = [r for r in comparison.passes if r.name == "swap_recompute"]
    assert comparison.fired("swap_recompute") and record.verdicts.matched["recompute"].count > 0
    assert stats["feasible"] and stats["peak_after"] <= stats["budget_bytes"]
    assert stats["solver"].startswith(solver)
    assert stats["plan"]["solver"] == stats["solver"]


@pytest.mark.parametrize("budget", [0.5, "byte"])
def test_a_dumped_plan_replays_without_a_budget(tmp_path, budget):
    x = torch.randn(64, 48)
    budget = _peak_budget(x) if budget == "byte" else budget
    planned = assert_same_as_eager(deep_mlp(), (x,), {"codegen": "fx", "memory_budget": budget,
                                                      "strict": True, "debug_dir": str(tmp_path)})
    (plan_file,) = tmp_path.glob("*/*swap_recompute.plan.json")
    replayed = assert_same_as_eager(deep_mlp(), (x,), {"plan": str(plan_file)})
    assert replayed.fired("swap_recompute")
    before, after = _stats(planned), _stats(replayed)
    assert after["solver"] == "plan"
    assert after["plan"]["actions"] == before["plan"]["actions"]
    for key in ("peak_after", "saved_bytes_after"):
        assert after.get(key) == before.get(key)


def test_a_missing_plan_file_is_a_clear_error():
    from fxopt.config import resolve

    with pytest.raises(ValueError, match="no such file"):
        resolve({"plan": "missing-plan.json"})
