"""``fxopt::library_rnn``: a whole ``nn.LSTM`` / ``nn.GRU`` call run once by the library, as
eager runs it, inside a compiled graph.

AOTAutograd cannot trace into the library's fused RNN (cuDNN, oneDNN): it decomposes a traced
``torch.lstm`` into per-step ops, which on CUDA run several times slower than cuDNN
(issue 30.2's table: 6.6x). :mod:`fxopt.kernels.recompute_rnn` keeps the library call by
saving only its inputs and running the call again in the backward, which pays under a memory
budget and costs a second forward where none is asked for. This op keeps what eager keeps
instead: its forward runs the call once under autograd, on detached leaves, and keeps the
library's own autograd graph (cuDNN's reserve space, oneDNN's workspace) in a table under a
key that the op returns as ``handle``, a 0-d int64 CPU tensor. Its backward,
``fxopt::library_rnn_backward``, takes that graph out of the table and differentiates it at
the gradients it is given. The step's time and bytes are eager's call's. A call no gradient
flows through (an inference graph: ``keep=False``) runs the library's inference kernel and
keeps nothing.

The kept graph reads tensors the compiled graph does not know it reads, so the op keeps the
code generator away from them:

- it runs the call on copies of the sequence and the initial states. A code generator may
  reuse an input's buffer once the graph has no further use for it (Inductor's buffer reuse
  and in-place kernels), and the kept graph reads the sequence in its backward. The weights
  are the graph's inputs, which no code generator overwrites; an in-place change to them
  before the backward raises autograd's usual version error, as it does in eager;
- its backward takes the op's outputs as arguments (``kept``), so the compiled forward
  returns them as saved tensors and keeps them whole until the backward: cuDNN's backward
  reads the call's output.

The table entry goes when the backward has run (the library's bytes are freed there, as in
eager) or when the handle is freed without a backward (a forward under grad whose loss is
never differentiated). A second backward through one forward (``retain_graph=True``) raises
an error that names the fix: the library's graph was freed by the first.

Outputs are the training kernel's, so the op's outputs and gradients are eager's call's bit
for bit, inter-layer dropout included (its masks are drawn once, in the forward, and kept in
the graph). The op takes what :mod:`fxopt.kernels.library_rnn_calls` says, with the call's
dropout and training flag too, and returns the call's ``[output, h_n(, c_n)]`` and the
handle; both ops keep that module's custom-op contract on the storage of their returns.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass

import torch

from fxopt import _compat
from fxopt.kernels import library_rnn_calls

__all__ = ["kept_calls", "library_rnn", "library_rnn_backward"]


@dataclass
class _KeptCall:
    """One forward's library graph: its leaves (the copies and the weights) and outputs."""

    leaves: list[torch.Tensor]
    outputs: list[torch.Tensor]


_kept: dict[int, _KeptCall] = {}
_keys = itertools.count()
_NO_GRAPH = -1  # the handle of a call run without a graph (keep=False)


def kept_calls() -> int:
    """How many forwards' library graphs are held now, waiting for their backward (the
    tests' check that none is left behind)."""
    return len(_kept)


@torch.library.custom_op("fxopt::library_rnn", mutates_args=())
def library_rnn(x: torch.Tensor, hx: list[torch.Tensor], params: list[torch.Tensor],
                mode: str, has_biases: bool, num_layers: int, dropout: float, train: bool,
                bidirectional: bool, batch_first: bool, keep: bool) -> list[torch.Tensor]:
    """``torch.lstm`` / ``torch.gru`` (``mode``) run once, its autograd graph kept for
    :func:`library_rnn_backward` under the returned handle (module doc). ``keep=False``
    (no gradient flows through the call: an inference graph) runs the library's inference
    kernel and keeps nothing; its handle names no graph."""
    if not keep:
        outputs = library_rnn_calls.inference_call(mode, x, hx, params, has_biases,
                                                   num_layers, dropout, train, bidirectional,
                                                   batch_first)
        return [*outputs, torch.tensor(_NO_GRAPH, dtype=torch.int64)]
    with torch.enable_grad(), _compat.autograd_dispatch_restored():
        leaves, outputs = library_rnn_calls.call_on_leaves(
            mode, x, hx, params, has_biases, num_layers, dropout, train, bidirectional,
            batch_first, copy_inputs=True)
    key = next(_keys)
    _kept[key] = _KeptCall(leaves, outputs)
    handle = torch.tensor(key, dtype=torch.int64)
    weakref.finalize(handle, _kept.pop, key, None)  # freed without a backward (module doc)
    return [*(out.detach() for out in outputs), handle]


