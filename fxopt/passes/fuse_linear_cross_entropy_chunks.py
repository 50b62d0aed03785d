"""fuse_linear_cross_entropy_chunks: the size of each fused loss op's pieces, chosen from the
step's predicted peak and the memory budget.

fuse_linear_cross_entropy's ops (:mod:`fxopt.kernels.fuse_linear_cross_entropy` and its
with-grads sibling) walk the logits in pieces: the with-grads form in chunks of token rows,
the recompute form's forward and backward ops each in blocks of vocabulary columns. A
piece's temporaries are the op's workspace while it runs; on a GPU fewer, larger pieces run
faster (:func:`fxopt.planner.forms.linear_cross_entropy_work`: each piece costs launches and, where
the op accumulates a gradient over its pieces, a read and write of that fp32 accumulator:
W's over the chunks, h's over the backward's blocks). The ops' default (``block_bytes=0``)
is the finest this pass considers: pieces of at most 1/16 (chunks) or 1/64 (blocks) of the
logits' fp32 bytes.

The step's peak is known only once the step is partitioned, so the pass runs on the
partitioned graphs: at the FORWARD stage it sizes the forward ops, the step simulated with
the partitioned backward; at the BACKWARD stage the recompute form's backward op, with the
forward as compiled (``PassContext.estimate_memory``, what explain reports). Each op gets
the fewest pieces, from one up in powers of two, whose step the memory model predicts
within a bound:

- under a byte ``memory_budget``: the budget less :attr:`fxopt.codegen.Codegen.peak_margin`'s
  share (the planner holds its plans to the same target), or the step's peak at the default
  where that is already above it;
- otherwise (a fraction, which bounds saved bytes, not the peak; a replayed plan; the flag
  alone): the step's peak at the default, so the pieces only take what the step's peak
  elsewhere leaves free, never more.

A candidate's peak is the simulated step with the op's workspace at its own step replaced by
the candidate's, measured as the memory model measures every fxopt op
(:func:`fxopt.analysis.workspace.workspace_bytes`: the op run on tensors of its node's
shapes, once per signature). The peak falls as the pieces multiply, so the fewest within the
bound are found by bisection, a few measurements an op.

Where it runs: on CUDA, where each piece's softmax and gradient math is one Triton kernel
(:func:`larger_pieces_pay`). On the CPU the torch path makes several passes over each
piece, fast while a piece stays in cache, and larger pieces measured slower: GPT-2 at 512
tokens (fx, one thread), 490 ms a step with the default 65 vocabulary blocks, 577 with the
2 and 4 the pass chose, 648 with one (benchmarks/results/
fuse_linear_cross_entropy_chunks_cpu.md). The CPU cost model has no cache to predict that,
so there the pass declines the graph and the default stays.

Verdicts: matched per op kind (:data:`PIECE_OPS`: "with-grads chunks", "recompute blocks,
forward", "recompute blocks, backward") where the op's pieces changed; declined where the
default stays (one piece already, or fewer would raise the peak above the bound), with the
reason. ``stats["sizes"]``: per op its default and chosen pieces, the bound, the predicted
peaks and the op's predicted time on the device's profile at both (explain shows them).
Default: on where fuse_linear_cross_entropy is (its flag).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.fx as fx

from fxopt import _compat
from fxopt.analysis.memory import MemoryEstimate
from fxopt.analysis.workspace import workspace_bytes
from fxopt.codegen import peak_target
from fxopt.kernels import fuse_linear_cross_entropy as _ops
from fxopt.kernels import fuse_linear_cross_entropy_with_grads as _with_grads
from fxopt.passes.base import PassContext, PassResult, Stage, Verdicts
from fxopt.passes.fuse_linear_cross_entropy import fused_accumulate, predicted_ms
from fxopt.planner.hardware import profile_for
from fxopt.units import format_mib

__all__ = ["fuse_linear_cross_entropy_chunks", "larger_pieces_pay", "PIECE_OPS"]

# op name -> (the form it belongs to, the verdict's kind)
PIECE_OPS = {
    "fxopt::linear_cross_entropy_with_grads": ("with_grads", "with-grads chunks"),
    "fxopt::linear_cross_entropy": ("recompute", "recompute blocks, forward"),
    "fxopt::linear_cross_entropy_backward": ("recompute", "recompute blocks, backward"),
}


@dataclass(frozen=True)
class _Op:
    """One op to size: its node, form, and the shapes that set its pieces."""

    node: fx.Node
    form: str
    kind: str
    tokens: int
    hidden: int
    vocab: int
    compute_dtype: torch.dtype
    wanted: tuple[bool, bool, bool]
    device: torch.device

    @property
    def backward(self) -> bool:
        return self.node.target.name() == "fxopt::linear_cross_entropy_backward"

    def pieces(self, block_bytes: int) -> int:
        counter = _with_grads.chunk_count if self.form == "with_grads" else _ops.block_count
        return counter(self.tokens, self.vocab, block_bytes, self.compute_dtype, self.device)

    def block_bytes(self, pieces: int) -> int:
        bound = (_with_grads.chunk_bytes_for if self.form == "with_grads"
                 else _ops.block_bytes_for)
        return bound(pieces, self.tokens, self.vocab, self.compute_dtype, self.device)

    def predicted_ms(self, pieces: int, ctx: PassContext) -> float:
        """The op's form, forward and backward, with this op in ``pieces`` and the other
        op of a recompute pair at its default."""
        default = self.pieces(0)
        forward, backward = (default, pieces) if self.backward else (pieces, default)
        return predicted_ms(self.form, self.tokens, self.hidden, self.vocab, self.wanted,
                            self.compute_dtype, profile_for(ctx.device),
                            fused_accumulate(ctx.device),
                            pieces=forward, backward_pieces=backward)


def larger_pieces_pay(device: torch.device) -> bool:
    """Whether fewer, larger pieces can run faster on ``device`` (module doc): where the
    ops' per-piece math is one Triton kernel."""
    return _ops.uses_triton_on(device)


