"""The overlap-aware step time of :func:`fxopt.planner.activations.added_seconds`: swaps on
one host link are priced together, a recompute that runs while a prefetch copies is priced
as overlapped, and the solvers choose by that price (checked against brute force).

Every problem has 6 steps of 1 s of compute each (forward 0-2, backward 3-5); the answers
below are derived by hand in each test's comments (the link copies in issue order, one
copy at a time; compute waits for an offload where its window frees the bytes, and for a
prefetch at its use step)."""

import itertools

import pytest

from fxopt.planner.activations import (
    ActivationChoice,
    ActivationProblem,
    SavedActivation,
    added_seconds,
    evaluate,
)
from fxopt.planner.solvers.greedy import solve_greedy
from fxopt.planner.solvers.milp import solve_activations

STEPS = (1.0,) * 6


def swap(copy: float, window: tuple[int, int], seconds: float = 0.0,
         offload_step: int = 1) -> ActivationChoice:
    """Offloaded before ``offload_step`` (finished before window[0]: compute waits there
    for the copy), prefetched before window[1], waited for before step 5."""
    return ActivationChoice("swap", window, seconds, copy_seconds=copy,
                            offload_step=offload_step, use_step=5)


def recompute(seconds: float) -> ActivationChoice:
    """Freed after step 0, rebuilt just before step 5."""
    return ActivationChoice("recompute", (1, 5), seconds)


def problem(*activations: SavedActivation, budget: int = 100) -> ActivationProblem:
    return ActivationProblem(live_bytes=(10, 10, 20, 10, 10, 10), activations=activations,
                             budget_bytes=budget, step_seconds=STEPS)


def test_swaps_sharing_the_link_queue_behind_each_other():
    # Alone, a 1 s copy is hidden: offload 1->2 under step 1 (its finish before step 2
    # waits for nothing), prefetch 4->5 under step 4, ready when step 5 needs it: 0 s.
    a = SavedActivation("a", 4, (swap(1.0, (2, 4)),))
    b = SavedActivation("b", 4, (swap(1.0, (2, 4)),))
    assert added_seconds(problem(a), {"a": "swap"}) == 0.0
    # Together: offloads 1->2 and 2->3, so b's finish before step 2 waits until 3;
    # prefetches issued before step 4 (at 5) copy 5->6 and 6->7; step 5 waits until 7 and
    # ends at 8, against 6: 2 s added (each priced alone would say 0).
    assert added_seconds(problem(a, b), {"a": "swap", "b": "swap"}) == pytest.approx(2.0)


def test_an_offload_not_hidden_by_its_window_waits_at_the_finish():
    # A 2 s offload 1->3 whose bytes the window frees from step 2: compute waits 1 s
    # there (until 3); the prefetch issued before step 3 (at 4) copies 4->6, ready for
    # step 5 (at 6): 1 s added.
    a = SavedActivation("a", 4, (swap(2.0, (2, 3)),))
    assert added_seconds(problem(a), {"a": "swap"}) == pytest.approx(1.0)


def test_recompute_during_a_prefetch_is_priced_as_overlapped():
    # A 3 s copy: offload 0->3 under steps 0-2, prefetch issued at 4 copies 4->7, step 5
    # (at 5) waits 2 s.
    a = SavedActivation("a", 4, (swap(3.0, (3, 4), seconds=2.0, offload_step=0),))
    assert added_seconds(problem(a), {"a": "swap"}) == pytest.approx(2.0)
    # A 1.5 s recompute before step 5 runs 5->6.5 while the copy ends at 7: the step
    # still ends at 8, 2 s added, not 2 + 1.5.
    b = SavedActivation("b", 4, (recompute(1.5),))
    both = {"a": "swap", "b": "recompute"}
    assert added_seconds(problem(a, b), both) == pytest.approx(2.0)
    # A 3 s recompute outlasts the wait: 5->8, then step 5: 3 s added, max(2, 3).
    c = SavedActivation("b", 4, (recompute(3.0),))
    assert added_seconds(problem(a, c), both) == pytest.approx(3.0)


@pytest.mark.parametrize("solve", [solve_activations, solve_greedy])
def test_solvers_choose_by_the_joint_price(solve):
    # The peak (20 at step 2) must fall to 12: both tensors leave. Two swaps (free alone)
    # cost 2 s together (first test); two recomputes 3 s (5->8, then step 5); one of each
    # 1.5 s (the recompute runs before the prefetch's wait at 5, which is ready at 5).
    tensors = [SavedActivation(n, 4, (swap(1.0, (2, 4)), recompute(1.5))) for n in "ab"]
    p = problem(*tensors, budget=12)
    best = min((d for d in (evaluate(p, dict(zip("ab", acts)), "brute force")
                            for acts in itertools.product(("keep", "swap", "recompute"),
                                                          repeat=2)) if d.feasible),
               key=lambda d: d.added_seconds)
    assert best.added_seconds == pytest.approx(1.5)
    decision = solve(p)
    assert decision.feasible
    assert decision.added_seconds == pytest.approx(best.added_seconds)
    assert sorted(decision.actions.values()) == ["recompute", "swap"]


def test_a_swap_without_link_data_keeps_its_own_seconds():
    a = SavedActivation("a", 4, (ActivationChoice("swap", (2, 3), 0.25),))
    b = SavedActivation("b", 4, (recompute(1.5),))
    assert added_seconds(problem(a, b), {"a": "swap", "b": "recompute"}) == 1.75


def test_link_data_outside_the_window_is_refused():
    bad = ActivationChoice("swap", (2, 3), 0.0, copy_seconds=1.0, offload_step=4, use_step=5)
    with pytest.raises(ValueError, match="outside its window"):
        problem(SavedActivation("a", 4, (bad,)))
