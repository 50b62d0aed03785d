"""The torch.compile entry point: options in, a compiled callable out.

``torch.compile(model, backend="fxopt", options={...})`` finds :func:`fxopt_backend` through
the ``torch_dynamo_backends`` entry point (no import of fxopt needed); ``fxopt.backend(...)``
returns a :class:`Backend` with fixed options that also remembers what it compiled.

Per Dynamo graph (one per graph break) the stages run in order:

    Dynamo graph -> PRE_AUTOGRAD passes -> AOTAutograd: joint graph -> JOINT passes
      -> partition (fx: saves what autograd saves; inductor: min-cut) -> FORWARD passes
      -> code generation; later, at the first backward: BACKWARD passes -> code generation

An inference graph (no input needs grad, e.g. under ``torch.no_grad``) goes through the
FORWARD passes. Code generation is fx's own Python (boxed, so inputs are freed at their last
use) or Inductor's per-graph compiler.
"""

from __future__ import annotations

import itertools
import logging
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.fx as fx

from fxopt import _compat, config
from fxopt.analysis.cost import GraphCost, graph_cost
from fxopt.analysis.memory import (
    MemoryEstimate,
    estimate_forward_memory,
    estimate_joint_memory,
    estimate_step_memory,
)
from fxopt.codegen import FX, Codegen, graph_device, peak_target, resolve_codegen
from fxopt.config import Options
from fxopt.passes import PIPELINE, GraphKind, PassContext, Stage
from fxopt.passes.base import ACTIVATION_INPUTS, REMOVED_SAVED_BYTES, activation_inputs
from fxopt.passes.torch_calls import example_value
from fxopt.pipeline import (
    Instrument,
    PassFailure,
    PassRecord,
    capture_step,
    removed_saved_bytes,
    run_stage,
)
from fxopt.planner.ledger import BudgetLedger, Replannable
from fxopt.planner.plan import load_plans
from fxopt.planner.size_watch import SizeWatch, traced_sizes

__all__ = ["Backend", "GraphRecord", "StrictCompileError", "backend", "fxopt_backend"]

log = logging.getLogger(__name__)

_graph_ids = itertools.count()
T = TypeVar("T")


class StrictCompileError(RuntimeError):
    """Under ``strict=True`` a graph failed to compile while Dynamo's ``suppress_errors``
    was set: raised when the graph runs, where Dynamo cannot swallow it."""


@dataclass
class GraphRecord:
    """What fxopt did to one Dynamo graph: explain's and the tests' source of truth.

    ``graphs`` holds the final graph module per kind ("dynamo", "joint", "forward",
    "backward" or "inference"); ``memory`` the predicted step memory of plain autograd
    ("autograd": the joint graph of Dynamo's graph without any fxopt pass; absent when a
    pre-autograd pass changed the graph and the backend was not asked to trace the plain
    graph as well, see :class:`Backend`) and of what fxopt runs ("fxopt", once the
    backward is compiled, or the inference graph); ``cost`` the FLOPs and bytes moved of
    each final forward/backward/inference graph.
    """

    name: str
    options: Options
    dynamo_nodes: int = 0
    passes: list[PassRecord] = field(default_factory=list)
    graphs: dict[str, fx.GraphModule] = field(default_factory=dict)
    memory: dict[str, MemoryEstimate | None] = field(default_factory=dict)
    cost: dict[str, GraphCost | None] = field(default_factory=dict)
    compile_seconds: float = 0.0
    codegen: Codegen = FX  # the code generator, resolved once, and why (codegen.reason)
    # what runs with less than was asked, and why: the graph uncompiled, a graph without
    # Inductor; failed passes are in ``passes`` (see every_fallback)
    fallbacks: list[str] = field(default_factory=list)
    # the sizes (symbol -> size) a byte budget's graph was planned again at, after a larger
    # call (SizeWatch); empty: planned at the sizes Dynamo traced
    planned_at: dict[str, int] = field(default_factory=dict)

    @property
    def fallback(self) -> str | None:
        """The compiler's fallbacks of this graph as one line (None: there was none)."""
        return "; ".join(self.fallbacks) or None

    def every_fallback(self) -> list[str]:
        """Every fallback on this graph: the compiler's, then each pass that failed (and was
        skipped)."""
        passes = [f"pass {r.name!r} on {r.graph} {r.status}: {r.reason}" for r in self.passes
                  if r.status == "failed"]
        return self.fallbacks + passes

    def pass_records(self, name: str) -> list[PassRecord]:
        return [r for r in self.passes if r.name == name]


