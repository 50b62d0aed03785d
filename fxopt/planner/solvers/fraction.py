"""A fraction budget: keep for backward at most ``f`` x the bytes plain autograd keeps.

``memory_budget=f`` (or ``"50%"``) bounds what ``fxopt.analysis.measure_saved_bytes``
measures (saved-tensor hooks; parameters, buffers and the model's inputs excluded): the
bytes one step keeps for backward. A graph's input that another graph made across a graph
break (the logits a loss graph reads) is an activation: kept, it counts
(:func:`fxopt.planner.joint.saved_bytes_problem`'s ``activation_inputs``), and a
recompute that reads it keeps it. It is what Inductor's ``activation_memory_budget`` bounds, so the
two compare. The budget is the model's: graphs share it as they compile
(:mod:`fxopt.planner.ledger`), and :func:`solve_fraction` answers one graph's share.

The problem (:class:`SavedBytesProblem`, plain data; :func:`fxopt.planner.joint.
saved_bytes_problem` builds it from a joint graph) is exact for the partitioner fxopt's fx
code generation uses (AOTAutograd's default one): recomputing a saved tensor tags its
*one-level chain* (the nodes back to placeholders, to other saved tensors and to nodes
that cannot be recomputed) ``MUST_RECOMPUTE``, and the partitioner saves every untagged
node a tagged node reads. When a saved tensor that a chain reads is recomputed too, its
own chain is tagged and the two join: chains of any depth compose, the tagged set of a
plan is the union of its members' chains (each node rebuilt once), and the bytes kept are

- the saved tensors not recomputed (their storages; several may share one),
- the *stops*: storages of the nodes the chains of recomputed tensors end at because they
  cannot be recomputed (a random op where random recompute is off, a mutating op),
- the RNG state of each recomputed random op (dropout): the partitioner replays it with
  torch's functionalized RNG ops (``run_and_save_rng_state`` in the forward,
  ``run_with_rng_state`` in the backward), so the recomputed mask is the forward's, bit
  for bit; on the CPU the state is the generator's (about 5 KB), on CUDA a seed and offset,
- and the saved tensors never offered (a forward output shares their storage).

Seconds: the roofline time of the tagged nodes, each once.

Search (:func:`solve_fraction`): start from everything recomputable recomputed, keep the
tensors whose recompute adds bytes (an RNG state larger than the mask it rebuilds), then
walk towards keeping everything, each step keeping the tensor that saves the most seconds
per byte it adds. The floor is the fewest bytes on that path; the answer for a target is
the last state on that one path within the target. So a target
at or above the floor is always met, the bytes kept never grow as the target falls, and the
added time never falls with it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["FractionDecision", "RecomputeOption", "SavedBytesProblem", "fraction_decision",
           "fraction_path", "replay_fraction", "rng_state_bytes", "solve_fraction"]

_GRAPHSAFE_RNG_STATE_BYTES = 16  # CUDA: a seed and an offset (int64 each)


def rng_state_bytes(device: torch.device | str) -> int:
    """Bytes the functionalized RNG saves per recomputed random op on ``device``: the CPU
    generator's whole state, or CUDA's seed and offset."""
    if torch.device(device).type == "cpu":
        return torch.get_rng_state().numel()
    return _GRAPHSAFE_RNG_STATE_BYTES


@dataclass(frozen=True)
class RecomputeOption:
    """Saved tensors recomputed together (those of one random op share its RNG state): their
    storages, the one-level chain (node names) and the storages that must be saved when
    they are recomputed (their stops, RNG states)."""

    name: str
    storages: tuple[str, ...]
    chain: tuple[str, ...]
    stops: tuple[str, ...] = ()


@dataclass(frozen=True)
class SavedBytesProblem:
    storage_bytes: dict[str, int]        # every storage that may be kept -> bytes
    always_kept: tuple[str, ...]         # storages of saved tensors without an option
    options: tuple[RecomputeOption, ...]
    node_seconds: dict[str, float]       # chain node -> its roofline seconds
    # plain autograd's bytes a rewrite before autograd took out of the graph (recompute_rnn)
    removed_bytes: int = 0
    # storages that are the graph's activation inputs (another graph's outputs): kept by
    # every plan that keeps or recomputes from them, whatever it recomputes
    input_storages: tuple[str, ...] = ()

    @property
    def plain_bytes(self) -> int:
        """Bytes kept with everything kept: plain autograd's (the graph's, and what the
        rewrites before autograd took out of it, so a fraction's base stays eager's)."""
        kept = {*self.always_kept, *(s for o in self.options for s in o.storages)}
        return sum(self.storage_bytes[s] for s in kept) + self.removed_bytes


@dataclass
class FractionDecision:
    recompute: tuple[str, ...]     # option names, recomputed
    kept_bytes: int
    plain_bytes: int
    floor_bytes: int
    added_seconds: float
    target_bytes: int
    tagged: tuple[str, ...] = ()   # chain nodes to tag MUST_RECOMPUTE
    solver: str = "fraction path"
    path: list[tuple[int, float]] = field(default_factory=list)  # (kept, seconds) per state
    # the step's predicted peak and plain autograd's (None: not predicted; simulated: the
    # partitioned step's simulation, else the chain model's), and whether the peak is
    # within what larger budgets' plans and plain autograd's reach (:mod:`.fraction_peak`)
    peak_bytes: int | None = None
    plain_peak_bytes: int | None = None
    peak_simulated: bool = False
    peak_capped: bool = True

    @property
    def feasible(self) -> bool:
        return self.kept_bytes <= self.target_bytes

    @property
    def floor_fraction(self) -> float:
        return self.floor_bytes / self.plain_bytes if self.plain_bytes else 0.0


class _State:
    """Recomputed options with refcounts of kept storages and tagged nodes."""

    def __init__(self, problem: SavedBytesProblem) -> None:
        self.problem = problem
        self.size = problem.storage_bytes
        self.recomputed = {o.name: o for o in problem.options}
        self.storage_refs = Counter(problem.always_kept)
        self.node_refs: Counter[str] = Counter()
        for option in problem.options:
            self.storage_refs.update(option.stops)
            self.node_refs.update(option.chain)

    def kept_bytes(self) -> int:
        return sum(self.size[s] for s, n in self.storage_refs.items() if n > 0)

    def seconds(self) -> float:
        return sum(self.problem.node_seconds.get(n, 0.0)
                   for n, k in self.node_refs.items() if k > 0)

    def keep_delta(self, option: RecomputeOption) -> tuple[int, float]:
        """(bytes added, seconds saved) by keeping ``option`` instead of recomputing it."""
        added = sum(self.size[s] for s in set(option.storages) if self.storage_refs[s] == 0)
        added -= sum(self.size[s] for s in set(option.stops) if self.storage_refs[s] == 1)
        saved = sum(self.problem.node_seconds.get(n, 0.0) for n in option.chain
                    if self.node_refs[n] == 1)
        return added, saved

    def keep(self, option: RecomputeOption) -> None:
        del self.recomputed[option.name]
        self.storage_refs.update(option.storages)
        self.storage_refs.subtract(option.stops)
        self.node_refs.subtract(option.chain)

    def keep_free(self) -> None:
        """Keep every option whose recompute adds no bytes (and costs time), to a fixpoint."""
        changed = True
        while changed:
            changed = False
            for option in sorted(self.recomputed.values(), key=lambda o: o.name):
                if self.keep_delta(option)[0] <= 0:
                    self.keep(option)
                    changed = True


Rank = Callable[[str, frozenset[str], tuple[int, float]], Any]


def _seconds_per_byte(name: str, recomputed: frozenset[str], delta: tuple[int, float]) -> Any:
    return delta[1] / max(delta[0], 1), -delta[0], name


def fraction_path(problem: SavedBytesProblem, rank: Rank = _seconds_per_byte
                  ) -> list[tuple[int, float, tuple[str, ...]]]:
    """The search path of the module doc, from the floor to keeping everything: per state
    (bytes kept, seconds added, option names recomputed). ``rank(name, recomputed,
    (bytes added, seconds saved))``: the option kept next is the highest ranked (by
    default the most seconds saved per byte added; :mod:`.fraction_peak` walks a second
    path ranked by the predicted peak)."""
    state = _State(problem)
    state.keep_free()
    states = [(state.kept_bytes(), state.seconds(), tuple(sorted(state.recomputed)))]
    while state.recomputed:
        recomputed = frozenset(state.recomputed)
        deltas = {name: state.keep_delta(o) for name, o in state.recomputed.items()}
        name = max(deltas, key=lambda n: rank(n, recomputed, deltas[n]))
        state.keep(state.recomputed[name])
        state.keep_free()
        states.append((state.kept_bytes(), state.seconds(), tuple(sorted(state.recomputed))))
    return states


def solve_fraction(problem: SavedBytesProblem, target_bytes: int) -> FractionDecision:
    """The fastest plan on the search path (module doc) that keeps at most
    ``target_bytes``; below the floor, the floor's plan (``feasible`` is then False)."""
    states = fraction_path(problem)
    floor = min(states, key=lambda s: s[0])
    chosen = next((s for s in reversed(states) if s[0] <= target_bytes), floor)
    return fraction_decision(problem, chosen[2], target_bytes, floor[0], "fraction path",
                             [(k, s) for k, s, _ in states])


