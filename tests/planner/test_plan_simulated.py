"""plan_step checks a byte plan against the compiled step's simulation (the memory model
explain shows), not only the timeline model the solvers optimise: the timeline model
counts nothing for a recompute chain's own values, which the partitioner may rebuild
early and hold (Llama's lowest plan: 45.20 MiB by the model, 48.10 MiB simulated and
measured, issue 16)."""

import dataclasses

import pytest
import torch
from models import Block

from fxopt.analysis import estimate_partitioned_memory
from fxopt.cli.capture import capture_joints
from fxopt.config import MemoryBudget
from fxopt.planner import peak_bytes, profile_for
from fxopt.planner.joint import group_chain, step_problem
from fxopt.planner.search import quiet_plan
from fxopt.planner.step import plan_step


@pytest.fixture(scope="module")
def planned():
    torch.manual_seed(0)
    joint = capture_joints(Block(dim=32, heads=4), (torch.randn(4, 24, 32),))[0]
    analysis, problem = step_problem(joint.gm, joint.num_fwd_outputs, profile_for("cpu"))
    return joint, analysis, problem


def test_a_byte_plans_peak_is_the_partitioned_steps_simulation(planned):
    joint, analysis, problem = planned
    lowest = quiet_plan(problem, MemoryBudget(bytes=1), profile_for("cpu"))  # warns: 1 byte
    budget = (problem.keep_all_peak_bytes + int(lowest.predictions["peak_bytes"])) // 2
    plan = plan_step(problem, MemoryBudget(bytes=budget), profile_for("cpu"))
    assert plan.actions
    tagged = [n.name for name in plan.actions for n in group_chain(analysis, name)[0]]
    simulated = estimate_partitioned_memory(joint.gm, joint.num_fwd_outputs,
                                            recompute=tagged).peak_bytes
    assert plan.predictions["peak_bytes"] == simulated
    assert plan.predictions["model_peak_bytes"] == peak_bytes(problem.activations,
                                                              plan.actions)
    assert plan.feasible == (simulated <= budget)


def test_a_plan_the_simulation_puts_over_the_budget_is_tightened_until_it_fits(planned):
    _, _, problem = planned
    model = dataclasses.replace(problem, simulate=None)  # the timeline model alone
    lowest = quiet_plan(model, MemoryBudget(bytes=1), profile_for("cpu")).predictions
    excess = (problem.keep_all_peak_bytes - int(lowest["peak_bytes"])) // 4

    def simulate(actions):  # a simulation that sees `excess` more than the model
        return peak_bytes(problem.activations, actions) + excess

    budget = int(lowest["peak_bytes"]) + 2 * excess
    model_only = plan_step(model, MemoryBudget(bytes=budget), profile_for("cpu"))
    assert model_only.feasible and simulate(model_only.actions) > budget  # the old plan

    checked = dataclasses.replace(problem, simulate=simulate)
    plan = plan_step(checked, MemoryBudget(bytes=budget), profile_for("cpu"))
    assert plan.feasible
    assert plan.predictions["peak_bytes"] == simulate(plan.actions) <= budget
    assert plan.predictions["model_peak_bytes"] <= budget - excess


def test_an_unmet_budget_with_nothing_to_recompute_reports_the_simulated_step():
    """Where no plan lowers the peak, the plan (and the warning) name the compiled step's
    simulated peak, not the joint graph's keep-all: under Inductor the two differ (a Llama
    with ``drop_logits`` at 256 tokens: 72.52 MiB simulated and measured, 83.39 MiB by the
    joint graph, which the warning once called the lowest peak reachable)."""
    joint = capture_joints(torch.nn.Linear(8, 4), (torch.randn(6, 8),))[0]
    _, problem = step_problem(joint.gm, joint.num_fwd_outputs, profile_for("cpu"))
    assert not problem.activations.activations  # only inputs are saved: nothing recomputes
    simulated_keep_all = problem.keep_all_peak_bytes - 64
    checked = dataclasses.replace(problem, simulate=lambda actions: simulated_keep_all)
    budget = simulated_keep_all - 32
    with pytest.warns(UserWarning, match=rf"lowest predicted peak reachable is .* "
                                         rf"\({simulated_keep_all} bytes"):
        plan = plan_step(checked, MemoryBudget(bytes=budget), profile_for("cpu"))
    assert not plan.actions and not plan.feasible
    assert plan.predictions["peak_bytes"] == simulated_keep_all
    assert plan.predictions["keep_all_peak_bytes"] == simulated_keep_all


def test_a_pessimistic_model_is_loosened_to_a_cheaper_plan_the_simulation_fits(planned):
    """Under Inductor the timeline model can put a plan ``gap`` bytes above what the step
    simulates (its partition recomputes what it fuses); the plan is then the one the model
    would take at the bound plus that gap, not the model's own, which recomputes more."""
    _, _, problem = planned
    model = dataclasses.replace(problem, simulate=None)
    lowest = int(quiet_plan(model, MemoryBudget(bytes=1), profile_for("cpu"))
                 .predictions["peak_bytes"])
    gap = (problem.keep_all_peak_bytes - lowest) // 4

    def simulate(actions):  # a simulation that sees `gap` less than the model
        return peak_bytes(problem.activations, actions) - gap

    budget = lowest + gap // 4
    strict_model = plan_step(model, MemoryBudget(bytes=budget), profile_for("cpu"))
    at_the_gap = plan_step(model, MemoryBudget(bytes=budget + gap), profile_for("cpu"))
    assert at_the_gap.predictions["added_seconds"] < strict_model.predictions["added_seconds"]

    checked = dataclasses.replace(problem, simulate=simulate)
    plan = plan_step(checked, MemoryBudget(bytes=budget), profile_for("cpu"))
    assert plan.feasible and plan.actions == at_the_gap.actions
    assert plan.predictions["peak_bytes"] == simulate(plan.actions) <= budget
    assert "loosened" in plan.status


def test_a_plan_the_simulation_puts_no_lower_than_keeping_everything_recomputes_nothing(
        planned):
    """A budget out of reach where the step's simulation peaks the same whatever is
    recomputed (transformers' loss graph under Inductor, where the partition's own
    recomputation sets the peak): the plan keeps everything instead of paying for a
    recomputation that lowers nothing."""
    _, _, problem = planned
    flat = dataclasses.replace(problem, simulate=lambda actions: problem.keep_all_peak_bytes)
    with pytest.warns(UserWarning, match="cannot fit"):
        plan = plan_step(flat, MemoryBudget(bytes=problem.keep_all_peak_bytes // 2),
                         profile_for("cpu"))
    assert not plan.actions and not plan.feasible
    assert plan.predictions["peak_bytes"] == problem.keep_all_peak_bytes
    assert plan.predictions["added_seconds"] == 0