class Backend:
    """A torch.compile backend with fixed options: ``torch.compile(m, backend=Backend(...))``.

    Options are validated here (errors surface at once, not at the first call) and
    resolved again at each compilation so that an active :func:`fxopt.config.patch`
    applies. ``graphs`` lists a :class:`GraphRecord` per compiled Dynamo graph.

    ``plain_baseline=True`` (explain uses it) also traces Dynamo's graph through
    AOTAutograd without fxopt's passes whenever a pre-autograd pass changed it, so that
    ``memory["autograd"]`` is plain autograd's and not the pre-autograd passes' result; it
    costs one more AOTAutograd trace per such graph, hence off for ordinary compilation.

    A fraction ``memory_budget`` is the model's: the graphs this backend compiles share it
    through one :class:`~fxopt.planner.ledger.BudgetLedger` (``budget_ledger``), so use
    one backend per model.
    """

    def __init__(self, options: Mapping[str, Any] | None = None, mode: str | None = None,
                 *, instruments: Sequence[Instrument] = (), plain_baseline: bool = False
                 ) -> None:
        _resolve(options, mode)
        self._options = dict(options or {})
        self._mode = mode
        self._instruments = tuple(instruments)
        self._plain_baseline = plain_baseline
        self.graphs: list[GraphRecord] = []
        self.budget_ledger = BudgetLedger(replans=True)

    def __repr__(self) -> str:  # Dynamo's error messages name the backend with this
        arguments = [f"{k}={v!r}" for k, v in self._options.items()]
        if self._mode is not None:
            arguments.append(f"mode={self._mode!r}")
        return f"fxopt.backend({', '.join(arguments)})"

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any],
                 **kwargs: Any) -> Callable[..., Any]:
        unknown = set(kwargs) - {"options", "mode"}
        if unknown:
            raise TypeError(f"fxopt backend got unexpected arguments {sorted(unknown)}")
        options = {**self._options, **(kwargs.get("options") or {})}
        resolved = _resolve(options, kwargs.get("mode", self._mode))
        compiler = _GraphCompiler(resolved, f"g{next(_graph_ids)}", self._instruments,
                                  self._plain_baseline, self.budget_ledger)
        self.graphs.append(compiler.record)
        self.budget_ledger.begin(_compat.dynamo_frame_id())
        entries = len(self.budget_ledger.shares)
        try:
            compiled = compiler.compile(gm, example_inputs)
            index = len(self.graphs) - 1
            if len(self.budget_ledger.shares) == entries + 1:  # a share of the budget
                recompile = self._replanner(gm, resolved, index, entries)
                return Replannable(compiled, self.budget_ledger, entries,
                                   lambda inputs: recompile(inputs)[0])
            return self._watched(compiled, compiler, gm, example_inputs, index)
        except Exception as exc:
            if _compat.is_dynamo_protocol_error(exc):
                # Dynamo compiles the frame again (a float it had made symbolic is
                # specialized: "Restarting analysis") or runs it eagerly: this compile made
                # no graph, and its record would show one that never runs
                self.graphs.remove(compiler.record)
                raise
            if not resolved.strict or not _compat.dynamo_suppresses_errors():
                raise
            return _raise_when_run(compiler.record.name, exc)

    def _replanner(self, gm: fx.GraphModule, options: Options, index: int,
                   entry: int | None = None
                   ) -> Callable[..., tuple[Callable[..., Any], _GraphCompiler]]:
        """Compile graph ``index`` again, on the values Dynamo traced it with, in a tracing
        context like Dynamo's, so a graph of symbolic sizes stays symbolic
        (``dynamic=True``: on the call's inputs the size symbols became the call's ints, and
        the recompile failed); a graph Dynamo did not trace, on the call's inputs. For its
        ledger ``entry``, planned within a smaller share
        (:class:`~fxopt.planner.ledger.Replannable`); with ``planned_sizes`` (symbol ->
        size), planned at those sizes (:class:`~fxopt.planner.size_watch.SizeWatch`).
        Returns the compiled graph and its compiler."""
        # what Dynamo traced each input with: fake tensors (with their size symbols) and
        # SymInts, which hold no memory, unlike a step's real inputs (a loss graph's logits)
        traced: list[Any] | None = [example_value(p)
                                    for p in gm.graph.find_nodes(op="placeholder")]
        if any(value is None for value in traced):
            traced = None

        def recompile(inputs: list[Any], planned_sizes: dict[str, int] | None = None
                      ) -> tuple[Callable[..., Any], _GraphCompiler]:
            name = self.graphs[index].name
            compiler = _GraphCompiler(options, name, self._instruments, self._plain_baseline,
                                      self.budget_ledger, planned_sizes)
            self.budget_ledger.replanning = entry
            try:
                if traced is None:
                    compiled = compiler.compile(gm, inputs)
                else:
                    with _compat.tracing_again(traced):
                        compiled = compiler.compile(gm, traced)
            finally:
                self.budget_ledger.replanning = None
            self.graphs[index] = compiler.record
            return compiled, compiler
        return recompile

    def _watched(self, compiled: Callable[..., Any], compiler: _GraphCompiler,
                 gm: fx.GraphModule, example_inputs: Sequence[Any], index: int
                 ) -> Callable[..., Any]:
        """A graph of symbolic sizes planned within a byte budget, wrapped to be planned
        again at a larger call whose predicted peak passes the budget
        (:class:`~fxopt.planner.size_watch.SizeWatch`); any other graph as compiled."""
        budget = compiler.options.memory_budget
        if budget is None or budget.bytes is None:
            return compiled
        bound = peak_target(budget.bytes, compiler.codegen.peak_margin)
        planned = _planned_peak(compiler.record)
        sizes = traced_sizes(gm, example_inputs)
        if planned is None or planned > bound or not sizes:  # no plan, or one that warned
            return compiled
        recompile = self._replanner(gm, compiler.options, index)

        def predict(planned_sizes: dict[str, int]) -> int | None:
            record = self.graphs[index]  # as compiled now, planned again or not
            forward, backward = record.graphs.get("forward"), record.graphs.get("backward")
            if forward is None or backward is None:
                return None
            with _compat.sizes_planned_at(planned_sizes):
                estimate = _report_only(lambda fw: estimate_step_memory(
                    fw, backward, codegen=record.codegen), forward)
            return None if estimate is None else estimate.peak_bytes

        def replan(inputs: list[Any], planned_sizes: dict[str, int]
                   ) -> tuple[Callable[..., Any], int | None]:
            again, again_compiler = recompile(inputs, planned_sizes)
            return again, _planned_peak(again_compiler.record)

        return SizeWatch(compiled, compiler.record.name, budget.bytes, bound, sizes, predict,
                         replan)


