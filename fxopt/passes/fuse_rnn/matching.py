"""What the hand-written cell matchers share: their failure reasons and the gate split.

A matcher follows a cell's algebra forward from the split of its gates (``chunk(k, -1)``).
It raises :class:`NotACell` for a split that is no cell at all (an attention head split),
which is not worth a decline, and :class:`NoMatch` with the reason for a cell it cannot
fuse, which the pass records as one (its verdicts).
"""

from __future__ import annotations

import operator

import torch.fx as fx

from fxopt.passes.fuse_rnn.graph import is_op
from fxopt.passes.torch_calls import example_tensor


class NoMatch(Exception):
    """The split is the gate split of a cell that cannot be fused (with the reason)."""


class NotACell(NoMatch):
    """The split is not a cell's gate split at all."""


def only_user(node: fx.Node) -> fx.Node:
    """The one user of an intermediate value (else the cell cannot be fused)."""
    if len(node.users) != 1:
        raise NoMatch("an intermediate value is used outside the cell")
    return next(iter(node.users))


def other_operand(node: fx.Node, known: fx.Node) -> object:
    """The operand of a binary ``node`` that is not ``known``."""
    x, y = node.args
    return y if x is known else x


def is_gate_split(node: object, gates: int) -> bool:
    """Whether ``node`` splits 2-D gates into ``gates`` chunks along the last dimension."""
    if not is_op(node, "chunk"):
        return False
    chunks = node.args[1] if len(node.args) > 1 else node.kwargs.get("chunks")
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    value = example_tensor(node.args[0])
    return chunks == gates and value is not None and value.dim() == 2 and dim in (1, -1)


def gate_pieces(split: fx.Node, gates: int) -> dict[int, fx.Node]:
    """{chunk index: the node that takes it}, each chunk taken once by index."""
    pieces = {}
    for user in split.users:
        if not (user.op == "call_function" and user.target is operator.getitem
                and isinstance(user.args[1], int)):
            raise NotACell("the chunks are used other than by index")
        pieces[user.args[1] % gates] = user
    if sorted(pieces) != list(range(gates)) or any(len(p.users) != 1 for p in pieces.values()):
        raise NotACell(f"not {gates} gates, each used once")
    return pieces
