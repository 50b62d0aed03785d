"""fuse_rnn's rewrite of ``torch.lstm_cell`` / ``torch.gru_cell`` (what Dynamo records for
``nn.LSTMCell`` / ``nn.GRUCell``).

A cell becomes ``linear(x, W_ih, b_ih)``, ``linear(h, W_hh)`` (the hidden projection: one
GEMM per step) and the fused op, which adds ``b_hh`` (``b_ih`` rides in the input GEMM, so
its gradient is one reduction when the projection is hoisted). When the cells of an
unrolled loop step through one sequence, their input projections become one GEMM
(`hoist`). Declined with the reason: unbatched (1-D) input, hidden and cell states of
different shapes, and a dtype the fused op would not reproduce.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from fxopt.kernels.fuse_rnn import GRU_ORDER, LSTM_ORDER
from fxopt.passes.fuse_rnn.graph import Rewrite, dtype_problem, same_shape
from fxopt.passes.fuse_rnn.hoist import LINEAR, hoist_input_projections
from fxopt.passes.torch_calls import example_tensor, example_value


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
    projections = []
    for cell in cells:
        kind = targets[cell.target]
        what = f"{kind}_cell"
        parsed = _builtin_args(cell, kind)
        if parsed is None:
            rw.decline(what, "unrecognised arguments", cell)
            continue
        x, h, c, w_ih, w_hh, b_ih, b_hh = parsed
        xv, hv, cv, wv, whv = (example_tensor(n) for n in (x, h, c, w_ih, w_hh))
        outs = example_value(cell)
        expected = (outs[0] if isinstance(outs, (tuple, list)) else outs).dtype
        if any(v is None or v.dim() != 2 for v in (xv, hv, cv, wv, whv)):
            rw.decline(what, "unbatched or non-2D input or state", cell)
            continue
        if (problem := dtype_problem(xv, hv, cv, wv, whv)) is not None:
            rw.decline(what, problem, cell)
            continue
        if not same_shape(hv, cv):
            rw.decline(what, "hidden and cell state shapes differ", cell)
            continue
        proj = torch.promote_types(rw.projection_dtype(cell, xv, wv),
                                   rw.projection_dtype(cell, hv, whv))
        state_dtype = rw.state_dtype_for(cv.dtype, proj, expected)
        if state_dtype is None:
            rw.decline(what, f"eager returns {expected}, the fused op would not", cell)
            continue
        if not rw.ctx.rewrites.allow():
            continue
        with rw.graph.inserting_before(cell):
            state = rw.cast(c, cv.dtype, state_dtype, [cell.name])
            a = rw.emit(LINEAR, x, w_ih, b_ih, replaces=[cell.name])
            projections.append(a)
            b = rw.emit(LINEAR, h, w_hh, None, replaces=[cell.name])
            order = LSTM_ORDER if kind == "lstm" else GRU_ORDER
            fused = rw.fused_cell(kind, a, b, state, None, b_hh, order, [cell.name])
            result = fused if kind == "lstm" else rw.emit(
                operator.getitem, fused, 0, replaces=[cell.name], like=cell)
        cell.replace_all_uses_with(result)
        rw.graph.erase_node(cell)
        rw.count(what)
    hoist_input_projections(rw, projections)
