"""``fxopt.explain``: compile a model, run one training step, and say what fxopt did.

The report lists the graphs Dynamo captured (and its graph breaks with their reasons), per
graph and per pass whether the pass ran or why not, nodes before/after, time, what it matched
and declined (its verdicts: a row per reason it declined sites for), its own stats and the
predicted activation memory and peak before/after; ``str(report)`` is a table and the same
data is on the object (``report.passes[i].name``, ``.verdicts``, ``.stats``, ...).

"Plain autograd" is always the Dynamo graph without any fxopt pass (explain asks the
backend to trace it separately when a pre-autograd pass such as tempo changed the graph).
``report.notes`` says what the table cannot: why Dynamo captured no graph, RNN modules
Dynamo does not trace (``torch._dynamo.config.allow_rnn``), which fuse_rnn and a memory
budget (recompute_rnn) then never see, and graph breaks at logging calls (transformers'
``logger.warning_once``, :func:`logging_break`) with the setting that removes them.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fxopt import _compat, config
from fxopt.analysis.memory import MemoryEstimate
from fxopt.compiler import Backend, GraphRecord
from fxopt.config import Options
from fxopt.lm_outputs import drops_logits
from fxopt.passes.base import WHOLE_GRAPH, Verdicts
from fxopt.pipeline import PassRecord
from fxopt.units import format_mib as _mib

__all__ = ["explain", "ExplainReport", "GraphBreak", "logging_break"]


@dataclass(frozen=True)
class GraphBreak:
    reason: str
    count: int


@dataclass
class ExplainReport:
    """What fxopt did during one compiled training step."""

    options: Options
    graphs: list[GraphRecord]
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    ran_backward: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def passes(self) -> list[PassRecord]:
        """Every pass record of every graph, in pipeline order."""
        return [record for graph in self.graphs for record in graph.passes]

    @property
    def fallbacks(self) -> list[str]:
        """Every fallback of every graph (a graph uncompiled, a graph without Inductor, a
        pass failed and skipped); empty: none happened."""
        return [f for graph in self.graphs for f in graph.every_fallback()]

    def fired(self, name: str) -> bool:
        """Whether pass ``name`` changed at least one graph."""
        return any(r.fired for r in self.passes if r.name == name)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-serialisable) for tools and the debug index."""
        return {
            "options": self.options.as_dict(),
            "graph_breaks": [vars(b) for b in self.graph_breaks],
            "ran_backward": self.ran_backward,
            "notes": list(self.notes),
            "graphs": [{
                "name": g.name, "dynamo_nodes": g.dynamo_nodes,
                "fallbacks": g.every_fallback(),
                "compile_seconds": g.compile_seconds,
                "codegen": {"name": g.codegen.name, "reason": g.codegen.reason},
                "memory": {k: _memory_dict(v) for k, v in g.memory.items()},
                "cost": {k: None if c is None else {"flops": c.flops, "bytes": c.bytes}
                         for k, c in g.cost.items()},
                "passes": [{**{k: v for k, v in vars(r).items()
                               if not k.startswith("memory") and k != "verdicts"},
                            **r.verdicts.as_dict(),  # "matched" and "declined"
                            "memory_before": _memory_dict(r.memory_before),
                            "memory_after": _memory_dict(r.memory_after)} for r in g.passes],
            } for g in self.graphs],
        }

    def __str__(self) -> str:
        return "\n".join(_render(self))


def explain(model: Any, *args: Any, options: Mapping[str, Any] | None = None,
            **kwargs: Any) -> ExplainReport:
    """Compile ``model`` with fxopt, run one forward (and backward when the output needs
    grad: the sum of its floating outputs is the loss), and report.

    ``.grad`` of parameters and inputs and the model's buffers (e.g. BatchNorm running
    stats) are restored afterwards, so explaining does not change a training run.
    """
    backend = Backend(options, plain_baseline=True)
    breaks_before = _compat.graph_break_counts()
    compiled = torch.compile(model, backend=backend)
    with _restored_state(model, args, kwargs):
        output = compiled(*args, **kwargs)
        loss = _loss_of(output)
        if loss is not None:
            loss.backward()
    breaks_after = _compat.graph_break_counts()
    breaks = [GraphBreak(reason, count - breaks_before.get(reason, 0))
              for reason, count in breaks_after.items()
              if count > breaks_before.get(reason, 0)]
    resolved = config.resolve(options)
    return ExplainReport(options=resolved, graphs=list(backend.graphs),
                         graph_breaks=breaks, ran_backward=loss is not None,
                         notes=_notes(model, resolved, backend.graphs, breaks))


