"""The suite's results as JSON, a markdown report (a table per workload and a summary of
ratios against eager and against the best baseline) and a time-vs-memory chart per
workload (matplotlib, optional: without it the charts are skipped with a note).

A time ratio is marked ``*`` (unreliable) when either of its step times is
(`fxopt.bench.measure`: too few steps or too wide a spread); the tables give each step
time's spread.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fxopt.bench.measure import RELIABLE_SPREAD, RELIABLE_STEPS, Measurement

__all__ = ["compare", "markdown", "plot_workloads", "write_json"]

log = logging.getLogger(__name__)
MiB = 2**20


def write_json(path: Path, results: Sequence[Measurement], meta: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in results]},
                               indent=1))
    return path


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def compare(results: Sequence[Measurement], workload: str) -> list[dict[str, Any]]:
    """Per fxopt configuration of ``workload`` that ran: step time and peak memory as
    ratios to eager and to the best baseline (the fastest one for time, the leanest one
    for memory), with that baseline's name, and whether each time ratio rests on two
    reliable step times. Below 1 is better."""
    ok = [r for r in results if r.workload == workload and r.status == "ok"]
    baselines = [r for r in ok if r.kind == "baseline"]
    eager = next((r for r in ok if r.config == "eager"), None)
    fastest = min(baselines, key=lambda r: r.step_ms, default=None)
    leanest = min(baselines, key=lambda r: r.peak_bytes, default=None)
    rows = []
    for r in ok:
        if r.kind != "fxopt":
            continue
        rows.append({
            "config": r.config,
            "time_vs_eager": _ratio(r.step_ms, eager and eager.step_ms),
            "time_vs_eager_reliable": bool(eager) and r.timing_reliable
            and eager.timing_reliable,
            "memory_vs_eager": _ratio(r.peak_bytes, eager and eager.peak_bytes),
            "time_vs_fastest": _ratio(r.step_ms, fastest and fastest.step_ms),
            "time_vs_fastest_reliable": bool(fastest) and r.timing_reliable
            and fastest.timing_reliable,
            "fastest_baseline": fastest and fastest.config,
            "memory_vs_leanest": _ratio(r.peak_bytes, leanest and leanest.peak_bytes),
            "leanest_baseline": leanest and leanest.config,
        })
    return rows


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else format(value, spec)


def _time(value: float | None, reliable: bool) -> str:
    return _fmt(value, ".2f") + ("" if reliable or value is None else "*")


def markdown(results: Sequence[Measurement], meta: dict[str, Any]) -> str:
    """The report: a summary of ratios, then a table per workload."""
    workloads = list(dict.fromkeys(r.workload for r in results))
    title = "# fxopt benchmark"
    if meta.get("smoke"):
        title += " (smoke run: tiny sizes, not performance figures)"
    lines = [title, "", f"device: {meta['device']}; torch {meta['torch']}; "
             f"transformers {meta.get('transformers') or '—'}; {meta['date']}",
             f"command: `{meta['command']}`", ""]
    lines += ["## Summary: fxopt against eager and the best baseline (ratios; < 1 is better)",
              "", (f"\\* unreliable time ratio: a step time from fewer than {RELIABLE_STEPS} "
                   f"timed steps or spread over more than {RELIABLE_SPREAD:.0%} of its median "
                   "(tiny sizes, shared cores); noise, not a performance figure."), "",
              "| workload | config | time / eager | memory / eager | time / fastest "
              "baseline | memory / leanest baseline |", "| --- | --- | --- | --- | --- | --- |"]
    for workload in workloads:
        for row in compare(results, workload):
            lines.append(
                f"| {workload} | {row['config']} | "
                f"{_time(row['time_vs_eager'], row['time_vs_eager_reliable'])} | "
                f"{_fmt(row['memory_vs_eager'], '.2f')} | "
                f"{_time(row['time_vs_fastest'], row['time_vs_fastest_reliable'])} "
                f"({row['fastest_baseline'] or '—'}) | "
                f"{_fmt(row['memory_vs_leanest'], '.2f')} ({row['leanest_baseline'] or '—'}) |")
    for workload in workloads:
        rows = [r for r in results if r.workload == workload]
        lines += ["", f"## {workload}", "", "| config | status | batch | step ms | spread "
                  "| throughput | peak MiB | activations MiB | max batch | compile s |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            status = "ok" if r.status == "ok" else f"failed: {r.error}"
            throughput = f"{r.throughput:,.0f} {r.unit}" if r.throughput is not None else "—"
            lines.append(
                f"| {r.config} | {status.replace('|', '/')} | {r.batch} | "
                f"{_time_ms(r)} | {_spread(r)} | "
                f"{throughput} | "
                f"{_fmt(r.peak_bytes and r.peak_bytes / MiB, '.1f')} | "
                f"{_fmt(r.activation_bytes and r.activation_bytes / MiB, '.1f')} | "
                f"{r.max_batch if r.max_batch is not None else '—'} | "
                f"{_fmt(r.compile_s, '.1f')} |")
    return "\n".join(lines) + "\n"


def _spread(r: Measurement) -> str:
    return "—" if r.step_spread is None else f"{100 * r.step_spread:.0f}%"


def _time_ms(r: Measurement) -> str:
    return _fmt(r.step_ms, ".1f") + ("" if r.timing_reliable or r.step_ms is None else "*")


def plot_workloads(results: Sequence[Measurement], out: Path) -> list[Path]:
    """A time-vs-peak-memory scatter per workload, each point a configuration. Returns
    the files written; none (with a log message) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("bench: no matplotlib, so no charts (pip install 'fxopt[plot]')")
        return []
    written = []
    for workload in dict.fromkeys(r.workload for r in results):
        ok = [r for r in results if r.workload == workload and r.status == "ok"]
        if not ok:
            continue
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        for r in ok:
            marker = "o" if r.kind == "fxopt" else "s"
            ax.scatter(r.peak_bytes / MiB, r.step_ms, marker=marker,
                       color="tab:blue" if r.kind == "fxopt" else "tab:grey")
            ax.annotate(r.config, (r.peak_bytes / MiB, r.step_ms), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("peak memory (MiB)")
        ax.set_ylabel("median step time (ms)")
        ax.set_title(f"{workload}: time vs memory (squares: baselines, dots: fxopt)")
        fig.tight_layout()
        path = out / f"{workload}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
