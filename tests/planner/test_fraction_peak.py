"""A fraction plan's predicted peak never rises as the budget falls
(:mod:`fxopt.planner.solvers.fraction_peak`), checked by brute force on ``fxopt doctor``'s
deep MLP (12 saved tensors: every one of the 4096 plans), tiny: the chain model equals the
timeline model wherever no recompute reads another, every fraction at or above the floor
is met, and the peak of every plan marked capped is at most plain autograd's and at most
the plan of every larger budget's; a plan over plain autograd's peak warns."""

import dataclasses
import itertools
import warnings

import pytest
import torch

from fxopt.cli.capture import capture_joints
from fxopt.config import MemoryBudget
from fxopt.doctor.memory import deep_mlp
from fxopt.planner import peak_bytes, profile_for
from fxopt.planner.joint import step_problem
from fxopt.planner.solvers.fraction_peak import ChainPeak, solve_peak_capped
from fxopt.planner.step import plan_step


@pytest.fixture(scope="module")
def problem():
    torch.manual_seed(0)
    joint = capture_joints(deep_mlp(16), (torch.randn(32, 16),))[0]
    return step_problem(joint.gm, joint.num_fwd_outputs, profile_for("cpu"))[1]


def test_the_chain_model_is_the_timeline_model_where_no_chain_joins(problem):
    model = ChainPeak.build(problem.activations, problem.saved_bytes)
    reads = model.reads
    names = [o.name for o in problem.saved_bytes.options]
    assert len(names) == 12
    checked = 0
    for r in range(len(names) + 1):
        for chosen in itertools.combinations(names, r):
            if any(s in chosen for t in chosen for s in reads[t]):
                continue  # a recompute reading a recomputed tensor: the chains join
            actions = dict.fromkeys(chosen, "recompute")
            assert model.peak(chosen) == peak_bytes(problem.activations, actions)
            checked += 1
    assert checked > 300


def test_a_lower_target_never_peaks_higher_in_the_model(problem):
    saved = problem.saved_bytes
    unit = max(saved.storage_bytes.values())
    plans = {}
    for kept in range(13):  # each level of 12 equal tensors, and between levels
        for target in (kept * unit, kept * unit + unit // 2):
            plans[target] = solve_peak_capped(saved, problem.activations, target)
    plain = ChainPeak.build(problem.activations, saved).peak(())
    for target, plan in plans.items():
        assert plan.kept_bytes <= target or target < unit  # met from one tensor up
        assert plan.plain_peak_bytes == plain and not plan.peak_simulated
        if plan.peak_capped:
            assert plan.peak_bytes <= plain
            assert all(plan.peak_bytes <= larger.peak_bytes
                       for t, larger in plans.items() if t > target), target
    capped = [t for t, p in plans.items() if p.peak_capped]
    # the budget saves memory: capped from keeping everything down to a third of it, and
    # there the activations' and temporaries' peak is below 2/3 of plain autograd's
    base = problem.baseline_bytes
    assert min(capped) <= 4 * unit
    assert plans[min(capped)].peak_bytes - base < (plain - base) * 2 / 3


def test_simulated_peaks_do_not_rise(problem):
    profile = profile_for("cpu")
    peaks = []
    for fraction in (1.0, 0.8, 0.6, 0.45, 0.35):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            plan = plan_step(problem, MemoryBudget(fraction=fraction), profile, strict=True)
        assert plan.predictions["saved_bytes"] <= fraction * plan.predictions[
            "plain_saved_bytes"]
        peaks.append(plan.predictions.get("peak_bytes",
                                          plan.predictions.get("plain_peak_bytes")))
    assert peaks == sorted(peaks, reverse=True) and peaks[-1] < peaks[0]


def test_a_fraction_that_only_plans_over_plain_autograds_peak_meet_warns(problem):
    plain = problem.simulate_tagged(())

    def simulate(tagged):  # a step whose every recompute raises the peak
        return plain + len(tagged)

    worse = dataclasses.replace(problem, simulate_tagged=simulate)
    # the fraction is met, so strict (which raises where a budget is not) warns too
    with pytest.warns(UserWarning, match="above plain autograd's .* or a byte budget"):
        plan = plan_step(worse, MemoryBudget(fraction=0.5), profile_for("cpu"), strict=True)
    assert plan.extra["peak_capped"] is False
    assert plan.predictions["saved_bytes"] <= 0.5 * plan.predictions["plain_saved_bytes"]
    assert plan.predictions["peak_bytes"] > plain
