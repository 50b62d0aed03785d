"""A byte ``memory_budget`` under dynamic shapes: its plan holds at the sizes Dynamo traced.

Under dynamic shapes (``dynamic=True``, or Dynamo's automatic dynamic once a batch's size
changed) a graph is compiled once for every size, and fxopt plans it at its size symbols'
hints: the sizes of the call that compiled it. A byte budget bounds the step's predicted
peak at those sizes. A later call with larger sizes (a longer sequence) runs the same plan,
and its peak grows with them: a Llama (2 x 128, vocabulary 32000, batch 4) planned within
104 MiB at 32 tokens peaked at 137 MiB at 128, silently. :class:`SizeWatch` wraps such a
graph; at a call with a size above the traced one it predicts the plan's peak there (the
planned peak scaled as the graph's symbolic memory model, :mod:`fxopt.planner.symbolic`,
scales between the two sizes) and warns, once, where that is above the budget, naming the
sizes and what holds the budget at every size. A fraction budget bounds saved bytes against
each step's own (plain autograd's at that size), so it is not watched.

Dynamo passes a graph's size symbols as int arguments (the backend's example inputs hold
them as SymInts), so a call of sizes already seen costs a few int comparisons; the symbolic
model is built at the first larger call, a fraction of a second for a small transformer.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from fxopt import _compat
from fxopt.planner.symbolic import SymbolicStep
from fxopt.units import format_mib

__all__ = ["SizeWatch", "traced_sizes"]


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
    the first call with a larger size). Called as Dynamo calls what a backend returns."""

    def __init__(self, compiled: Callable[..., Any], graph: str, budget_bytes: int,
                 sizes: dict[int, tuple[str, str, int]], planned_peak_bytes: int,
                 model: Callable[[], SymbolicStep]) -> None:
        self.compiled = compiled
        self.graph = graph
        self.budget_bytes = budget_bytes
        self.sizes: dict[int, tuple[str, str, int]] | None = sizes  # None once warned
        self.planned_peak_bytes = planned_peak_bytes
        self._model = model
        self._built: SymbolicStep | None = None
        self._traced_peak = 1.0  # the symbolic model's peak at the traced sizes, once built
        self._fitting: set[tuple[int, ...]] = set()  # larger sizes predicted within

    def __call__(self, *args: Any) -> Any:
        if self.sizes is not None:
            values = tuple(args[i] for i in self.sizes)
            if values not in self._fitting and any(
                    isinstance(v, int) and v > planned
                    for v, (_, _, planned) in zip(values, self.sizes.values(), strict=True)):
                self._check(values)
        return self.compiled(*args)

    def predicted_peak_bytes(self, values: tuple[int, ...]) -> int:
        """The plan's predicted peak at these sizes (one per watched argument)."""
        if self._built is None:
            self._built = self._model()
            self._traced_peak = max(float(self._built.peak_bytes()[0]), 1.0)
        symbols = {symbol: v for (_, symbol, _), v in zip(self.sizes.values(), values,
                                                          strict=True)
                   if symbol in self._built.symbols and isinstance(v, int)}
        scale = float(self._built.peak_bytes(**symbols)[0]) / self._traced_peak
        return int(self.planned_peak_bytes * scale)

    def _check(self, values: tuple[int, ...]) -> None:
        predicted = self.predicted_peak_bytes(values)
        if predicted <= self.budget_bytes:
            self._fitting.add(values)
            return
        planned = ", ".join(f"{name}={size}" for name, _, size in self.sizes.values())
        now = ", ".join(f"{name}={v}" for (name, _, size), v in
                        zip(self.sizes.values(), values, strict=True) if v != size)
        self.sizes = None
        warnings.warn(
            f"fxopt: memory_budget {format_mib(self.budget_bytes)} MiB was planned for graph "
            f"{self.graph} at the sizes Dynamo traced ({planned}, a predicted peak of "
            f"{format_mib(self.planned_peak_bytes)} MiB); this call has {now}, where the "
            f"same plan is predicted to peak at {format_mib(predicted)} MiB, above the "
            "budget. To hold it at every size, let the graph's first dynamic compile see the "
            "largest batch (dynamic=True with the largest batch first) or pad batches to "
            "one length; a fraction memory_budget bounds saved bytes against each step's own",
            stacklevel=3)
