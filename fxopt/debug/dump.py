"""The ``debug_dir`` dump: every stage's input graph and every pass that changed a graph.

Layout: ``<debug_dir>/<graph>/NN_<stage>_<kind>_<what>.py``, numbered in pipeline order per
Dynamo graph, each the graph's readable Python as fx prints it (shapes, dtypes, strides
and devices as comments), plus ``<debug_dir>/index.json`` listing every file with its
stage, graph kind, pass and node count. It is an instrument: it only observes, and a
failure to write is logged, never raised into training.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import torch.fx as fx

from fxopt.passes import PassContext
from fxopt.pipeline import PassRecord

__all__ = ["DebugDump"]

log = logging.getLogger(__name__)
_lock = threading.Lock()


def readable(gm: fx.GraphModule) -> str:
    """The graph as fx prints it, with shape/dtype/stride comments."""
    return gm.print_readable(print_output=False, include_stride=True, include_device=True)


class DebugDump:
    """Writes the dumps and keeps ``index.json`` current after each file."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._counters: dict[str, int] = {}

    def stage_started(self, ctx: PassContext, gm: fx.GraphModule) -> None:
        graph, kind = ctx.graph_name.split("/")
        self._write(graph, gm, stage=ctx.stage.value, kind=kind, what="input", pass_name=None)

    def pass_finished(self, record: PassRecord, before: fx.GraphModule,
                      after: fx.GraphModule) -> None:
        if record.status != "changed":
            return
        graph, kind = record.graph.split("/")
        self._write(graph, after, stage=record.stage, kind=kind, what=record.name,
                    pass_name=record.name, nodes_before=record.nodes_before)

    def _write(self, graph: str, gm: fx.GraphModule, *, stage: str, kind: str, what: str,
               pass_name: str | None, **extra: Any) -> None:
        try:
            with _lock:
                number = self._counters.get(graph, 0)
                self._counters[graph] = number + 1
                name = f"{number:02d}_{stage}_{kind}_{what}.py"
                folder = self.root / graph
                folder.mkdir(parents=True, exist_ok=True)
                (folder / name).write_text(readable(gm))
                self._add_to_index(dict(graph=graph, file=f"{graph}/{name}", stage=stage,
                                        kind=kind, pass_name=pass_name,
                                        nodes=len(gm.graph.nodes), **extra))
        except OSError:
            log.warning("fxopt: could not write the debug dump to %s", self.root, exc_info=True)

    def _add_to_index(self, entry: dict[str, Any]) -> None:
        path = self.root / "index.json"
        index = json.loads(path.read_text()) if path.exists() else {"files": []}
        index["files"] = [f for f in index["files"] if f["file"] != entry["file"]] + [entry]
        path.write_text(json.dumps(index, indent=1))
