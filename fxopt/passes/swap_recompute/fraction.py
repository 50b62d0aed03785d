"""swap_recompute under a fraction budget: keep at most ``f`` x plain autograd's saved bytes.

The problem and its search are :mod:`fxopt.planner.fraction`'s; this module builds the
problem from the joint graph, decides, reports, and tags the chosen chains
``MUST_RECOMPUTE`` for the partitioner. Random ops (dropout) may be in a chain with fx code
generation: AOTAutograd's default partitioner then saves their RNG state and replays it in
the backward (``functionalize_rng_ops``), so the mask, and every gradient, is the
forward's bit for bit. Under ``codegen="inductor"`` they are not (Inductor regenerates
random numbers its own way unless ``fallback_random``), so their outputs are kept.

Below the floor (everything recomputable recomputed) the floor's plan is applied with one
warning naming the floor as a fraction and in bytes, or ``InfeasibleBudget`` under
``strict``. A replayed plan is the user's explicit choice: it is applied as saved, neither
warned about nor refused for missing its budget (the pass has checked that it was made for
this graph). Only recomputation is offered here, on CUDA too: a swap there would count as
a saving (the tensor leaves device memory), but swapping is decided under byte budgets
only so far; on the CPU a swapped tensor's host copy would count as kept.
"""

from __future__ import annotations

import logging
import warnings

from torch import fx
from torch.utils.checkpoint import CheckpointPolicy

from fxopt.passes.base import PassContext, PassResult
from fxopt.planner import profile_for
from fxopt.planner.fraction import (
    FractionDecision,
    replay_fraction,
    rng_state_bytes,
    solve_fraction,
)
from fxopt.planner.joint import JointAnalysis, saved_bytes_problem
from fxopt.planner.plan import Plan, graph_fingerprint

__all__ = ["fit_fraction"]

log = logging.getLogger(__name__)

def fit_fraction(gm: fx.GraphModule, ctx: PassContext, analysis: JointAnalysis,
                 fraction: float, infeasible: type[Exception],
                 replay: Plan | None = None) -> PassResult:
    """Decide (or ``replay`` a fraction plan's decision) and apply the plan for
    ``memory_budget=fraction`` on one joint graph."""
    problem = saved_bytes_problem(analysis, random_ok=ctx.options.codegen == "fx",
                                  rng_state_bytes=rng_state_bytes(ctx.device))
    target = int(fraction * problem.plain_bytes)
    if replay is None:
        decision = solve_fraction(problem, target)
    else:
        try:
            decision = replay_fraction(problem, target, replay.actions)
        except KeyError as error:
            raise ValueError(f"fxopt: the plan of graph {replay.graph or '?'} does not match "
                             f"this graph (no saved tensor {error}); plan it again") from error
    stats = _stats(fraction, decision)
    if decision.recompute:
        plan = Plan.from_fraction(decision, problem, profile_for(ctx.device), fraction)
        plan.graph = ctx.graph_name
        plan.fingerprint = graph_fingerprint(gm)
        stats["plan"] = plan.to_dict()
    if not decision.feasible and replay is None:  # a replayed plan is the user's choice
        message = (f"fxopt: swap_recompute cannot keep {ctx.graph_name}'s saved bytes within "
                   f"memory_budget {fraction:g} of plain autograd's ({decision.plain_bytes} "
                   f"bytes): the floor, with everything recomputable recomputed, is "
                   f"{decision.floor_fraction:.3f} ({decision.floor_bytes} bytes)")
        if ctx.options.strict:
            raise infeasible(message)
        warnings.warn(f"{message}; applying the floor's plan", stacklevel=3)
    if not decision.recompute:
        stats["fits"] = decision.feasible
        return PassResult(gm, False, stats)
    by_name = {n.name: n for n in gm.graph.nodes}
    tagged = 0
    for name in decision.tagged:
        if not ctx.rewrites.allow():
            break
        node = by_name[name]
        node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
        node.meta["fxopt"] = {**node.meta.get("fxopt", {}), "swap_recompute": "recompute"}
        tagged += 1
    log.info("fxopt: swap_recompute on %s: recompute %d saved tensors (%d nodes), keeping "
             "%d of %d bytes", ctx.graph_name, len(decision.recompute), tagged,
             decision.kept_bytes, decision.plain_bytes)
    return PassResult(gm, tagged > 0, stats)


def _stats(fraction: float, decision: FractionDecision) -> dict[str, object]:
    plain = max(decision.plain_bytes, 1)
    return {
        "budget": f"{fraction:g} of plain autograd's saved bytes",
        "plain_saved_bytes": decision.plain_bytes, "target_saved_bytes": decision.target_bytes,
        "saved_bytes_after": decision.kept_bytes,
        "saved_fraction_after": round(decision.kept_bytes / plain, 4),
        "floor_bytes": decision.floor_bytes, "floor_fraction": round(decision.floor_fraction, 4),
        "feasible": decision.feasible, "solver": decision.solver,
        "recompute": len(decision.recompute), "swap": 0,
        "recompute_nodes": len(decision.tagged),
        "added_ms": round(decision.added_seconds * 1e3, 4),
    }
