"""swap_recompute: keep, recompute or swap each saved activation, under ``memory_budget``.

At the JOINT stage (AOTAutograd's joint forward+backward graph, before the partitioner):

1. :func:`fxopt.planner.joint.step_problem` builds the step's problem (plain data) from the
   graph: per saved tensor a ``recompute`` choice and, on CUDA (or with ``force_swap``,
   which offers only swapping) a ``swap`` choice, and the fraction budget's saved-bytes
   problem;
2. :func:`fxopt.planner.plan_step`, the one way a plan is made (``fxopt plan`` calls it
   too), decides: the MILP with the planner on (the default with a budget), the greedy
   solver's DELTA mode with ``planner=False``, or a saved plan (``plan``) replayed as saved
   on the graph its fingerprint names. What each budget bounds, the floor, the warnings
   and what ``strict`` raises are :mod:`fxopt.planner.step`'s;
3. the plan is applied: a fraction plan tags its recompute chains ``MUST_RECOMPUTE`` for
   the partitioner (random ops with fx code generation: AOTAutograd's default partitioner
   replays their RNG state, so every gradient is the forward's bit for bit); a byte plan
   is rewritten by :mod:`.apply` (recompute tags, swap ops), and the compiler places the
   prefetches in the backward. Under ``codegen="inductor"`` a fraction is met by Inductor's
   budgeted min-cut instead, within the graph's share (:mod:`.inductor_budget`; the plan's
   tags are its fallback), random ops replayed exactly there too.

Two rewrites run before autograd under the same flag: ``noop_dropout``
(:mod:`fxopt.passes.noop_dropout`) drops dropout calls that return their input, so the plain
saved bytes a fraction is taken of are eager's; ``recompute_rnn``
(:mod:`fxopt.passes.recompute_rnn`) makes each whole ``nn.LSTM`` / ``nn.GRU`` call the
library's fused RNN that saves only its inputs and runs again in the backward; it reports a
lower bound of the saved bytes it took out of the graph, which a fraction's base adds back
(``removed_bytes``), so the fraction stays one of eager's bytes.

A fraction is the model's: the graphs one backend compiles share it, each planned within
what the graphs before it left (:mod:`fxopt.planner.ledger`; ``stats["share_bytes"]``).
A step that already fits is left unchanged (``stats["fits"]``). On a CPU device swapping
frees nothing, so only recompute is offered unless ``force_swap`` is set.
"""

from __future__ import annotations

import logging

import torch.fx as fx

from fxopt import _compat
from fxopt.analysis import estimate_partitioned_memory
from fxopt.codegen import Codegen
from fxopt.config import MemoryBudget
from fxopt.passes.base import (
    ACTIVATION_INPUTS,
    REMOVED_SAVED_BYTES,
    PassContext,
    PassResult,
    Verdicts,
)
from fxopt.passes.swap_recompute.apply import (
    SWAP_OPS,
    apply_decision,
    mark_recompute,
    place_prefetches,
)
from fxopt.passes.swap_recompute.inductor_budget import BudgetedMinCut
from fxopt.planner import InfeasibleBudget, Plan, StepProblem, plan_step, profile_for
from fxopt.planner.joint import (
    JointAnalysis,
    activation_placeholders,
    group_chain,
    step_problem,
)
from fxopt.planner.plan import load_plans, plan_for_graph

__all__ = ["swap_recompute", "InfeasibleBudget", "place_prefetches", "predict_plan_peak",
           "SWAP_OPS"]

log = logging.getLogger(__name__)


