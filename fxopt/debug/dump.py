"""The ``debug_dir`` dump: every stage's input graph and every pass that changed a graph.

Layout, numbered in pipeline order per Dynamo graph (``NN`` counts per graph):

- ``<graph>/NN_<stage>_<kind>_<what>.py``: the graph's readable Python as fx prints it
  (shapes, dtypes, strides and devices as comments); ``what`` is ``input`` for the graph a
  stage received, or the name of the pass that produced it;
- ``<graph>/NN_<stage>_<kind>_<what>.json``: the same graph as plain data with its
  predicted memory (:mod:`fxopt.debug.snapshot`), what ``fxopt diff`` reads;
- ``<graph>/NN_<stage>_<kind>_<pass>.plan.json``: a pass's plan, when its stats carry one
  under ``"plan"`` (written whether or not the pass changed the graph);
- ``<graph>/repro_<kind>.py``: a runnable repro of each captured graph as its stage
  received it (:mod:`fxopt.debug.repro`);
- ``index.json``: every file in order with its graph, stage, graph kind, pass, node count
  and predicted memory, and each pass's verdicts (``matched``: per kind a count and bytes;
  ``declined``: per site the reason; a pass that declined sites without changing the graph
  has an entry without a graph file), rewritten after each file so that it is usable
  mid-run.

Graphs are numbered per dump: the first graph a process dumps into a directory is ``g0``
there, whatever the compiler called it (``compiled_as`` in the index keeps that name, as
explain and the logs show it). Numbers restart in each process, so a process's first dump
replaces the index an earlier run left there (its files are overwritten or left unlisted).

It is an instrument: it only observes, and a failure to write is never raised into
training: the first one is logged as one warning naming the directory (the traceback only at
debug level), and the dump then stops for this compilation (a ``DebugDump`` per Dynamo
graph), so an unwritable ``debug_dir`` costs one line per compile, not one per file.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.fx as fx

from fxopt.analysis.memory import MemoryEstimate
from fxopt.debug.repro import write_repro
from fxopt.debug.snapshot import graph_snapshot, memory_data
from fxopt.passes import PassContext
from fxopt.pipeline import PassRecord

__all__ = ["DebugDump", "INDEX", "readable"]

log = logging.getLogger(__name__)
_lock = threading.Lock()
_started: set[Path] = set()  # debug dirs whose index this process has begun
_graph_names: dict[Path, dict[str, str]] = {}  # per debug dir: compiler's name -> dump's
INDEX = "index.json"


def readable(gm: fx.GraphModule) -> str:
    """The graph as fx prints it, with shape/dtype/stride comments."""
    return gm.print_readable(print_output=False, include_stride=True, include_device=True)


class DebugDump:
    """Writes the dumps and keeps ``index.json`` current after each file."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._counters: dict[str, int] = {}
        self._failed = False
        self._compiled_as: dict[str, str] = {}  # the dump's graph name -> compiler's

    def _graph(self, compiled_as: str) -> str:
        """The dump's own name of a compiled graph: g0, g1, ... in this directory."""
        with _lock:
            names = _graph_names.setdefault(self.root.resolve(), {})
            graph = names.setdefault(compiled_as, f"g{len(names)}")
        self._compiled_as[graph] = compiled_as
        return graph

    def stage_started(self, ctx: PassContext, gm: fx.GraphModule) -> None:
        if self._failed:
            return
        compiled_as, kind = ctx.graph_name.split("/")
        with self._logged_failure():
            graph = self._graph(compiled_as)
            estimate = _estimate(ctx, gm)
            entry = self._write(graph, gm, stage=ctx.stage.value, kind=kind, what="input",
                                pass_name=None, memory=estimate)
            entry["repro"] = self._repro(gm, graph, kind, ctx.stage.value)
            self._add_to_index(entry)

    def pass_finished(self, record: PassRecord, before: fx.GraphModule,
                      after: fx.GraphModule) -> None:
        plan = _plan_text(record)
        if self._failed or (record.status != "changed" and plan is None
                            and not record.verdicts.declined):
            return
        compiled_as, kind = record.graph.split("/")
        with self._logged_failure():
            graph = self._graph(compiled_as)
            common = dict(stage=record.stage, kind=kind, what=record.name,
                          pass_name=record.name)
            if record.status == "changed":
                entry = self._write(graph, after, memory=record.memory_after,
                                    nodes_before=record.nodes_before, **common)
            else:
                entry = self._entry(graph, status=record.status, **common)
            if plan is not None:
                entry["plan"] = f"{entry['stem']}.plan.json"
                (self.root / entry["plan"]).write_text(plan)
            entry.update(record.verdicts.as_dict())  # "matched" and "declined"
            self._add_to_index(entry)

    @contextlib.contextmanager
    def _logged_failure(self) -> Iterator[None]:
        """A write's failure is one warning, and stops the dump (see the module doc)."""
        try:
            yield
        except Exception as exc:
            self._failed = True
            log.warning("fxopt: cannot write the debug dump to %s (%s: %s); no dump for "
                        "this compilation", self.root, type(exc).__name__, exc)
            log.debug("fxopt: traceback of the failed dump", exc_info=True)

    def _entry(self, graph: str, *, stage: str, kind: str, what: str,
               pass_name: str | None, status: str) -> dict[str, Any]:
        with _lock:
            number = self._counters.get(graph, 0)
            self._counters[graph] = number + 1
        (self.root / graph).mkdir(parents=True, exist_ok=True)
        return dict(graph=graph, compiled_as=self._compiled_as[graph],
                    stem=f"{graph}/{number:02d}_{stage}_{kind}_{what}",
                    stage=stage, kind=kind, pass_name=pass_name, status=status, file=None,
                    data=None, plan=None)

    def _write(self, graph: str, gm: fx.GraphModule, *, stage: str, kind: str, what: str,
               pass_name: str | None, memory: MemoryEstimate | None,
               **extra: Any) -> dict[str, Any]:
        entry = self._entry(graph, stage=stage, kind=kind, what=what, pass_name=pass_name,
                            status="input" if pass_name is None else "changed")
        stem = entry["stem"]
        (self.root / f"{stem}.py").write_text(readable(gm))
        snapshot = graph_snapshot(gm, kind, memory)
        (self.root / f"{stem}.json").write_text(json.dumps(snapshot))
        entry.update(file=f"{stem}.py", data=f"{stem}.json", nodes=len(gm.graph.nodes),
                     memory=memory_data(memory), **extra)
        return entry

    def _repro(self, gm: fx.GraphModule, graph: str, kind: str, stage: str) -> str | None:
        try:
            script = write_repro(gm, self.root / graph, graph=graph, kind=kind, stage=stage)
        except ValueError as exc:  # a graph it cannot reproduce; the dumps still help
            log.info("fxopt: no repro for %s/%s: %s", graph, kind, exc)
            return None
        return script.relative_to(self.root).as_posix()

    def _add_to_index(self, entry: dict[str, Any]) -> None:
        with _lock:
            path = self.root / INDEX
            if self.root.resolve() in _started and path.exists():
                index = json.loads(path.read_text())
            else:  # graph numbers restart in each process: an earlier run's index goes
                if path.exists():
                    log.info("fxopt: replacing the %s of an earlier run in %s", INDEX,
                             self.root)
                index = {"files": []}
                _started.add(self.root.resolve())
            index["files"] = [f for f in index["files"] if f["stem"] != entry["stem"]] + [entry]
            path.write_text(json.dumps(index, indent=1))


def _plan_text(record: PassRecord) -> str | None:
    """The pass's ``stats["plan"]`` as JSON; None when it has none or it is not plain
    data (logged: the graph is still dumped, the plan is not)."""
    if "plan" not in record.stats:
        return None
    try:
        return json.dumps(record.stats["plan"], indent=1)
    except (TypeError, ValueError) as exc:
        log.warning("fxopt: the plan of pass %s on %s is not JSON-serialisable (%s); not "
                    "dumped", record.name, record.graph, exc)
        return None


def _estimate(ctx: PassContext, gm: fx.GraphModule) -> MemoryEstimate | None:
    try:
        return ctx.estimate_memory(gm)
    except Exception:  # a prediction feeds a report; its absence is shown as "-"
        log.info("fxopt: no memory prediction for the dump of %s", ctx.graph_name,
                 exc_info=True)
        return None
