"""Run (workload, configuration) pairs with progress, and write the results (JSON,
markdown, charts). Each pair is measured in isolation (a fresh model, Dynamo reset between
pairs); a pair that fails is recorded as failed with its error and the run goes on.

:func:`all_pairs` is every workload under every configuration. :func:`smoke_pairs`, what
``fxopt bench --smoke`` runs unless workloads or configurations are named, covers both
with fewer compilations: every configuration on the first workload, every other workload
under the first baseline and the first fxopt configuration (eager and fxopt). Compilation
dominates a smoke run (Inductor's C++ build takes a minute per model on two shared cores),
so the full cross product took 447 s and more.
"""

from __future__ import annotations

import datetime
import logging
import platform
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from fxopt.bench.configs import Config
from fxopt.bench.measure import Measurement, Settings, measure
from fxopt.bench.report import markdown, plot_workloads, write_json
from fxopt.bench.workloads import Workload
from fxopt.devices import indexed

__all__ = ["Suite", "all_pairs", "run_suite", "smoke_pairs"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class Suite:
    """What a run wrote: its results and the paths of its JSON, markdown and charts."""

    def __init__(self, results: list[Measurement], json_path: Path, markdown_path: Path,
                 charts: list[Path], report: str) -> None:
        self.results, self.json_path, self.markdown_path = results, json_path, markdown_path
        self.charts, self.report = charts, report


def _progress(items: Sequence[T], enabled: bool) -> Iterator[T]:
    """tqdm's bar when it is installed and wanted, else a log line per item."""
    if enabled:
        try:
            from tqdm import tqdm
        except ImportError:
            pass
        else:
            bar = tqdm(items, desc="fxopt bench", unit="run", file=sys.stderr)
            for item in bar:
                bar.set_postfix_str(f"{item[0].name} / {item[1].name}")  # type: ignore[index]
                yield item
            return
    for i, item in enumerate(items, 1):
        log.info("bench %d/%d: %s / %s", i, len(items), item[0].name, item[1].name)  # type: ignore[index]
        yield item


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(indexed(device))
    return f"CPU ({platform.processor() or platform.machine()})"


Pair = tuple[Workload, Config]


def all_pairs(workloads: Iterable[Workload], configs: Iterable[Config]) -> list[Pair]:
    """Every workload under every configuration."""
    configs = list(configs)
    return [(w, c) for w in workloads for c in configs]


def smoke_pairs(workloads: Sequence[Workload], configs: Sequence[Config]) -> list[Pair]:
    """Every configuration on the first workload; the other workloads under the first
    baseline and the first fxopt configuration (see the module docstring)."""
    if not workloads:
        return []
    firsts = [c for kind in ("baseline", "fxopt")
              for c in [next((c for c in configs if c.kind == kind), None)] if c is not None]
    return ([(workloads[0], c) for c in configs]
            + [(w, c) for w in workloads[1:] for c in firsts])


def run_suite(pairs: Sequence[Pair], settings: Settings, out: Path, *, command: str,
              progress: bool = True) -> Suite:
    """Measure each (workload, configuration) pair and write ``results.json``,
    ``results.md`` and one ``<workload>.png`` per workload to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for workload, config in _progress(pairs, progress):
        torch.compiler.reset()  # each configuration compiles from scratch
        results.append(measure(workload, config, settings))
    torch.compiler.reset()
    meta = _meta(settings, command)
    report = markdown(results, meta)
    json_path = write_json(out / "results.json", results, meta)
    markdown_path = out / "results.md"
    markdown_path.write_text(report)
    charts = plot_workloads(results, out)
    return Suite(results, json_path, markdown_path, charts, report)


def _meta(settings: Settings, command: str) -> dict[str, Any]:
    try:
        import transformers

        transformers_version = transformers.__version__
    except ImportError:
        transformers_version = None
    return {
        "device": device_name(settings.device), "torch": torch.__version__,
        "transformers": transformers_version, "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command, "smoke": settings.smoke, "warmup": settings.warmup,
        "steps": settings.steps, "memory_cap": settings.memory_cap,
    }
