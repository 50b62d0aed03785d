"""``tempo="auto"``: rewrite only the tempo site kinds that pay under the memory budget.

Tempo trades gradient accuracy and time for memory, so under ``tempo="auto"`` (which needs
``memory_budget``) the planner decides per site kind (GELU, LayerNorm, RMSNorm,
attention softmax-dropout) instead of the user. :func:`choose_sites`:

1. finds the kinds this graph has (the sites tempo would rewrite);
2. for every subset of them (``2**k`` variants, ``()`` included), rewrites a copy of the
   Dynamo graph, traces its joint graph as compilation does (AOTAutograd, same flags, no
   code generated) and builds its problem (:func:`fxopt.planner.joint.step_problem`);
3. lets :func:`fxopt.planner.search.choose_tempo` plan each variant exactly as the
   ``swap_recompute`` pass will (same budget, same solver, a copy of the model's budget
   ledger) and take the fastest variant that meets the budget, exact ties to fewer kinds.

A fraction holds each variant to ``f`` of its own graph's plain saved bytes (what the pass
then does), which for a tempo variant are below plain autograd's: the budget holds as
measured against eager's, at the price of asking a little more of tempo's variants.

Cost at compile time: one AOTAutograd trace and one plan per variant, e.g. 8 for a
transformer with GELU, LayerNorm and attention sites; explain's stats carry the
candidates' table and the seconds the search took (``auto.seconds``).
"""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Sequence
from typing import Any

from torch import fx

from fxopt import _compat
from fxopt.codegen import Codegen, as_codegen
from fxopt.passes.base import PassContext, RewriteCounter
from fxopt.planner import profile_for
from fxopt.planner.joint import step_problem
from fxopt.planner.search import choose_tempo, quiet_plan
from fxopt.planner.step import StepProblem

__all__ = ["choose_sites", "tempo_variants", "trace_joint"]


def trace_joint(gm: fx.GraphModule, example_inputs: Sequence[Any], *,
                codegen: Codegen | str = "fx") -> tuple[fx.GraphModule, int]:
    """The joint graph AOTAutograd builds for ``gm`` (a copy is traced) and its number of
    forward outputs, with compilation's flags (:meth:`fxopt.codegen.Codegen.trace`; the
    pre-autograd stage is where this runs, so no pre-autograd pass runs again); nothing is
    compiled or run."""
    found: list[tuple[fx.GraphModule, int]] = []

    def partition(joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int,
                  **kwargs: Any) -> Any:
        found.append((joint, num_fwd_outputs))
        return _compat.default_partition(joint, joint_inputs,
                                         num_fwd_outputs=num_fwd_outputs, **kwargs)

    as_codegen(codegen).trace(_compat.copy_graph_module(gm), example_inputs, partition=partition)
    if not found:
        raise ValueError("fxopt: tempo='auto' found no joint graph (no input requires grad)")
    return found[0]


def tempo_variants(gm: fx.GraphModule, example_inputs: Sequence[Any], hardware: Any, *,
                   codegen: Codegen | str = "fx", name: str = "", kinds: Sequence[str] | None = None
                   ) -> dict[tuple[str, ...], StepProblem]:
    """Each subset of the tempo site kinds of ``gm`` (``kinds``: those to try, default all
    it has) -> the step problem of ``gm`` with those kinds rewritten (in the form the pass
    uses under ``codegen``: the aten-only one under Inductor)."""
    from fxopt.passes.tempo import rewrite_sites

    codegen = as_codegen(codegen)
    if kinds is None:
        probe = _compat.copy_graph_module(gm)
        kinds = sorted(rewrite_sites(probe, RewriteCounter()).matched)
    variants = {}
    for size in range(len(kinds) + 1):
        for subset in itertools.combinations(sorted(kinds), size):
            variant = _compat.copy_graph_module(gm)
            if subset:
                rewrite_sites(variant, RewriteCounter(), set(subset),
                              fusible=codegen.fuses_pointwise)
            joint, outputs = trace_joint(variant, example_inputs, codegen=codegen)
            variants[subset] = step_problem(joint, outputs, hardware, codegen=codegen,
                                            name=name)[1]
    return variants


def choose_sites(gm: fx.GraphModule, ctx: PassContext) -> dict[str, Any]:
    """The tempo kinds to rewrite in ``gm`` under ``ctx``'s budget, and the search's table
    (the pass's ``stats["auto"]``)."""
    began = time.perf_counter()
    options = ctx.options
    if options.memory_budget is None:  # Options refuses it; a direct caller may not
        raise ValueError("fxopt: tempo='auto' decides under a memory budget; set "
                         "memory_budget too (e.g. 0.5 or '6GiB')")
    from fxopt.passes.tempo import rewrite_sites

    kinds = sorted(rewrite_sites(_compat.copy_graph_module(gm), RewriteCounter()).matched)
    if not kinds:  # nothing to decide: no trace, no plan
        return {"taken": [], "reason": "no tempo site in this graph", "candidates": [],
                "seconds": time.perf_counter() - began}
    hardware = profile_for(ctx.device)
    variants = tempo_variants(gm, ctx.example_inputs, hardware, codegen=ctx.codegen,
                              name=ctx.graph_name.rsplit("/", 1)[0] + "/joint", kinds=kinds)
    solver = "milp" if options.planner_enabled else "delta"

    def plan(problem: StepProblem) -> Any:
        ledger = copy.deepcopy(ctx.budget_ledger)  # the pass will plan with the real one
        return quiet_plan(problem, options.memory_budget, hardware, solver=solver,
                          ledger=ledger)

    choice = choose_tempo(variants, options.memory_budget, hardware, plan=plan)
    out = choice.to_dict()
    out["seconds"] = time.perf_counter() - began
    return out
