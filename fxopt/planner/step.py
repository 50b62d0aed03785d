"""The one way a plan is made: :func:`plan_step` (a step's problem, a budget, a machine in;
a JSON-serialisable :class:`~fxopt.planner.plan.Plan` out).

The ``swap_recompute`` pass, ``fxopt plan`` and explain (which shows the pass's plan) all
call it, so a plan saved by ``fxopt plan --save`` is the plan compilation builds and
replays. Its input is plain data: a :class:`StepProblem`, which
:func:`fxopt.planner.joint.step_problem` builds from a joint graph (the graph is never
edited here; the pass applies the plan).

What a budget means, and who decides it:

- a fraction ``f`` bounds the bytes kept for backward to ``f`` x plain autograd's
  (:mod:`fxopt.planner.solvers.fraction`, recompute only). Below the floor (everything
  recomputable recomputed) the floor's plan is returned with one warning naming the floor
  as a fraction and in bytes, or :class:`InfeasibleBudget` is raised under ``strict``.
  When the problem offers swaps only (``force_swap``), a fraction bounds the peak instead
  (:meth:`fxopt.config.MemoryBudget.peak_bytes_bound`).
- bytes bound the predicted peak of the step (parameters, inputs, gradients, activations
  and temporaries; optimizer state lives outside the compiled step). ``solver`` picks who
  decides: ``"milp"`` (:mod:`fxopt.planner.solvers.milp`, the default; one that raises is
  answered by the greedy solver with a warning, and raises under ``strict``), ``"delta"``
  (the greedy solver's DELTA mode) or ``"greedy"``. A budget that cannot be met warns
  naming the lowest peak reached and returns that plan, or raises under ``strict``. A
  byte budget below the parameters and inputs warns that a fraction was probably meant.
  The solvers optimise a timeline model; a recompute plan's predicted peak is the
  compiled step's simulation (``StepProblem.simulate``, the memory model explain shows),
  and a plan the simulation puts over the bound is solved again for less
  (:func:`_simulation_checked`), one it leaves room under for more, where that recomputes
  less (:func:`_loosened`).
- ``ledger``: the model's :class:`~fxopt.planner.ledger.BudgetLedger`: a fraction is then
  the model's, shared by its graphs (:mod:`fxopt.planner.ledger`), and the graph's share
  is recorded in it; ``share_bytes`` (from :func:`~fxopt.planner.ledger.
  split_by_frontiers`) sets the share instead.
- ``replay``: a saved plan, checked against the problem's fingerprint (another graph is
  refused naming the first node that differs) and returned as saved: the user's choice,
  neither warned about nor refused for missing its budget.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from fxopt.codegen import peak_target
from fxopt.config import MemoryBudget, OptionError
from fxopt.planner.activations import ActivationProblem, Decision, evaluate
from fxopt.planner.hardware import HardwareProfile
from fxopt.planner.ledger import BudgetLedger
from fxopt.planner.plan import Plan
from fxopt.planner.solvers.fraction import (
    FractionDecision,
    SavedBytesProblem,
    replay_fraction,
)
from fxopt.planner.solvers.fraction_peak import solve_peak_capped
from fxopt.planner.solvers.greedy import solve_greedy
from fxopt.planner.solvers.milp import DEFAULT_TIME_LIMIT, solve_activations
from fxopt.units import format_mib

__all__ = ["SOLVERS", "InfeasibleBudget", "StepProblem", "plan_step"]

log = logging.getLogger(__name__)

SOLVERS = ("milp", "delta", "greedy")
_SIMULATION_ROUNDS = 3  # tightened re-solves before asking the model for its lowest plan
_LOOSEN_ROUNDS = 4  # re-solves of the model's bound where the simulation leaves room
_LOOSEN_RESOLUTION = 0.005  # ... stopped once the interval is this share of the bound


class InfeasibleBudget(RuntimeError):
    """No plan reaches ``memory_budget`` (raised under ``strict``)."""


@dataclass(frozen=True)
class StepProblem:
    """One graph's decision problem, plain data. ``activations``' budget is the keep-all peak
    (:func:`plan_step` sets the budget's); ``fraction_bounds_peak``: only swaps are offered,
    so a fraction bounds the peak, not the saved bytes."""

    graph: str
    fingerprint: tuple[str, ...]
    activations: ActivationProblem
    saved_bytes: SavedBytesProblem
    keep_all_peak_bytes: int
    baseline_bytes: int          # parameters and inputs
    activation_bytes: int        # plain autograd's saved bytes
    step_seconds: float          # predicted, everything kept
    fraction_bounds_peak: bool = False
    # the share of a byte bound left free for the code generator's own kernel order
    # (:attr:`fxopt.codegen.Codegen.peak_margin`): plans are held to the rest
    peak_margin: float = 0.0
    codegen: str = "fx"  # the code generator the graph compiles with: a plan replays only there
    # the forward's outputs (not inputs), which the prediction holds to the step's end, as a
    # caller that keeps the model's output through backward() does
    held_output_bytes: int = 0
    # actions -> the compiled step's simulated peak (the memory model explain shows;
    # :func:`fxopt.planner.joint.step_problem` sets it); None: the timeline model's stands
    simulate: Callable[[Mapping[str, str]], int] | None = field(
        default=None, compare=False, repr=False)
    # nodes tagged MUST_RECOMPUTE -> the same simulation (a fraction plan's chains)
    simulate_tagged: Callable[[Sequence[str]], int] | None = field(
        default=None, compare=False, repr=False)


def plan_step(problem: StepProblem, budget: MemoryBudget | None, hardware: HardwareProfile, *,
              solver: str = "milp", replay: Plan | None = None, strict: bool = False,
              time_limit: float = DEFAULT_TIME_LIMIT, ledger: BudgetLedger | None = None,
              share_bytes: int | None = None) -> Plan:
    """The plan for ``problem`` under ``budget`` (None: keep everything, or replay
    ``replay``) on ``hardware``; see the module doc."""
    if solver not in SOLVERS:
        raise ValueError(f"fxopt: solver {solver!r} is not one of {SOLVERS}")
    began = time.perf_counter()
    if replay is not None:
        _check_codegen(replay, problem)
        replay.check_fingerprint(list(problem.fingerprint))
    if replay is not None and "fraction" in replay.extra:
        plan = _fraction_plan(problem, MemoryBudget(fraction=replay.extra["fraction"]),
                              hardware, strict, replay, ledger, share_bytes)
    elif (replay is None and budget is not None and budget.fraction is not None
          and not problem.fraction_bounds_peak):
        plan = _fraction_plan(problem, budget, hardware, strict, None, ledger, share_bytes)
    else:
        plan = _peak_plan(problem, budget, hardware, solver, replay, strict, time_limit)
    plan.graph = problem.graph
    plan.fingerprint = list(problem.fingerprint)
    plan.extra["codegen"] = problem.codegen
    plan.predictions.setdefault("step_seconds", problem.step_seconds)
    plan.planning_seconds = time.perf_counter() - began
    return plan


def _check_codegen(replay: Plan, problem: StepProblem) -> None:
    """Refuse a plan made for another code generator (``OptionError``): each traces its own
    joint graph (Inductor's with its decompositions), so the fingerprints would differ
    anyway; this names the cause (a plan of an older fxopt does not say: its fingerprint
    decides)."""
    made = replay.extra.get("codegen")
    if made is not None and made != problem.codegen:
        raise OptionError(
            f"fxopt: the plan of graph {replay.graph or '?'} was made for {made} code "
            f"generation and this graph compiles with {problem.codegen}: compile with "
            f"codegen={made!r}, or plan it again with `fxopt plan --codegen "
            f"{problem.codegen}`")


def _fraction_plan(problem: StepProblem, budget: MemoryBudget, hardware: HardwareProfile,
                   strict: bool, replay: Plan | None, ledger: BudgetLedger | None,
                   share_bytes: int | None) -> Plan:
    fraction, saved = budget.fraction, problem.saved_bytes
    if ledger is not None:
        ledger.replace_earlier_compile()
    shared = ledger is not None and ledger.graphs > 0  # graphs before this one
    if share_bytes is not None:
        target = share_bytes
    elif ledger is not None:
        target = ledger.share_for(budget, saved.plain_bytes)
    else:
        target = budget.saved_bytes_bound(saved.plain_bytes)
    if replay is None:
        def solve(bound: int) -> FractionDecision:
            return solve_peak_capped(saved, problem.activations, bound, problem.simulate_tagged)

        decision = solve(target)
        if not decision.feasible and ledger is not None and share_bytes is None and (
                rebalanced := ledger.rebalance(budget, saved.plain_bytes,
                                               decision.floor_bytes)) is not None:
            target = rebalanced  # earlier graphs are planned again with less
            decision = solve(target)
    else:
        try:
            decision = replay_fraction(saved, target, replay.actions)
        except KeyError as error:
            raise ValueError(f"fxopt: the plan of graph {replay.graph or '?'} does not match "
                             f"this graph (no saved tensor {error}); plan it again") from error
        if (simulate := problem.simulate_tagged) is not None:  # predicted as when solved
            plain = simulate(())
            decision = dataclasses.replace(
                decision, peak_bytes=simulate(decision.tagged) if decision.recompute else plain,
                plain_peak_bytes=plain, peak_simulated=True)
    if not decision.feasible and replay is None:
        within = (f"its share ({target} bytes) of memory_budget {fraction:g} of the model's "
                  f"plain saved bytes (this graph's: {decision.plain_bytes} bytes), what the "
                  f"{ledger.graphs} graphs compiled before it left" if shared else
                  f"memory_budget {fraction:g} of plain autograd's ({decision.plain_bytes} "
                  "bytes)")
        message = (f"fxopt: swap_recompute cannot keep {problem.graph}'s saved bytes within "
                   f"{within}: the floor, with everything recomputable recomputed, is "
                   f"{decision.floor_fraction:.3f} ({decision.floor_bytes} bytes)")
        if shared:  # the model's floor: what no re-planning of earlier graphs goes below
            floors = sum(s.floor_bytes for s in ledger.shares) + decision.floor_bytes
            message += (f"; the floors of the model's {ledger.graphs + 1} graphs "
                        f"together are {floors / (ledger.plain_bytes + decision.plain_bytes):.3f}"
                        " of its plain saved bytes")
        base = decision.plain_bytes + (ledger.plain_bytes if shared else 0)
        _infeasible(message + _input_floor(saved, base), "applying the floor's plan", strict)
    if replay is None and decision.feasible:
        _peak_checked(problem, decision, fraction)
    plan = Plan.from_fraction(decision, saved, hardware, fraction)
    plan.extra["tagged"] = list(decision.tagged)
    if ledger is not None:
        entry = ledger.record(problem.graph, decision.plain_bytes, target,
                              decision.kept_bytes, decision.floor_bytes)
        plan.extra["model"] = {"graphs": ledger.graphs, "plain_bytes": ledger.plain_bytes,
                               "kept_bytes": ledger.kept_bytes, "entry": entry,
                               "replan": [ledger.shares[i].graph
                                          for i in sorted(ledger.replan_shares)]}
    return plan


def _input_floor(saved: SavedBytesProblem, base_bytes: int) -> str:
    """What of an infeasible graph's floor is its activation inputs (another graph's
    outputs, read across a graph break: the logits of a loss graph), as a fraction of the
    budget's base, and the fix: no plan of either graph can recompute them, one graph can."""
    inputs = sum(saved.storage_bytes[s] for s in saved.input_storages)
    if not inputs:
        return ""
    return (f"; {inputs} bytes of the floor ({inputs / max(base_bytes, 1):.3f} of the plain "
            "saved bytes) are inputs another graph made across a graph break (a loss "
            "graph's logits), kept whatever is recomputed. To go below it, compile the "
            "model into one graph, where they are recomputed (and the LM head's "
            "fuse_linear_cross_entropy never stores logits): "
            "fxopt.ignore_transformers_logging() around the first call removes "
            "transformers' logging breaks (for GPT-2's, whose loss_type is unset, so does "
            "model.loss_type = 'ForCausalLM', its default loss); fxopt.explain names the "
            "breaks")


def _peak_checked(problem: StepProblem, decision: FractionDecision, fraction: float) -> None:
    """Warn where a fraction plan's predicted peak is above plain autograd's; log where it
    is above what a larger budget's plan reaches (:mod:`~fxopt.planner.solvers.
    fraction_peak`). The fraction is met, so ``strict`` (which raises where a budget is
    not) does not raise: on small graphs whose peak recompute cannot lower, every plan
    within the fraction can peak a few bytes above plain autograd's."""
    if decision.peak_capped or decision.peak_bytes is None:
        return
    plain = decision.plain_peak_bytes or 0
    message = (f"fxopt: swap_recompute meets memory_budget {fraction:g} on {problem.graph} "
               f"(keeps {decision.kept_bytes} of {decision.plain_bytes} saved bytes), but "
               f"its plan predicts a step peak of {format_mib(decision.peak_bytes)} MiB "
               f"({decision.peak_bytes} bytes)")
    if decision.peak_bytes > plain:
        warnings.warn(f"{message}, above plain autograd's {format_mib(plain)} MiB ({plain} "
                      "bytes): no plan found within the fraction peaks lower (recomputed "
                      "chains come back together in the backward). A larger memory_budget, "
                      "or a byte budget (which bounds the peak), avoids it", stacklevel=4)
    else:
        log.info("%s, above what a larger memory_budget's plan reaches (no plan found "
                 "within this one peaks lower; plain autograd's: %d bytes)", message, plain)


def _peak_plan(problem: StepProblem, budget: MemoryBudget | None, hardware: HardwareProfile,
               solver: str, replay: Plan | None, strict: bool, time_limit: float) -> Plan:
    value_bytes = budget.bytes if budget is not None else None
    if value_bytes is not None and value_bytes < problem.baseline_bytes:
        warnings.warn(f"fxopt: memory_budget {value_bytes} bytes is below {problem.graph}'s "
                      f"parameters and inputs ({problem.baseline_bytes} bytes): did you mean "
                      f"a fraction? (e.g. 0.5 keeps half of plain autograd's saved bytes)",
                      stacklevel=4)
    if budget is not None:
        bound = budget.peak_bytes_bound(problem.keep_all_peak_bytes, problem.activation_bytes)
    else:
        bound = (replay.budget_bytes if replay is not None else None) \
            or problem.keep_all_peak_bytes
    target = peak_target(bound, problem.peak_margin)
    activations = dataclasses.replace(problem.activations, budget_bytes=target)
    simulated = None
    keep_all = problem.keep_all_peak_bytes
    if problem.simulate is not None:
        problem = dataclasses.replace(problem, simulate=_memoized(problem.simulate))
    if replay is None and problem.simulate is not None:
        # the step compiled with nothing recomputed: under Inductor its min-cut partition
        # recomputes what it fuses, below the joint graph's keep-all peak (a Llama at 512
        # tokens: 106.5 MiB simulated and 105.6 measured, where the joint graph says 119.6)
        keep_all = problem.simulate({})
    if replay is not None:
        decision = _replayed(activations, replay)
        if _simulated(problem, decision):
            simulated = problem.simulate(decision.actions)
    elif keep_all <= target:  # nothing to recompute
        decision = evaluate(activations, {}, solver, status="everything kept fits")
        simulated = keep_all if problem.simulate is not None else None
    else:
        solve = _Solver(solver, strict, time_limit, problem.graph)
        decision, simulated = _simulation_checked(problem, activations, solve(activations),
                                                  solve)
        decision, simulated = _loosened(problem, activations, decision, simulated, solve)
        if decision.actions and simulated is not None and simulated >= keep_all:
            # recomputing costs time and lowers nothing (transformers' loss graph under
            # Inductor: one alias recomputed for a predicted 122 ms, the same peak)
            decision = evaluate(activations, {}, solver,
                                status="everything kept: the plans tried peaked no lower")
        if problem.simulate is not None and not decision.actions:
            simulated = keep_all  # the compiled step's, not the joint graph's keep-all
    peak = decision.peak_bytes if simulated is None else simulated
    if peak > target and replay is None:
        message = (f"fxopt: swap_recompute cannot fit {problem.graph} in memory_budget "
                   f"{budget} (a predicted peak of {format_mib(bound)} MiB"
                   f"{_margin_words(bound, target)}): the lowest "
                   f"predicted peak reachable is {format_mib(peak)} MiB "
                   f"({peak} bytes; "
                   f"{format_mib(keep_all)} MiB with everything kept)"
                   f"{_held_outputs_words(problem.held_output_bytes, peak)}")
        _infeasible(message, "using the plan that reaches it", strict)
    plan = Plan.from_decision(decision, hardware, bound, keep_all_peak_bytes=keep_all,
                              activation_bytes=problem.activation_bytes,
                              step_seconds=problem.step_seconds)
    if simulated is not None:
        plan.predictions["model_peak_bytes"] = decision.peak_bytes
        plan.predictions["peak_bytes"] = simulated
        plan.feasible = simulated <= target
    if target < bound:
        plan.extra["peak_target_bytes"] = target
    plan.extra["tensors"] = _tensor_rows(activations, decision)
    plan.extra["order"] = list(decision.details.get("order", sorted(decision.actions)))
    return plan


# held outputs named in an infeasible byte budget's message from this share of its peak on
HELD_OUTPUTS_NAMED = 0.1


def _held_outputs_words(held: int, peak: int) -> str:
    """The graph's outputs in an infeasible peak, where they weigh: the prediction holds
    them through the backward (a caller that keeps ``out = model(...)`` does); a step that
    drops them first can peak lower, and a language model's logits need not be returned."""
    if held < HELD_OUTPUTS_NAMED * peak:
        return ""
    return (f"; {format_mib(held)} MiB of it are the graph's outputs, held to the step's end "
            "as by a caller that keeps the model's output through backward() (a step that "
            "drops it first, loss = model(...).loss, can peak lower; "
            "fxopt.drop_logits(model) keeps a language model's logits out of a step that "
            "reads only its loss)")


def _margin_words(bound: int, target: int) -> str:
    return (f", {format_mib(target)} MiB with the code generator's margin for its kernel "
            f"order" if target < bound else "")


def _simulation_checked(problem: StepProblem, activations: ActivationProblem,
                        decision: Decision, solve: Callable[[ActivationProblem], Decision]
                        ) -> tuple[Decision, int | None]:
    """``decision`` checked against the compiled step's simulation (``problem.simulate``):
    (the decision taken, its simulated peak; None where nothing was simulated: no
    simulator, or swaps, whose bytes leave when their copy is done, which a simulation of
    the graphs cannot see). A decision with nothing recomputed is checked too: where the
    model's keep-all peak is within the bound and the step's is not (a transformer block
    under fx: 293,888 bytes by the model, 318,336 simulated), it is solved again for less.

    The timeline model frees a recomputed tensor's bytes over its window and counts
    nothing for its chain; the partitioner rebuilds each recomputed node once, at its
    first backward use, so a forward value several chains read (Llama's residual stream,
    read by every layer's recomputed norm) is rebuilt early in the backward and lives
    until the last chain reads it: Llama at its lowest plan (46 tensors recomputed)
    simulated and measured 48.10 MiB where the model said 45.20. When the simulation
    exceeds the bound, the model is asked for that much less, up to
    :data:`_SIMULATION_ROUNDS` times, then for its lowest plan; the first plan whose
    simulation meets the bound is taken, else the one with the lowest simulated peak."""
    if not _simulated(problem, decision):
        return decision, None
    bound = activations.budget_bytes
    tried = [(problem.simulate(decision.actions), decision)]
    model_bound = bound
    for attempt in range(_SIMULATION_ROUNDS + 1):
        simulated, current = tried[-1]
        if simulated <= bound or not current.feasible:
            break
        model_bound = 1 if attempt == _SIMULATION_ROUNDS else model_bound - (simulated - bound)
        current = solve(dataclasses.replace(activations, budget_bytes=max(1, model_bound)))
        if not current.actions:
            break
        tried.append((problem.simulate(current.actions), current))
    fitting = [t for t in tried if t[0] <= bound]
    simulated, chosen = fitting[0] if fitting else min(tried, key=lambda t: t[0])
    if chosen is not decision:  # judged against the caller's bound, not the tightened one
        chosen = _rejudged(activations, chosen, f"bound tightened {len(tried) - 1}x to "
                           "meet the compiled step's simulated peak")
    log.debug("fxopt: %s: model peak %d, simulated %d (%d plans tried)", problem.graph,
              chosen.peak_bytes, simulated, len(tried))
    return chosen, simulated


def _loosened(problem: StepProblem, activations: ActivationProblem, decision: Decision,
              simulated: int | None, solve: Callable[[ActivationProblem], Decision]
              ) -> tuple[Decision, int | None]:
    """``decision``, or a cheaper plan the compiled step's simulation also fits in the bound,
    found by asking the timeline model for more.

    The model can be pessimistic: under Inductor the partition recomputes what it fuses, so
    a Llama with ``drop_logits`` at 512 tokens has a model peak of 96.49 MiB at its lowest
    plan (13 tensors recomputed) where the step simulates 86.49 MiB; a 95 MiB budget
    (90.25 MiB to plan for) took that lowest plan, as the model put every cheaper plan
    over the bound. So where the simulation leaves room, the model is asked again at a
    looser bound: first the bound shifted by the gap between the chosen plan's model peak
    and its simulation, then by bisection between the model peaks known to fit and not,
    for at most :data:`_LOOSEN_ROUNDS` solves (a simulation runs the partitioner: 1.6 s on
    that Llama on the CPU); the plan with the least added time whose simulation meets the
    bound is taken."""
    if simulated is None or simulated > activations.budget_bytes:
        return decision, simulated
    bound = activations.budget_bytes
    fits, fails = decision.peak_bytes, problem.keep_all_peak_bytes  # model bounds
    best = (decision, simulated)
    model_bound = bound + decision.peak_bytes - simulated
    for _ in range(_LOOSEN_ROUNDS):
        if not fits < model_bound < fails:
            model_bound = (fits + fails) // 2
        if fails - fits <= _LOOSEN_RESOLUTION * bound:
            break
        candidate = solve(dataclasses.replace(activations, budget_bytes=model_bound))
        if not candidate.actions or not _simulated(problem, candidate):
            # nothing recomputed (the step's keep-all is over the bound) or swaps, which
            # the simulation cannot judge: looser bounds are not tried
            fails = model_bound
            continue
        peak = problem.simulate(candidate.actions)
        if peak > bound:
            fails = model_bound
        else:
            fits = model_bound
            if candidate.added_seconds < best[0].added_seconds:
                best = (candidate, peak)
        model_bound = (fits + fails) // 2
    chosen, peak = best
    if chosen is decision:
        return decision, simulated
    log.debug("fxopt: %s: loosened to a model peak of %d, simulated %d", problem.graph,
              chosen.peak_bytes, peak)
    return _rejudged(activations, chosen, "the model's bound loosened while the compiled "
                     "step's simulation fits"), peak


def _rejudged(activations: ActivationProblem, decision: Decision, how: str) -> Decision:
    """``decision``, solved for another model bound, judged against the caller's
    (``activations``' bound), its status saying ``how`` it was found."""
    return evaluate(activations, decision.actions, decision.solver, **{
        **decision.details, "status": f"{decision.details.get('status', '')}; {how}"})


def _memoized(simulate: Callable[[Mapping[str, str]], int]
              ) -> Callable[[Mapping[str, str]], int]:
    """``simulate`` asked once per set of actions: the plan's solves repeat plans, and each
    simulation runs the partitioner."""
    peaks: dict[frozenset[tuple[str, str]], int] = {}

    def simulated(actions: Mapping[str, str]) -> int:
        key = frozenset(actions.items())
        if key not in peaks:
            peaks[key] = simulate(actions)
        return peaks[key]
    return simulated


def _simulated(problem: StepProblem, decision: Decision) -> bool:
    """Whether ``decision``'s peak is the simulation's (see :func:`_simulation_checked`)."""
    return problem.simulate is not None and "swap" not in decision.actions.values()


def _infeasible(message: str, instead: str, strict: bool) -> None:
    """A budget no plan meets: raise under ``strict``, else warn once saying what is applied
    ``instead`` (the stack level names the user's compiled call)."""
    if strict:
        raise InfeasibleBudget(message)
    warnings.warn(f"{message}; {instead}", stacklevel=5)


def _replayed(problem: ActivationProblem, replay: Plan) -> Decision:
    try:
        return evaluate(problem, replay.actions, "plan", status="replayed from a plan",
                        order=replay.extra.get("order", sorted(replay.actions)))
    except (KeyError, ValueError) as error:
        raise ValueError(f"fxopt: the plan of graph {replay.graph or '?'} does not match "
                         f"this graph ({error}); plan it again") from error


@dataclass
class _Solver:
    """The solver a plan's solves share (a plan solves again for a tighter or looser model
    bound): an MILP that raises is answered by the greedy solver with one warning, and the
    greedy answers the plan's later solves; under ``strict`` it raises."""

    name: str
    strict: bool
    time_limit: float
    graph: str

    def __call__(self, problem: ActivationProblem) -> Decision:
        if self.name != "milp":
            return solve_greedy(problem, mode="delta" if self.name == "delta" else "peak")
        try:
            return solve_activations(problem, time_limit=self.time_limit)
        except Exception as error:
            if self.strict:
                raise
            warnings.warn(f"fxopt: swap_recompute's solver failed on {self.graph} "
                          f"({type(error).__name__}: {error}); used the greedy solver "
                          "instead. Set options={'strict': True} to raise instead.",
                          stacklevel=4)
            log.debug("fxopt: traceback of the failed solver", exc_info=True)
            self.name = "greedy"
            return solve_greedy(problem,
                                status=f"fallback: solver raised {type(error).__name__}")


def _tensor_rows(problem: ActivationProblem, decision: Decision) -> list[dict[str, object]]:
    """Per saved tensor: its action, bytes and predicted added seconds (explain's table)."""
    rows = []
    for act in problem.activations:
        action = decision.actions.get(act.name, "keep")
        choice = act.choice(action) if action != "keep" else None
        rows.append({"tensor": act.name, "bytes": act.nbytes, "action": action,
                     "seconds": choice.seconds if choice else 0.0})
    return rows
