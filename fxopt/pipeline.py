"""The pass runner: the one place that does everything cross-cutting around a pass, and the
one capture of a training step (:func:`capture_step`: the pre-autograd passes, then
AOTAutograd's joint graph) that compilation, ``fxopt plan`` and explain share.

For each pass of a stage (in `fxopt.passes.PIPELINE` order) the runner decides whether it
runs (flag, default policy), gives it a private copy of the graph, times it,
lints and recompiles what it returns, refreshes missing fake values, predicts memory before
and after, tells the instruments (explain's recorder, the debug dumper) and, when the pass
raises, keeps the untouched graph and warns naming the pass and the graph (training goes on,
correct), or raises under ``strict``; an ``OptionError`` (an option the user gave that
cannot be honoured) always raises. Passes never do any of this themselves.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import torch.fx as fx

from fxopt import _compat
from fxopt.analysis.shapes import ensure_fake_values
from fxopt.config import OptionError
from fxopt.passes import PassContext, PassSpec, RewriteCounter, Stage, passes_for
from fxopt.passes.base import REMOVED_SAVED_BYTES, Verdicts
from fxopt.passes.fuse_linear_cross_entropy_returned import (
    ReturnedLogits,
    WithReturnedLogits,
    split_returned_logits,
)

if TYPE_CHECKING:
    from fxopt.analysis.memory import MemoryEstimate

__all__ = ["PassRecord", "Instrument", "PassFailure", "run_stage", "capture_step",
           "removed_saved_bytes"]

log = logging.getLogger(__name__)


class PassFailure(RuntimeError):
    """A pass raised (or produced an invalid graph) and ``strict=True`` was set."""


@dataclass
class PassRecord:
    """What happened to one pass on one graph; explain's rows and the debug index."""

    name: str
    stage: str
    graph: str
    status: str  # "changed" | "unchanged" | "skipped" | "failed"
    reason: str
    nodes_before: int | None = None
    nodes_after: int | None = None
    seconds: float = 0.0
    verdicts: Verdicts = field(default_factory=Verdicts)  # what it matched and declined
    stats: dict[str, Any] = field(default_factory=dict)   # the pass's own data (a plan)
    memory_before: MemoryEstimate | None = None
    memory_after: MemoryEstimate | None = None

    @property
    def ran(self) -> bool:
        return self.status in ("changed", "unchanged")

    @property
    def fired(self) -> bool:
        """True when the pass ran and changed the graph, or ran and reported a plan (an
        annotation pass plans without changing a node)."""
        return self.status == "changed" or (self.ran and self.stats.get("plan") is not None)


class Instrument(Protocol):
    """Observes the pipeline without changing it (explain's recorder, the debug dumper)."""

    def stage_started(self, ctx: PassContext, gm: fx.GraphModule) -> None: ...

    def pass_finished(self, record: PassRecord, before: fx.GraphModule,
                      after: fx.GraphModule) -> None: ...


def run_stage(stage: Stage, gm: fx.GraphModule, ctx: PassContext,
              records: list[PassRecord], instruments: tuple[Instrument, ...] = ()
              ) -> fx.GraphModule:
    """Run every pass of ``stage`` on ``gm``; returns the final graph module."""
    for instrument in instruments:
        _observe(instrument.stage_started, ctx, gm)
    memory = _LastEstimate(ctx)
    for spec in passes_for(stage):
        gm = _run_pass(spec, gm, ctx, records, instruments, memory)
    return gm


def capture_step(gm: fx.GraphModule, example_inputs: Sequence[Any], ctx: PassContext,
                 records: list[PassRecord] | None, instruments: tuple[Instrument, ...] = (),
                 *, traced: Callable[[fx.GraphModule], None] | None = None,
                 **aot: Callable[..., Any]) -> Any:
    """The one capture of a training step, shared by compilation, ``fxopt plan``'s capture
    and explain's plain baseline, so a new pre-autograd pass reaches all three with no
    edit: Dynamo's graph through the PRE_AUTOGRAD passes (:func:`run_stage`; ``records``
    None: none run, plain autograd) and the split of the logits they left only for the
    graph's output (:func:`split_returned_logits`, which adds outputs: the callable
    returned is wrapped to give the caller the graph's own), ``traced(gm)`` with the graph
    they leave, then AOTAutograd with compilation's flags for ``ctx.codegen``
    (:meth:`fxopt.codegen.Codegen.trace`; ``aot``: its partition and compilers)."""
    returned: list[ReturnedLogits] = []
    if records is not None:
        gm = run_stage(Stage.PRE_AUTOGRAD, gm, ctx, records, instruments)
        gm, returned = split_returned_logits(gm)
    if traced is not None:
        traced(gm)
    compiled = ctx.codegen.trace(gm, example_inputs, **aot)
    return WithReturnedLogits(compiled, returned) if returned else compiled


def removed_saved_bytes(records: list[PassRecord]) -> int:
    """Plain autograd's saved bytes the pre-autograd passes that fired took out of the
    graph (their ``REMOVED_SAVED_BYTES`` stat): a fraction's base keeps them."""
    return sum(r.stats.get(REMOVED_SAVED_BYTES, 0) for r in records
               if r.stage == Stage.PRE_AUTOGRAD.value and r.fired)


