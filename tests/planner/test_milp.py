"""The MILP and greedy solvers on plain data: table-driven cases and brute-force agreement."""

import itertools
import random

import pytest

from fxopt.planner import (
    ActivationChoice,
    ActivationProblem,
    SavedActivation,
    evaluate,
    peak_bytes,
)
from fxopt.planner.solvers.greedy import solve_greedy
from fxopt.planner.solvers.milp import lowest_peak, lowest_peak_plan, solve_activations


def _problem(budget):
    a = SavedActivation("a", 40, (ActivationChoice("recompute", (1, 4), 0.5),
                                  ActivationChoice("swap", (2, 3), 0.25)))
    b = SavedActivation("b", 30, (ActivationChoice("recompute", (2, 5), 1.0, requires=("a",)),))
    return ActivationProblem(live_bytes=(50, 90, 120, 110, 70, 40), activations=(a, b),
                             budget_bytes=budget)


@pytest.mark.parametrize("budget, actions, peak, feasible", [
    (1000, {}, 120, True),                    # budget above need: nothing is touched
    (120, {}, 120, True),                     # exactly the keep-all peak
    (110, {"a": "swap"}, 110, True),          # the cheaper choice suffices
    (90, {"a": "recompute"}, 80, True),       # only the wider window reaches it
    (79, {"a": "recompute"}, 80, False),      # infeasible: the lowest reachable peak
    (0, {"a": "recompute"}, 80, False),       # zero budget
])
@pytest.mark.parametrize("solver", [solve_activations, solve_greedy])
def test_table(solver, budget, actions, peak, feasible):
    decision = solver(_problem(budget))
    assert (decision.actions, decision.peak_bytes, decision.feasible) == (actions, peak, feasible)
    assert decision.peak_bytes == peak_bytes(_problem(budget), decision.actions)


def test_details_name_solver_status_and_time():
    decision = solve_activations(_problem(90))
    assert decision.solver == "milp" and decision.details["status"] == "optimal"
    assert decision.details["planning_seconds"] > 0 and decision.details["variables"] == 3
    assert "infeasible budget" in solve_activations(_problem(10)).details["status"]


def test_empty_problem():
    problem = ActivationProblem(live_bytes=(), activations=(), budget_bytes=0)
    for solver in (solve_activations, solve_greedy):
        decision = solver(problem)
        assert decision.actions == {} and decision.feasible and decision.peak_bytes == 0
    assert lowest_peak(problem) == 0


def test_no_choices_over_budget_is_infeasible_not_an_error():
    problem = ActivationProblem(live_bytes=(5, 9, 3), budget_bytes=4,
                                activations=(SavedActivation("a", 4),))
    decision = solve_activations(problem)
    assert decision.actions == {} and decision.peak_bytes == 9 and not decision.feasible


def test_ties_are_broken_deterministically_and_free_choices_are_not_taken():
    # Two identical tensors; freeing either one meets the budget at the same cost.
    acts = tuple(SavedActivation(n, 10, (ActivationChoice("swap", (1, 3), 0.1),))
                 for n in ("x", "y"))
    free = SavedActivation("z", 10, (ActivationChoice("swap", (0, 1), 0.0),))
    problem = ActivationProblem(live_bytes=(20, 30, 30, 10), activations=(*acts, free),
                                budget_bytes=20)
    answers = [solve_activations(problem).actions for _ in range(3)]
    assert answers[0] in ({"x": "swap"}, {"y": "swap"}) and answers.count(answers[0]) == 3
    assert solve_greedy(problem).actions == {"x": "swap"}  # problem order breaks its ties


def test_bad_time_limit_is_refused():
    with pytest.raises(ValueError, match="time_limit"):
        solve_activations(_problem(90), time_limit=0)


def test_too_large_for_the_milp_falls_back_to_greedy():
    decision = solve_activations(_problem(90), max_variables=2)
    assert decision.solver == "greedy" and "max_variables" in decision.details["status"]
    assert decision.feasible and decision.peak_bytes <= 90


def test_without_scipy_the_greedy_answers(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "scipy", None)
    decision = solve_activations(_problem(90))
    assert decision.solver == "greedy" and "scipy" in decision.details["status"]
    assert decision.feasible


def _random_problem(rng: random.Random) -> ActivationProblem:
    steps = rng.randint(3, 12)
    live = [rng.randint(50, 200) for _ in range(steps)]
    acts: list[SavedActivation] = []
    for i in range(rng.randint(1, 6)):
        choices = []
        for action in rng.sample(["recompute", "swap"], rng.randint(0, 2)):
            start = rng.randint(0, steps - 1)
            end = rng.randint(start, steps)
            requires = ((rng.choice(acts).name,) if acts and action == "recompute"
                        and rng.random() < 0.4 else ())
            choices.append(ActivationChoice(action, (start, end),
                                            round(rng.uniform(0, 3), 2), requires))
        acts.append(SavedActivation(f"t{i}", rng.randint(0, 60), tuple(choices)))
    budget = rng.randint(min(live) - 50, max(live))
    return ActivationProblem(tuple(live), tuple(acts), budget)


def _brute_force(problem: ActivationProblem):
    """(feasible, lowest peak reachable, least seconds at max(budget, that peak))."""
    options = [["keep", *(c.action for c in a.choices)] for a in problem.activations]
    plans = []
    for combo in itertools.product(*options):
        actions = dict(zip((a.name for a in problem.activations), combo))
        try:
            d = evaluate(problem, actions, "brute")
        except ValueError:  # breaks a requirement
            continue
        plans.append(d)
    floor = min(d.peak_bytes for d in plans)
    target = max(problem.budget_bytes, floor)
    return (floor <= problem.budget_bytes, floor,
            min(d.added_seconds for d in plans if d.peak_bytes <= target))


@pytest.mark.parametrize("seed", range(60))
def test_milp_matches_brute_force(seed):
    problem = _random_problem(random.Random(seed))
    feasible, floor, seconds = _brute_force(problem)
    decision = solve_activations(problem)
    assert decision.feasible == feasible
    assert decision.peak_bytes <= max(problem.budget_bytes, floor)  # never over the budget
    assert decision.added_seconds == pytest.approx(seconds, rel=1e-4, abs=1e-9)
    assert lowest_peak(problem) == floor
    assert lowest_peak_plan(problem).peak_bytes == floor
    greedy = solve_greedy(problem)  # a heuristic: valid, never better than the optimum
    if greedy.feasible:
        assert greedy.peak_bytes <= problem.budget_bytes
        assert greedy.added_seconds >= seconds - 1e-9


def test_a_time_limited_incumbent_competes_with_the_greedy(monkeypatch):
    from fxopt.planner.solvers import milp

    # HiGHS stopped by its time limit with a poor incumbent: recompute a (0.5 s) where a
    # swap (0.25 s) meets the budget.
    monkeypatch.setattr(milp._Model, "min_time",
                        lambda self, budget, limit: ({"a": "recompute"}, "time limit"))
    decision = solve_activations(_problem(110))
    assert decision.actions == {"a": "swap"} and decision.feasible
    assert decision.details["status"].startswith("time limit; greedy")


def test_no_solution_in_time_falls_back_to_the_greedy(monkeypatch):
    from fxopt.planner.solvers import milp

    monkeypatch.setattr(milp._Model, "min_time", lambda self, budget, limit: (None, "time limit"))
    decision = solve_activations(_problem(90))
    assert decision.solver == "greedy" and decision.feasible and decision.peak_bytes <= 90
    assert "no solution" not in decision.details["status"]
    assert decision.details["status"].startswith("fallback: time limit")
