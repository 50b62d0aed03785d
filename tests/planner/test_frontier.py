"""The Pareto frontier: non-dominated points from the lowest peak to the keep-all peak."""

import pytest

from fxopt.planner import ActivationChoice, ActivationProblem, Decision, SavedActivation
from fxopt.planner.frontier import non_dominated, pareto_frontier


def _problem():
    acts = tuple(SavedActivation(f"t{i}", 10 * (i + 1), (
        ActivationChoice("recompute", (1, 6), 0.1 * (i + 1) ** 2),
        ActivationChoice("swap", (2, 5), 0.05 * (i + 1)))) for i in range(4))
    return ActivationProblem(live_bytes=(100, 180, 200, 190, 160, 150, 120),
                             activations=acts, budget_bytes=0)


def _d(peak, seconds):
    return Decision({}, peak, seconds, True, "t")


def test_non_dominated_keeps_the_staircase():
    points = [_d(10, 5.0), _d(20, 5.0), _d(20, 3.0), _d(15, 4.0), _d(30, 0.0), _d(25, 4.5)]
    assert [(d.peak_bytes, d.added_seconds) for d in non_dominated(points)] == [
        (10, 5.0), (15, 4.0), (20, 3.0), (30, 0.0)]


def test_frontier_spans_floor_to_keep_all_and_is_monotone(tmp_path):
    frontier = pareto_frontier(_problem(), points=8, step_seconds=1.0)
    peaks = [p.peak_bytes for p in frontier.points]
    times = [p.added_seconds for p in frontier.points]
    assert peaks == sorted(peaks) and times == sorted(times, reverse=True)
    assert peaks[0] == 120 and times[-1] == 0.0 and len(peaks) >= 3
    assert all(p.peak_bytes <= p.budget_bytes for p in frontier.points)
    table = frontier.table()
    assert "peak" in table and "120 B" in table and len(table.splitlines()) == len(peaks) + 1
    assert frontier.to_dict()["points"][0]["peak_bytes"] == 120
    pytest.importorskip("matplotlib")
    png = frontier.plot(tmp_path / "frontier.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_frontier_needs_two_points():
    with pytest.raises(ValueError, match="at least 2"):
        pareto_frontier(_problem(), points=1)
