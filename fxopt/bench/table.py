"""A benchmark as a list of configurations and a table: :class:`Case` (one configuration of
one section), run in priority order under a deadline by :func:`run_cases`, each answer a
:class:`Row` of the markdown file that is rewritten after every row (so a run cut off at
its limit still leaves every row it finished), in the shape of the GPU tables under
``../shared/gpu`` and ``benchmarks/results/gpu_check_*.md``.

A case's failure (an exception, or running past its own time limit, which a ``SIGALRM``
timer turns into :class:`CaseTimeout` on the main thread) is recorded as its row's error
line and the next case runs; a case whose turn comes with less than ``min_start_s`` left
before the deadline is recorded as not run. Between cases Dynamo is reset and the
allocator's cache emptied (:func:`fxopt.bench.timing.release`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fxopt.bench.timing import release

__all__ = ["Case", "CaseTimeout", "Row", "markdown_tables", "read_rows", "run_cases",
           "write_atomically"]

log = logging.getLogger(__name__)

COLUMNS = ("configuration", "step ms", "peak MiB", "compile s", "loss (vs eager)", "notes")


class CaseTimeout(Exception):
    """A case ran past its own time limit."""


@dataclass
class Row:
    """One configuration's answer; ``status`` is "ok", "failed" or "not run"."""

    section: str
    name: str
    status: str = "not run"
    step: str = ""
    peak: str = ""
    compile: str = ""
    loss: float | None = None
    loss_text: str = ""
    notes: list[str] = field(default_factory=list)

    def cells(self) -> tuple[str, ...]:
        if self.status != "ok":
            reason = "; ".join(self.notes)
            return (self.name, f"{self.status}: {reason}" if reason else self.status,
                    "", "", "", "")
        return (self.name, self.step, self.peak, self.compile, self.loss_text,
                "; ".join(self.notes))


@dataclass(frozen=True)
class Case:
    """``run(row)`` measures one configuration into ``row`` (step, peak, compile, loss,
    notes); ``limit_s`` bounds it, compile included."""

    section: str
    name: str
    run: Callable[[Row], None]
    limit_s: float = 120.0


@contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Raise :class:`CaseTimeout` after ``seconds`` (main thread only; elsewhere no limit)."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise CaseTimeout(f"ran past its limit of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _error_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def run_cases(cases: Sequence[Case], *, deadline_s: float, write: Callable[[list[Row]], None],
              device: str = "cpu", min_start_s: float = 10.0,
              order: Sequence[str] | None = None,
              between: Callable[[], None] | None = None,
              kept: Mapping[tuple[str, str], Row] | None = None) -> list[Row]:
    """Run ``cases`` in their order (the priority) until ``deadline_s`` seconds have
    passed; ``write(rows)`` after each, the rows in ``order`` (section names; default the
    cases' order); ``between()`` after each case (default: release Dynamo's and the
    allocator's caches on ``device``). ``kept``: rows of an earlier run by (section, name),
    which stand for their cases (not run again). Returns the rows."""
    between = between or (lambda: release(device))
    start = time.monotonic()
    kept = kept or {}
    rows = [kept.get((c.section, c.name)) or Row(c.section, c.name) for c in cases]
    sections = list(order) if order is not None else list(dict.fromkeys(c.section
                                                                         for c in cases))
    ordered = sorted(rows, key=lambda r: sections.index(r.section))
    write(ordered)
    for case, row in zip(cases, rows):
        if row.status != "not run":  # kept from an earlier run
            continue
        left = deadline_s - (time.monotonic() - start)
        if left < min_start_s:
            row.notes = [f"deadline ({deadline_s:.0f} s) reached"]
            write(ordered)
            continue
        begin = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with _alarm(min(case.limit_s, left)):
                    case.run(row)
                row.status = "ok"
            except Exception as exc:  # one configuration's failure is its row; go on
                row.status = "failed"
                row.notes = [_error_line(exc)]
                log.debug("case %s / %s failed", case.section, case.name, exc_info=True)
        fxopt_warnings = [str(w.message).splitlines()[0][:160] for w in caught
                          if str(w.message).startswith("fxopt")]
        if fxopt_warnings:
            row.notes.append(f"warned: {fxopt_warnings[0]}"
                             + (f" (+{len(fxopt_warnings) - 1} more)"
                                if len(fxopt_warnings) > 1 else ""))
        log.info("%s / %s: %s %s (%.0f s)", case.section, case.name, row.status,
                 row.step or "; ".join(row.notes), time.monotonic() - begin)
        try:
            between()
        except Exception as exc:  # a broken device after a failure: say so, go on
            row.notes.append(f"release failed: {_error_line(exc)}")
        write(ordered)
    return rows


def markdown_tables(rows: Sequence[Row], titles: dict[str, str]) -> str:
    """One markdown table per section (its title from ``titles``), rows in order."""
    out: list[str] = []
    for section in dict.fromkeys(r.section for r in rows):
        out += ["", titles.get(section, f"## {section}"), "",
                "| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
        out += ["| " + " | ".join(c.replace("|", "/") for c in r.cells()) + " |"
                for r in rows if r.section == section]
    return "\n".join(out) + "\n"


def read_rows(text: str, titles: dict[str, str]) -> list[Row]:
    """The rows that ran (ok or failed) in a file :func:`markdown_tables` wrote with
    ``titles``, as rows that print the same cells: what a resumed run keeps."""
    sections = {title: section for section, title in titles.items()}
    rows: list[Row] = []
    section = None
    for line in text.splitlines():
        if line.startswith("## "):
            section = sections.get(line, line[3:])
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if section is None or len(cells) != len(COLUMNS) or cells[0] == COLUMNS[0] \
                or set(cells[0]) <= {"-", " "}:
            continue
        name, step = cells[0], cells[1]
        if step.startswith("failed"):
            rows.append(Row(section, name, "failed", notes=[step.partition(": ")[2]]))
        elif not step.startswith("not run"):
            rows.append(Row(section, name, "ok", step=step, peak=cells[2], compile=cells[3],
                            loss_text=cells[4], notes=[cells[5]] if cells[5] else []))
    return rows


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` at once (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)