def _planned_peak(record: GraphRecord) -> int | None:
    """The step peak the byte budget's plan of a graph predicts (None: no plan made)."""
    return next((r.stats["peak_after"] for r in record.pass_records("swap_recompute")
                 if r.stats.get("peak_after") is not None), None)


def backend(**options: Any) -> Backend:
    """``torch.compile(model, backend=fxopt.backend(tempo=True))``: same as the string
    backend with ``options={...}``, validated immediately."""
    return Backend(options)


def fxopt_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *,
                  options: Mapping[str, Any] | None = None,
                  mode: str | None = None) -> Callable[..., Any]:
    """The ``torch_dynamo_backends`` entry point (``backend="fxopt"``)."""
    return Backend(options, mode)(gm, example_inputs)


def _raise_when_run(graph: str, exc: Exception) -> Callable[..., Any]:
    """The compiled function of a graph that failed under ``strict=True`` while Dynamo's
    ``suppress_errors`` is set: Dynamo would log the error and run the frame eagerly, the
    silent fallback strict forbids, so the error is raised when the graph runs instead
    (Dynamo does not catch errors raised at run time)."""
    message = (f"fxopt: graph {graph} failed to compile and strict=True is set "
               f"(Dynamo's suppress_errors=True would have run it uncompiled): "
               f"{type(exc).__name__}: {exc}")
    log.error("%s", message)

    def failed(*args: Any, **kwargs: Any) -> Any:
        raise StrictCompileError(message) from exc

    return failed


