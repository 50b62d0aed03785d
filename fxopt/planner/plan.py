"""The planner's answer for one graph, as plain JSON data: a :class:`Plan`.

A plan records what was decided and what it was decided for: the hardware profile, the
budget, the action per saved tensor (absent: keep), the predictions (peak, keep-all peak,
step time with everything kept, added seconds) and the planning time. It is shown by
explain, dumped with the debug dir, and loaded again (``Plan.load``) to reproduce a run
without solving (:func:`fxopt.planner.step.plan_step`'s ``replay``).

A plan is keyed by its joint graph's fingerprint (:func:`graph_fingerprint`: every node's
name, target, shapes and dtypes), so a plan replays only on the graph it was made for;
:meth:`Plan.check_fingerprint` refuses another one (other sizes included) naming the first node
that differs. A file that is not a plan, or a plan of another version, is refused at load.
A model with graph breaks has one plan per graph, saved together in one file
(:func:`save_plans`); each graph replays the plan of its own fingerprint.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from torch import fx

from fxopt.config import OptionError
from fxopt.planner.activations import ACTIONS, Decision
from fxopt.planner.hardware import HardwareProfile
from fxopt.planner.solvers.fraction import FractionDecision, SavedBytesProblem
from fxopt.units import format_bytes

__all__ = ["PLAN_VERSION", "Plan", "graph_fingerprint", "load_plans", "plan_for_graph",
           "save_plans"]

PLAN_VERSION = 2  # 2: plans carry their graph's fingerprint


@dataclass
class Plan:
    """What the planner chose for one graph, and what it predicted (see the module doc)."""

    hardware: dict[str, Any]
    budget_bytes: int | None
    actions: dict[str, str]
    predictions: dict[str, float]
    solver: str
    status: str
    planning_seconds: float
    feasible: bool = True
    graph: str = ""
    fingerprint: list[str] = field(default_factory=list)
    version: int = PLAN_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.version != PLAN_VERSION:
            raise ValueError(f"fxopt: plan version {self.version} is not supported "
                             f"(this fxopt reads version {PLAN_VERSION}); plan it again")
        bad = {n: a for n, a in self.actions.items() if a not in ACTIONS}
        if bad:
            raise ValueError(f"fxopt: plan has unknown actions {bad}; valid: {ACTIONS}")

    @classmethod
    def from_decision(cls, decision: Decision, hardware: HardwareProfile,
                      budget_bytes: int | None, **predictions: float) -> Plan:
        return cls(hardware=hardware.to_dict(), budget_bytes=budget_bytes,
                   actions=dict(decision.actions),
                   predictions={"peak_bytes": decision.peak_bytes,
                                "added_seconds": decision.added_seconds, **predictions},
                   solver=decision.solver, status=str(decision.details.get("status", "")),
                   planning_seconds=float(decision.details.get("planning_seconds", 0.0)),
                   feasible=decision.feasible)

    @classmethod
    def from_fraction(cls, decision: FractionDecision, problem: SavedBytesProblem,
                      hardware: HardwareProfile, fraction: float) -> Plan:
        """A fraction budget's plan: the recomputed tensors, the saved bytes predicted
        (plain, after, floor), one row per saved tensor that could be recomputed."""
        recomputed = set(decision.recompute)
        peak = {} if decision.peak_bytes is None else {
            "peak_bytes" if decision.peak_simulated else "model_peak_bytes":
                decision.peak_bytes, "plain_peak_bytes": decision.plain_peak_bytes}
        rows = [{"tensor": o.name, "bytes": sum(problem.storage_bytes[s] for s in o.storages),
                 "action": "recompute" if o.name in recomputed else "keep",
                 "seconds": sum(problem.node_seconds.get(n, 0.0) for n in o.chain)
                 if o.name in recomputed else 0.0} for o in problem.options]
        return cls(hardware=hardware.to_dict(), budget_bytes=decision.target_bytes,
                   actions=dict.fromkeys(decision.recompute, "recompute"),
                   predictions={"saved_bytes": decision.kept_bytes,
                                "plain_saved_bytes": decision.plain_bytes,
                                "floor_saved_bytes": decision.floor_bytes,
                                "added_seconds": decision.added_seconds, **peak},
                   solver=decision.solver, status="", planning_seconds=0.0,
                   feasible=decision.feasible, extra={"fraction": fraction, "tensors": rows,
                                                      "peak_capped": decision.peak_capped})

    def table(self, floor_peak_bytes: int | None = None) -> str:
        """The plan as text: what it recomputes, swaps and keeps, the predicted peak (or saved
        bytes, for a fraction) and step time, the floor, and one row per tensor not kept.
        ``floor_peak_bytes``: the lowest reachable peak, when the caller knows it (a byte
        plan's floor; a fraction plan carries its own)."""
        p, rows = self.predictions, self.extra.get("tensors", [])
        lines = [f"plan for {self.graph or '?'}: {self.solver} "
                 f"({self.status or 'done'}) in {self.planning_seconds:.2f} s"
                 f"{'' if self.feasible else ', OVER BUDGET'}"]
        for action in ("recompute", "swap", "keep"):
            chosen = [r for r in rows if r["action"] == action]
            lines.append(f"  {action:<10} {len(chosen):>4} tensors "
                         f"{format_bytes(sum(r['bytes'] for r in chosen)):>11}")
        step = p.get("step_seconds")
        timing = (f"predicted step {1e3 * (step + p['added_seconds']):.3f} ms "
                  f"({1e3 * step:.3f} ms with everything kept, +"
                  if step is not None else "predicted added time (+")
        timing += f"{1e3 * p['added_seconds']:.3f} ms)"
        if "fraction" in self.extra:
            plain = max(int(p["plain_saved_bytes"]), 1)
            lines += [f"  predicted saved bytes {format_bytes(int(p['saved_bytes']))} of "
                      f"{format_bytes(plain)} ({p['saved_bytes'] / plain:.3f}; bound "
                      f"{format_bytes(self.budget_bytes or 0)}); {timing}",
                      f"  floor: {p['floor_saved_bytes'] / plain:.3f} of plain autograd's "
                      f"saved bytes ({format_bytes(int(p['floor_saved_bytes']))}), "
                      "everything recomputable recomputed"]
        else:
            target = self.extra.get("peak_target_bytes")  # Codegen.peak_margin's share
            margin = (f", {format_bytes(target)} with the code generator's margin for its "
                      "kernel order" if target is not None else "")
            lines.append(f"  predicted peak {format_bytes(int(p['peak_bytes']))} (bound "
                         f"{format_bytes(self.budget_bytes or 0)}{margin}, everything kept "
                         f"{format_bytes(int(p['keep_all_peak_bytes']))}); {timing}")
            if floor_peak_bytes is not None:
                lines.append(f"  floor: lowest reachable peak {format_bytes(floor_peak_bytes)}")
        changed = [r for r in rows if r["action"] != "keep"]
        if changed:
            lines.append(f"  {'tensor':<32}{'action':<11}{'bytes':>11}{'added ms':>11}")
            lines += [f"  {r['tensor']:<32}{r['action']:<11}{format_bytes(r['bytes']):>11}"
                      f"{1e3 * r['seconds']:>11.4f}" for r in changed]
        return "\n".join(lines)

    def profile(self) -> HardwareProfile:
        return HardwareProfile.from_dict(self.hardware)

    def check_fingerprint(self, theirs: list[str]) -> None:
        """Refuse to replay on a graph (of fingerprint ``theirs``, :func:`graph_fingerprint`)
        other than the one planned (``OptionError``)."""
        mine = self.fingerprint
        if mine == theirs:
            return
        index = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b),
                     min(len(mine), len(theirs)))
        planned = mine[index] if index < len(mine) else "(the plan's graph ends here)"
        found = theirs[index] if index < len(theirs) else "(this graph ends here)"
        raise OptionError(
            f"fxopt: the plan of graph {self.graph or '?'} was made for another graph: node "
            f"{index} is {planned!r} in the plan and {found!r} here; plan this model again "
            "(fxopt plan --save, or a debug_dir's *.plan.json)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        all_fields = {f.name: f for f in fields(cls)}
        unknown = set(data) - set(all_fields)
        if unknown:
            raise ValueError(f"fxopt: unknown plan fields {sorted(unknown)}; "
                             f"valid: {sorted(all_fields)}")
        required = {name for name, f in all_fields.items()
                    if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING}
        if missing := sorted(required - set(data)):
            raise ValueError(f"fxopt: the plan lacks the fields {missing}")
        for name, kind in (("actions", dict), ("hardware", dict), ("predictions", dict),
                           ("fingerprint", list)):
            if name in data and not isinstance(data[name], kind):
                raise ValueError(f"fxopt: the plan's {name!r} must be a JSON "
                                 f"{'object' if kind is dict else 'array'}")
        return cls(**data)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """The one plan in ``path``; a ``ValueError`` naming the file when it is not one (or
        holds several graphs' plans: :func:`load_plans`)."""
        plans = load_plans(path)
        if len(plans) != 1:
            raise ValueError(f"fxopt: {path} holds the plans of {len(plans)} graphs; read it "
                             "with fxopt.planner.plan.load_plans")
        return plans[0]


def save_plans(plans: list[Plan], path: str | Path) -> Path:
    """Write one plan as it is, or a model's several (one per graph) as ``{"graphs": [...]}``;
    compiling with ``plan=path`` replays each graph's own (:func:`plan_for_graph`)."""
    if len(plans) == 1:
        return plans[0].save(path)
    path = Path(path)
    data = {"graphs": [plan.to_dict() for plan in plans]}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def load_plans(path: str | Path) -> list[Plan]:
    """The plans in ``path`` (one, or a model's, see :func:`save_plans`); a ``ValueError``
    naming the file when it is not a plan file."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"fxopt: {path} is not a plan (bad JSON: {error})") from error
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"fxopt: cannot read the plan {path}: {error}") from error
    if not isinstance(data, dict):
        raise ValueError(f"fxopt: {path} is not a plan (a JSON object is expected)")
    many = list(data) == ["graphs"]
    if many and (not isinstance(data["graphs"], list) or not data["graphs"]
                 or not all(isinstance(d, dict) for d in data["graphs"])):
        raise ValueError(f"fxopt: {path} is not a plan ('graphs' must be a list of plans)")
    try:
        return [Plan.from_dict(d) for d in (data["graphs"] if many else [data])]
    except ValueError as error:
        reason = str(error).removeprefix("fxopt: ")
        raise ValueError(f"fxopt: {path} is not a usable plan: {reason}") from None


def plan_for_graph(plans: list[Plan], fingerprint: list[str], position: int | None = None
                   ) -> Plan:
    """The plan made for the graph of ``fingerprint``: the one at ``position`` (the graph's
    place in compilation order) when it is, as two identical graphs of one model may have
    different plans under a shared fraction; else the first that is; else the first plan,
    whose :meth:`Plan.check_fingerprint` then names where the graphs differ."""
    if position is not None and position < len(plans) \
            and plans[position].fingerprint == fingerprint:
        return plans[position]
    return next((plan for plan in plans if plan.fingerprint == fingerprint), plans[0])


def graph_fingerprint(gm: fx.GraphModule) -> list[str]:
    """One line per node: name, target, and the shape and dtype of each tensor it makes.
    Two graphs with the same fingerprint have the same saved tensors, of the same sizes."""
    def value(v: Any) -> str:
        if isinstance(v, (tuple, list)):
            return "(" + ", ".join(value(x) for x in v) + ")"
        shape, dtype = getattr(v, "shape", None), getattr(v, "dtype", None)
        if shape is None or dtype is None:
            return "-"
        return f"{str(dtype).removeprefix('torch.')}{list(shape)}"

    return [f"{n.name} {n.op} {getattr(n.target, '__name__', n.target)} "
            f"{value(n.meta.get('val'))}" for n in gm.graph.nodes]
