"""The greedy solver's DELTA mode on plain data: table-driven, no graphs."""

import random
from functools import partial

import pytest

from fxopt.planner import ActivationChoice, ActivationProblem, SavedActivation, peak_bytes
from fxopt.planner.solvers.greedy import solve_greedy

decide_delta = partial(solve_greedy, mode="delta")


def act(name, nbytes, *choices):
    return SavedActivation(name, nbytes, tuple(choices))


def rc(start, end, seconds, *requires):
    return ActivationChoice("recompute", (start, end), seconds, tuple(requires))


def sw(start, end, seconds):
    return ActivationChoice("swap", (start, end), seconds)


LIVE = (100, 200, 300, 250, 150)  # peak 300 at step 2


@pytest.mark.parametrize("activations, budget, expected, feasible", [
    # fits already: nothing changes
    ([act("a", 100, rc(1, 4, 1.0))], 300, {}, True),
    # empty problem, zero budget: nothing to do, infeasible
    ([], 0, {}, False),
    # the cheaper per byte wins (b: 1.0/100 < a: 5.0/100)
    ([act("a", 100, rc(1, 4, 5.0)), act("b", 100, rc(1, 4, 1.0))], 200, {"b": "recompute"},
     True),
    # equal cost per byte: the larger tensor first
    ([act("a", 50, rc(1, 4, 0.5)), act("b", 100, rc(1, 4, 1.0))], 250, {"b": "recompute"},
     True),
    # recompute vs swap at equal cost: recompute
    ([act("a", 100, sw(1, 4, 1.0), rc(1, 4, 1.0))], 200, {"a": "recompute"}, True),
    # swap cheaper than recompute: swap
    ([act("a", 100, sw(1, 4, 0.1), rc(1, 4, 1.0))], 200, {"a": "swap"}, True),
    # a window that does not cover the peak step is filtered out
    ([act("a", 100, rc(3, 5, 0.0)), act("b", 10, rc(2, 3, 1.0))], 295, {"b": "recompute"},
     True),
    # a recompute that requires b locks b as kept: the peak cannot go lower
    ([act("a", 100, rc(1, 4, 0.1, "b")), act("b", 100, rc(1, 4, 1.0))], 100,
     {"a": "recompute"}, False),
    # nothing covers the peak: infeasible, no action
    ([act("a", 100, rc(3, 5, 0.0))], 100, {}, False),
])
def test_decisions(activations, budget, expected, feasible):
    problem = ActivationProblem(LIVE, tuple(activations), budget)
    decision = decide_delta(problem)
    assert decision.actions == expected
    assert decision.feasible is feasible
    assert decision.peak_bytes == peak_bytes(problem, expected)
    assert decision.solver == "delta"


def test_infeasible_reports_the_lowest_peak_it_reaches():
    problem = ActivationProblem(LIVE, (act("a", 80, rc(1, 4, 1.0)),), budget_bytes=10)
    decision = decide_delta(problem)
    assert decision.actions == {"a": "recompute"}
    assert not decision.feasible and decision.peak_bytes == 220
    assert decision.details["order"] == ["a"]


def _random_problem(rng, budget):
    steps = 12
    live = tuple(rng.randrange(100, 1000) for _ in range(steps))
    activations = []
    for i in range(8):
        start = rng.randrange(0, steps - 1)
        end = rng.randrange(start + 1, steps + 1)
        requires = (f"t{rng.randrange(i)}",) if i and rng.random() < 0.3 else ()
        choices = [rc(start, end, rng.random(), *requires)]
        if rng.random() < 0.5:
            choices.append(sw(min(start + 1, end), end, rng.random()))
        activations.append(act(f"t{i}", rng.randrange(1, 200), *choices))
    return ActivationProblem(live, tuple(activations), budget)


@pytest.mark.parametrize("seed", range(20))
def test_lower_budget_never_gives_a_higher_peak_and_is_deterministic(seed):
    peaks = []
    for budget in range(1000, -1, -50):
        problem = _random_problem(random.Random(seed), budget)
        first, again = decide_delta(problem), decide_delta(problem)
        assert first.actions == again.actions and first.peak_bytes == again.peak_bytes
        assert first.feasible == (first.peak_bytes <= budget)
        peaks.append(first.peak_bytes)
    assert peaks == sorted(peaks, reverse=True)