def _notes(model: Any, options: Options, graphs: list[GraphRecord],
           breaks: list[GraphBreak]) -> list[str]:
    """What the table alone does not say: why nothing was compiled, RNN modules Dynamo
    leaves out of its graphs, logging breaks, and logits the fused loss could not remove."""
    notes = []
    rnns = [f"{name or 'the model'} ({type(m).__name__})"
            for name, m in (model.named_modules() if isinstance(model, torch.nn.Module) else ())
            if isinstance(m, torch.nn.RNNBase)]
    rnn_untraced = bool(rnns) and not _compat.dynamo_traces_rnn()
    budgeted = options.memory_budget is not None
    if rnn_untraced and (options.fuse_rnn or budgeted or not graphs):
        lost = [*(["fuse_rnn=True has no effect on it"] if options.fuse_rnn else []),
                *(["memory_budget does not bound what it saves (recompute_rnn never sees "
                   "it)"] if budgeted else [])]
        notes.append(
            f"Dynamo does not trace {', '.join(rnns)}: it breaks the graph there unless "
            "torch._dynamo.config.allow_rnn = True is set before compiling, so fxopt never "
            "sees the module" + (f" ({'; '.join(lost)})" if lost else ""))
    logging_calls = sorted({m for b in breaks if (m := logging_break(b.reason)) is not None})
    if logging_calls:
        notes.append(
            f"Dynamo breaks the graph at a logging call ({', '.join(logging_calls)}): the "
            "model compiles into more graphs (a memory budget is then shared by them, and "
            "a loss after the break keeps its logits input; fxopt.planner.ledger). "
            "fxopt.ignore_transformers_logging() removes transformers' breaks (a "
            "transformers model whose loss_type is unset, GPT-2's, warns at every loss: "
            "model.loss_type = 'ForCausalLM', its default loss, ends that one); in torch "
            "itself the setting is torch._dynamo.config.ignore_logging_functions (torch "
            ">= 2.11; it takes the exact function, e.g. transformers' "
            "logging.Logger.warning_once), ignore_logger_methods in older torch")
    kept_logits = [kind for graph in graphs for r in graph.passes
                   if r.name == "fuse_linear_cross_entropy" for kind in r.verdicts.matched
                   if "its logits still made" in kind]
    if kept_logits:
        still_made = ("fuse_linear_cross_entropy computes the loss without the logits, but "
                      "something else in the graph still uses them, so they are still made")
        if drops_logits(model) and breaks:
            notes.append(
                f"{still_made}: the model drops them (fxopt.drop_logits), but Dynamo breaks "
                "the graph inside its forward (the graph break(s) above), so the graph that "
                "computes the loss returns them to the frame that drops them. Without the "
                "break they are never made")
        else:
            notes.append(
                f"{still_made}: a transformers language model (causal or "
                "sequence-to-sequence) returns them with its loss"
                + (" (their gradient is made only for a caller whose loss reads them)"
                   if all("graph's output" in kind for kind in kept_logits) else "")
                + ". For training steps that read only the loss, fxopt.drop_logits(model) "
                "removes them from the output")
    if not graphs:
        why = ("see the graph break(s) above" if breaks else
               "the call ran no tensor operation Dynamo could capture, or Dynamo skipped "
               "the frame (torch.compiler.disable, TORCHDYNAMO_DISABLE=1)")
        notes.append(f"Dynamo captured no graph, so fxopt compiled nothing and no pass ran "
                     f"({'set torch._dynamo.config.allow_rnn = True' if rnn_untraced else why})")
    return notes


_LOGGING_BREAK = re.compile(r"logging\.Logger method|Logger not supported")
_LOGGING_METHOD = re.compile(r"method: <Logger [^>]*>\.(\w+)")