def fuse_linear_cross_entropy_chunks(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    ops = [op for node in gm.graph.nodes if (op := _op(node)) is not None]
    if not ops:  # nothing to size (as tempo with no site): no verdict for explain to print
        return PassResult(gm, False)
    if not larger_pieces_pay(ctx.device):
        return PassResult.declined_graph(
            gm, f"on {ctx.device.type} the ops' torch path runs larger pieces slower (its "
                "passes over a piece run from cache): the default pieces kept")
    verdicts, sized, estimate = Verdicts(), [], None
    for op in ops:
        default = op.pieces(0)
        if default == 1:
            verdicts.decline(op.node.name, "one piece already: nothing to choose")
            continue
        estimate = estimate or ctx.estimate_memory(gm)
        if estimate is None:
            verdicts.decline(op.node.name, "no step simulation for this graph")
            continue
        label = f"{'bw' if ctx.stage is Stage.BACKWARD else 'fw'}:{op.node.name}"
        step = _Step(estimate, label, op)
        if not step.default_workspace:
            verdicts.decline(op.node.name, "its workspace could not be measured: the "
                             "default pieces kept")
            continue
        current = step.peak(0)
        bound = max(current, _budget_target(ctx))
        pieces = _fewest_pieces(op, default, functools.partial(step.fits, bound=bound))
        row = {"op": op.node.name, "form": op.form, "default_pieces": default,
               "pieces": pieces, "bound_bytes": bound, "peak_bytes_default": current,
               "predicted_ms_default": round(op.predicted_ms(default, ctx), 4)}
        sized.append(row)
        if pieces == default:
            verdicts.decline(op.node.name, f"fewer pieces would raise the step's predicted "
                             f"peak above {format_mib(bound)} MiB: the default {default} kept")
            continue
        if not ctx.rewrites.allow():
            continue
        block_bytes = op.block_bytes(pieces)
        row.update(block_bytes=block_bytes, peak_bytes=step.peak(block_bytes),
                   predicted_ms=round(op.predicted_ms(pieces, ctx), 4))
        op.node.args = _with_block_bytes(op.node, block_bytes)
        op.node.meta.setdefault("fxopt", {})["pieces"] = {
            "pass": "fuse_linear_cross_entropy_chunks", "default": default, "chosen": pieces}
        estimate = None  # the step changed: a second op is sized against the new one
        verdicts.match(op.kind)
    changed = any("block_bytes" in row for row in sized)
    return PassResult(gm, changed, verdicts, {"sizes": sized} if sized else {})


def _op(node: fx.Node) -> _Op | None:
    """The node as an op to size, or None (another op, one whose shapes are unknown, or a
    call that names ``block_bytes`` by keyword)."""
    if node.op != "call_function" or not _compat.is_op_overload(node.target) \
            or node.target.name() not in PIECE_OPS:
        return None
    form, kind = PIECE_OPS[node.target.name()]
    # AOTAutograd's graphs pass every argument by position; a keyword call is left alone
    if _block_bytes_index(node) >= len(node.args):
        return None
    named = dict(zip(_argument_names(node), node.args)) | dict(node.kwargs)
    h, weight = (named[k].meta.get("val") if isinstance(named.get(k), fx.Node) else None
                 for k in ("h", "weight"))
    if not isinstance(h, torch.Tensor) or not isinstance(weight, torch.Tensor):
        return None
    # the recompute form's forward op does not say which gradients its backward computes:
    # its time is priced with all of them
    wanted = ((named["grad_h"], named["grad_weight"], named["grad_bias"])
              if "grad_h" in named else (True, True, True))
    # sized at the shapes' hints: a symbolic token count (dynamic=True, or a batch whose
    # size changed) read as an int would guard on it, one recompile per batch shape
    tokens, hidden, vocab = (_compat.size_hint(d, 1)
                             for d in (h.shape[0], h.shape[1], weight.shape[0]))
    return _Op(node, form, kind, tokens, hidden, vocab, named["compute_dtype"],
               tuple(bool(w) for w in wanted), h.device)


def _argument_names(node: fx.Node) -> list[str]:
    return [a.name for a in node.target._schema.arguments]


def _block_bytes_index(node: fx.Node) -> int:
    return _argument_names(node).index("block_bytes")


def _with_block_bytes(node: fx.Node, block_bytes: int) -> tuple:
    """``node``'s arguments with ``block_bytes`` in its place (positional: :func:`_op`)."""
    index = _block_bytes_index(node)
    return (*node.args[:index], block_bytes, *node.args[index + 1:])


class _Step:
    """The step's simulated timeline around one op: its peak with the op's workspace at a
    candidate's ``block_bytes`` (the rest as simulated)."""

    def __init__(self, estimate: MemoryEstimate, label: str, op: _Op) -> None:
        steps = [i for i, (name, _) in enumerate(estimate.timeline) if name == label]
        if len(steps) != 1:
            raise ValueError(f"the step's simulation has {len(steps)} steps labelled "
                             f"{label!r}")
        self.op = op
        self.others = max((b for i, (_, b) in enumerate(estimate.timeline) if i != steps[0]),
                          default=estimate.baseline_bytes)
        self.default_workspace = workspace_bytes(op.node)
        self.without = estimate.timeline[steps[0]][1] - self.default_workspace

    def peak(self, block_bytes: int) -> int:
        """The predicted peak, or -1 where the workspace could not be measured (0: the
        measurement warned; an op that walks pieces always has some)."""
        measured = workspace_bytes(self.op.node, _with_block_bytes(self.op.node, block_bytes))
        return max(self.others, self.without + measured) if measured else -1

    def fits(self, block_bytes: int, bound: int) -> bool:
        """Whether the candidate's step stays within ``bound``. ``block_bytes`` is a lower
        bound of its workspace (a piece's logits alone, in the compute dtype, are that
        much; the torch path's fp32 copy is counted in both), so a candidate it already
        puts over is not run: a measurement allocates the piece on the device."""
        if self.without + block_bytes > bound:
            return False
        return 0 <= self.peak(block_bytes) <= bound


def _budget_target(ctx: PassContext) -> int:
    """A byte budget's bound on the simulated peak (the planner's target); 0 without one."""
    budget = ctx.options.memory_budget
    if budget is None or budget.bytes is None:
        return 0
    return peak_target(budget.bytes, ctx.codegen.peak_margin)


def _fewest_pieces(op: _Op, default: int, fits: Callable[[int], bool]) -> int:
    """The fewest pieces among 1, 2, 4, ... (below the default) and the default whose
    ``block_bytes`` ``fits`` (the default's does), by bisection: the peak falls as pieces
    grow."""
    candidates = sorted({op.pieces(op.block_bytes(p)) for p in _powers_below(default)}
                        | {default})
    low, high = 0, len(candidates) - 1  # candidates[high] fits
    while low < high:
        middle = (low + high) // 2
        pieces = candidates[middle]
        if fits(op.block_bytes(pieces)):
            high = middle
        else:
            low = middle + 1
    return candidates[high]


def _powers_below(limit: int) -> list[int]:
    powers, p = [], 1
    while p < limit:
        powers.append(p)
        p *= 2
    return powers
