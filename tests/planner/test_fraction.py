"""The fraction budget's search on plain data: the floor, one path whose kept bytes never
grow as the target falls, chains that join, RNG states that outweigh a mask."""

import pytest

from fxopt.planner.solvers.fraction import (
    RecomputeOption,
    SavedBytesProblem,
    replay_fraction,
    solve_fraction,
)


def _chain_problem() -> SavedBytesProblem:
    """a -> b -> c, each 100 bytes, each rebuilt by its own node (1, 2, 3 seconds)."""
    sizes = {"a": 100, "b": 100, "c": 100}
    options = tuple(RecomputeOption(n, (n,), (f"op_{n}",)) for n in "abc")
    return SavedBytesProblem(sizes, (), options, {"op_a": 1.0, "op_b": 2.0, "op_c": 3.0})


def test_the_floor_recomputes_everything_and_a_target_above_it_is_met():
    problem = _chain_problem()
    assert problem.plain_bytes == 300
    for target in (300, 250, 200, 150, 100, 50, 0):
        decision = solve_fraction(problem, target)
        assert decision.floor_bytes == 0 and decision.feasible
        assert decision.kept_bytes <= target
    assert solve_fraction(problem, 300).recompute == ()
    # the cheapest seconds per byte go first: a (1 s) before b before c
    assert solve_fraction(problem, 200).recompute == ("a",)
    assert set(solve_fraction(problem, 0).tagged) == {"op_a", "op_b", "op_c"}


def test_kept_bytes_never_grow_and_seconds_never_fall_as_the_target_falls():
    problem = _chain_problem()
    answers = [solve_fraction(problem, t) for t in range(300, -1, -25)]
    kept = [d.kept_bytes for d in answers]
    seconds = [d.added_seconds for d in answers]
    assert kept == sorted(kept, reverse=True) and seconds == sorted(seconds)


def test_a_random_op_whose_rng_state_outweighs_its_mask_keeps_the_mask():
    sizes = {"mask": 32, "rng:drop": 5056, "h": 1000}
    options = (RecomputeOption("mask", ("mask",), ("drop",), ("rng:drop",)),
               RecomputeOption("h", ("h",), ("mm",)))
    decision = solve_fraction(SavedBytesProblem(sizes, (), options, {"mm": 1.0}), 0)
    assert decision.recompute == ("h",) and decision.floor_bytes == 32
    assert not decision.feasible and decision.floor_fraction == pytest.approx(32 / 1032)


def test_a_stop_is_kept_while_a_chain_needs_it():
    """``h`` can only be rebuilt from ``x`` (not recomputable, not otherwise saved)."""
    sizes = {"h": 400, "x": 100}
    options = (RecomputeOption("h", ("h",), ("mm",), ("x",)),)
    problem = SavedBytesProblem(sizes, (), options, {"mm": 1.0})
    assert problem.plain_bytes == 400
    decision = solve_fraction(problem, 100)
    assert decision.recompute == ("h",) and decision.kept_bytes == 100


def test_a_replayed_plan_is_the_decision_and_a_foreign_one_is_refused():
    problem = _chain_problem()
    decided = solve_fraction(problem, 150)
    replayed = replay_fraction(problem, 150, dict.fromkeys(decided.recompute, "recompute"))
    assert replayed.recompute == decided.recompute and replayed.solver == "plan"
    assert replayed.kept_bytes == decided.kept_bytes
    with pytest.raises(KeyError):
        replay_fraction(problem, 150, {"zzz": "recompute"})
