"""Concrete ints for symbolic sizes, and the sizes a graph is planned at.

A graph of symbolic sizes (``dynamic=True``) is planned at its size symbols' hints: the
sizes of the call that compiled it. :func:`sizes_planned_at` plans it at other sizes
instead: a byte budget's graph compiled again at a larger call
(:class:`fxopt.planner.size_watch.SizeWatch`) is planned for that call, on the values
Dynamo traced it with, whose hints are still the first call's.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from typing import Any

import torch

__all__ = ["size_hint", "sizes_planned_at"]

# symbol name -> the size to plan at, inside sizes_planned_at
_planned_sizes: contextvars.ContextVar[Mapping[str, int] | None] = contextvars.ContextVar(
    "fxopt_planned_sizes", default=None)


@contextlib.contextmanager
def sizes_planned_at(sizes: Mapping[str, int]) -> Iterator[None]:
    """Within, :func:`size_hint` reads a size of these symbols (name -> size) at these
    sizes, and every other symbol at its hint: ``s1`` is 128 and ``4*s1`` 512 inside
    ``sizes_planned_at({"s1": 128})`` wherever the trace saw 32."""
    token = _planned_sizes.set(dict(sizes) or None)
    try:
        yield
    finally:
        _planned_sizes.reset(token)


def size_hint(size: Any, fallback: int) -> int:
    """A concrete int for a SymInt, without adding a guard (``fallback`` for unbacked
    sizes): its hint, or its value at the sizes :func:`sizes_planned_at` plans at. torch
    2.13 calls the hint ``optimization_hint``, 2.11 and 2.12 ``size_hint`` (their
    ``hint_int`` warns that it is deprecated), earlier releases ``hint_int``."""
    planned = _planned_sizes.get()
    if planned and isinstance(size, torch.SymInt):
        at = _at_planned_sizes(size, planned, fallback)
        if at is not None:
            return at
    from torch.fx.experimental import symbolic_shapes

    hint = (getattr(symbolic_shapes, "optimization_hint", None)
            or getattr(symbolic_shapes, "size_hint", None) or symbolic_shapes.hint_int)
    return int(hint(size, fallback=fallback))


def _at_planned_sizes(size: torch.SymInt, planned: Mapping[str, int], fallback: int
                      ) -> int | None:
    """``size`` evaluated with the planned symbols at their planned sizes and every other
    symbol at its hint (``fallback`` for an unbacked one); None where it has no planned
    symbol."""
    expr = size.node.expr
    symbols = expr.free_symbols
    if not any(s.name in planned for s in symbols):
        return None
    hints = size.node.shape_env.backed_var_to_val
    values = {s: planned[s.name] if s.name in planned else int(hints.get(s, fallback))
              for s in symbols}
    return int(expr.xreplace(values))