def replay_fraction(problem: SavedBytesProblem, target_bytes: int,
                    actions: dict[str, str]) -> FractionDecision:
    """A saved plan's recomputes on ``problem`` (KeyError: a name it does not have)."""
    floor = solve_fraction(problem, 0).floor_bytes
    options = {o.name: o for o in problem.options}
    names = tuple(sorted(n for n, a in actions.items() if a == "recompute"))
    missing = [n for n in names if n not in options]
    if missing:
        raise KeyError(missing[0])
    return fraction_decision(problem, names, target_bytes, floor, "plan", [])


def fraction_decision(problem: SavedBytesProblem, names: tuple[str, ...], target_bytes: int,
                      floor_bytes: int, solver: str, path: list[tuple[int, float]]
                      ) -> FractionDecision:
    """The decision recomputing the options ``names`` (the rest kept)."""
    state = _State(problem)
    for option in problem.options:
        if option.name not in names:
            state.keep(option)
    by_name = {o.name: o for o in problem.options}
    tagged = sorted({n for name in names for n in by_name[name].chain})
    return FractionDecision(recompute=names, kept_bytes=state.kept_bytes(),
                            plain_bytes=problem.plain_bytes, floor_bytes=floor_bytes,
                            added_seconds=state.seconds(), target_bytes=target_bytes,
                            tagged=tuple(tagged), solver=solver, path=path)
