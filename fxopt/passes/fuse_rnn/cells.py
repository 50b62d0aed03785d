"""fuse_rnn's cell rewrites: ``torch.lstm_cell`` / ``torch.gru_cell`` (what Dynamo records
for ``nn.LSTMCell`` / ``nn.GRUCell``) and hand-written LSTM cells.

A built-in cell becomes ``linear(x, W_ih)``, ``linear(h, W_hh)`` (the hidden projection:
one GEMM per step) and the fused op, which adds both biases. When several cells of an
unrolled loop take time steps of one sequence ``X`` (``X[t]``, ``X[:, t]``) with the same
``W_ih``, the input projection of all steps is one GEMM ``linear(X, W_ih)`` up front and
each step reads its slice (EcoRNN's hoisting).

A hand-written cell is matched on its algebra: ``chunk(A + B, 4, dim=-1)``, three sigmoids
and a tanh on the chunks, ``c' = f * c + i * g`` and ``h' = o * tanh(c')`` (products and
sums in either order, any gate order). ``A`` and ``B`` are whatever the code added (its
projections, biases included). Intermediate values used outside the cell, broadcasting
states or a dtype the fused op would not reproduce are declined with the reason.
"""

from __future__ import annotations

import operator
from collections import Counter
from typing import Any

import torch
import torch.fx as fx

from fxopt.kernels.rnn import GRU_ORDER, LSTM_ORDER
from fxopt.passes.fuse_rnn.graph import Rewrite, same_shape, tensor_value, value

LINEAR = torch._C._nn.linear


def _leading_index(x: fx.Node) -> tuple[fx.Node, Any] | None:
    """(X, index) when ``x`` is ``X[index]`` taking leading dimensions only (an int, or ints
    and full slices before the last dimension), so ``linear(X, W)[index]`` is
    ``linear(x, W)``."""
    if not (x.op == "call_function" and x.target is operator.getitem):
        return None
    base, index = x.args
    base_value = tensor_value(base)
    if base_value is None or base_value.dim() < 3:
        return None
    parts = index if isinstance(index, tuple) else (index,)
    full = slice(None, None, None)
    if len(parts) >= base_value.dim() or not all(
            isinstance(p, int) or p == full for p in parts) or not any(
            isinstance(p, int) for p in parts):
        return None
    return base, index


def _hoistable(rw: Rewrite, cells: list[fx.Node]) -> set[tuple[fx.Node, fx.Node]]:
    """(X, W_ih) pairs that at least two cells project: worth one GEMM for all steps."""
    keys: Counter[tuple[fx.Node, fx.Node]] = Counter()
    for cell in cells:
        found = _leading_index(cell.args[0]) if isinstance(cell.args[0], fx.Node) else None
        if found is not None:
            keys[(found[0], cell.args[2])] += 1
    return {key for key, count in keys.items() if count >= 2}


class _InputProjections:
    """The input projection of a cell: hoisted over the whole sequence where it pays."""

    def __init__(self, rw: Rewrite, hoist: set[tuple[fx.Node, fx.Node]]) -> None:
        self.rw, self.hoist = rw, hoist
        self.whole: dict[tuple[fx.Node, fx.Node], fx.Node] = {}

    def __call__(self, x: fx.Node, w: fx.Node, replaces: list[str]) -> fx.Node:
        found = _leading_index(x)
        key = (found[0], w) if found is not None else None
        if key not in self.hoist:
            return self.rw.emit(LINEAR, x, w, None, replaces=replaces)
        if key not in self.whole:  # emitted before the first cell that needs it
            self.whole[key] = self.rw.emit(LINEAR, key[0], w, None, replaces=replaces)
            self.rw.hoisted_projections += 1
        return self.rw.emit(operator.getitem, self.whole[key], found[1],
                            replaces=replaces)


def _builtin_args(cell: fx.Node, kind: str) -> tuple[Any, ...] | None:
    args = list(cell.args) + [None] * (6 - len(cell.args))
    if cell.kwargs or len(cell.args) < 4:
        return None
    x, state = args[0], args[1]
    if kind == "lstm":
        if not (isinstance(state, (tuple, list)) and len(state) == 2):
            return None
        h, c = state
    else:
        h, c = state, state
    return x, h, c, args[2], args[3], args[4], args[5]


def rewrite_builtin_cells(rw: Rewrite) -> None:
    """Replace every ``torch.lstm_cell`` / ``torch.gru_cell`` node by the fused op."""
    targets = {torch.lstm_cell: "lstm", torch.gru_cell: "gru"}
    cells = [n for n in rw.graph.nodes if n.op == "call_function" and n.target in targets]
    projections = _InputProjections(rw, _hoistable(rw, cells))
    for cell in cells:
        kind = targets[cell.target]
        what = f"{kind}_cell"
        parsed = _builtin_args(cell, kind)
        if parsed is None:
            rw.decline(what, "unrecognised arguments")
            continue
        x, h, c, w_ih, w_hh, b_ih, b_hh = parsed
        xv, hv, cv, wv, whv = (tensor_value(n) for n in (x, h, c, w_ih, w_hh))
        outs = value(cell)
        expected = (outs[0] if isinstance(outs, (tuple, list)) else outs).dtype
        if any(v is None or v.dim() != 2 for v in (xv, hv, cv, wv, whv)):
            rw.decline(what, "unbatched or non-2D input or state")
            continue
        if not same_shape(hv, cv):
            rw.decline(what, "hidden and cell state shapes differ")
            continue
        proj = torch.promote_types(rw.projection_dtype(cell, xv, wv),
                                   rw.projection_dtype(cell, hv, whv))
        state_dtype = rw.state_dtype_for(cv.dtype, proj, expected)
        if state_dtype is None:
            rw.decline(what, f"eager returns {expected}, the fused op would not")
            continue
        if not rw.ctx.rewrites.allow():
            continue
        with rw.graph.inserting_before(cell):
            state = rw.cast(c, cv.dtype, state_dtype, [cell.name])
            a = projections(x, w_ih, [cell.name])
            b = rw.emit(LINEAR, h, w_hh, None, replaces=[cell.name])
            order = LSTM_ORDER if kind == "lstm" else GRU_ORDER
            fused = rw.fused_cell(kind, a, b, state, b_ih, b_hh, order, [cell.name])
            result = fused if kind == "lstm" else rw.emit(
                operator.getitem, fused, 0, replaces=[cell.name], like=cell)
        cell.replace_all_uses_with(result)
        rw.graph.erase_node(cell)
        rw.count(what)
