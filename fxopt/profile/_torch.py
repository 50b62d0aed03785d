"""The profiler's one adapter to torch's private APIs: allocation records and phase marks.

``torch.profiler.profile(profile_memory=True)`` records every allocation and free made
through the CPU allocator and the CUDA caching allocator, with its address and size — for
eager code and for compiled code alike (Inductor's and fxopt's generated code allocate
through the same allocators). The public API only aggregates these per op; the raw records
are in the event tree of ``prof.profiler.kineto_results`` (``_EventType.Allocation`` events
whose ``extra_fields`` carry ``ptr``, ``alloc_size`` and ``device``). Reading them is the
only private use, and it lives here so a torch upgrade breaks one file (checked on 2.13).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["AllocationEvent", "Mark", "read_events"]


@dataclass(frozen=True)
class AllocationEvent:
    """One allocator call: ``size`` > 0 allocates ``size`` bytes at ``ptr``, < 0 frees."""

    time_ns: int
    ptr: int
    size: int
    device: str   # "cpu", "cuda:0", ...
    site: str     # the op (or compiled graph) that made the call


@dataclass(frozen=True)
class Mark:
    """A ``record_function`` range (the profiler's phase markers)."""

    name: str
    start_ns: int
    end_ns: int


def read_events(prof: Any, mark_prefix: str) -> tuple[list[AllocationEvent], list[Mark]]:
    """The allocation events (time order) and the ``record_function`` ranges whose names
    start with ``mark_prefix`` of a finished ``torch.profiler.profile``."""
    from torch._C._profiler import _EventType

    events: list[AllocationEvent] = []
    marks: list[Mark] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.tag == _EventType.Allocation:
            fields = event.extra_fields
            parent = event.parent
            events.append(AllocationEvent(int(event.start_time_ns), int(fields.ptr),
                                          int(fields.alloc_size), str(fields.device),
                                          parent.name if parent is not None else "?"))
        elif event.name.startswith(mark_prefix):
            marks.append(Mark(event.name, int(event.start_time_ns), int(event.end_time_ns)))
        stack.extend(reversed(event.children))  # pre-order: ties keep call order
    events.sort(key=lambda e: e.time_ns)
    marks.sort(key=lambda m: m.start_ns)
    return events, marks
