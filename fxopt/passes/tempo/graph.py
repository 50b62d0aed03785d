"""What tempo's matchers ask of Dynamo's torch-level graph beyond the shared vocabulary
(:mod:`fxopt.passes.torch_calls`): a node's only user, and whether a node's value is kept
for backward by a neighbour.

A neighbour is reached through the calls that return their input's very tensor: views, and
casts to the dtype (device, layout) the value already has, which return it unchanged, as
Gemma's and OLMo 2's RMSNorms end (``output.type_as(x)``, ``.to(input_dtype)``), a no-op
in fp32 and under autocast, where the residual stream is fp32."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from fxopt.passes.torch_calls import example_tensor, is_call

__all__ = ["cast_by_savers", "drop_noop_casts", "is_alias", "is_noop_cast",
           "kept_by_neighbour", "only_user"]

# Ops that keep an input for backward when the other operand needs a gradient: a Linear
# keeps its input for dW, a matmul each operand for the other's gradient.
# (operations of CALLS, positions of the kept arguments)
_SAVERS: tuple[tuple[tuple[str, ...], tuple[int, ...]], ...] = (
    (("linear",), (0,)),
    (("addmm",), (1, 2)),
    (("matmul", "bmm", "mm"), (0, 1)),
    (("baddbmm",), (1, 2)),
)

# Ops whose output shares its input's memory (a saver of the view keeps the same tensor).
_VIEWS = ("view", "reshape", "transpose", "permute", "flatten", "unsqueeze", "squeeze",
          "view_as", "t", "expand")


def is_noop_cast(user: fx.Node, value: fx.Node) -> bool:
    """Whether ``user`` casts ``value`` to what it already is (same dtype, device and
    strides, no ``copy=True``), and so returns ``value``'s own tensor."""
    if not user.args or user.args[0] is not value or user.kwargs.get("copy") or \
            not is_call(user, "cast", "float_cast", "type_as"):
        return False
    before, after = example_tensor(value), example_tensor(user)
    return before is not None and after is not None and (
        before.dtype, before.device, before.stride()) == (after.dtype, after.device,
                                                          after.stride())


def is_alias(user: fx.Node, value: fx.Node) -> bool:
    """Whether ``user`` returns ``value``'s own tensor or a view of it: a view, basic
    indexing, or a no-op cast (:func:`is_noop_cast`)."""
    if user.args and user.args[0] is value and (is_call(user, *_VIEWS) or
                                                _is_basic_indexing(user)):
        return True
    return is_noop_cast(user, value)


def drop_noop_casts(node: fx.Node) -> None:
    """Erase the no-op casts among ``node``'s aliases (:func:`is_noop_cast`), their users
    reading the cast's input: no value changes. Tempo does this before it hands a
    low-precision cast to those users, where a no-op fp32 cast would convert it back."""
    for user in list(node.users):
        if is_noop_cast(user, node):
            user.replace_all_uses_with(node)
            user.graph.erase_node(user)
            drop_noop_casts(node)  # the erased cast's users are now node's: visit them
            return
        if is_alias(user, node):
            drop_noop_casts(user)


def only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def kept_by_neighbour(node: fx.Node) -> bool:
    """Whether some consumer of ``node``'s value (through its aliases) keeps that very tensor for
    backward: a Linear or matmul that computes in its dtype (under autocast a Linear keeps
    its own low-precision copy instead, which does not count)."""
    value = example_tensor(node)
    pending, seen = [node], set()
    while pending:
        current = pending.pop()
        for user in current.users:
            if user in seen:
                continue
            seen.add(user)
            if is_alias(user, current):
                pending.append(user)
                continue
            for names, positions in _SAVERS:
                if not is_call(user, *names):
                    continue
                kept = any(i < len(user.args) and user.args[i] is current for i in positions)
                out = example_tensor(user)
                if kept and (value is None or out is None or out.dtype == value.dtype):
                    return True
    return False


def cast_by_savers(node: fx.Node) -> tuple[torch.dtype, list[fx.Node]] | None:
    """Under autocast: (the low-precision dtype, the users of ``node``) where those users,
    directly or through aliases, are all Linears or matmuls that compute in that dtype from
    ``node``'s fp32 value, and so each keep their own cast of it for backward. Given the
    cast itself they compute the same values and keep that one tensor. None where no user
    is such (or they compute in different dtypes); the other users take the value as is."""
    value = example_tensor(node)
    if value is None or value.dtype != torch.float32:
        return None
    found: dict[fx.Node, torch.dtype | None] = {user: _saver_dtype(user, node)
                                                for user in node.users}
    cast = [u for u, dtype in found.items() if dtype is not None]
    dtypes = {found[u] for u in cast}
    if not cast or len(dtypes) != 1:
        return None
    return dtypes.pop(), cast


def _saver_dtype(user: fx.Node, value: fx.Node) -> torch.dtype | None:
    """The low-precision dtype ``user`` computes in from ``value`` (itself a saver of it, or
    an alias of it (:func:`is_alias`) whose users all are, in one dtype), else None."""
    if is_alias(user, value):
        if not user.users:
            return None
        dtypes = {_saver_dtype(u, user) for u in user.users}
        return dtypes.pop() if len(dtypes) == 1 else None
    for names, positions in _SAVERS:
        if is_call(user, *names) and any(i < len(user.args) and user.args[i] is value
                                         for i in positions):
            out = example_tensor(user)
            if out is not None and out.dtype in (torch.bfloat16, torch.float16):
                return out.dtype
    return None


def _is_basic_indexing(node: fx.Node) -> bool:
    """``t[:, i:j, ...]``: indexing by ints, slices, None and Ellipsis returns a view."""
    if node.op != "call_function" or node.target is not operator.getitem:
        return False
    index = node.args[1]
    items = index if isinstance(index, tuple) else (index,)
    return all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in items)
