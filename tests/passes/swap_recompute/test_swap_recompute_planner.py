"""swap_recompute with the planner: the MILP decides by default under a budget, the
heuristic with planner=False, and a plan from the debug dump replays through `plan`."""

import pytest
import torch

from fxopt.testing import assert_same_as_eager
from tests.models import deep_mlp


def _stats(comparison):
    (record,) = [r for r in comparison.passes if r.name == "swap_recompute"]
    return record.stats


@pytest.mark.filterwarnings("ignore:fxopt. swap_recompute cannot fit")
@pytest.mark.parametrize("planner, solver", [(None, "milp"), (False, "delta")])
def test_the_planner_decides_by_default_and_the_heuristic_without_it(planner, solver):
    options = {"memory_budget": 0.5, "planner": planner}
    comparison = assert_same_as_eager(deep_mlp(), (torch.randn(64, 48),), options)
    stats = _stats(comparison)
    assert comparison.fired("swap_recompute") and stats["recompute"] > 0
    assert stats["solver"].startswith(solver)
    assert stats["plan"]["solver"] == stats["solver"]


@pytest.mark.filterwarnings("ignore:fxopt. swap_recompute cannot fit")
def test_a_dumped_plan_replays_without_a_budget(tmp_path):
    x = torch.randn(64, 48)
    planned = assert_same_as_eager(deep_mlp(), (x,), {"memory_budget": 0.5,
                                                      "debug_dir": str(tmp_path)})
    (plan_file,) = tmp_path.glob("*/*swap_recompute.plan.json")
    replayed = assert_same_as_eager(deep_mlp(), (x,), {"plan": str(plan_file)})
    assert replayed.fired("swap_recompute")
    before, after = _stats(planned), _stats(replayed)
    assert after["solver"] == "plan"
    assert after["plan"]["actions"] == before["plan"]["actions"]
    assert after["peak_after"] == before["peak_after"]


def test_a_missing_plan_file_is_a_clear_error():
    from fxopt.config import resolve

    with pytest.raises(ValueError, match="no such file"):
        resolve({"plan": "missing-plan.json"})