def logging_break(reason: str) -> str | None:
    """The logging method a Dynamo graph-break ``reason`` names (``"Logger.warning_once"``;
    ``"Logger"`` where the reason does not say which), or None: not a logging call."""
    if not _LOGGING_BREAK.search(reason):
        return None
    method = _LOGGING_METHOD.search(reason)
    return f"Logger.{method.group(1)}" if method else "Logger"


def differentiable_outputs(output: Any) -> list[torch.Tensor]:
    """The floating-point tensors in a model's output (any pytree, e.g. a ModelOutput)
    that require grad: what a loss for a test or an explain step is built from."""
    return [t for t in _compat.tree_leaves(output)
            if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]


def _loss_of(output: Any) -> torch.Tensor | None:
    leaves = differentiable_outputs(output)
    return sum(t.float().sum() for t in leaves) if leaves else None


@contextlib.contextmanager
def _restored_state(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[None]:
    tensors = [t for t in _compat.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    buffers: dict[str, torch.Tensor] = {}
    if isinstance(model, torch.nn.Module):
        tensors += list(model.parameters())
        buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    grads = [(t, t.grad) for t in tensors if t.requires_grad]
    try:
        yield
    finally:
        for tensor, grad in grads:
            tensor.grad = grad
        if isinstance(model, torch.nn.Module):
            with torch.no_grad():
                for name, b in model.named_buffers():
                    if name in buffers:
                        b.copy_(buffers[name])


# ----------------------------------------------------------------------------- rendering


def _memory_dict(m: MemoryEstimate | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return {"peak_bytes": m.peak_bytes, "activation_bytes": m.activation_bytes,
            "baseline_bytes": m.baseline_bytes, "peak_node": m.peak_node}


def _memory_change(before: MemoryEstimate | None, after: MemoryEstimate | None) -> str:
    if before is None and after is None:
        return ""
    b = (None, None) if before is None else (before.peak_bytes, before.activation_bytes)
    a = (None, None) if after is None else (after.peak_bytes, after.activation_bytes)
    return f"{_mib(b[0])}->{_mib(a[0])} / {_mib(b[1])}->{_mib(a[1])}"


def _stats_text(stats: dict[str, Any]) -> str:
    """One line: scalars as they are, containers as their size (the data stays in
    ``report.passes[i].stats``; a plan is in the debug dump and, for swap_recompute, in
    the rows below the line)."""
    def short(value: Any) -> str:
        if isinstance(value, (list, tuple)):
            return f"[{len(value)} items]"
        if isinstance(value, dict) and len(str(value)) > 60:
            return f"{{{len(value)} entries}}"
        return str(value)

    return ", ".join(f"{k}={short(v)}" for k, v in stats.items())


def _verdicts_text(verdicts: Verdicts) -> str:
    """What the pass matched, per kind: the count and, where it saves bytes, the bytes."""
    if not verdicts.matched:
        return ""
    return "matched " + ", ".join(
        f"{kind}={m.count}" + (f" ({m.bytes / 1024:.1f} KiB)" if m.bytes else "")
        for kind, m in verdicts.matched.items())


def _decline_rows(verdicts: Verdicts, shown: int = 3) -> list[str]:
    """One row per reason a pass declined sites for: how many and the first few sites (every
    site is in ``report.passes[i].verdicts.declined``)."""
    sites: dict[str, list[str]] = {}
    for decline in verdicts.declined:
        sites.setdefault(decline.reason, []).append(decline.site)
    return [f"      declined the graph: {reason}" if where == [WHOLE_GRAPH] else
            f"      declined {len(where)}x: {reason} (at {', '.join(where[:shown])}"
            f"{', ...' if len(where) > shown else ''})" for reason, where in sites.items()]


def _tempo_auto_rows(auto: dict[str, Any]) -> list[str]:
    """tempo='auto': the site kinds taken and why, and per candidate (a set of kinds) whether
    its plan meets the budget, its predicted step time and what it reaches."""
    lines = [f"      tempo='auto' took {', '.join(auto['taken']) or 'no site kind'}: "
             f"{auto['reason']} (search {auto['seconds']:.2f} s)"]
    if auto["candidates"]:
        lines.append(f"      {'site kinds':<28}{'fits':<6}{'pred. ms':>10}{'reaches KiB':>13}")
    lines += [f"      {','.join(c['tempo']) or '(none)':<28}"
              f"{'yes' if c['feasible'] else 'no':<6}{1e3 * c['seconds']:>10.3f}"
              f"{c['reached'] / 1024:>13.1f}" for c in auto["candidates"]]
    return lines


def _plan_rows(stats: dict[str, Any]) -> list[str]:
    """swap_recompute's plan: predicted peak before/after, and per saved tensor the action,
    its bytes and the step time it is predicted to add; tempo='auto''s choice; fuse_rnn's
    cost model per whole RNN call; fuse_linear_cross_entropy_chunks' pieces per op."""
    if isinstance(stats.get("auto"), dict):
        return _tempo_auto_rows(stats["auto"])
    if isinstance(stats.get("cost_model"), list):  # fuse_rnn's whole RNN calls
        return [f"      {c['call']}: cuDNN predicted {c['library_ms']:.2f} ms, fused "
                f"{c['fused_ms']:.2f} ms ({c['hardware']} profile): "
                f"{'cuDNN faster' if c['keep_library'] else 'fused faster'}"
                for c in stats["cost_model"]]
    if isinstance(stats.get("sizes"), list):  # fuse_linear_cross_entropy_chunks' ops
        return [_size_row(row) for row in stats["sizes"]]
    plan = stats.get("plan")
    tensors = (plan.get("extra") or {}).get("tensors") if isinstance(plan, dict) else None
    if not tensors:
        return []
    fits = "fits" if stats["feasible"] else "NOT reachable"
    if "saved_bytes_after" in stats:  # a fraction budget: bytes kept for backward
        share = (f"share {_mib(stats['share_bytes'])} MiB of the model's budget, graph "
                 f"{stats['model_graphs']}: the model keeps "
                 f"{_mib(stats['model_saved_bytes_after'])} of "
                 f"{_mib(stats['model_plain_saved_bytes'])} MiB so far"
                 + (f"; {', '.join(stats['model_replan'])} planned again with less at "
                    "their next call" if stats.get("model_replan") else "")
                 if "share_bytes" in stats else
                 f"bound {_mib(stats['target_saved_bytes'])} MiB")
        head = (f"      predicted saved bytes {_mib(stats['plain_saved_bytes'])} -> "
                f"{_mib(stats['saved_bytes_after'])} MiB ({share}, floor "
                f"{stats['floor_fraction']:.3f} = {_mib(stats['floor_bytes'])} MiB, {fits}; "
                f"{plan['solver']})")
    else:
        head = (f"      predicted peak {_mib(stats['peak_before'])} -> "
                f"{_mib(stats['peak_after'])} MiB (bound {_mib(stats['budget_bytes'])} MiB, "
                f"{fits}; {plan['solver']} ({plan['status'] or 'done'}) in "
                f"{plan['planning_seconds']:.3f} s; profile {plan['hardware']['name']})")
    lines = [head, f"      {'saved tensor':<28}{'action':<11}{'KiB':>10}{'added ms':>11}"]
    changed = [t for t in tensors if t["action"] != "keep"]
    lines += [f"      {t['tensor']:<28}{t['action']:<11}{t['bytes'] / 1024:>10.1f}"
              f"{t['seconds'] * 1e3:>11.4f}" for t in changed]
    kept = [t for t in tensors if t["action"] == "keep"]
    if kept:  # each row is in report.passes[i].stats["plan"]["extra"]["tensors"]
        lines.append(f"      {f'({len(kept)} others)':<28}{'keep':<11}"
                     f"{sum(t['bytes'] for t in kept) / 1024:>10.1f}{0:>11.4f}")
    return lines


def _size_row(row: dict[str, Any]) -> str:
    """One fused loss op's pieces: the default and the choice, the predicted peak against
    the bound, the predicted op time of both."""
    chosen = "pieces" if "block_bytes" not in row else (
        f"pieces, predicted peak {_mib(row['peak_bytes'])} MiB, op "
        f"{row['predicted_ms_default']:.3f} -> {row['predicted_ms']:.3f} ms")
    return (f"      {row['op']} ({row['form']}): {row['default_pieces']} -> {row['pieces']} "
            f"{chosen} (default's peak {_mib(row['peak_bytes_default'])} MiB, bound "
            f"{_mib(row['bound_bytes'])} MiB)")


def _render(report: ExplainReport) -> list[str]:
    non_default = {k: v for k, v in report.options.as_dict().items()
                   if v != getattr(Options(), k) and k != "memory_budget"}
    if report.options.memory_budget is not None:
        non_default["memory_budget"] = str(report.options.memory_budget)
    lines = [
        f"fxopt explain: {len(report.graphs)} graph(s), "
        f"{sum(b.count for b in report.graph_breaks)} graph break(s), "
        f"{'forward+backward' if report.ran_backward else 'forward only'}",
        f"options: {non_default or 'defaults'}",
    ]
    lines += [f"NOTE: {note}" for note in report.notes]
    lines += [f"  graph break ({b.count}x): {b.reason}" for b in report.graph_breaks]
    fallbacks = report.fallbacks
    lines.append(f"fallbacks: {len(fallbacks) or 'none'}")
    lines += [f"  FALLBACK: {f}" for f in fallbacks]
    width = max([19] + [len(r.name) + 2 for g in report.graphs for r in g.passes])
    header = (f"  {'stage':<13}{'graph':<11}{'pass':<{width}}{'status':<12}{'nodes':>11}"
              f"{'ms':>8}  {'peak MiB / activations MiB':<28}stats")
    for graph in report.graphs:
        lines.append("")
        lines.append(f"{graph.name}: Dynamo graph of {graph.dynamo_nodes} nodes, "
                     f"compiled in {graph.compile_seconds:.2f}s")
        lines.append(f"  code generation: {graph.codegen} ({graph.codegen.reason})")
        lines += [f"  FALLBACK: {f}" for f in graph.fallbacks]
        costs = [f"{kind} {c.flops / 1e6:,.1f} MFLOP, {c.bytes / 2**20:,.2f} MiB moved"
                 for kind, c in graph.cost.items() if c is not None]
        if costs:
            lines.append(f"  cost: {'; '.join(costs)}")
        for label, key in (("plain autograd", "autograd"), ("fxopt", "fxopt")):
            m = graph.memory.get(key)
            if m is not None:
                lines.append(f"  predicted memory, {label}: peak {_mib(m.peak_bytes)} MiB, "
                             f"activations kept for backward {_mib(m.activation_bytes)} MiB")
        lines += _peak_above_plain(graph)
        lines.append(header)
        for r in graph.passes:
            nodes = "" if r.nodes_before is None else f"{r.nodes_before}->{r.nodes_after or '-'}"
            detail = r.reason if r.status in ("skipped", "failed") else "; ".join(
                text for text in (_verdicts_text(r.verdicts), _stats_text(r.stats)) if text)
            lines.append(
                f"  {r.stage:<13}{r.graph.split('/')[-1]:<11}{r.name:<{width}}{r.status:<12}"
                f"{nodes:>11}{r.seconds * 1e3:>8.1f}  "
                f"{_memory_change(r.memory_before, r.memory_after):<28}{detail}")
            if r.ran:
                lines += _decline_rows(r.verdicts) + _plan_rows(r.stats)
    return lines


def _peak_above_plain(graph: GraphRecord) -> list[str]:
    """Why fxopt's predicted peak is above plain autograd's, with the numbers: the joint
    graph the passes before autograd left (their forms can hold more than autograd's) and
    what the joint passes made of it (swap_recompute never plans above the graph it is
    given, :mod:`fxopt.planner.solvers.fraction_peak`)."""
    plain, ours = graph.memory.get("autograd"), graph.memory.get("fxopt")
    if plain is None or ours is None or ours.peak_bytes <= plain.peak_bytes:
        return []
    above = f"  fxopt's peak is {_mib(ours.peak_bytes - plain.peak_bytes)} MiB above plain " \
            "autograd's"
    joint = next((r for r in graph.passes if r.stage == "joint" and r.memory_before), None)
    if joint is None or joint.memory_before.peak_bytes <= plain.peak_bytes:
        return [f"{above}: see the passes' peaks below"]
    before = [r.name for r in graph.passes if r.stage == "pre_autograd" and r.status == "changed"]
    return [f"{above}: the joint graph the passes before autograd left "
            f"({', '.join(before) or 'none changed it'}) peaks at "
            f"{_mib(joint.memory_before.peak_bytes)} MiB, and the joint passes took it to "
            f"{_mib(ours.peak_bytes)} MiB"]

