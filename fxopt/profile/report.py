"""What `fxopt.profile_memory` returns: a :class:`MemoryProfile` with a text table, JSON
and a stacked-area chart (matplotlib, an optional dependency: ``pip install fxopt[plot]``).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fxopt.profile.attribute import CATEGORIES, Timeline
from fxopt.units import format_bytes

__all__ = ["MemoryProfile", "format_bytes"]


@dataclass
class MemoryProfile:
    """Memory of ``steps`` profiled training steps on ``device``.

    ``peak_categories`` add up to ``peak_bytes``; ``peak_sites`` lists, per category, the
    ops (or compiled graphs) that allocated what was alive at the peak, largest first;
    ``measured_peak_bytes`` is ``torch.cuda.max_memory_allocated`` on CUDA (None on the CPU).
    ``timeline`` holds bytes per category after every allocator event. ``host_bytes`` is
    memory the step holds on the host that is not the profiled device's (an offloaded
    optimizer's host state when the device is a GPU), per category, outside the totals."""

    device: str
    steps: int
    peak_bytes: int
    peak_categories: dict[str, int]
    peak_phase: str
    peak_sites: dict[str, list[tuple[str, int]]]
    measured_peak_bytes: int | None
    timeline: Timeline = field(repr=False)
    mark_prefix: str = field(default="", repr=False)
    host_bytes: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_timeline(cls, timeline: Timeline, *, device: str, steps: int,
                      measured_peak_bytes: int | None, mark_prefix: str,
                      host_bytes: dict[str, int] | None = None) -> MemoryProfile:
        peak = timeline.peak_index()
        t = timeline.times_ns[peak]
        sites: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for iv in timeline.intervals:
            if iv.alive_at(t):
                sites[iv.category][iv.site] += iv.size
        top = {c: sorted(s.items(), key=lambda kv: -kv[1])[:5] for c, s in sites.items()}
        return cls(device, steps, timeline.totals()[peak],
                   {c: timeline.bytes[c][peak] for c in CATEGORIES},
                   timeline.phases[peak].removeprefix(mark_prefix), top,
                   measured_peak_bytes, timeline, mark_prefix, dict(host_bytes or {}))

    def device_peak_bytes(self, phase: str | None = None) -> int:
        """The peak of what lives on the profiled device, in the steps' ``phase``
        ("forward", "backward" or "optimizer"; None: anywhere). On the CPU an offloaded
        optimizer's host part (``optimizer_state_host``) is in the recorded memory but would
        be host memory beside an accelerator, so it is left out of every point of the
        timeline; on CUDA it is not in the totals."""
        host = self.timeline.bytes["optimizer_state_host"]
        phases = self.timeline.phases
        return max((total - host[i] for i, total in enumerate(self.timeline.totals())
                    if phase is None or phases[i].endswith(":" + phase)), default=0)

    def table(self) -> str:
        """The categories at the peak, with shares and the largest allocation sites."""
        lines = [f"memory at the peak of {self.steps} training step(s) on {self.device}: "
                 f"{format_bytes(self.peak_bytes)} (during {self.peak_phase or 'start'})"]
        if self.measured_peak_bytes is not None:
            lines.append(f"torch.cuda.max_memory_allocated: "
                         f"{format_bytes(self.measured_peak_bytes)}")
        lines.append(f"{'category':<21}{'bytes':>14}{'share':>8}  largest sites")
        for category in CATEGORIES:
            size = self.peak_categories[category]
            if size == 0 and category in ("other", "optimizer_state_host"):
                continue
            share = size / self.peak_bytes if self.peak_bytes else 0.0
            where = ", ".join(f"{_short(site)} {format_bytes(n)}"
                              for site, n in self.peak_sites.get(category, [])[:3])
            lines.append(f"{category:<21}{format_bytes(size):>14}{share:>8.1%}  {where}")
        lines += [f"{category:<21}{format_bytes(size):>14}  on the host, not in the "
                  f"{self.device} total" for category, size in self.host_bytes.items()]
        return "\n".join(lines)

    def to_dict(self, max_points: int = 2000) -> dict[str, Any]:
        """JSON-ready: the peak, its categories and sites, and the timeline downsampled to
        at most ``max_points`` points (each the largest-total event of its stretch)."""
        index = _downsample(self.timeline.totals(), max_points)
        t0 = self.timeline.times_ns[0] if self.timeline.times_ns else 0
        return {
            "device": self.device, "steps": self.steps, "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase, "peak_categories": self.peak_categories,
            "peak_sites": {c: [list(s) for s in sites] for c, sites in self.peak_sites.items()},
            "measured_peak_bytes": self.measured_peak_bytes, "host_bytes": self.host_bytes,
            "timeline": {
                "time_us": [(self.timeline.times_ns[i] - t0) / 1e3 for i in index],
                "phase": [self.timeline.phases[i].removeprefix(self.mark_prefix)
                          for i in index],
                "bytes": {c: [self.timeline.bytes[c][i] for i in index] for c in CATEGORIES},
            },
        }

    def save_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    def plot(self, path: str | Path, title: str | None = None) -> Path:
        """A stacked area chart of the categories over the profiled steps (PNG)."""
        try:
            import matplotlib

            matplotlib.use("Agg", force=False)
            import matplotlib.pyplot as plt
        except ImportError as exc:
            raise RuntimeError("fxopt: the memory chart needs matplotlib: "
                               "pip install 'fxopt[plot]' (or pip install matplotlib)") from exc
        data = self.to_dict()["timeline"]
        categories = [c for c in CATEGORIES if any(data["bytes"][c])]
        x = [t / 1e3 for t in data["time_us"]]
        fig, ax = plt.subplots(figsize=(9, 4.5))
        ax.stackplot(x, [[b / 2**20 for b in data["bytes"][c]] for c in categories],
                     labels=categories, step="post")
        for i in range(1, len(x)):
            if data["phase"][i] != data["phase"][i - 1]:
                ax.axvline(x[i], color="grey", lw=0.5, ls=":")
        ax.set_xlabel("time (ms; dotted lines: forward / backward / optimizer)")
        ax.set_ylabel("MiB")
        ax.set_title(title or f"memory by category, {self.steps} step(s) on {self.device}, "
                              f"peak {format_bytes(self.peak_bytes)}")
        ax.legend(loc="upper left", fontsize="small")
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def _short(site: str, width: int = 40) -> str:
    site = site.replace("## Call CompiledFxGraph ", "compiled ").strip("# ")
    return site if len(site) <= width else site[:width - 1] + "…"


def _downsample(totals: list[int], max_points: int) -> list[int]:
    """Indices to keep: all when few; else the first, the last, and the largest-total
    index of each of ``max_points`` equal stretches (so the peak is always kept)."""
    n = len(totals)
    if n <= max_points:
        return list(range(n))
    edges = [round(i * n / max_points) for i in range(max_points + 1)]
    keep = {0, n - 1}
    for lo, hi in zip(edges, edges[1:]):
        if hi > lo:
            keep.add(max(range(lo, hi), key=totals.__getitem__))
    return sorted(keep)