def _resolve(options: Mapping[str, Any] | None, mode: str | None) -> Options:
    """:func:`fxopt.config.resolve` plus the checks that need the passes and the planner:
    every pass named in ``rewrite_limit`` exists, and the ``plan`` file is a plan. Both are
    the user's explicit request, so they raise here rather than warn in the pass."""
    resolved = config.resolve(options, mode)
    config.check_names(resolved.rewrite_limit or {}, [spec.name for spec in PIPELINE],
                       "pass", "rewrite_limit")
    if resolved.plan is not None:
        load_plans(resolved.plan)
    return resolved


def _debug_instruments(options: Options) -> tuple[Instrument, ...]:
    if options.debug_dir is None:
        return ()
    from fxopt.debug.dump import DebugDump

    return (DebugDump(options.debug_dir),)


class _GraphCompiler:
    """Compiles one Dynamo graph: runs the stages and keeps the record."""

    def __init__(self, options: Options, name: str, instruments: tuple[Instrument, ...],
                 plain_baseline: bool = False, budget_ledger: BudgetLedger | None = None,
                 planned_sizes: dict[str, int] | None = None) -> None:
        self.options = options
        self.plain_baseline = plain_baseline
        self.budget_ledger = budget_ledger
        # planned_at: symbol -> size to plan at instead of the trace's (for the compile and
        # the lazily compiled backward)
        self.record = GraphRecord(name=name, options=options, planned_at=planned_sizes or {})
        self.instruments = instruments + _debug_instruments(options)
        self.device = torch.device("cpu")
        self.codegen = FX  # resolved for the graph's device in compile()
        self._partitioned_backward: fx.GraphModule | None = None
        self.num_fwd_outputs: int | None = None  # the joint graph's, once partitioned
        self._activation_inputs: tuple[tuple[int, ...], int] = ((), 0)
        # the Dynamo graph's outputs: Inductor keeps their strides
        self._model_outputs: int | None = None

    def compile(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        start = time.perf_counter()
        self.device = graph_device(example_inputs)
        self.codegen = self.record.codegen = resolve_codegen(self.options, self.device)
        self.record.dynamo_nodes = len(gm.graph.nodes)
        try:
            with _compat.sizes_planned_at(self.record.planned_at):
                compiled = self._compile_stages(gm, example_inputs)
        except (PassFailure, config.OptionError):
            raise  # strict, or an option that cannot be honoured: already explained
        except Exception as exc:
            # fxopt's own machinery (AOTAutograd tracing, a partitioner, a code generator)
            # failed: run the graph as Dynamo captured it, which is eager and correct.
            if self.options.strict or _compat.is_dynamo_protocol_error(exc):
                raise
            lost = (f"graph {self.record.name} runs uncompiled (eager: no fxopt pass and "
                    f"no code generation apply): {type(exc).__name__}: {exc}")
            self._fall_back(lost, stacklevel=4)
            log.debug("fxopt: traceback of the failed compilation", exc_info=True)
            compiled = gm.forward
        self.record.compile_seconds += time.perf_counter() - start
        return compiled

    def _compile_stages(self, gm: fx.GraphModule, example_inputs: Sequence[Any]
                        ) -> Callable[..., Any]:
        ctx = self._context(Stage.PRE_AUTOGRAD, GraphKind.DYNAMO, example_inputs)
        self._activation_inputs = (activation_inputs(example_inputs), len(example_inputs))
        plain = gm

        def traced(gm: fx.GraphModule) -> None:
            self.record.graphs["dynamo"] = gm
            # with the returned logits' h (fuse_linear_cross_entropy_returned)
            self._model_outputs = len(_compat.tree_leaves(
                next(iter(gm.graph.find_nodes(op="output"))).args))
            if gm is not plain:  # a pre-autograd pass changed it: the joint is not plain
                self.record.memory["autograd"] = (
                    _report_only(_plain_joint_memory(example_inputs, ctx), plain)
                    if self.plain_baseline else None)

        return capture_step(gm, example_inputs, ctx, self.record.passes, self.instruments,
                            traced=traced, partition=self._partition,
                            fw_compiler=self._compile_forward,
                            bw_compiler=self._compile_backward,
                            inference_compiler=self._compile_inference)

    def _context(self, stage: Stage, kind: GraphKind, example_inputs: Sequence[Any],
                 estimate: Callable[[fx.GraphModule], MemoryEstimate | None] | None = None,
                 **facts: Any) -> PassContext:
        return PassContext(
            options=self.options, stage=stage, graph_kind=kind,
            graph_name=f"{self.record.name}/{kind.value}", device=self.device,
            example_inputs=tuple(example_inputs),
            estimate_memory=estimate or (lambda gm: None), facts=dict(facts),
            budget_ledger=self.budget_ledger, codegen=self.codegen)

    # AOTAutograd calls the methods below.

    def _partition(self, joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int,
                   **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
        def estimate(gm: fx.GraphModule) -> MemoryEstimate:
            return estimate_joint_memory(gm, num_fwd_outputs)

        self.num_fwd_outputs = num_fwd_outputs
        self.record.memory.setdefault("autograd", _report_only(estimate, joint))
        removed = removed_saved_bytes(self.record.passes)
        ctx = self._context(Stage.JOINT, GraphKind.JOINT, (), estimate,
                            num_fwd_outputs=num_fwd_outputs, **{REMOVED_SAVED_BYTES: removed,
                                                                ACTIVATION_INPUTS:
                                                                self._activation_inputs})
        joint = run_stage(Stage.JOINT, joint, ctx, self.record.passes, self.instruments)
        self.record.graphs["joint"] = joint
        forward, backward = self.codegen.partitioner(
            joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
        self._partitioned_backward = backward
        self._joint_passes_memory_after(forward, backward)
        return forward, backward

    def _fall_back(self, lost: str, stacklevel: int) -> None:
        """Record and warn what runs with less than was asked (``lost``); under ``strict``
        the caller raised instead."""
        self.record.fallbacks.append(lost)
        warnings.warn(f"fxopt: {lost}. Set options={{'strict': True}} to raise instead.",
                      stacklevel=stacklevel)

    def _joint_passes_memory_after(self, forward: fx.GraphModule,
                                      backward: fx.GraphModule) -> None:
        """A joint pass that changed the graph changed it through tags the partitioner
        reads (recompute, swaps), which the joint graph's own simulation cannot see: its
        "after" is the partitioned step's simulation, so explain's columns agree with the
        plan's rows."""
        changed = [r for r in self.record.passes if r.stage == Stage.JOINT.value
                   and r.status == "changed"]
        if changed:
            codegen = self.codegen
            after = _report_only(
                lambda fw: estimate_step_memory(fw, backward, codegen=codegen), forward)
            for record in changed:
                record.memory_after = after

    def _compile_forward(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        backward, codegen = self._partitioned_backward, self.codegen

        def estimate(g: fx.GraphModule) -> MemoryEstimate | None:
            return (None if backward is None
                    else estimate_step_memory(g, backward, codegen=codegen))

        ctx = self._context(Stage.FORWARD, GraphKind.FORWARD, example_inputs, estimate)
        return self._finish(Stage.FORWARD, gm, ctx, example_inputs)

    def _compile_backward(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        start = time.perf_counter()
        forward, codegen = self.record.graphs.get("forward"), self.codegen

        def estimate(g: fx.GraphModule) -> MemoryEstimate | None:
            return (None if forward is None
                    else estimate_step_memory(forward, g, codegen=codegen))

        ctx = self._context(Stage.BACKWARD, GraphKind.BACKWARD, example_inputs, estimate)
        with _compat.sizes_planned_at(self.record.planned_at):  # compiled at the first backward
            compiled = self._finish(Stage.BACKWARD, gm, ctx, example_inputs)
            self.record.memory["fxopt"] = _report_only(estimate,
                                                         self.record.graphs["backward"])
        self.record.compile_seconds += time.perf_counter() - start
        return compiled

    def _compile_inference(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        ctx = self._context(Stage.FORWARD, GraphKind.INFERENCE, example_inputs,
                            estimate_forward_memory)
        compiled = self._finish(Stage.FORWARD, gm, ctx, example_inputs)
        self.record.memory["fxopt"] = _report_only(estimate_forward_memory,
                                                     self.record.graphs["inference"])
        return compiled

    def _finish(self, stage: Stage, gm: fx.GraphModule, ctx: PassContext,
                example_inputs: Sequence[Any]) -> Any:
        gm = run_stage(stage, gm, ctx, self.record.passes, self.instruments)
        self.record.graphs[ctx.graph_kind.value] = gm
        self.record.cost[ctx.graph_kind.value] = _report_only(graph_cost, gm)
        if self.codegen.compiles_by_inductor:
            try:
                return self._inductor(stage, _compat.copy_graph_module(gm), ctx, example_inputs)
            except Exception as exc:
                if self.options.strict or _compat.is_dynamo_protocol_error(exc):
                    raise
                lost = (f"graph {ctx.graph_name} runs without Inductor (fx code generation, "
                        f"unfused): Inductor failed: {type(exc).__name__}: {exc}")
                self._fall_back(lost, stacklevel=3)
                log.debug("fxopt: traceback of the Inductor failure", exc_info=True)
        return _compat.boxed_fx_callable(gm)

    def _inductor(self, stage: Stage, gm: fx.GraphModule, ctx: PassContext,
                  example_inputs: Sequence[Any]) -> Any:
        """Inductor's code generation, on a copy: it rewrites the graph it is given, and
        a failure must leave fxopt's graph intact for the fx fallback.

        Under a ``memory_budget`` Inductor's conv layout optimization is off: it
        converts a convolution's input and weight to channels-last copies in the forward
        and keeps those copies for the backward, bytes no partition can recompute or see
        (measured on a tiny ViT at 0.5: 0.685 of eager's saved bytes kept with it, 0.478
        without; a tiny ResNet 0.533 against 0.310)."""
        inference = ctx.graph_kind is GraphKind.INFERENCE
        if inference:
            gm = _compat.inductor_inference_passes(gm)
        return _compat.inductor_compile(
            gm, example_inputs, is_backward=stage is Stage.BACKWARD, is_inference=inference,
            max_autotune=self.options.inductor_max_autotune,
            layout_optimization=self.options.memory_budget is None,
            model_outputs=self._model_outputs)


def _plain_joint_memory(example_inputs: Sequence[Any], ctx: PassContext
                        ) -> Callable[[fx.GraphModule], MemoryEstimate | None]:
    """Plain autograd's predicted step memory of a Dynamo graph: captured as fxopt's own
    compilation captures it (:func:`~fxopt.pipeline.capture_step`, its flags for
    ``ctx.codegen``) but with no pre-autograd pass; nothing compiled is kept."""
    def plain_joint_memory(gm: fx.GraphModule) -> MemoryEstimate | None:
        found: list[MemoryEstimate] = []

        def partition(joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int,
                      **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
            found.append(estimate_joint_memory(joint, num_fwd_outputs))
            return _compat.default_partition(joint, joint_inputs,
                                             num_fwd_outputs=num_fwd_outputs, **kwargs)

        capture_step(_compat.copy_graph_module(gm), example_inputs, ctx, None, partition=partition)
        return found[0] if found else None

    return plain_joint_memory


def _report_only(analysis: Callable[[fx.GraphModule], T], gm: fx.GraphModule) -> T | None:
    """Predictions feed reports; an analysis that fails is logged, never raised."""
    try:
        return analysis(gm)
    except Exception:
        log.warning("fxopt: %s failed", getattr(analysis, "__name__", "analysis"),
                    exc_info=True)
        return None
