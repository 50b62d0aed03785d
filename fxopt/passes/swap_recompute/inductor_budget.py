"""A fraction budget under Inductor code generation: Inductor's budgeted min-cut decides.

Inductor fuses the pointwise ops it recomputes into the kernels that read them, so its
min-cut partitioner (with functorch's ``activation_memory_budget``) recomputes more for
less time than fxopt's chains, which the fx code generation runs op by op. Under
``codegen="inductor"`` the pass therefore hands its share of the budget (the bytes this
graph may keep, from :func:`fxopt.planner.plan_step` and the model's ledger) to the
partition: :class:`BudgetedMinCut` is called by :func:`fxopt._compat.inductor_partition`
after Inductor's joint-graph passes, and

1. partitions with Inductor's min-cut under ``activation_memory_budget`` = the user's
   fraction, which is what Inductor itself does at that fraction, so where that fits the
   share fxopt's point is Inductor's (same bytes, same kernels); only where it keeps more
   than the share (Inductor's fraction is of its own min-cut's saved bytes, not of plain
   autograd's, and a graph's share may be below ``f`` of its own bytes) it bisects the
   budget below the fraction for the largest value whose partition keeps at most the share,
   each trial on a copy of the joint graph; the bytes kept are the partitioned step's saved
   activations (:func:`fxopt.analysis.memory.estimate_step_memory`). Where the graph keeps
   no more than its share with everything kept (after recompute_rnn took an RNN's saves
   out of it, say), Inductor's partition without a budget is tried first;
2. keeps random ops exact: a random op (dropout) that min-cut chose to recompute in the
   backward would draw a new mask (Inductor with ``fallback_random`` then gets gradients
   wrong by 35-66%); the trial is partitioned again with that op tagged ``MUST_RECOMPUTE``,
   so torch's partitioner replays its forward's RNG state (``run_and_save_rng_state`` /
   ``run_with_rng_state``) and the mask is the forward's, bit for bit. Inductor's own
   random ops (``fallback_random`` off) draw from one seeds tensor (``inductor_seeds``):
   where min-cut would redraw that in the backward it is tagged ``MUST_SAVE`` (a few
   bytes, less than an RNG state), and the ops reading it replay from the saved seeds;
3. where no budget fits the share, applies fxopt's own plan (its recompute tags, which
   meet the share wherever it is at or above fxopt's floor) under Inductor's min-cut, and
   where that keeps more than the share (min-cut saves what it likes around the tags),
   under torch's default partitioner, for which fxopt's plan is exact; where even that
   keeps more, the share is missed: warned, or ``InfeasibleBudget`` under ``strict``.

Every partition's bytes count the graph's inputs that are activations (another graph's
outputs across a graph break, ``activation_inputs``) when it saves them: a fraction is a
promise about what the step keeps, measured as saved-tensor hooks measure it.

4. never peaks above fxopt's own plan: each partition's step peak is predicted
   (:func:`~fxopt.analysis.memory.estimate_step_memory` as Inductor's code runs it), and
   fxopt's plan (whose peak, by its model, never rises as the budget falls and stays at or
   below plain autograd's, :mod:`fxopt.planner.solvers.fraction_peak`) is partitioned too
   (one more partition per graph) and taken where it keeps within the share and peaks
   lower than the min-cut's: on ``fxopt doctor``'s deep MLP the min-cut at 0.35 peaked
   above its own at 0.6, fxopt's plan does not (``benchmarks/results/doctor_memory_cpu.md``).

The ledger's entry for the graph and the pass's stats (``stats["inductor"]``) are then
set to what the chosen partition keeps (the pass's other stats are fxopt's own plan,
the fallback).
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

from fxopt import _compat
from fxopt.analysis.cost import storage_root
from fxopt.analysis.memory import estimate_step_memory
from fxopt.analysis.shapes import storage_nbytes
from fxopt.passes.swap_recompute.apply import mark_recompute
from fxopt.planner import InfeasibleBudget
from fxopt.planner.joint import is_random
from fxopt.planner.ledger import BudgetLedger
from fxopt.planner.solvers.fraction import rng_state_bytes

__all__ = ["BudgetedMinCut", "BISECTION_STEPS"]

log = logging.getLogger(__name__)

BISECTION_STEPS = 6  # activation_memory_budget to within 1/64


@dataclasses.dataclass
class BudgetedMinCut:
    """The partition search of one graph under the user's ``fraction``: keep at most
    ``target_bytes``, the graph's share (module doc).
    ``fallback_tags``: fxopt's plan (node names to tag) where no budget fits; ``stats``:
    the pass's ``stats["inductor"]``, filled with what was chosen (the partition, its
    budget, the bytes it keeps, every trial's (budget, bytes)); ``ledger``: the model's ledger,
    whose last entry (this graph's) gets the bytes the chosen partition keeps."""

    fraction: float
    target_bytes: int
    fallback_tags: tuple[str, ...]
    stats: dict[str, Any]
    ledger: BudgetLedger | None = None
    plain_fits: bool = False  # everything kept is within the share: try no budget first
    # placeholders that are activations (another graph's outputs): counted when kept
    activation_inputs: frozenset[str] = frozenset()
    entry: int | None = None  # this graph's entry in the ledger
    num_fwd_outputs: int | None = None  # the joint's: for the default partitioner fallback
    strict: bool = False  # raise InfeasibleBudget where no partition keeps within the share
    plan_feasible: bool = True  # fxopt's plan meets the share (else plan_step warned already)

    def __call__(self, joint: fx.GraphModule, partition: Callable[..., Any]
                 ) -> tuple[fx.GraphModule, fx.GraphModule]:
        """``partition(joint_copy, budget)``: Inductor's min-cut of a copy under
        ``activation_memory_budget=budget`` (None: its default, no budget)."""
        trials: list[_Trial] = []

        def trial(budget: float | None, tags: tuple[str, ...] = ()) -> int:
            result = _exact_random_partition(joint, partition, budget, tags)
            kept = (estimate_step_memory(*result).activation_bytes
                    + saved_input_bytes(*result, self.activation_inputs))
            peak = estimate_step_memory(*result, codegen="inductor").peak_bytes
            trials.append(_Trial(budget, kept, result, peak))
            return kept

        first = self.fraction if self.fraction < 1 and not self.plain_fits else None
        fits: _Trial | None = None
        if trial(first) <= self.target_bytes:
            fits = trials[-1]
        else:
            low, high = 0.0, self.fraction
            for _ in range(BISECTION_STEPS):
                middle = (low + high) / 2
                if trial(middle) <= self.target_bytes:
                    low, fits = middle, trials[-1]
                else:
                    high = middle
        chosen = "inductor min-cut"
        if fits is None:
            chosen, fits = self._fallback(joint, partition, trial, trials)
        elif self.fallback_tags:  # fxopt's plan, where it keeps within the share and peaks lower
            label, own = self._fallback(joint, partition, trial, trials)
            if own.kept <= self.target_bytes and own.peak < fits.peak:
                chosen, fits = label, own
        self._record(chosen, fits, trials)
        if fits.kept > self.target_bytes and self.plan_feasible:
            message = (f"fxopt: swap_recompute under Inductor cannot keep this graph's "
                       f"saved bytes within its share ({self.target_bytes} bytes) of "
                       f"memory_budget {self.fraction:g}: the fewest its partitions keep "
                       f"are {fits.kept} bytes")
            if self.strict:
                raise InfeasibleBudget(message)
            warnings.warn(f"{message}; using that partition", stacklevel=2)
        return fits.result

    def _fallback(self, joint: fx.GraphModule, partition: Callable[..., Any],
                  trial: Callable[..., int], trials: list[_Trial]) -> tuple[str, _Trial]:
        """fxopt's plan (its recompute tags) under Inductor's min-cut, else under torch's
        default partitioner, for which fxopt's plan is exact (it saves what the plan
        keeps); the one that keeps the fewest bytes where neither fits."""
        trial(None, self.fallback_tags)
        if trials[-1].kept <= self.target_bytes or self.num_fwd_outputs is None:
            return "fxopt plan", trials[-1]

        def own(copy: fx.GraphModule, _: float | None) -> Any:
            return _compat.default_partition(copy, None, num_fwd_outputs=self.num_fwd_outputs)

        trial_own = _exact_random_partition(joint, own, None, self.fallback_tags)
        kept = (estimate_step_memory(*trial_own).activation_bytes
                + saved_input_bytes(*trial_own, self.activation_inputs))
        trials.append(_Trial(None, kept, trial_own,
                             estimate_step_memory(*trial_own, codegen="inductor").peak_bytes))
        if kept <= trials[-2].kept:
            return "fxopt plan, default partitioner", trials[-1]
        return "fxopt plan", trials[-2]

    def _record(self, chosen: str, fits: _Trial, trials: list[_Trial]) -> None:
        self.stats.update(partition=chosen, activation_memory_budget=fits.budget,
                          saved_bytes_after=fits.kept, peak_bytes=fits.peak,
                          trials=[(t.budget, t.kept, t.peak) for t in trials])
        if self.ledger is not None and self.entry is not None:
            self.ledger.shares[self.entry] = dataclasses.replace(
                self.ledger.shares[self.entry], kept_bytes=fits.kept)
        log.info("fxopt: swap_recompute under Inductor: %s (activation_memory_budget %s) "
                 "keeps %d bytes of a %d-byte share, predicted peak %d", chosen, fits.budget,
                 fits.kept, self.target_bytes, fits.peak)


@dataclasses.dataclass(frozen=True)
class _Trial:
    """One partition tried: its budget, the bytes it keeps, the graphs, its predicted
    peak (Inductor's generated code, :func:`~fxopt.analysis.memory.estimate_step_memory`)."""

    budget: float | None
    kept: int
    result: tuple[fx.GraphModule, fx.GraphModule]
    peak: int


def saved_input_bytes(forward: fx.GraphModule, backward: fx.GraphModule,
                      inputs: frozenset[str]) -> int:
    """Bytes of the forward's placeholders named in ``inputs`` that the partition saves
    for the backward, as themselves or through a view (each storage once): the activation
    inputs a step's saved bytes count, which the memory estimate leaves to the caller."""
    if not inputs:
        return 0
    by_name = {n.name: n for n in forward.graph.nodes}
    kept: dict[str, int] = {}
    for placeholder in backward.graph.find_nodes(op="placeholder"):
        node = by_name.get(placeholder.name)
        if node is not None:
            node = storage_root(node)
        if node is not None and node.op == "placeholder" and node.name in inputs:
            kept[node.name] = storage_nbytes(node.meta.get("val"))
    return sum(kept.values())


def _exact_random_partition(joint: fx.GraphModule, partition: Callable[..., Any],
                            budget: float | None, tags: tuple[str, ...]
                            ) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Inductor's min-cut of a copy of ``joint`` (``tags`` tagged ``MUST_RECOMPUTE``), again
    with every random op it recomputed pinned: tagged ``MUST_RECOMPUTE``, so that torch
    replays its RNG state, or, where its value is no larger than that state (Inductor's
    seeds tensor), ``MUST_SAVE``."""
    forward_nodes = {n.name: n for n in joint.graph.nodes if n.op == "call_function"
                     and n.meta.get("partitioner_tag") != "is_backward"}
    pinned: set[str] = set()
    while True:
        copy = fx.GraphModule(joint, _compat.copy_graph(joint.graph))
        for node in copy.graph.nodes:
            if node.name in tags or (node.name in pinned and not _save_instead(node)):
                mark_recompute(node)
            elif node.name in pinned:
                node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
        forward, backward = partition(copy, budget)
        redrawn = {n.name for n in backward.graph.nodes
                   if n.op == "call_function" and _draws(n)} & forward_nodes.keys() - pinned
        if not redrawn:
            return forward, backward
        log.debug("fxopt: min-cut recomputes random ops %s: pinning them", sorted(redrawn))
        pinned |= redrawn


def _draws(node: fx.Node) -> bool:
    """A random op that draws from the generator (not its getitem, not a replay wrapper)."""
    return node.target is not operator.getitem and is_random(node)


def _save_instead(node: fx.Node) -> bool:
    """A random tensor no larger than the RNG state a replay would save."""
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and \
        value.numel() * value.element_size() <= rng_state_bytes(value.device)
