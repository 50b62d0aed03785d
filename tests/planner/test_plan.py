"""The joint graph's step problem, plan_step, and Plan save/load/replay."""

import json

import pytest
import torch
from models import Block

from fxopt.analysis import estimate_joint_memory
from fxopt.cli.capture import capture_joints
from fxopt.config import parse_memory_budget
from fxopt.planner import peak_bytes, profile_for
from fxopt.planner.hardware import KNOWN_GPUS
from fxopt.planner.joint import step_problem
from fxopt.planner.plan import Plan, load_plans, plan_for_graph, save_plans
from fxopt.planner.step import plan_step


def activation_problem(gm, num_fwd_outputs, hardware):
    analysis, problem = step_problem(gm, num_fwd_outputs, hardware, name="g0")
    return analysis, problem.activations


@pytest.fixture(scope="module")
def joint():
    torch.manual_seed(0)
    return capture_joints(Block(dim=32, heads=4), (torch.randn(4, 24, 32),))[0]


def test_problem_matches_the_memory_simulation(joint):
    analysis, problem = activation_problem(joint.gm, joint.num_fwd_outputs, profile_for("cpu"))
    estimate = estimate_joint_memory(joint.gm, joint.num_fwd_outputs)
    assert peak_bytes(problem, {}) == estimate.peak_bytes
    assert sum(1 for a in problem.activations if a.choices) >= 2
    assert all(c.action == "recompute" for a in problem.activations for c in a.choices)
    names = {a.name for a in problem.activations}
    assert all(set(c.requires) <= names for a in problem.activations for c in a.choices)
    assert sum(analysis.step_seconds) > 0


def test_gpu_profile_adds_swaps_whose_cost_is_the_unhidden_copy(joint):
    _, problem = activation_problem(joint.gm, joint.num_fwd_outputs, KNOWN_GPUS["H100"])
    swaps = [(a, a.choice("swap")) for a in problem.activations if a.choice("swap")]
    assert swaps
    for act, swap in swaps:
        assert swap.seconds <= 2 * KNOWN_GPUS["H100"].copy_seconds(act.nbytes) + 1e-12


def test_plan_meets_a_budget_and_round_trips(joint, tmp_path):
    estimate = estimate_joint_memory(joint.gm, joint.num_fwd_outputs)
    expected = parse_memory_budget(0.5).peak_bytes_bound(estimate.peak_bytes,
                                                         estimate.activation_bytes)
    budget = parse_memory_budget(expected)  # bytes: a bound on the predicted peak
    _, problem = step_problem(joint.gm, joint.num_fwd_outputs, profile_for("cpu"), name="g0")
    plan = plan_step(problem, budget, profile_for("cpu"))
    assert plan.budget_bytes == expected < estimate.peak_bytes
    assert plan.actions and set(plan.actions.values()) == {"recompute"}
    assert plan.predictions["keep_all_peak_bytes"] == estimate.peak_bytes
    if plan.feasible:
        assert plan.predictions["peak_bytes"] <= expected
    assert plan.planning_seconds > 0 and plan.graph == "g0"

    loaded = Plan.load(plan.save(tmp_path / "plan.json"))
    assert loaded == plan and loaded.profile() == profile_for("cpu")
    replayed = plan_step(problem, None, profile_for("cpu"), replay=loaded)
    assert replayed.actions == plan.actions and replayed.solver == "plan"
    assert replayed.predictions["peak_bytes"] == plan.predictions["peak_bytes"]


def test_a_fraction_plans_saved_bytes_and_reports_its_floor(joint):
    estimate = estimate_joint_memory(joint.gm, joint.num_fwd_outputs)
    _, problem = step_problem(joint.gm, joint.num_fwd_outputs, profile_for("cpu"), name="g0")
    plan = plan_step(problem, parse_memory_budget(0.5), profile_for("cpu"))
    plain = plan.predictions["plain_saved_bytes"]
    assert plain == estimate.activation_bytes
    assert plan.feasible and plan.predictions["saved_bytes"] <= 0.5 * plain
    assert plan.predictions["floor_saved_bytes"] <= plan.predictions["saved_bytes"]
    assert set(plan.actions.values()) == {"recompute"} and plan.extra["fraction"] == 0.5


def test_without_a_budget_everything_is_kept(joint):
    _, problem = step_problem(joint.gm, joint.num_fwd_outputs, profile_for("cpu"))
    plan = plan_step(problem, None, profile_for("cpu"))
    assert plan.actions == {} and plan.feasible
    assert plan.budget_bytes == problem.keep_all_peak_bytes


@pytest.mark.parametrize("text, error", [
    ("not json", "bad JSON"),
    ("[1, 2]", "JSON object"),
    (json.dumps({"bogus": 1}), "unknown plan fields"),
    (json.dumps({"graphs": []}), "'graphs' must be a list of plans"),
    (json.dumps({"graphs": [{"bogus": 1}]}), "unknown plan fields"),
])
def test_bad_plan_files_are_refused(tmp_path, text, error):
    path = tmp_path / "plan.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=error):
        Plan.load(path)


def test_a_model_plan_file_holds_each_graphs_plan_found_by_fingerprint(joint, tmp_path):
    _, problem = step_problem(joint.gm, joint.num_fwd_outputs, profile_for("cpu"), name="g0")
    first = plan_step(problem, parse_memory_budget(0.5), profile_for("cpu"))
    other = Plan.from_dict({**first.to_dict(), "graph": "g1", "fingerprint": ["x"]})
    path = save_plans([other, first], tmp_path / "plan.json")
    plans = load_plans(path)
    assert plans == [other, first]
    assert plan_for_graph(plans, list(problem.fingerprint)) == first
    twin = Plan.from_dict({**first.to_dict(), "graph": "g2", "actions": {}})
    plans = [first, other, twin]  # two identical graphs: each replays its own plan
    assert plan_for_graph(plans, list(problem.fingerprint), 2) == twin
    assert plan_for_graph(plans, list(problem.fingerprint), 0) == first
    assert plan_for_graph(plans, list(problem.fingerprint), 1) == first  # g1 is another graph
    with pytest.raises(ValueError, match="holds the plans of 2 graphs"):
        Plan.load(path)


def test_bad_plan_contents_are_refused():
    base = dict(hardware={}, budget_bytes=1, actions={}, predictions={}, solver="s",
                status="", planning_seconds=0.0)
    with pytest.raises(ValueError, match="version"):
        Plan(**base, version=99)
    with pytest.raises(ValueError, match="unknown actions"):
        Plan(**{**base, "actions": {"a": "delete"}})


@pytest.mark.parametrize("budget", [0, -5, 1.5, "6 gigs", True])
def test_bad_budgets_are_refused(budget):
    with pytest.raises((ValueError, TypeError), match="memory_budget"):
        parse_memory_budget(budget)