class _LastEstimate:
    """The memory prediction of the stage's current graph, computed once: a pass's
    'before' is the previous pass's 'after'. It holds the graph itself (not its id, which
    Python may reuse for a later graph once this one is freed)."""

    def __init__(self, ctx: PassContext) -> None:
        self._ctx = ctx
        self._graph: fx.GraphModule | None = None
        self._estimate: MemoryEstimate | None = None

    def __call__(self, gm: fx.GraphModule) -> MemoryEstimate | None:
        if gm is not self._graph:
            self._graph = gm
            try:
                self._estimate = self._ctx.estimate_memory(gm)
            except Exception:  # a prediction is a report, never a reason to stop training
                log.warning("fxopt: memory prediction failed on %s", self._ctx.graph_name,
                            exc_info=True)
                self._estimate = None
        return self._estimate


def _run_pass(spec: PassSpec, gm: fx.GraphModule, ctx: PassContext,
              records: list[PassRecord], instruments: tuple[Instrument, ...],
              memory: _LastEstimate) -> fx.GraphModule:
    enabled, reason = spec.decide(ctx)
    record = PassRecord(name=spec.name, stage=ctx.stage.value, graph=ctx.graph_name,
                        status="skipped", reason=reason)
    records.append(record)
    if not enabled:
        log.debug("fxopt: %s on %s: %s", spec.name, ctx.graph_name, reason)
        return gm

    limit = (ctx.options.rewrite_limit or {}).get(spec.name)
    pass_ctx = replace(ctx, rewrites=RewriteCounter(limit=limit))
    record.nodes_before = len(gm.graph.nodes)
    record.memory_before = memory(gm)
    start = time.perf_counter()
    try:
        work = _compat.copy_graph_module(gm)
        result = spec.run(work, pass_ctx)
        out = result.graph_module
        if result.modified:
            out.graph.lint()
            _check_interface(gm, out)
            if ctx.stage is not Stage.PRE_AUTOGRAD:  # Dynamo's graph needs no fake values
                ensure_fake_values(out)
            out.recompile()
    except OptionError:
        raise  # the user's explicit request cannot be honoured: never a silent fallback
    except Exception as exc:
        record.seconds = time.perf_counter() - start
        record.status, record.reason = "failed", f"{type(exc).__name__}: {exc}"
        message = (f"fxopt: pass {spec.name!r} failed on graph {ctx.graph_name} "
                   f"({record.reason})")
        if ctx.options.strict:
            raise PassFailure(message) from exc
        warnings.warn(f"{message}; graph {ctx.graph_name} runs without {spec.name} "
                      "(the pass is skipped, the graph unchanged). "
                      "Set options={'strict': True} to raise instead.", stacklevel=2)
        log.debug("fxopt: traceback of the failed pass", exc_info=True)
        return gm

    record.seconds = time.perf_counter() - start
    record.verdicts = result.verdicts
    record.stats = dict(result.stats)
    if pass_ctx.rewrites.limit is not None:
        record.stats["rewrites_refused_by_limit"] = pass_ctx.rewrites.refused
    record.status = "changed" if result.modified else "unchanged"
    record.nodes_after = len(out.graph.nodes)
    record.memory_after = memory(out) if result.modified else record.memory_before
    log.info("fxopt: %s on %s: %s in %.3fs, nodes %d -> %d", spec.name, ctx.graph_name,
             record.status, record.seconds, record.nodes_before, record.nodes_after)
    for decline in result.verdicts.declined:  # the "why not" of each site, on request
        log.debug("fxopt: %s on %s declined %s: %s", spec.name, ctx.graph_name,
                  decline.site, decline.reason)
    for instrument in instruments:
        _observe(instrument.pass_finished, record, gm, out)
    # a pass that neither changed the graph nor planned hands on the graph it was given:
    # the compiler reads an untouched Dynamo graph as plain autograd's
    return out if record.fired else gm


def _interface(gm: fx.GraphModule) -> tuple[list[str], int | None]:
    placeholders = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    outputs = gm.graph.find_nodes(op="output")
    if len(outputs) != 1:
        return placeholders, None
    value = outputs[0].args[0]
    return placeholders, len(value) if isinstance(value, (tuple, list)) else 1


def _check_interface(before: fx.GraphModule, after: fx.GraphModule) -> None:
    """A pass must keep the graph's inputs and its number of outputs (README rule 4):
    AOTAutograd and the caller depend on them, and lint does not check it."""
    (inputs_before, outputs_before), (inputs_after, outputs_after) = (
        _interface(before), _interface(after))
    if inputs_after != inputs_before:
        raise ValueError(f"the pass changed the graph's inputs: {inputs_before} -> "
                         f"{inputs_after}")
    if outputs_after != outputs_before:
        raise ValueError(f"the pass changed the graph's outputs: {outputs_before} -> "
                         f"{outputs_after} values")


def _observe(method: Any, *args: Any) -> None:
    """Instruments observe; a failing one is logged and never stops compilation."""
    try:
        method(*args)
    except Exception:
        log.warning("fxopt: instrument %r failed", method, exc_info=True)