@library_rnn.register_fake
def _(x, hx, params, mode, has_biases, num_layers, dropout, train, bidirectional,
      batch_first, keep):
    outputs = library_rnn_calls.fake_outputs(x, hx, params, mode, num_layers, bidirectional,
                                             batch_first)
    return [*outputs, torch.empty((), dtype=torch.int64)]


@torch.library.custom_op("fxopt::library_rnn_backward", mutates_args=())
def library_rnn_backward(handle: torch.Tensor, kept: list[torch.Tensor],
                         grads: list[torch.Tensor], sizes: list[int],
                         ranks: list[int]) -> list[torch.Tensor]:
    """The gradients of ``[x, *hx, *params]`` (their shapes: ``sizes`` flattened, split by
    ``ranks``) given those of ``[output, h_n(, c_n)]``, from the graph the forward kept
    under ``handle``. ``kept`` (the forward's outputs) is only held (module doc)."""
    if int(handle) == _NO_GRAPH:
        raise RuntimeError(
            "fxopt: an nn.LSTM/nn.GRU call compiled without a gradient flowing through it "
            "(under torch.no_grad, or no input requiring grad) was differentiated; this is "
            "fxopt's bug, please report it. Workaround: library_rnn=False")
    call = _kept.pop(int(handle), None)
    if call is None:
        raise RuntimeError(
            "fxopt: this nn.LSTM/nn.GRU call's library graph was already freed by an earlier "
            "backward through the same forward (retain_graph=True). fxopt keeps one "
            "library graph per forward, as eager's cuDNN call does; to differentiate a step "
            "twice, compile with fuse_rnn=True (the call fused) or run the RNN eagerly")
    with torch.enable_grad(), _compat.autograd_dispatch_restored():
        results = library_rnn_calls.leaf_gradients(call.leaves, call.outputs, grads)
    # cuDNN's weight gradients are views of one flat buffer: owning copies them
    return library_rnn_calls.owning(results, [*kept, *grads])


@library_rnn_backward.register_fake
def _(handle, kept, grads, sizes, ranks):
    shapes = [sizes[start:start + rank] for start, rank in zip(
        itertools.accumulate([0, *ranks[:-1]]), ranks, strict=True)]
    return [grads[0].new_empty(shape) for shape in shapes]


def _setup_context(ctx, inputs, output):
    x, hx, params, *_ = inputs
    *outputs, handle = output
    ctx.save_for_backward(handle, *outputs)
    shapes = [t.shape for t in (x, *hx, *params)]
    ctx.sizes, ctx.ranks = [d for s in shapes for d in s], [len(s) for s in shapes]
    ctx.hx_count, ctx.argument_count = len(hx), len(inputs) - 3


def _backward(ctx, grads):
    handle, *outputs = ctx.saved_tensors
    grads = [torch.zeros_like(out) if g is None else g for g, out in zip(grads, outputs)]
    result = library_rnn_backward(handle, outputs, grads, ctx.sizes, ctx.ranks)
    n_hx = ctx.hx_count
    return (result[0], result[1:1 + n_hx], result[1 + n_hx:], *([None] * ctx.argument_count))


library_rnn.register_autograd(_backward, setup_context=_setup_context)
