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
