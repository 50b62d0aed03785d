"""One budget type with one meaning per kind (issue 31): a MemoryBudget is bytes or a
fraction, exactly one, and each conversion to bytes is a named method the planner calls."""

import pytest

from fxopt.config import MemoryBudget, parse_memory_budget


@pytest.mark.parametrize("fields", [{}, {"bytes": 10, "fraction": 0.5}])
def test_a_budget_is_bytes_or_a_fraction_exactly_one(fields):
    with pytest.raises(ValueError, match="exactly one"):
        MemoryBudget(**fields)


def test_the_conversions_say_what_each_kind_bounds():
    half = parse_memory_budget(0.5)
    assert half.saved_bytes_bound(1001) == 500  # of plain autograd's saved bytes
    # a fraction where only swaps are offered bounds the peak: half the activations resident
    assert half.peak_bytes_bound(keep_all_peak=1000, activation_bytes=600) == 700
    six = parse_memory_budget("6KiB")
    assert six.peak_bytes_bound(keep_all_peak=1, activation_bytes=1) == 6 * 1024
    with pytest.raises(ValueError, match="bounds the peak"):
        six.saved_bytes_bound(1000)
