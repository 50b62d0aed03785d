"""fuse_rnn's match of a hand-written GRU cell, PyTorch's formulation::

    i_r, i_z, i_n = gi.chunk(3, 1)                 # gi: the input projection (bias anywhere)
    h_r, h_z, h_n = gh.chunk(3, 1)                 # gh: the hidden projection
    r = torch.sigmoid(i_r + h_r)
    z = torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    h = (1 - z) * n + z * h

Any gate order (the same in both projections), sums and products in either order. The side
whose chunk is multiplied by ``r`` is the hidden side. Other hidden updates (``n + z * (h -
n)``, or ``z`` and ``1 - z`` swapped) are declined with the reason, as are intermediate
values used outside the cell.
"""

from __future__ import annotations

import operator

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

WHAT = "handwritten_gru"


def _piece_of(node: object) -> tuple[fx.Node, int] | None:
    """(chunk, index) when ``node`` is a 3-way chunk's piece."""
    if (isinstance(node, fx.Node) and node.op == "call_function"
            and node.target is operator.getitem and is_gate_split(node.args[0], 3)):
        return node.args[0], node.args[1] % 3
    return None


def _is_one(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 1


def _match(chunk_a: fx.Node) -> tuple:
    """(a, b, h_prev, out, order, internal nodes) of the cell whose input side is chunk_a."""
    pieces_a = gate_pieces(chunk_a, 3)
    sums = {k: only_user(p) for k, p in pieces_a.items()}
    if not all(is_op(s, "add") for s in sums.values()) or sorted(
            is_op(next(iter(s.users), None), "sigmoid") for s in sums.values()) != [
            False, True, True]:
        raise NotACell("not a GRU's input side")
    gates, n_index, chunk_b, r_mul = {}, None, None, None
    for k, s in sums.items():
        other = other_operand(s, pieces_a[k])
        act = only_user(s)
        found = _piece_of(other)
        if found is not None and is_op(act, "sigmoid"):
            gates[k], piece_b = act, other
        elif is_op(other, "mul") and is_op(act, "tanh"):
            n_index, r_mul = k, other
            piece_b = next((x for x in other.args if _piece_of(x) is not None), None)
            found = _piece_of(piece_b)
        else:
            raise NoMatch("the gates are not sigmoid(a + b) and tanh(a + r * b)")
        if found is None or found[1] != k or (chunk_b is not None and found[0] is not chunk_b):
            raise NoMatch("the two projections' gates do not pair up in one order")
        chunk_b = found[0]
        only_user(piece_b)
    if n_index is None or len(gates) != 2:
        raise NoMatch("the gates are not sigmoid(a + b) and tanh(a + r * b)")
    if not same_shape(example_tensor(chunk_a.args[0]), example_tensor(chunk_b.args[0])):
        raise NoMatch("the projections differ in shape (broadcasting)")
    pieces_b = gate_pieces(chunk_b, 3)
    r_act = other_operand(r_mul, next(x for x in r_mul.args if _piece_of(x)))
    r_index = next((k for k, act in gates.items() if act is r_act), None)
    if r_index is None or only_user(r_act) is not r_mul:
        raise NoMatch("the candidate is not scaled by a sigmoid gate")
    (z_index,) = set(gates) - {r_index}
    z_act, n_act = gates[z_index], only_user(sums[n_index])
    if len(n_act.users) != 1:
        raise NoMatch("the hidden update is not (1 - z) * n + z * h")
    m1 = only_user(n_act)
    one_minus_z = other_operand(m1, n_act) if is_op(m1, "mul") else None
    out = only_user(m1)
    if not (is_op(one_minus_z, "sub") and _is_one(one_minus_z.args[0])
            and one_minus_z.args[1] is z_act and only_user(one_minus_z) is m1
            and is_op(out, "add")):
        raise NoMatch("the hidden update is not (1 - z) * n + z * h")
    m2 = other_operand(out, m1)
    if not (is_op(m2, "mul") and z_act in m2.args and only_user(m2) is out
            and set(z_act.users) == {one_minus_z, m2}):
        raise NoMatch("the hidden update is not (1 - z) * n + z * h")
    h_prev = other_operand(m2, z_act)
    internal = [chunk_a, chunk_b, *pieces_a.values(), *pieces_b.values(),
                *sums.values(), r_mul, *gates.values(), n_act, one_minus_z, m1, m2, out]
    order = (r_index, z_index, n_index)
    return chunk_a.args[0], chunk_b.args[0], h_prev, out, order, internal


def _check_values(a: fx.Node, b: fx.Node, h_prev: object, out: fx.Node) -> None:
    av, bv, hv, ov = (example_tensor(n) for n in (a, b, h_prev, out))
    if hv is None or not same_shape(hv, ov):
        raise NoMatch("the hidden state is not a [batch, hidden] tensor (broadcasting)")
    if (problem := dtype_problem(av, bv, hv)) is not None:
        raise NoMatch(problem)
    dtype = torch.promote_types(torch.promote_types(av.dtype, bv.dtype), hv.dtype)
    if ov.dtype != dtype:
        raise NoMatch(f"eager returns {ov.dtype}, the fused op would return {dtype}")


def rewrite_handwritten_gru(rw: Rewrite) -> None:
    """Replace every hand-written GRU cell found by the fused op."""
    projections = []
    order_of = {node: i for i, node in enumerate(rw.graph.nodes)}
    for chunk in [n for n in rw.graph.nodes if is_gate_split(n, 3)]:
        if chunk not in order_of:
            continue  # erased as the hidden side of an earlier match
        try:
            a, b, h_prev, out, order, internal = _match(chunk)
            _check_values(a, b, h_prev, out)
        except NotACell:
            continue  # also the hidden side: matched (or declined) from the input side
        except NoMatch as why:
            rw.decline(WHAT, str(why), chunk)
            continue
        if not rw.ctx.rewrites.allow():
            continue
        with rw.graph.inserting_before(out):
            fused = rw.fused_cell("gru", a, b, h_prev, None, None, order,
                                  [n.name for n in internal])
            h_new = rw.emit(operator.getitem, fused, 0, replaces=[out.name], like=out)
        out.replace_all_uses_with(h_new)
        for node in sorted(internal, key=order_of.__getitem__, reverse=True):
            rw.graph.erase_node(node)
            order_of.pop(node)
        rw.count(WHAT)
        projections += [a, b]
    hoist_input_projections(rw, projections)

