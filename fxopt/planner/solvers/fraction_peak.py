"""A fraction plan whose predicted peak never rises as the budget falls.

A fraction bounds the bytes kept for backward (:mod:`.fraction`), and every plan on the
saved-bytes search path meets it; the step's peak is another matter. A recomputed tensor
is rebuilt at its first backward use, and when a tensor its chain reads is recomputed too,
that one is rebuilt at the same moment and lives until its own last backward use: whole
chains come back at once. So plans keeping fewer bytes can peak higher: on ``fxopt
doctor``'s deep MLP the path's plan at 0.35 peaked above its plan at 0.6
(``benchmarks/results/doctor_memory_cpu.md``, before this module).

The peak model (:class:`ChainPeak`): the step's timeline with everything kept (the
memory simulation of the joint graph, :class:`~fxopt.planner.activations.
ActivationProblem`'s ``live_bytes``), less each recomputed tensor's bytes over its window,
from its last forward use to its rebuild, which is its first backward use or the rebuild
of any recomputed tensor whose chain reads it, whichever comes first. The transient values
inside a chain are not counted; under fx code generation the chosen plan is checked
against the partitioned step's simulation (:func:`solve_peak_capped`'s ``simulate``);
under Inductor the partition search predicts each partition's peak
(:mod:`fxopt.passes.swap_recompute.inductor_budget`).

The choice (:func:`solve_peak_capped`). Candidates: the states of the saved-bytes path
(fastest first) and of two paths ranked by the model's peak (from the floor, keep next
the option whose keeping leaves the lowest peak; from keeping everything, recompute next
the option whose recompute does), each with its predicted peak. The
budgets are walked from keeping everything down to the target, one level per candidate's
kept bytes; at each level the plan is the fastest candidate within that level's bytes
whose peak is at most the *cap*, and the cap is the lowest peak of the plans of all
larger levels, starting at plain autograd's. So the plan for a smaller budget never peaks
above the plan for a larger one (in the model), nor above plain autograd's. Where no
candidate within the target meets the cap, the lowest-peak one is taken and
``peak_capped`` is False (:func:`fxopt.planner.step.plan_step` warns where it is above
plain autograd's, and logs where it is only above a larger budget's). Cost: each peak
path evaluates the model (one pass over the timeline) about n^2 / 2 times for n options; above
:data:`PEAK_PATH_OPTIONS` options only the saved-bytes path's states are candidates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from fxopt.planner.activations import ActivationProblem
from fxopt.planner.solvers.fraction import (
    FractionDecision,
    SavedBytesProblem,
    fraction_decision,
    fraction_path,
)

__all__ = ["ChainPeak", "PEAK_PATH_OPTIONS", "SIMULATED_CANDIDATES", "solve_peak_capped"]

PEAK_PATH_OPTIONS = 200  # the peak path's n^2 / 2 model evaluations stay under a second
SIMULATED_CANDIDATES = 3  # plans checked by the partitioned step's simulation at most


@dataclass(frozen=True)
class ChainPeak:
    """The peak model of the module doc, per saved-bytes option (several tensors each)."""

    live: np.ndarray                        # bytes per step, everything kept
    tensors: dict[str, tuple[str, ...]]     # option -> its saved tensors with a window
    window: dict[str, tuple[int, int]]      # tensor -> (last forward use, first backward use)
    nbytes: dict[str, int]
    reads: dict[str, tuple[str, ...]]       # tensor -> saved tensors its recompute reads
    order: tuple[str, ...]                  # tensors, last created first

    @classmethod
    def build(cls, activations: ActivationProblem, problem: SavedBytesProblem) -> ChainPeak:
        known = activations.by_name()
        window, nbytes, reads = {}, {}, {}
        for act in activations.activations:
            choice = act.choice("recompute")
            if choice is not None:
                window[act.name], nbytes[act.name] = choice.window, act.nbytes
                reads[act.name] = tuple(r for r in choice.requires if r in known)
        tensors = {o.name: tuple(n for n in o.name.split("+") if n in window)
                   for o in problem.options}
        order = tuple(a.name for a in reversed(activations.activations) if a.name in window)
        return cls(np.asarray(activations.live_bytes, dtype=np.int64), tensors, window,
                   nbytes, reads, order)

    def peak(self, recomputed: Iterable[str]) -> int:
        """The predicted peak with the options ``recomputed`` (the rest kept)."""
        chosen = {t for name in recomputed for t in self.tensors.get(name, ())}
        if not len(self.live):
            return 0
        rebuilt = {t: self.window[t][1] for t in chosen}
        for tensor in self.order:  # readers are created after what they read
            if tensor in chosen:
                for source in self.reads[tensor]:
                    if source in chosen and rebuilt[tensor] < rebuilt[source]:
                        rebuilt[source] = rebuilt[tensor]
        delta = np.zeros(len(self.live) + 1, dtype=np.int64)
        for tensor in chosen:
            start, end = self.window[tensor][0], rebuilt[tensor]
            if end > start:
                delta[start] -= self.nbytes[tensor]
                delta[end] += self.nbytes[tensor]
        return int((self.live + np.cumsum(delta[:-1])).max())


@dataclass(frozen=True)
class _Candidate:
    kept: int
    seconds: float
    names: tuple[str, ...]
    peak: int


def solve_peak_capped(problem: SavedBytesProblem, activations: ActivationProblem,
                      target_bytes: int,
                      simulate: Callable[[Sequence[str]], int] | None = None
                      ) -> FractionDecision:
    """The plan of the module doc for ``target_bytes``; ``simulate(tagged nodes)`` (the
    partitioned step's simulated peak) checks the chosen plan against plain autograd's
    and, where it is above, the next lowest-peak candidates within the target. The
    decision's ``peak_bytes`` is the simulated peak where simulated, else the model's."""
    model = ChainPeak.build(activations, problem)
    seconds_path = fraction_path(problem)
    states = {names: (kept, seconds) for kept, seconds, names in seconds_path}
    options = len(problem.options)
    if options <= PEAK_PATH_OPTIONS:
        def lowest_peak(name: str, recomputed: frozenset[str], delta: tuple[int, float]):
            return -model.peak(recomputed - {name}), delta[1] / max(delta[0], 1), name

        for kept, seconds, names in fraction_path(problem, lowest_peak):
            states.setdefault(names, (kept, seconds))
        for names in _downward(problem, model):
            decision = fraction_decision(problem, names, 0, 0, "", [])
            states.setdefault(names, (decision.kept_bytes, decision.added_seconds))
    candidates = [_Candidate(k, s, n, model.peak(n)) for n, (k, s) in states.items()]
    floor = min(c.kept for c in candidates)
    plain = model.peak(())
    chosen, cap = _capped(candidates, target_bytes, plain)
    peak, capped, simulated = chosen.peak, chosen.peak <= cap, simulate is not None
    if simulated and not chosen.names:
        peak = plain = simulate(())
    elif simulated:
        peak, plain, chosen, capped = _simulated(problem, candidates, chosen, cap,
                                                 target_bytes, simulate)
    decision = fraction_decision(problem, chosen.names, target_bytes, floor,
                                 "fraction path, peak-capped",
                                 [(k, s) for k, s, _ in seconds_path])
    return dataclasses.replace(decision, peak_bytes=peak, plain_peak_bytes=plain,
                               peak_simulated=simulated, peak_capped=capped)


def _downward(problem: SavedBytesProblem, model: ChainPeak) -> list[tuple[str, ...]]:
    """The states of a path from keeping everything to recomputing everything, each step
    recomputing the option that leaves the lowest model peak (ties: the cheaper chain)."""
    seconds = {o.name: sum(problem.node_seconds.get(n, 0.0) for n in o.chain)
               for o in problem.options}
    recomputed: set[str] = set()
    states = []
    while len(recomputed) < len(seconds):
        name = min(seconds.keys() - recomputed,
                   key=lambda n: (model.peak(recomputed | {n}), seconds[n], n))
        recomputed.add(name)
        states.append(tuple(sorted(recomputed)))
    return states


def _capped(candidates: list[_Candidate], target: int, plain: int
            ) -> tuple[_Candidate, int]:
    """(the plan for ``target``, its cap): the walk of the module doc."""
    cap, chosen = plain, None
    levels = sorted({c.kept for c in candidates if c.kept > target}, reverse=True)
    within = [c for c in candidates if c.kept <= target] or \
        [min(candidates, key=lambda c: c.kept)]
    for level in [*levels, target]:
        allowed = [c for c in candidates if c.kept <= level] if level != target else within
        fitting = [c for c in allowed if c.peak <= cap]
        chosen = min(fitting, key=lambda c: (c.seconds, c.peak)) if fitting else \
            min(allowed, key=lambda c: (c.peak, c.seconds))
        if level != target:
            cap = min(cap, chosen.peak)
    return chosen, cap


def _simulated(problem: SavedBytesProblem, candidates: list[_Candidate], chosen: _Candidate,
               cap: int, target: int, simulate: Callable[[Sequence[str]], int]
               ) -> tuple[int, int, _Candidate, bool]:
    """(simulated peak, plain autograd's simulated peak, the plan, whether it is capped):
    the chosen plan's simulated peak; where it is above plain autograd's simulated peak,
    the lowest simulated of up to :data:`SIMULATED_CANDIDATES` candidates within the
    target, lowest model peak first."""
    plain = simulate(())
    by_name = {o.name: o for o in problem.options}

    def tagged(candidate: _Candidate) -> list[str]:
        return sorted({n for name in candidate.names for n in by_name[name].chain})

    tried = [(simulate(tagged(chosen)), chosen)]
    if tried[0][0] > plain:
        others = sorted((c for c in candidates if c.kept <= target and c is not chosen),
                        key=lambda c: (c.peak, c.seconds))
        for other in others[:SIMULATED_CANDIDATES - 1]:
            tried.append((simulate(tagged(other)) if other.names else plain, other))
    peak, best = min(tried, key=lambda t: (t[0], t[1].seconds))
    return peak, plain, best, peak <= plain and best.peak <= cap
