"""A byte ``memory_budget`` under dynamic shapes: its plan follows the largest step.

Under dynamic shapes (``dynamic=True``, or Dynamo's automatic dynamic once a batch's size
changed) a graph is compiled once for every size, and fxopt plans it at its size symbols'
hints: the sizes of the call that compiled it. A byte budget bounds the step's predicted
peak at those sizes. A later call with larger sizes (a longer sequence) runs the same plan,
and its peak grows with them: a Llama (2 x 128, vocabulary 32000, batch 4, drop_logits)
planned within 95 MiB at 128 tokens peaked at 96.1 MiB at 512. :class:`SizeWatch` wraps
such a graph. At a call with a size above the planned one it predicts the compiled step's
peak there (the memory model explain shows, :func:`fxopt.analysis.memory.
estimate_step_memory`, of the graphs as compiled, read at the call's sizes through
:func:`fxopt._compat.sizes_planned_at`) and, where that is above the plan's bound (the
budget less the code generator's margin), plans the graph again at those sizes (on the
values Dynamo traced it with, the same symbols: it still serves every size) before running
it. A plan is made at sizes that only grow, each the largest seen in its dimension, so
plans never go back and forth; where the budget cannot be met at the new sizes the planner
warns as at any compile (raises under ``strict``), and the watch stops. A fraction budget
bounds saved bytes against each step's own (plain autograd's at that size), so it is not
watched.

Dynamo passes a graph's size symbols as int arguments (the backend's example inputs hold
them as SymInts), so a call of sizes already seen costs a few int comparisons; the step is
simulated once for each larger size seen, a fraction of a second for a small transformer.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from fxopt import _compat
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
    """A compiled graph of symbolic sizes planned under a byte budget at ``sizes``
    (:func:`traced_sizes`); ``bound_bytes`` is what its plan's predicted peak is held to
    (``budget_bytes`` less the code generator's margin). ``predict(sizes)`` is the compiled
    step's predicted peak at ``sizes`` (symbol -> size; None before its backward is
    compiled); ``replan(args, sizes)`` compiles the graph again, planned at ``sizes``, and
    returns it with its plan's predicted peak (None: no plan made). Called as Dynamo calls
    what a backend returns."""

    def __init__(self, compiled: Callable[..., Any], graph: str, budget_bytes: int,
                 bound_bytes: int, sizes: dict[int, tuple[str, str, int]],
                 predict: Callable[[dict[str, int]], int | None],
                 replan: Callable[[list[Any], dict[str, int]],
                                  tuple[Callable[..., Any], int | None]]) -> None:
        self.compiled = compiled
        self.graph = graph
        self.budget_bytes = budget_bytes
        self.bound_bytes = bound_bytes
        self.sizes: dict[int, tuple[str, str, int]] | None = sizes  # None: not watched
        self._predict = predict
        self._replan = replan
        self._fitting: set[tuple[int, ...]] = set()  # larger sizes predicted within

    def __call__(self, *args: Any) -> Any:
        if self.sizes is not None:
            values = tuple(args[i] for i in self.sizes)
            if values not in self._fitting and any(
                    isinstance(v, int) and v > planned
                    for v, (_, _, planned) in zip(values, self.sizes.values(), strict=True)):
                self._check(values, args)
        return self.compiled(*args)

    def _by_symbol(self, values: tuple[int, ...]) -> dict[str, int]:
        return {symbol: v for (_, symbol, _), v in zip(self.sizes.values(), values, strict=True)
                if isinstance(v, int)}

    def _named(self, values: tuple[int, ...]) -> str:
        return ", ".join(f"{name}={v}" for (name, _, _), v in
                         zip(self.sizes.values(), values, strict=True))

    def _check(self, values: tuple[int, ...], args: tuple[Any, ...]) -> None:
        predicted = self._predict(self._by_symbol(values))
        if predicted is None:  # not trained yet: nothing compiled to predict from
            return
        if predicted <= self.bound_bytes:
            self._fitting.add(values)
            return
        planned = tuple(size for _, _, size in self.sizes.values())
        # the sizes the new plan is made at: each dimension's largest so far
        at = tuple(max(v, size) if isinstance(v, int) else size
                   for v, size in zip(values, planned, strict=True))
        log.info("fxopt: graph %s was planned within memory_budget %s MiB at %s; this call "
                 "has %s, where that plan is predicted to peak at %s MiB: planning it again "
                 "at %s", self.graph, format_mib(self.budget_bytes), self._named(planned),
                 self._named(values), format_mib(predicted), self._named(at))
        try:
            self.compiled, peak = self._replan(list(args), self._by_symbol(at))
        except Exception as exc:  # strict: the planner's error, at this call
            exc.add_note(f"fxopt: graph {self.graph} was being planned again for a call "
                         f"with {self._named(values)}, larger than the sizes it was planned "
                         f"at ({self._named(planned)})")
            raise
        if peak is None or peak > self.bound_bytes:  # the planner said why (it warns)
            self.sizes = None
            return
        self.sizes = {i: (name, symbol, v) for (i, (name, symbol, _)), v in
                      zip(self.sizes.items(), at, strict=True)}
        self._fitting.clear()  # predictions made for the plan replaced
