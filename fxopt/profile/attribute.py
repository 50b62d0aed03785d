"""Attribute every byte of a training step to a category, from allocation records.

Plain data in, plain data out (no torch): the profiler (`fxopt.profile.profiler`) supplies
the allocator's records (:class:`~fxopt.profile._torch.AllocationEvent`), the storages that
existed before recording (``baseline``: parameters, buffers, inputs, gradients and optimizer
state, each with its category) and *tags*: "the allocation at address ``ptr`` that is alive
at time ``t`` is a ``category``" — for example each tensor autograd saved during a forward,
tagged at the end of that forward, is an activation; each ``.grad`` at the end of the
backward is a gradient. An allocation gets the category of its tags (the most specific one
when several apply, :data:`CATEGORIES` order) and ``temporaries`` when untagged, so the
categories add up to the total by construction; what checks the total is an independent
measurement (the tests compare it with `fxopt.analysis.measure_peak_memory` and, on CUDA,
``torch.cuda.max_memory_allocated``).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fxopt.profile._torch import AllocationEvent, Mark

__all__ = ["CATEGORIES", "Interval", "Tag", "Timeline", "build_timeline", "intervals_of"]

# Most specific first: an allocation tagged both "gradients" and "activations" (a gradient
# some op saved) is a gradient. "optimizer_state_host" is the state of an offloaded
# optimizer's subgroups updated on the host (`fxopt.optim.offload`). "other" is memory that
# was allocated before recording and belongs to none of the known tensors (CUDA: the
# allocator's count at the start).
CATEGORIES = ("parameters", "buffers", "optimizer_state", "optimizer_state_host",
              "gradients", "inputs", "activations", "temporaries", "other")
BEFORE = "(before profiling)"


@dataclass(frozen=True)
class Tag:
    ptr: int
    time_ns: int
    category: str


@dataclass
class Interval:
    """One allocation's life: [start_ns, end_ns), end None while still alive."""

    ptr: int
    size: int
    start_ns: int
    end_ns: int | None
    site: str
    category: str = "temporaries"

    def alive_at(self, t: int) -> bool:
        return self.start_ns <= t and (self.end_ns is None or t < self.end_ns)


@dataclass(frozen=True)
class Timeline:
    """Bytes per category after each allocator event, with the phase each event fell in."""

    times_ns: list[int]
    bytes: dict[str, list[int]]    # category -> one value per time
    phases: list[str]
    intervals: list[Interval]      # every allocation seen, baseline included

    def totals(self) -> list[int]:
        return [sum(col) for col in zip(*self.bytes.values())] if self.times_ns else []

    def peak_index(self) -> int:
        totals = self.totals()
        return max(range(len(totals)), key=totals.__getitem__)


def intervals_of(events: Iterable[AllocationEvent],
                 baseline: dict[int, tuple[int, str]], start_ns: int) -> list[Interval]:
    """Pair allocations with frees. Baseline storages (ptr -> (bytes, category)) start
    alive at ``start_ns``; a free of an address neither allocated in the recording nor in
    the baseline (memory the step does not own) is ignored."""
    live: dict[int, Interval] = {ptr: Interval(ptr, size, start_ns, None, BEFORE, category)
                                 for ptr, (size, category) in baseline.items()}
    done: list[Interval] = []
    for event in events:
        if event.size > 0:
            if event.ptr in live:  # an address reused after a free we did not see
                done.append(_ended(live.pop(event.ptr), event.time_ns))
            live[event.ptr] = Interval(event.ptr, event.size, event.time_ns, None, event.site)
        elif event.ptr in live:
            done.append(_ended(live.pop(event.ptr), event.time_ns))
    return done + list(live.values())


def _ended(interval: Interval, t: int) -> Interval:
    interval.end_ns = t
    return interval


def apply_tags(intervals: Sequence[Interval], tags: Iterable[Tag]) -> None:
    """Set each interval's category from the tags that fall in its life (baseline
    intervals keep theirs unless a more specific tag applies)."""
    by_ptr: dict[int, list[Interval]] = defaultdict(list)
    for interval in intervals:
        by_ptr[interval.ptr].append(interval)
    rank = {c: i for i, c in enumerate(CATEGORIES)}
    for tag in tags:
        for interval in by_ptr.get(tag.ptr, ()):
            if interval.alive_at(tag.time_ns) and rank[tag.category] < rank[interval.category]:
                interval.category = tag.category


def build_timeline(intervals: Sequence[Interval], marks: Sequence[Mark], start_ns: int,
                   other_bytes: int = 0) -> Timeline:
    """Replay the intervals in time order into bytes per category; ``other_bytes`` is a
    constant of unattributed memory that existed before recording."""
    changes: list[tuple[int, int, int, str]] = []  # (time, order, delta, category)
    current = dict.fromkeys(CATEGORIES, 0)
    current["other"] = other_bytes
    for i, iv in enumerate(intervals):
        if iv.start_ns <= start_ns and iv.site == BEFORE:
            current[iv.category] += iv.size
        else:
            changes.append((iv.start_ns, 2 * i, iv.size, iv.category))
        if iv.end_ns is not None:
            changes.append((iv.end_ns, 2 * i + 1, -iv.size, iv.category))
    changes.sort()
    starts = [m.start_ns for m in marks]

    def phase(t: int) -> str:  # the last mark started at or before t ('' before the first)
        i = bisect.bisect_right(starts, t) - 1
        return marks[i].name if i >= 0 else ""

    times, phases = [start_ns], [phase(start_ns)]
    columns = {c: [v] for c, v in current.items()}
    for t, _, delta, category in changes:
        current[category] += delta
        times.append(t)
        phases.append(phase(t))
        for c in CATEGORIES:
            columns[c].append(current[c])
    return Timeline(times, columns, phases, list(intervals))

