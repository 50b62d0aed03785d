"""swap_recompute: keep, recompute or swap each saved activation, under ``memory_budget``.

At the JOINT stage (AOTAutograd's joint forward+backward graph, before the partitioner):

1. :mod:`fxopt.planner.joint` builds an :class:`fxopt.planner.ActivationProblem` from the graph: the
   memory simulation's timeline with everything kept, one ``SavedActivation`` per saved
   tensor with a ``recompute`` choice and, on CUDA (or with ``force_swap``), a ``swap``
   choice, and the budget as a bound on the predicted peak of the step;
2. a decider, any ``Callable[[ActivationProblem], Decision]``, picks the actions;
   :func:`choose_decider` is the one place that says which: the planner's MILP when the
   planner is on (the default with a budget), the DELTA-style heuristic
   (:func:`.delta.decide_delta`) with ``planner=False``, or a saved plan's actions;
3. :mod:`.apply` rewrites the joint graph (recompute tags, swap ops); the partitioner then
   saves what the decision keeps, and the compiler places the prefetches in the backward.

A fraction budget ``f`` bounds the bytes kept for backward (``f`` x plain autograd's, per
graph) and is decided by :mod:`.fraction` (chains of any depth, dropout replayed from its
RNG state, the floor reported). A byte budget bounds the predicted peak of one step:
parameters, inputs, gradients, activations and temporaries as :mod:`fxopt.analysis.memory`
simulates them (optimizer state lives outside the compiled step and is not in the graph);
the steps above decide it. A step that already fits is left unchanged
(``stats["fits"]``); one that cannot fit raises under ``strict`` naming the lowest peak
the decider reaches, and otherwise warns with that figure and applies that plan. A
replayed plan (``plan``) is the user's choice: it is applied as saved, on the graph its
fingerprint names (another graph is refused). On a CPU
device swapping frees nothing, so only recompute is offered unless ``force_swap`` is set,
which offers only swapping (the swap path's tests; a fraction then goes through the peak
path too).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import torch.fx as fx

from fxopt.analysis.memory import MemoryEstimate
from fxopt.config import MemoryBudget
from fxopt.passes.base import PassContext, PassResult
from fxopt.passes.swap_recompute.apply import SWAP_OPS, apply_decision, place_prefetches
from fxopt.passes.swap_recompute.delta import decide_delta
from fxopt.passes.swap_recompute.fraction import fit_fraction
from fxopt.planner import ActivationProblem, Decision, profile_for, solve_activations
from fxopt.planner.greedy import solve_greedy
from fxopt.planner.joint import analyse_joint, build_problem
from fxopt.planner.plan import Plan, budget_bytes_for, graph_fingerprint
from fxopt.units import format_mib as _mib

__all__ = ["swap_recompute", "choose_decider", "InfeasibleBudget",
           "place_prefetches", "SWAP_OPS"]

log = logging.getLogger(__name__)

Decider = Callable[[ActivationProblem], Decision]


class InfeasibleBudget(RuntimeError):
    """No plan reaches ``memory_budget`` (raised under ``strict``)."""


def choose_decider(ctx: PassContext, plan: Plan | None = None) -> Decider:
    """Who decides the actions, the one place that says so: a saved plan (``plan`` option)
    replays its actions; with the planner on (the default whenever a budget is given) the
    MILP (:func:`fxopt.planner.solve_activations`) finds the fastest plan within the
    budget; otherwise (``planner=False``) the DELTA-style heuristic
    (:func:`.delta.decide_delta`)."""
    if plan is not None:
        return plan.decider()
    if ctx.options.planner_enabled:
        return solve_activations
    return decide_delta


def swap_recompute(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    budget = ctx.options.memory_budget
    saved_plan = Plan.load(ctx.options.plan) if ctx.options.plan is not None else None
    if budget is None and saved_plan is None:
        return PassResult(gm, False, {"reason": "no memory_budget set: nothing to bound"})
    profile = profile_for(ctx.device)
    force_swap = ctx.options.force_swap
    analysis = analyse_joint(gm, ctx.facts["num_fwd_outputs"], profile)
    if saved_plan is not None:
        saved_plan.check_graph(gm)
    if saved_plan is not None and "fraction" in saved_plan.extra:
        return fit_fraction(gm, ctx, analysis, saved_plan.extra["fraction"], InfeasibleBudget,
                            replay=saved_plan)
    if budget is not None and budget.fraction is not None and saved_plan is None \
            and not force_swap:
        return fit_fraction(gm, ctx, analysis, budget.fraction, InfeasibleBudget)
    estimate = analysis.estimate
    if budget is not None and budget.bytes is not None \
            and budget.bytes < estimate.baseline_bytes:
        warnings.warn(f"fxopt: memory_budget {budget.bytes} bytes is below {ctx.graph_name}'s "
                      f"parameters and inputs ({estimate.baseline_bytes} bytes): did you mean "
                      f"a fraction? (e.g. 0.5 keeps half of plain autograd's saved bytes)",
                      stacklevel=2)
    if budget is not None:
        bound = budget_bytes_for(budget, estimate.peak_bytes, estimate.activation_bytes)
    else:
        bound = saved_plan.budget_bytes or estimate.peak_bytes
        budget = MemoryBudget(bytes=bound)
    problem = build_problem(analysis, bound, profile,
                            recompute=not force_swap, swap=ctx.is_cuda or force_swap,
                            blocking_offload=ctx.options.codegen == "inductor")
    decision = _decide(choose_decider(ctx, saved_plan), problem, ctx)
    stats = _stats(budget, estimate, problem, decision)
    if decision.actions:  # the plan in the report and the debug dump, loadable by `plan`
        plan = Plan.from_decision(decision, profile, bound,
                                  keep_all_peak_bytes=estimate.peak_bytes,
                                  activation_bytes=estimate.activation_bytes,
                                  step_seconds=sum(analysis.step_seconds))
        plan.graph = ctx.graph_name
        plan.fingerprint = graph_fingerprint(gm)
        plan.extra["tensors"] = _tensor_rows(problem, decision)
        stats["plan"] = plan.to_dict()
    if not decision.feasible and saved_plan is None:  # a replayed plan is the user's choice
        message = (f"fxopt: swap_recompute cannot fit {ctx.graph_name} in memory_budget "
                   f"{budget} (a predicted peak of {_mib(problem.budget_bytes)} MiB): the "
                   f"lowest predicted peak reachable is {_mib(decision.peak_bytes)} MiB "
                   f"({decision.peak_bytes} bytes; {_mib(estimate.peak_bytes)} MiB with "
                   "everything kept)")
        if ctx.options.strict:
            raise InfeasibleBudget(message)
        warnings.warn(f"{message}; using the plan that reaches it", stacklevel=2)
    if not decision.actions:
        stats["fits"] = decision.feasible
        return PassResult(gm, False, stats)
    applied = apply_decision(gm, analysis, problem, decision, ctx)
    log.info("fxopt: swap_recompute on %s: %s", ctx.graph_name, applied)
    return PassResult(gm, bool(applied), stats)


def _decide(decider: Decider, problem: ActivationProblem, ctx: PassContext) -> Decision:
    """The decider's answer; a solver that raises (scipy's ``milp``, say) is answered by the
    greedy solver with a warning, and raises only under ``strict``."""
    try:
        return decider(problem)
    except Exception as error:
        if decider is not solve_activations or ctx.options.strict:
            raise
        warnings.warn(f"fxopt: swap_recompute's solver failed on {ctx.graph_name} "
                      f"({type(error).__name__}: {error}); used the greedy solver instead. "
                      "Set options={'strict': True} to raise instead.", stacklevel=3)
        log.debug("fxopt: traceback of the failed solver", exc_info=True)
        return solve_greedy(problem, status=f"fallback: solver raised {type(error).__name__}")


def _tensor_rows(problem: ActivationProblem, decision: Decision) -> list[dict[str, object]]:
    """Per saved tensor: its action, bytes and predicted added seconds (explain's table)."""
    rows = []
    for act in problem.activations:
        action = decision.actions.get(act.name, "keep")
        choice = act.choice(action) if action != "keep" else None
        rows.append({"tensor": act.name, "bytes": act.nbytes, "action": action,
                     "seconds": choice.seconds if choice else 0.0})
    return rows


def _stats(budget: MemoryBudget, estimate: MemoryEstimate, problem: ActivationProblem,
           decision: Decision) -> dict[str, object]:
    counts = {a: sum(1 for v in decision.actions.values() if v == a)
              for a in ("recompute", "swap")}
    return {
        "budget": str(budget), "budget_bytes": problem.budget_bytes,
        "peak_before": estimate.peak_bytes, "peak_after": decision.peak_bytes,
        "feasible": decision.feasible, "solver": decision.solver,
        "recompute": counts["recompute"], "swap": counts["swap"],
        "kept": len(problem.activations) - len(decision.actions),
        "added_ms": round(decision.added_seconds * 1e3, 4),
    }