def swap_recompute(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    budget = ctx.options.memory_budget
    saved_plans = load_plans(ctx.options.plan) if ctx.options.plan is not None else None
    if budget is None and saved_plans is None:
        return PassResult.declined_graph(gm, "no memory_budget set: nothing to bound")
    profile = profile_for(ctx.device)
    inputs = activation_placeholders(gm, *ctx.facts.get(ACTIVATION_INPUTS, ((), 0)))
    analysis, problem = step_problem(gm, ctx.facts["num_fwd_outputs"], profile,
                                     codegen=ctx.codegen,
                                     force_swap=ctx.options.force_swap, name=ctx.graph_name,
                                     removed_bytes=ctx.facts.get(REMOVED_SAVED_BYTES, 0),
                                     activation_inputs=inputs)
    ledger = ctx.budget_ledger  # its graphs so far: this graph's place in the model
    saved_plan = (plan_for_graph(saved_plans, list(problem.fingerprint),
                                 len(ledger.shares) if ledger is not None else None)
                  if saved_plans is not None else None)
    plan = plan_step(problem, budget, profile,
                     solver="milp" if ctx.options.planner_enabled else "delta",
                     replay=saved_plan, strict=ctx.options.strict,
                     ledger=ledger)
    fraction = "fraction" in plan.extra
    if fraction and partitions_by_min_cut(ctx) and saved_plan is None:
        # Inductor's budgeted min-cut decides at the partition, within this graph's share;
        # the graph changes there (modified: explain's "after" is the partitioned step's)
        stats = _fraction_stats(plan)
        if plan.actions:
            stats["plan"] = plan.to_dict()
        stats["inductor"] = {"partition": "pending"}
        gm.meta[_compat.PARTITION_SEARCH] = BudgetedMinCut(
            plan.extra["fraction"], plan.budget_bytes, tuple(plan.extra["tagged"]),
            stats["inductor"], ledger, plain_fits=not plan.actions,
            activation_inputs=inputs, entry=plan.extra.get("model", {}).get("entry"),
            num_fwd_outputs=ctx.facts["num_fwd_outputs"], strict=ctx.options.strict,
            plan_feasible=plan.feasible)
        return PassResult(gm, True, _verdicts(plan), stats)
    if plan.actions:
        predict_plan_peak(plan, gm, analysis, ctx.facts["num_fwd_outputs"], ctx.codegen)
    if not plan.actions:
        stats = _fraction_stats(plan) if fraction else _peak_stats(budget, problem, plan)
        stats["fits"] = plan.feasible
        return PassResult(gm, False, _verdicts(plan), stats)
    if fraction:
        changed = _tag_chains(gm, plan, ctx) > 0
    else:
        applied = apply_decision(gm, analysis, problem.activations, plan, ctx)
        log.info("fxopt: swap_recompute on %s: %s", ctx.graph_name, applied)
        changed = bool(applied)
    stats = _fraction_stats(plan) if fraction else _peak_stats(budget, problem, plan)
    stats["plan"] = plan.to_dict()  # in the report and the debug dump, loadable by `plan`
    return PassResult(gm, changed, _verdicts(plan), stats)


def predict_plan_peak(plan: Plan, gm: fx.GraphModule, analysis: JointAnalysis,
                      num_fwd_outputs: int, codegen: Codegen | str) -> None:
    """Set ``plan``'s predicted peak to the compiled step's simulation, the one explain
    shows: a copy of the joint graph ``gm`` with the plan's recompute tags, partitioned as
    the compiler will (:func:`~fxopt.analysis.estimate_partitioned_memory`). The solver's
    timeline model's figure stays as ``model_peak_bytes``; a byte plan's ``feasible`` is
    the simulated peak's. The pass and ``fxopt plan`` both call it, so a saved plan
    predicts what compilation predicts. A swap's bytes leave the device when its copy is
    done, which a simulation of the graphs cannot see: with swaps the timeline model's
    figure stands."""
    if "swap" in plan.actions.values() or "model_peak_bytes" in plan.predictions or (
            "plain_peak_bytes" in plan.predictions and "peak_bytes" in plan.predictions):
        return  # swaps: see above; plan_step simulated it already
    tagged = plan.extra["tagged"] if "fraction" in plan.extra else [
        n.name for name in plan.actions for n in group_chain(analysis, name)[0]]
    simulated = estimate_partitioned_memory(gm, num_fwd_outputs, codegen=codegen,
                                            recompute=tagged).peak_bytes
    if "peak_bytes" in plan.predictions:
        plan.predictions["model_peak_bytes"] = plan.predictions["peak_bytes"]
    plan.predictions["peak_bytes"] = simulated
    if "fraction" not in plan.extra and plan.budget_bytes is not None:
        plan.feasible = simulated <= plan.extra.get("peak_target_bytes", plan.budget_bytes)


def partitions_by_min_cut(ctx: PassContext) -> bool:
    """Whether a fraction is met by Inductor's budgeted min-cut (:mod:`.inductor_budget`):
    under Inductor code generation, which fuses what min-cut recomputes."""
    return ctx.codegen.partitions_by_min_cut


def _tag_chains(gm: fx.GraphModule, plan: Plan, ctx: PassContext) -> int:
    """Tag a fraction plan's recompute chains ``MUST_RECOMPUTE``; the number tagged."""
    by_name = {n.name: n for n in gm.graph.nodes}
    tagged = 0
    for name in plan.extra["tagged"]:
        if not ctx.rewrites.allow():
            break
        mark_recompute(by_name[name])
        tagged += 1
    log.info("fxopt: swap_recompute on %s: recompute %d saved tensors (%d nodes), keeping "
             "%d of %d bytes", ctx.graph_name, len(plan.actions), tagged,
             plan.predictions["saved_bytes"], plan.predictions["plain_saved_bytes"])
    return tagged


def _verdicts(plan: Plan) -> Verdicts:
    """The plan's saved tensors not kept, per action (recompute, swap): how many and their
    bytes."""
    verdicts = Verdicts()
    rows = {row["tensor"]: row["bytes"] for row in plan.extra.get("tensors", ())}
    for name, action in plan.actions.items():
        verdicts.match(action, bytes=rows.get(name, 0))
    return verdicts


def _fraction_stats(plan: Plan) -> dict[str, object]:
    p = plan.predictions
    plain = max(int(p["plain_saved_bytes"]), 1)
    return {
        "budget": f"{plan.extra['fraction']:g} of plain autograd's saved bytes",
        "plain_saved_bytes": p["plain_saved_bytes"], "target_saved_bytes": plan.budget_bytes,
        "saved_bytes_after": p["saved_bytes"],
        "saved_fraction_after": round(p["saved_bytes"] / plain, 4),
        "floor_bytes": p["floor_saved_bytes"],
        "floor_fraction": round(p["floor_saved_bytes"] / plain, 4),
        "feasible": plan.feasible, "solver": plan.solver,
        "recompute_nodes": len(plan.extra["tagged"]),
        "added_ms": round(p["added_seconds"] * 1e3, 4),
        **({"share_bytes": plan.budget_bytes,
            "model_graphs": plan.extra["model"]["graphs"],
            "model_plain_saved_bytes": plan.extra["model"]["plain_bytes"],
            "model_saved_bytes_after": plan.extra["model"]["kept_bytes"],
            # earlier graphs given smaller shares to make room for this one's floor
            # (fxopt.planner.ledger): compiled again at their next call
            "model_replan": plan.extra["model"].get("replan", [])}
           if "model" in plan.extra else {}),
    }


def _peak_stats(budget: MemoryBudget | None, problem: StepProblem, plan: Plan
                ) -> dict[str, object]:
    return {
        "budget": str(budget if budget is not None else f"{plan.budget_bytes} bytes"),
        "budget_bytes": plan.budget_bytes,
        "peak_before": plan.predictions["keep_all_peak_bytes"],
        "peak_after": plan.predictions["peak_bytes"],
        "feasible": plan.feasible, "solver": plan.solver,
        "kept": len(problem.activations.activations) - len(plan.actions),
        "added_ms": round(plan.predictions["added_seconds"] * 1e3, 4),
    }
