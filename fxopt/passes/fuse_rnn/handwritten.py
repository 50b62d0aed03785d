"""fuse_rnn's match of a hand-written LSTM cell, the way research code writes one::

    gates = x @ W_ih.T + b_ih + h @ W_hh.T        # any two summands, biases anywhere
    i, f, g, o = gates.chunk(4, 1)                 # any gate order
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    c = f * c + i * g
    h = o * torch.tanh(c)

The matcher starts at each 4-way chunk of the last dimension and follows the algebra
forward; every intermediate value must be used only inside the cell (else fusing would
compute it twice or drop a use). It declines, with the reason, what it cannot reproduce.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from fxopt.passes.fuse_rnn.graph import Rewrite, dtype_problem, is_op, same_shape
from fxopt.passes.fuse_rnn.hoist import hoist_input_projections
from fxopt.passes.fuse_rnn.matching import (
    NoMatch,
    NotACell,
    gate_pieces,
    is_gate_split,
    only_user,
    other_operand,
)
from fxopt.passes.torch_calls import example_tensor

WHAT = "handwritten_lstm"


@dataclass
class _Cell:
    a: fx.Node
    b: fx.Node
    c_prev: fx.Node
    c_new: fx.Node
    h_new: fx.Node
    pre: fx.Node
    order: tuple[int, int, int, int]
    internal: list[fx.Node]  # the nodes the fused op replaces, in graph order


def _match(chunk: fx.Node) -> _Cell:
    gates_value = example_tensor(chunk.args[0])
    pieces = gate_pieces(chunk, 4)
    acts = {index: only_user(piece) for index, piece in pieces.items()}
    tanhs = [k for k, act in acts.items() if is_op(act, "tanh")]
    sigmoids = [k for k, act in acts.items() if is_op(act, "sigmoid")]
    if len(tanhs) != 1 or len(sigmoids) != 3:
        raise NotACell("the gate nonlinearities are not three sigmoids and one tanh")
    pre = chunk.args[0]
    if not is_op(pre, "add") or len(pre.args) != 2 or not all(
            isinstance(t, fx.Node) and example_tensor(t) is not None
            and same_shape(example_tensor(t), gates_value) for t in pre.args):
        raise NoMatch("the gates are not the sum of two full-size projections")
    g_index = tanhs[0]
    gate_of = {act: k for k, act in acts.items()}
    ig = only_user(acts[g_index])
    i_act = other_operand(ig, acts[g_index]) if is_op(ig, "mul") else None
    if gate_of.get(i_act) not in sigmoids:
        raise NoMatch("the tanh gate is not multiplied by a sigmoid gate")
    c_new = only_user(ig)
    if not is_op(c_new, "add"):
        raise NoMatch("the cell update is not f * c + i * g")
    fc = other_operand(c_new, ig)
    f_act = next((x for x in getattr(fc, "args", ()) if gate_of.get(x) in sigmoids
                  and x is not i_act), None)
    if not is_op(fc, "mul") or f_act is None or only_user(fc) is not c_new:
        raise NoMatch("the cell update is not f * c + i * g")
    c_prev = other_operand(fc, f_act)
    only_user(f_act), only_user(i_act)
    (o_index,) = set(sigmoids) - {gate_of[i_act], gate_of[f_act]}
    h_new = only_user(acts[o_index])
    tc = other_operand(h_new, acts[o_index]) if is_op(h_new, "mul") else None
    if not (is_op(tc, "tanh") and tc.args[0] is c_new and only_user(tc) is h_new):
        raise NoMatch("the hidden state is not o * tanh(c)")
    internal = [chunk, *pieces.values(), *acts.values(), ig, fc, c_new, tc, h_new]
    order = (gate_of[i_act], gate_of[f_act], g_index, o_index)
    return _Cell(pre.args[0], pre.args[1], c_prev, c_new, h_new, pre, order, internal)


def _check_values(cell: _Cell) -> None:
    a, b, c = (example_tensor(n) for n in (cell.a, cell.b, cell.c_prev))
    h, c_new = example_tensor(cell.h_new), example_tensor(cell.c_new)
    if c is None or not (same_shape(c, h) and same_shape(c_new, h)):
        raise NoMatch("the cell state is not a [batch, hidden] tensor (broadcasting)")
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), c.dtype)
    if not (h.dtype == c_new.dtype == dtype):
        raise NoMatch(f"eager returns {h.dtype}, the fused op would return {dtype}")
    if (problem := dtype_problem(a, b, c)) is not None:
        raise NoMatch(problem)


def rewrite_handwritten_lstm(rw: Rewrite) -> None:
    """Replace every hand-written LSTM cell found by the fused op."""
    projections = []
    for chunk in [n for n in rw.graph.nodes if is_gate_split(n, 4)]:
        try:
            cell = _match(chunk)
            _check_values(cell)
        except NotACell:
            continue
        except NoMatch as why:
            rw.decline(WHAT, str(why), chunk)
            continue
        if not rw.ctx.rewrites.allow():
            continue
        replaces = [n.name for n in cell.internal]
        with rw.graph.inserting_before(cell.c_new):  # after every input of the cell
            fused = rw.fused_cell("lstm", cell.a, cell.b, cell.c_prev, None, None,
                                  cell.order, replaces)
            h_new = rw.emit(operator.getitem, fused, 0, replaces=[cell.h_new.name],
                            like=cell.h_new)
            c_new = rw.emit(operator.getitem, fused, 1, replaces=[cell.c_new.name],
                            like=cell.c_new)
        cell.h_new.replace_all_uses_with(h_new)
        cell.c_new.replace_all_uses_with(c_new)
        for node in reversed(cell.internal):
            rw.graph.erase_node(node)
        if not cell.pre.users:  # the summed gates were only split for the cell
            rw.graph.erase_node(cell.pre)
        rw.count(WHAT)
        projections += [cell.a, cell.b]
    hoist_input_projections(rw, projections)
