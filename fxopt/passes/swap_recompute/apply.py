"""Apply a :class:`~fxopt.planner.Plan`'s actions to the joint graph, for the partitioner.

- **recompute**: the nodes of the tensor's recompute chain (back to placeholders and other
  saved tensors, which the decision keeps) get the partitioner's policy tag
  ``node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE`` (public:
  ``torch.utils.checkpoint``). Both of torch's partitioners read it: the tagged node is not
  saved, its untagged inputs are (the default partitioner marks them ``MUST_SAVE``), and the
  backward rebuilds it just before its first use. No random op is ever tagged: dropout is
  never recomputed, its saved mask and output are what the backward reads, so the masks
  are the forward's.
- **swap**: ``token = fxopt::swap_offload_start(x)`` after the last forward use of ``x``'s
  storage, and ``h = fxopt::swap_offload_finish(token, x, [after])`` once the forward
  nodes the plan counts on to hide the copy (its window's start) have run, ``after`` being
  the last of them (so no scheduler hoists the finish above them, and ``x`` stays allocated
  until the copy has read it); ``fxopt::swap_prefetch_start(h)`` and
  ``fxopt::swap_prefetch_wait`` before ``x``'s first backward use, which then reads the
  waited tensor. ``x`` has no backward user left, so the partitioner saves the host copy
  ``h`` instead. Prefetch start and wait are tagged ``MUST_RECOMPUTE``: they depend on no
  tangent, and Inductor's min-cut partitioner otherwise runs them in the forward and saves
  the device copy (checked: no memory saved). The partitioner may reorder the backward;
  :func:`place_prefetches` then moves each start to where the plan issues it (its
  ``meta["fxopt"]["issue_before"]``), ahead of the wait by the prefetch distance, and pins
  starts and waits there. Min-cut may still run an offload in the backward, saving ``x``
  and its ``after`` instead of ``h``, where that costs it no more (its ``MUST_SAVE`` tag
  binds only nodes the forward's outputs need, which an offload is not): correct, but that
  tensor stays on the device (1 of 41 swaps on a tiny GPT-2, ``tests/test_real_models.py``),
  and :func:`undo_backward_offloads` removes that swap's copies.

Placeholders and the output signature are untouched; created nodes carry fake values
(computed by the ops' ``register_fake``) and ``meta["fxopt"]``.
"""

from __future__ import annotations

import contextlib

import torch
import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

import fxopt.runtime  # noqa: F401  (registers the fxopt::swap_* ops)
from fxopt import _compat
from fxopt.passes.base import PassContext
from fxopt.planner import ActivationProblem, Plan
from fxopt.planner.joint import JointAnalysis, group_chain

__all__ = ["apply_decision", "place_prefetches", "undo_backward_offloads", "SWAP_OPS"]

_OFFLOAD_START = torch.ops.fxopt.swap_offload_start.default
_OFFLOAD_FINISH = torch.ops.fxopt.swap_offload_finish.default
_PREFETCH_START = torch.ops.fxopt.swap_prefetch_start.default
_PREFETCH_WAIT = torch.ops.fxopt.swap_prefetch_wait.default
SWAP_OPS = (_OFFLOAD_START, _OFFLOAD_FINISH, _PREFETCH_START, _PREFETCH_WAIT)


def mark_recompute(node: fx.Node) -> None:
    """Tag ``node`` for the partitioner to recompute in the backward, and say so in fxopt's
    provenance (``node.meta["fxopt"]``, read by explain and the graph diff)."""
    node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
    node.meta["fxopt"] = {**node.meta.get("fxopt", {}), "swap_recompute": "recompute"}


def apply_decision(gm: fx.GraphModule, analysis: JointAnalysis, problem: ActivationProblem,
                   plan: Plan, ctx: PassContext) -> dict[str, str]:
    """Rewrite ``gm`` for ``plan``'s actions, in its order; returns the actions applied
    (bisecting may refuse some: a refused action keeps its tensor, which only raises
    memory)."""
    applied: dict[str, str] = {}
    for name in plan.extra.get("order", sorted(plan.actions)):
        if ctx.rewrites.allow():
            applied[name] = plan.actions[name]
    by_step = {s: n for n, s in analysis.step_of.items()}
    choices = problem.by_name()
    for name, action in applied.items():
        node = analysis.candidates[name][0]
        if action == "recompute":
            chain, _ = group_chain(analysis, name)
            for n in chain:
                mark_recompute(n)
        else:
            freed, fetched = choices[name].choice("swap").window
            _insert_swap(gm, analysis, node, by_step[freed - 1], by_step[fetched], ctx.device)
    return applied


