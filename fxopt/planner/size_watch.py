"""A byte ``memory_budget`` under dynamic shapes: its plan follows the largest step.

Under dynamic shapes (``dynamic=True``, or Dynamo's automatic dynamic once a batch's size
changed) a graph is compiled once for every size, and fxopt plans it at its size symbols'
hints: the sizes of the call that compiled it. A byte budget bounds the step's predicted
peak at those sizes. A later call with larger sizes (a longer sequence) runs the same plan,
and its peak grows with them: a Llama (2 x 128, vocabulary 32000, batch 4) planned within
104 MiB at 32 tokens peaked at 137 MiB at 128. :class:`SizeWatch` wraps such a graph; at a
call with a size above the planned one it predicts the plan's peak there (the planned peak
scaled as the graph's symbolic memory model, :mod:`fxopt.planner.symbolic`, scales between
the two sizes) and, where that is above the budget, plans the graph again at the call's
sizes (on the values Dynamo traced it with, the same symbols: it still serves every size)
before running it. A plan is made again only at a step predicted to peak above the
planned one's, so plans only follow larger steps, never back and forth; where the budget
cannot be met at the new sizes the planner warns as at any compile, and the watch stops.
A fraction budget bounds saved bytes against each step's own (plain autograd's at that
size), so it is not watched.

Dynamo passes a graph's size symbols as int arguments (the backend's example inputs hold
them as SymInts), so a call of sizes already seen costs a few int comparisons; the symbolic
model is built at the first larger call, a fraction of a second for a small transformer.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from fxopt import _compat
from fxopt.planner.symbolic import SymbolicStep
from fxopt.units import format_mib

__all__ = ["SizeWatch", "traced_sizes"]

log = logging.getLogger(__name__)


def traced_sizes(gm: fx.GraphModule, example_inputs: Sequence[Any]
                 ) -> dict[int, tuple[str, str, int]]:
    """Argument position -> (what the size is, its symbol, the size planned at) for each
    size symbol Dynamo passes the graph (``input_ids.size(1)``, or the symbol where Dynamo
    does not say whose size it is); empty for a graph of static sizes."""
    sources = _compat.dynamo_input_sources(gm)
    return {i: (_readable(sources[i] if i < len(sources) else None, value), str(value),
                _compat.size_hint(value, 1))
            for i, value in enumerate(example_inputs) if isinstance(value, torch.SymInt)}


def _readable(source: str | None, symbol: torch.SymInt) -> str:
    """``L['kwargs']['input_ids'].size()[1]`` as ``input_ids.size(1)``."""
    if source is None:
        return str(symbol)
    source = re.sub(r"^L\['kwargs'\]\['(\w+)'\]|^L\['(\w+)'\]",
                    lambda m: m.group(1) or m.group(2), source)
    return re.sub(r"\.size\(\)\[(\d+)\]", r".size(\1)", source)


class SizeWatch:
    """A compiled graph of symbolic sizes planned under a byte budget (``budget_bytes``)
    at ``sizes`` (:func:`traced_sizes`), its plan's predicted peak there
    ``planned_peak_bytes``; ``model`` builds the graph's symbolic step (called once, at
    the first call with a larger size); ``replan(args, sizes)`` compiles the graph again,
    planned at ``sizes`` (symbol -> size), and returns it with its plan's predicted peak
    (None: no plan). Called as Dynamo calls what a backend returns."""

    def __init__(self, compiled: Callable[..., Any], graph: str, budget_bytes: int,
                 sizes: dict[int, tuple[str, str, int]], planned_peak_bytes: int,
                 model: Callable[[], SymbolicStep],
                 replan: Callable[[list[Any], dict[str, int]],
                                  tuple[Callable[..., Any], int | None]]) -> None:
        self.compiled = compiled
        self.graph = graph
        self.budget_bytes = budget_bytes
        # None: not watched (a plan above the budget: more sizes cannot bring it within)
        self.sizes: dict[int, tuple[str, str, int]] | None = (
            sizes if planned_peak_bytes <= budget_bytes else None)
        self.planned_peak_bytes = planned_peak_bytes
        self._model = model
        self._replan = replan
        self._built: SymbolicStep | None = None
        self._planned_model_peak = 1.0  # the symbolic model's peak at the planned sizes
        self._fitting: set[tuple[int, ...]] = set()  # larger sizes predicted within

    def __call__(self, *args: Any) -> Any:
        if self.sizes is not None:
            values = tuple(args[i] for i in self.sizes)
            if values not in self._fitting and any(
                    isinstance(v, int) and v > planned
                    for v, (_, _, planned) in zip(values, self.sizes.values(), strict=True)):
                self._check(values, args)
        return self.compiled(*args)

    def predicted_peak_bytes(self, values: tuple[int, ...]) -> int:
        """The plan's predicted peak at these sizes (one per watched argument)."""
        if self._built is None:
            self._built = self._model()
            self._planned_model_peak = self._model_peak(
                tuple(planned for _, _, planned in self.sizes.values()))
        return int(self.planned_peak_bytes * self._model_peak(values)
                   / self._planned_model_peak)

    def _model_peak(self, values: tuple[int, ...]) -> float:
        symbols = {symbol: v for (_, symbol, _), v in zip(self.sizes.values(), values,
                                                          strict=True)
                   if symbol in self._built.symbols and isinstance(v, int)}
        return max(float(self._built.peak_bytes(**symbols)[0]), 1.0)

    def _check(self, values: tuple[int, ...], args: tuple[Any, ...]) -> None:
        predicted = self.predicted_peak_bytes(values)
        if predicted <= self.budget_bytes:
            self._fitting.add(values)
            return
        planned = ", ".join(f"{name}={size}" for name, _, size in self.sizes.values())
        now = ", ".join(f"{name}={v}" for (name, _, size), v in
                        zip(self.sizes.values(), values, strict=True) if v != size)
        log.info("fxopt: graph %s was planned within memory_budget %s MiB at %s (a "
                 "predicted peak of %s MiB); this call has %s, where that plan is predicted "
                 "to peak at %s MiB: planning it again at these sizes", self.graph,
                 format_mib(self.budget_bytes), planned, format_mib(self.planned_peak_bytes),
                 now, format_mib(predicted))
        try:
            self.compiled, peak = self._replan(
                list(args), {symbol: v for (_, symbol, _), v in
                             zip(self.sizes.values(), values, strict=True)})
        except Exception as exc:  # strict: the planner's error, at this call
            exc.add_note(f"fxopt: graph {self.graph} was being planned again for a call "
                         f"with {now}, larger than the sizes it was planned at ({planned})")
            raise
        if peak is None or peak > self.budget_bytes:  # the planner said why (it warns)
            self.sizes = None
            return
        self.sizes = {i: (name, symbol, v) for (i, (name, symbol, _)), v in
                      zip(self.sizes.items(), values, strict=True)}
        self.planned_peak_bytes = peak
        self._planned_model_peak = self._model_peak(values)
        self._fitting.clear()  # predictions made for the plan replaced
