"""The largest batch that fits with a plan's own savings (fxopt.planner.batch), against
static captures at batch 3, 5, 6 (brute force: the planner's own evaluation of the same
actions on each batch's graph)."""

import pytest
import torch
from models import Block

from fxopt.cli.capture import capture_joints
from fxopt.planner import evaluate, profile_for, symbolic_step
from fxopt.planner.batch import largest_batch, plan_peaks
from fxopt.planner.joint import step_problem
from fxopt.planner.solvers.milp import lowest_peak_plan

HARDWARE = profile_for("cpu")


def _capture(batch, dynamic):
    torch.manual_seed(0)
    (joint,) = capture_joints(Block(dim=32), (torch.randn(batch, 16, 32),), dynamic=dynamic)
    return joint, step_problem(joint.gm, joint.num_fwd_outputs, HARDWARE)[1]


@pytest.fixture(scope="module")
def dynamic():
    joint, problem = _capture(4, True)
    step = symbolic_step(joint.gm, joint.num_fwd_outputs, HARDWARE)
    batch = next(n for n, where in step.origins.items() if "primals_3[0]" in where)
    return joint, problem, step, batch, lowest_peak_plan(problem.activations)


def _static_peak(batch, dynamic_problem, actions):
    """The same actions evaluated on the static graph of ``batch`` (saved tensors matched
    by position: the graphs differ only in their sizes)."""
    _, problem = _capture(batch, False)
    names = [a.name for a in problem.activations.activations]
    assert len(names) == len(dynamic_problem.activations.activations)
    rename = dict(zip((a.name for a in dynamic_problem.activations.activations), names))
    return evaluate(problem.activations, {rename[k]: v for k, v in actions.items()},
                    "static").peak_bytes


def test_plan_peaks_equal_the_static_graphs_and_the_largest_batch_is_brute_forces(dynamic):
    joint, problem, step, batch, floor = dynamic
    assert floor.actions  # the plan saves something
    static = {b: _static_peak(b, problem, floor.actions) for b in (3, 5, 6)}
    for b, peak in static.items():
        assert plan_peaks(step, joint.gm, problem.activations, floor.actions,
                          **{batch: b})[0] == pytest.approx(peak, rel=1e-9)
    budget = static[5]
    answer = largest_batch(step, joint.gm, problem.activations, floor.actions,
                           floor.added_seconds, batch, budget)
    brute = max(b for b, peak in static.items() if peak <= budget)
    assert answer is not None and answer[0] == brute == 5 and answer[1] <= budget
    kept, _, _ = step.largest_fitting(batch, budget)
    assert kept < answer[0]  # everything kept fits fewer: the savings count


def test_an_unfitting_budget_and_an_unknown_symbol(dynamic):
    joint, problem, step, batch, floor = dynamic
    assert largest_batch(step, joint.gm, problem.activations, floor.actions, 0.0, batch,
                         1000) is None
    with pytest.raises(ValueError, match="no size symbol"):
        largest_batch(step, joint.gm, problem.activations, floor.actions, 0.0, "s999", 10**9)
