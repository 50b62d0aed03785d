"""What each pass did to each graph, computed from a ``debug_dir`` dump.

:func:`load_dump` reads ``index.json`` and the ``.json`` graph snapshots beside the dumps
(:mod:`fxopt.debug.dump`); :func:`pass_steps` pairs each pass's output with the graph it
was given (the previous snapshot of the same graph and kind), and :func:`diff_snapshots`
says which nodes were added, removed, replaced and changed:

- nodes are matched by name (fx never reuses a name within a graph);
- a node that is gone was *replaced* when a new node's provenance
  (``node.meta["fxopt"]["replaces"]``, passes README rule 5) names it;
- a node present on both sides *changed* when its op, target, inputs, shapes or dtypes did
  (users of a replaced node change this way: their inputs now name the replacement);
- a node otherwise unchanged was *annotated* when its ``fxopt`` metadata changed: how
  swap_recompute acts (it tags nodes ``recompute`` for the partitioner, the graph itself
  stays the same).

A pass that writes a plan (swap_recompute) gets its :class:`PlanEffect`: the saved tensors
per action (recompute, swap, keep) from the plan file, and the predicted saved bytes and
peak before (the pass's input graph) and after (the partitioned step: the next stage's
input of the same graph, which is where the plan takes effect).

:func:`dump_comparisons` pairs the final graphs of two dumps (two option sets, two fxopt
versions) graph by graph, in capture order. The renderers (text, HTML) only format these.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fxopt.debug.dump import INDEX

__all__ = ["DumpError", "Dump", "PlanEffect", "Snapshot", "SnapshotDiff", "Step", "load_dump",
           "diff_snapshots", "pass_steps", "dump_comparisons"]


class DumpError(ValueError):
    """The directory is missing, or is not a readable fxopt debug dump."""


@dataclass
class Snapshot:
    """One dumped graph: its index entry, nodes (plain data) and predicted memory."""

    entry: dict[str, Any]
    nodes: list[dict[str, Any]]
    memory: dict[str, Any] | None

    @property
    def label(self) -> str:
        return self.entry.get("pass_name") or f"{self.entry['stage']} input"

    @property
    def kernels(self) -> int:
        return sum(1 for n in self.nodes if n.get("kernel"))


@dataclass
class SnapshotDiff:
    """Nodes added, removed and changed between two graphs; ``replaced_by`` maps each
    removed node that a new node's provenance names to those new nodes' names."""

    added: list[dict[str, Any]]
    removed: list[dict[str, Any]]
    changed: list[tuple[dict[str, Any], dict[str, Any]]]
    replaced_by: dict[str, list[str]] = field(default_factory=dict)
    annotated: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)

    @property
    def replaces(self) -> dict[str, list[str]]:
        """Added node -> the removed nodes it replaces (the inverse of ``replaced_by``)."""
        inverse: dict[str, list[str]] = {}
        for old, new_names in self.replaced_by.items():
            for new in new_names:
                inverse.setdefault(new, []).append(old)
        return inverse


@dataclass
class PlanEffect:
    """What a planning pass decided (see the module docstring): saved tensors as
    (action, name, bytes) in graph order, and predicted bytes before -> after (None where
    the dump does not say; a byte-budget plan names only the tensors it acts on)."""

    tensors: list[tuple[str, str, int | None]]
    saved_before: int | None
    saved_after: int | None
    peak_before: int | None
    peak_after: int | None

    def count(self, action: str) -> int:
        return sum(1 for a, _, _ in self.tensors if a == action)


@dataclass
class Step:
    """Two graphs to compare: a pass's input and output, or two dumps' final graphs."""

    graph: str
    kind: str
    stage: str
    name: str          # the pass, or "A vs B" for two dumps
    before: Snapshot
    after: Snapshot
    before_file: Path
    after_file: Path
    plan: PlanEffect | None = None

    @functools.cached_property
    def diff(self) -> SnapshotDiff:
        return diff_snapshots(self.before, self.after)

    @property
    def title(self) -> str:
        return f"{self.graph}/{self.kind}"


@dataclass
class Dump:
    """A debug dump on disk: its root and index entries (those with a graph file)."""

    root: Path
    entries: list[dict[str, Any]]
    _loaded: dict[str, Snapshot] = field(default_factory=dict, repr=False)

    @property
    def graphs(self) -> list[str]:
        """Graph names in capture order."""
        return list(dict.fromkeys(e["graph"] for e in self.entries))

    def snapshot(self, entry: dict[str, Any]) -> Snapshot:
        """The snapshot an index entry names, read once (a pass's output is the next
        pass's input)."""
        if entry["data"] not in self._loaded:
            path = self.root / entry["data"]
            try:
                data = json.loads(path.read_text())
                snapshot = Snapshot(entry, list(data["nodes"]), data.get("memory"))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise DumpError(f"{path}: not a readable graph snapshot ({exc})") from exc
            self._loaded[entry["data"]] = snapshot
        return self._loaded[entry["data"]]

    def chains(self, graph: str) -> dict[str, list[dict[str, Any]]]:
        """Per graph kind, its snapshots' entries in pipeline order."""
        chains: dict[str, list[dict[str, Any]]] = {}
        for entry in self.entries:
            if entry["graph"] == graph:
                chains.setdefault(entry["kind"], []).append(entry)
        return chains


_ENTRY_KEYS = ("graph", "kind", "stage", "file", "data")


def load_dump(root: str | Path) -> Dump:
    """Read a debug dump's index; raises DumpError saying what is wrong."""
    root = Path(root)
    if not root.is_dir():
        raise DumpError(f"{root}: no such directory (give the debug_dir a compiled model "
                        "wrote, e.g. options={'debug_dir': 'dbg'} or FXOPT_DEBUG_DIR=dbg)")
    index = root / INDEX
    if not index.is_file():
        inside = sorted({p.parent.relative_to(root).as_posix()
                         for pattern in (f"*/{INDEX}", f"*/*/{INDEX}")
                         for p in root.glob(pattern)})
        if inside:
            raise DumpError(f"{root}: not a debug dump itself, but it holds "
                            f"{len(inside)}: {', '.join(inside)} (give one, or two to "
                            "compare them)")
        raise DumpError(f"{root}: no {INDEX}; not an fxopt debug dump (was anything "
                        "compiled with debug_dir set to it?)")
    try:
        entries = [e for e in json.loads(index.read_text())["files"] if e.get("data")]
        missing = {key for e in entries for key in _ENTRY_KEYS if key not in e}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DumpError(f"{index}: malformed index ({type(exc).__name__}: {exc})") from exc
    if missing:
        raise DumpError(f"{index}: malformed index (entries without {sorted(missing)})")
    if not entries:
        raise DumpError(f"{index}: lists no graphs")
    return Dump(root, entries)


def _signature(node: dict[str, Any]) -> tuple[Any, ...]:
    return (node["op"], node["target"], node["inputs"], node["shapes"], node["dtypes"])


def diff_snapshots(before: Snapshot, after: Snapshot) -> SnapshotDiff:
    """Match nodes by name and provenance (see the module docstring)."""
    old = {n["name"]: n for n in before.nodes}
    new = {n["name"]: n for n in after.nodes}
    removed = [n for n in before.nodes if n["name"] not in new]
    added = [n for n in after.nodes if n["name"] not in old]
    changed = [(old[n["name"]], n) for n in after.nodes
               if n["name"] in old and _signature(old[n["name"]]) != _signature(n)]
    annotated = [(old[n["name"]], n) for n in after.nodes
                 if n["name"] in old and _signature(old[n["name"]]) == _signature(n)
                 and (old[n["name"]].get("fxopt") or {}) != (n.get("fxopt") or {})]
    gone = {n["name"] for n in removed}
    replaced_by: dict[str, list[str]] = {}
    for node in added:
        replaces = (node.get("fxopt") or {}).get("replaces") or ()
        for name in [replaces] if isinstance(replaces, str) else replaces:
            if name in gone:
                replaced_by.setdefault(name, []).append(node["name"])
    return SnapshotDiff(added, removed, changed, replaced_by, annotated)


def _selected(graph: str, kind: str, graphs: list[str] | None) -> bool:
    return graphs is None or graph in graphs or f"{graph}/{kind}" in graphs


def pass_steps(dump: Dump, graphs: list[str] | None = None,
               pass_name: str | None = None) -> list[Step]:
    """Each pass that changed a graph, with the graph it was given; optionally only these
    graphs (``g0`` or ``g0/forward``) and this pass."""
    steps: list[Step] = []
    for graph in dump.graphs:
        for kind, chain in dump.chains(graph).items():
            if not _selected(graph, kind, graphs):
                continue
            for before, after in zip(chain, chain[1:]):
                if pass_name is not None and after.get("pass_name") != pass_name:
                    continue
                step = Step(graph, kind, after["stage"], after.get("pass_name") or "?",
                            dump.snapshot(before), dump.snapshot(after),
                            dump.root / before["file"], dump.root / after["file"])
                if after.get("plan"):
                    step.plan = _plan_effect(dump, step, after)
                steps.append(step)
    return steps


def _plan_effect(dump: Dump, step: Step, entry: dict[str, Any]) -> PlanEffect | None:
    """The plan file's actions, and the predictions around it (module docstring); None for
    a plan that is not the planner's (no ``actions``: another pass's own data)."""
    path = dump.root / entry["plan"]
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DumpError(f"{path}: not a readable plan ({type(exc).__name__}: {exc})") from exc
    if not isinstance(plan, dict) or not isinstance(plan.get("actions"), dict):
        return None
    try:
        rows = (plan.get("extra") or {}).get("tensors")
        if rows is None:  # a byte-budget plan lists only the tensors it acts on
            rows = [{"tensor": name, "action": action}
                    for name, action in plan["actions"].items()]
        tensors = [(r["action"], r["tensor"], r.get("bytes")) for r in rows]
        predictions = plan.get("predictions") or {}
    except (KeyError, TypeError, AttributeError) as exc:
        raise DumpError(f"{path}: not a readable plan ({type(exc).__name__}: {exc})") from exc
    later = dump.entries[dump.entries.index(entry) + 1:]
    partitioned = next((e.get("memory") for e in later if e["graph"] == step.graph
                        and e["stage"] != entry["stage"] and e.get("pass_name") is None), None)
    before = step.before.memory or {}
    after = partitioned or {}
    saved_after = after.get("activation_bytes", predictions.get("saved_bytes"))
    return PlanEffect(tensors, before.get("activation_bytes"), saved_after,
                      before.get("peak_bytes"), after.get("peak_bytes"))


def dump_comparisons(first: Dump, second: Dump,
                     graphs: list[str] | None = None) -> list[Step]:
    """The final graph of each kind, first dump vs second, graphs paired in capture
    order (graph numbers differ between processes), each step named "A vs B" and its
    graph "gA|gB" when the numbers differ. ``graphs`` filters by the first dump's names."""
    steps: list[Step] = []
    for graph_a, graph_b in zip(first.graphs, second.graphs):
        chains_a, chains_b = first.chains(graph_a), second.chains(graph_b)
        for kind in [k for k in chains_a if k in chains_b]:
            if not _selected(graph_a, kind, graphs):
                continue
            a, b = chains_a[kind][-1], chains_b[kind][-1]
            steps.append(Step(graph_a if graph_a == graph_b else f"{graph_a}|{graph_b}", kind,
                              a["stage"], "A vs B",
                              first.snapshot(a), second.snapshot(b),
                              first.root / a["file"], second.root / b["file"]))
    return steps
