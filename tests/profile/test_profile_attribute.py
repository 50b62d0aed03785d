"""fxopt.profile.attribute on plain data: pairing allocations, tags, the timeline."""

from fxopt.profile._torch import AllocationEvent, Mark
from fxopt.profile.attribute import CATEGORIES, Tag, apply_tags, build_timeline, intervals_of


def ev(t, ptr, size, site="op"):
    return AllocationEvent(t, ptr, size, "cpu", site)


def test_pairs_allocations_and_frees_and_keeps_baseline_alive():
    events = [ev(1, 0xA, 100), ev(2, 0xB, 50), ev(3, 0xA, -100), ev(4, 0xF, -7),
              ev(5, 0xA, 30)]
    intervals = intervals_of(events, {0xC: (10, "parameters")}, start_ns=0)
    spans = sorted((iv.ptr, iv.size, iv.start_ns, iv.end_ns, iv.category) for iv in intervals)
    # The free of 0xF (owned by nobody we know) is ignored; 0xA is reused after its free.
    assert spans == [(0xA, 30, 5, None, "temporaries"), (0xA, 100, 1, 3, "temporaries"),
                     (0xB, 50, 2, None, "temporaries"), (0xC, 10, 0, None, "parameters")]


def test_tags_pick_the_allocation_alive_at_their_time_most_specific_first():
    events = [ev(1, 0xA, 100), ev(3, 0xA, -100), ev(4, 0xA, 64), ev(5, 0xB, 8)]
    intervals = intervals_of(events, {}, start_ns=0)
    apply_tags(intervals, [Tag(0xA, 4, "activations"), Tag(0xA, 4, "gradients"),
                           Tag(0xB, 6, "activations"), Tag(0xB, 6, "activations")])
    categories = sorted((iv.start_ns, iv.category) for iv in intervals)
    assert categories == [(1, "temporaries"), (4, "gradients"), (5, "activations")]


def test_timeline_adds_up_and_names_phases():
    events = [ev(10, 0xA, 100), ev(20, 0xB, 40), ev(30, 0xA, -100), ev(40, 0xB, -40)]
    intervals = intervals_of(events, {0xC: (5, "parameters")}, start_ns=0)
    apply_tags(intervals, [Tag(0xA, 25, "activations")])
    marks = [Mark("fw", 5, 25), Mark("bw", 26, 45)]
    timeline = build_timeline(intervals, marks, start_ns=0, other_bytes=3)
    assert timeline.totals() == [8, 108, 148, 48, 8]
    assert timeline.phases == ["", "fw", "fw", "bw", "bw"]
    peak = timeline.peak_index()
    assert {c: timeline.bytes[c][peak] for c in CATEGORIES if timeline.bytes[c][peak]} == {
        "parameters": 5, "activations": 100, "temporaries": 40, "other": 3}


def test_empty_recording_is_the_baseline():
    timeline = build_timeline(intervals_of([], {1: (16, "inputs")}, 0), [], 0)
    assert timeline.totals() == [16] and timeline.peak_index() == 0