def _insert_swap(gm: fx.GraphModule, a: JointAnalysis, node: fx.Node, hidden_by: fx.Node,
                 issue_before: fx.Node, device: torch.device) -> None:
    """Swap ``node``: its offload finishes after ``hidden_by`` (the last forward node whose
    compute hides the copy, or ``node``'s last forward use where none does), its prefetch
    is issued before ``issue_before``."""
    def step(n: fx.Node) -> int:
        return a.step_of[n]

    aliases = [n for n in a.aliases[a.base[node]] if n in a.step_of]
    forward = [n for n in aliases if step(n) < a.bw_start]
    forward += [u for n in aliases for u in n.users if u in a.step_of and step(u) < a.bw_start]
    backward_users = [u for u in node.users if u in a.step_of and step(u) >= a.bw_start]
    last_forward, first_backward = max(forward, key=step), min(backward_users, key=step)
    meta = {"pass": "swap_recompute", "replaces": [node.name], "swap": node.name}
    val = node.meta["val"]
    after = _last_tensor(hidden_by, stop=last_forward)
    with _compat.fake_mode_of([val]) or contextlib.nullcontext():
        offload_val = _OFFLOAD_START(val)
        host_val = _OFFLOAD_FINISH(offload_val, val, [n.meta["val"] for n in after])
        token_val = _PREFETCH_START(host_val, device, [])
        back_val = _PREFETCH_WAIT(token_val, host_val, device, [])
    with gm.graph.inserting_after(last_forward):
        offload = gm.graph.call_function(_OFFLOAD_START, (node,))
    with gm.graph.inserting_after(after[0] if after else offload):
        finish = gm.graph.call_function(_OFFLOAD_FINISH, (offload, node, after))
    with gm.graph.inserting_before(first_backward):
        start = gm.graph.call_function(_PREFETCH_START, (finish, device, []))
        wait = gm.graph.call_function(_PREFETCH_WAIT, (start, finish, device, []))
    for new, value, tag in ((offload, offload_val, "is_forward"),
                            (finish, host_val, "is_forward"),
                            (start, token_val, "is_backward"),
                            (wait, back_val, "is_backward")):
        new.meta["val"] = value
        new.meta["partitioner_tag"] = tag
        new.meta["fxopt"] = dict(meta)
    start.meta["fxopt"]["issue_before"] = issue_before.name
    for new in (start, wait):  # Inductor's min-cut would otherwise run them in the forward
        new.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
    for user in backward_users:
        user.replace_input_with(node, wait)


def _last_tensor(node: fx.Node, *, stop: fx.Node | None = None) -> list[fx.Node]:
    """``[n]``, ``n`` the last node from ``node`` back to (not including) ``stop`` or the
    first placeholder whose value is a tensor; ``[]`` where there is none."""
    while node is not stop and node.op not in ("root", "placeholder"):
        if isinstance(node.meta.get("val"), torch.Tensor):
            return [node]
        node = node.prev
    return []


def undo_backward_offloads(backward: fx.GraphModule) -> list[str]:
    """Undo each swap whose offload the partitioner put in the backward (min-cut may, where
    saving the device tensor costs it no more than saving the host copy): the device
    tensor is saved then, so copying it to the host and back only costs time. Its readers
    read it again, and the four swap ops go; returns the undone swaps' tensors."""
    undone = []
    for finish in list(backward.graph.find_nodes(op="call_function",
                                                 target=_OFFLOAD_FINISH)):
        start, swapped, _ = finish.args
        waits = [u for u in finish.users if u.target is _PREFETCH_WAIT]
        prefetches = [u for u in finish.users if u.target is _PREFETCH_START]
        for wait in waits:
            wait.replace_all_uses_with(swapped)
        for node in (*waits, *prefetches, finish, start):
            if not node.users:
                backward.graph.erase_node(node)
        undone.append(swapped.name)
    if undone:
        backward.graph.lint()
        backward.recompile()
    return undone


def place_prefetches(backward: fx.GraphModule) -> tuple[int, int]:
    """Move each prefetch start of a partitioned backward to where its plan issues it
    (never after its wait), and pin every start and wait to its place (its ``after``
    argument: the node just before it); returns how many starts moved and how many calls
    were pinned. A no-op without swaps."""
    starts = list(backward.graph.find_nodes(op="call_function", target=_PREFETCH_START))
    if not starts:
        return 0, 0
    nodes = list(backward.graph.nodes)
    by_name = {n.name: n for n in nodes}
    first_compute = next(n for n in nodes if n.op != "placeholder")
    moved = 0
    for start in starts:
        target = by_name.get(start.meta.get("fxopt", {}).get("issue_before", ""))
        if target is None or target.op == "placeholder":
            target = first_compute
        position = {n: i for i, n in enumerate(backward.graph.nodes)}
        if target is not start and position[target] < position[start]:
            target.prepend(start)
            moved += 1
    waits = backward.graph.find_nodes(op="call_function", target=_PREFETCH_WAIT)
    for call in (*starts, *waits):
        call.update_arg(len(call.args) - 1, _last_tensor(call.prev))
    backward.graph.lint()
    backward.recompile()
    return moved, len(starts) + len(waits)
