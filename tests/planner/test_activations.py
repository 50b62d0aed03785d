"""The saved-activation problem's evaluation: windows, requirements, peaks, errors."""

import pytest

from fxopt.planner import (
    ActivationChoice,
    ActivationProblem,
    SavedActivation,
    added_seconds,
    evaluate,
    peak_bytes,
    timeline_bytes,
)


def _problem(budget=100):
    a = SavedActivation("a", 40, (ActivationChoice("recompute", (1, 4), 0.5),
                                  ActivationChoice("swap", (2, 3), 0.25)))
    b = SavedActivation("b", 30, (ActivationChoice("recompute", (2, 5), 1.0, requires=("a",)),))
    return ActivationProblem(live_bytes=(50, 90, 120, 110, 70, 40), activations=(a, b),
                             budget_bytes=budget)


@pytest.mark.parametrize("actions, timeline", [
    ({}, [50, 90, 120, 110, 70, 40]),
    ({"a": "recompute"}, [50, 50, 80, 70, 70, 40]),
    ({"a": "swap"}, [50, 90, 80, 110, 70, 40]),
    ({"b": "recompute"}, [50, 90, 90, 80, 40, 40]),
    ({"a": "swap", "b": "keep"}, [50, 90, 80, 110, 70, 40]),
])
def test_timeline_removes_bytes_over_the_window(actions, timeline):
    assert timeline_bytes(_problem(), actions) == timeline
    assert peak_bytes(_problem(), actions) == max(timeline)


def test_evaluate_reports_feasibility_and_time():
    decision = evaluate(_problem(budget=90), {"a": "recompute", "b": "keep"}, solver="test")
    assert decision.actions == {"a": "recompute"}
    assert (decision.peak_bytes, decision.added_seconds, decision.feasible) == (80, 0.5, True)
    assert not evaluate(_problem(budget=79), {"a": "recompute"}, solver="test").feasible
    assert decision.to_dict()["solver"] == "test"


def test_a_requirement_must_be_kept():
    with pytest.raises(ValueError, match="must then be kept"):
        timeline_bytes(_problem(), {"a": "swap", "b": "recompute"})


@pytest.mark.parametrize("actions, error", [
    ({"c": "swap"}, KeyError),
    ({"b": "swap"}, ValueError),
])
def test_unknown_names_and_missing_choices_raise(actions, error):
    with pytest.raises(error):
        added_seconds(_problem(), actions)


def test_empty_problem():
    problem = ActivationProblem(live_bytes=(), activations=(), budget_bytes=0)
    assert peak_bytes(problem, {}) == 0 and evaluate(problem, {}, "test").feasible


@pytest.mark.parametrize("choice", [
    ActivationChoice("swap", (3, 9), 0.0),     # past the timeline
    ActivationChoice("swap", (3, 2), 0.0),     # reversed
    ActivationChoice("keep", (0, 1), 0.0),     # keep is not a choice
    ActivationChoice("recompute", (0, 1), 0.0, requires=("zz",)),
])
def test_bad_problems_are_refused(choice):
    with pytest.raises(ValueError):
        ActivationProblem(live_bytes=(1, 2, 3), budget_bytes=5,
                          activations=(SavedActivation("a", 1, (choice,)),))
