"""``fxopt diff`` in the terminal: per graph and per pass, the nodes that changed.

One summary line per pass (nodes before -> after with +added -removed ~changed, kernels
(ops that are not views: what launches work), predicted activation memory and peak
before -> after), then one line per node: ``-``
removed (and what replaced it), ``+`` added (which pass made it, what it replaces), ``~``
changed (what differs). A pass with a plan (swap_recompute, which only tags nodes) gets a
second summary line (saved tensors recomputed, swapped and kept; predicted saved bytes and
peak before -> after) and one line per saved tensor with its action. Colours only when
asked (the CLI asks on a terminal).
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Iterator
from typing import Any

from fxopt.debug.diff import PlanEffect, Step
from fxopt.units import format_bytes

__all__ = ["render_steps", "summary_line", "unified", "shape_text"]

_COLOURS = {"-": "\033[31m", "+": "\033[32m", "~": "\033[33m", "head": "\033[1m"}
_RESET = "\033[0m"


def shape_text(node: dict[str, Any]) -> str:
    """``float32[3, 37]`` (several outputs joined by ``, ``); empty for non-tensors."""
    return ", ".join(f"{dtype}{list(shape)}"
                     for dtype, shape in zip(node.get("dtypes", ()), node.get("shapes", ())))


def _memory(step: Step, key: str) -> str:
    before = (step.before.memory or {}).get(key)
    after = (step.after.memory or {}).get(key)
    return f"{format_bytes(before)} -> {format_bytes(after)}"


def verdicts_line(step: Step) -> str | None:
    """What the pass matched (per kind) and declined (per reason, how many sites), from
    its verdicts in the dump's index; None when it reported neither."""
    matched = step.after.entry.get("matched") or {}
    reasons = Counter(d["reason"] for d in step.after.entry.get("declined") or ())
    parts = []
    if matched:
        parts.append("matched " + ", ".join(f"{kind}={m['count']}"
                                            for kind, m in matched.items()))
    if reasons:
        parts.append("declined " + ", ".join(f"{reason} x{n}"
                                             for reason, n in reasons.items()))
    return "; ".join(parts) or None


def summary_line(step: Step) -> str:
    """``pass: nodes 11 -> 19 (+10 -2 ~2), kernels 6 -> 14, activations ..., peak ...``
    and the pass's plan file when it wrote one."""
    diff = step.diff
    plan = step.after.entry.get("plan")
    if step.before.memory is None and step.after.memory is None:
        memory = "memory not predicted at this stage (before autograd)"
    else:
        memory = (f"activations {_memory(step, 'activation_bytes')}, "
                  f"peak {_memory(step, 'peak_bytes')}")
    tagged = f", {len(diff.annotated)} tagged" if diff.annotated else ""
    return (f"{step.name}: nodes {len(step.before.nodes)} -> {len(step.after.nodes)} "
            f"(+{len(diff.added)} -{len(diff.removed)} ~{len(diff.changed)}{tagged}), "
            f"kernels {step.before.kernels} -> {step.after.kernels}, {memory}"
            + (f", plan {plan}" if plan else ""))


def plan_line(plan: PlanEffect) -> str:
    """``plan: recompute 8, swap 0, keep 4 saved tensors; predicted saved 40 KiB -> 20 KiB,
    peak 143 KiB -> 143 KiB (partitioned)``."""
    counts = ", ".join(f"{action} {plan.count(action)}"
                       for action in ("recompute", "swap", "keep"))
    return (f"plan: {counts} saved tensors; predicted saved "
            f"{format_bytes(plan.saved_before)} -> {format_bytes(plan.saved_after)}, peak "
            f"{format_bytes(plan.peak_before)} -> {format_bytes(plan.peak_after)} "
            f"(partitioned)")


def _node_line(mark: str, node: dict[str, Any], note: str) -> str:
    return (f"    {mark} {node['name']:<24} {node['op']:<14} {node['target']:<32} "
            f"{shape_text(node):<20} {note}").rstrip()


def _provenance(node: dict[str, Any]) -> str:
    made_by = (node.get("fxopt") or {}).get("pass")
    return f"by {made_by}" if made_by else ""


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _inputs_change(old: dict[str, Any], new: dict[str, Any]) -> str:
    """Only the inputs that differ: ``inputs t -> permute`` when one input node was
    swapped for another, ``-a +b`` when their number changed, else the text."""
    before, after = old["uses"], new["uses"]
    if before == after:
        return f"inputs ({_short(old['inputs'])}) -> ({_short(new['inputs'])})"
    if len(before) == len(after):
        return "inputs " + ", ".join(f"{a} -> {b}" for a, b in zip(before, after) if a != b)
    return "inputs " + " ".join([f"-{a}" for a in before if a not in after]
                                + [f"+{b}" for b in after if b not in before])


def _change(old: dict[str, Any], new: dict[str, Any]) -> str:
    parts = []
    for key in ("op", "target"):
        if old[key] != new[key]:
            parts.append(f"{key} {old[key]} -> {new[key]}")
    if old["inputs"] != new["inputs"]:
        parts.append(_inputs_change(old, new))
    if (old["shapes"], old["dtypes"]) != (new["shapes"], new["dtypes"]):
        parts.append(f"{shape_text(old)} -> {shape_text(new)}")
    return "; ".join(parts)


def _node_lines(step: Step) -> Iterator[tuple[str, str]]:
    diff = step.diff
    replaces = diff.replaces
    for node in diff.removed:
        by = diff.replaced_by.get(node["name"])
        yield "-", _node_line("-", node, f"replaced by {', '.join(by)}" if by else "")
    for node in diff.added:
        notes = [_provenance(node)]
        if node["name"] in replaces:
            notes.append(f"replaces {', '.join(replaces[node['name']])}")
        yield "+", _node_line("+", node, ", ".join(n for n in notes if n))
    for old, new in diff.changed:
        yield "~", _node_line("~", new, _change(old, new))
    for old, new in diff.annotated:
        yield "~", _node_line("~", new, f"fxopt {old.get('fxopt') or {}} -> "
                                       f"{new.get('fxopt') or {}}")
    for action, name, size in step.plan.tensors if step.plan else ():
        yield _PLAN_MARKS[action], f"    {action:<9} {name:<24} {format_bytes(size)}"


_PLAN_MARKS = {"recompute": "-", "swap": "~", "keep": "+"}


def render_steps(steps: list[Step], *, stat: bool = False, colour: bool = False
                 ) -> Iterator[str]:
    """The report's lines: a heading per graph, a summary per step, and unless ``stat``
    a line per changed node."""
    def paint(kind: str, text: str) -> str:
        return f"{_COLOURS[kind]}{text}{_RESET}" if colour else text

    heading = None
    for step in steps:
        if step.title != heading:
            heading = step.title
            yield paint("head", f"{step.title} (stage {step.stage})")
        yield "  " + summary_line(step)
        if (verdicts := verdicts_line(step)) is not None:
            yield "  " + verdicts
        if step.plan is not None:
            yield "  " + plan_line(step.plan)
        if not stat:
            for mark, line in _node_lines(step):
                yield paint(mark, line)


def unified(step: Step) -> Iterator[str]:
    """A unified diff of the two graphs' readable dumps."""
    before = step.before_file.read_text().splitlines(keepends=True)
    after = step.after_file.read_text().splitlines(keepends=True)
    for line in difflib.unified_diff(before, after, str(step.before_file),
                                     str(step.after_file)):
        yield line.rstrip("\n")
