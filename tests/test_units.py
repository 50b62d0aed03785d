"""fxopt.units: the one parser and formatter of byte quantities."""

import pytest

from fxopt.units import format_bytes, format_mib, parse_bytes


@pytest.mark.parametrize("text, count", [
    ("4096", 4096), ("6GiB", 6 * 2**30), ("512 MB", 512 * 10**6), ("1.5KiB", 1536),
    (" 2 tib ", 2 * 2**40), ("7b", 7),
])
def test_parse_reads_decimal_and_binary_units(text, count):
    assert parse_bytes(text) == count


@pytest.mark.parametrize("text", ["6 gigs", "", "GiB", "-1MiB", "1e3"])
def test_parse_refuses_what_it_cannot_read_and_lists_the_units(text):
    with pytest.raises(ValueError, match=r"cannot read .* as bytes .*kib, mib, gib"):
        parse_bytes(text)


@pytest.mark.parametrize("count, text", [
    (None, "-"), (0, "0 B"), (1023, "1023 B"), (1536, "1.50 KiB"), (3.2 * 2**20, "3.20 MiB"),
    (6 * 2**30, "6.00 GiB"), (-2048, "-2.00 KiB"), (3 * 2**40, "3.00 TiB"), (511.6, "512 B"),
])
def test_format_picks_the_largest_binary_unit_at_least_one(count, text):
    assert format_bytes(count) == text


def test_format_mib_is_a_number_for_a_column_headed_mib():
    assert format_mib(3 * 2**19) == "1.50" and format_mib(None) == "-"
