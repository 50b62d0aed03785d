"""recompute_rnn: whole ``nn.LSTM`` / ``nn.GRU`` calls that save only their inputs, before autograd.

Under a memory budget, each ``torch.lstm`` / ``torch.gru`` call in Dynamo's graph (Dynamo
traces one only under ``torch._dynamo.config.allow_rnn``; fuse_rnn, when on, has taken the
calls it fuses) becomes :func:`fxopt.kernels.recompute_rnn.recompute_rnn`: the library's
fused RNN (oneDNN, cuDNN) in the forward, the same call run again and differentiated in the
backward. Left alone, AOTAutograd decomposes the call into per-step ops, which runs slower
than the fused call and its recompute together and saves every step's gates; the
rewritten call saves its inputs only. On a 2-layer ``nn.LSTM`` LM (hidden 256, seq 64,
batch 8, CPU) the compiled step keeps 0.067 of eager's saved bytes in 1.33x eager's time
at any fraction, where the decomposed call under Inductor kept 0.12 at 0.5 in 1.69x
(``benchmarks/results/budget_frontier_models_cpu.md``). A fraction's base keeps a lower
bound of what the call would have saved (:func:`removed_saved_bytes`, the stat
``plain_saved_bytes_removed``), so the fraction stays one of eager's bytes.

Outputs and gradients are eager's to fp32 rounding (the op's doc). The calls it declines,
with the reason, are :mod:`fxopt.passes.whole_rnn_calls`'s, inter-layer dropout while
training among them (a recompute would draw new masks). It runs under the ``swap_recompute``
flag (on with a budget), after fuse_rnn; without a budget, library_rnn keeps the calls
fuse_rnn leaves to cuDNN as one library call each.
"""

from __future__ import annotations

import torch
import torch.fx as fx

import fxopt.kernels.recompute_rnn  # noqa: F401  (registers the ops)
from fxopt import _compat
from fxopt.passes.base import REMOVED_SAVED_BYTES, PassContext, PassResult, Verdicts
from fxopt.passes.torch_calls import RnnCall, example_tensor
from fxopt.passes.whole_rnn_calls import replace_whole_rnns

__all__ = ["recompute_rnn", "recompute_whole_rnns", "removed_saved_bytes"]

PASS = "recompute_rnn"


def removed_saved_bytes(call: RnnCall) -> int:
    """A lower bound on the bytes plain autograd keeps for one call that the rewritten graph
    no longer keeps. Per time step, layer and direction, any implementation that does not
    recompute keeps the gate activations (an LSTM's 4 of hidden size and its new cell state;
    a GRU's 3 and the hidden projection's candidate part) and, but for the last layer (whose
    output the graph may still keep), the layer's output (the next layer's input). A lower
    bound, so that a fraction is never taken of more than plain autograd keeps: eager keeps
    more (on the CPU, 8 hidden-size tensors per LSTM step with oneDNN off, about 17 with it
    on)."""
    xv = example_tensor(call.x)
    steps, batch = (_compat.size_hint(xv.shape[i], 1) for i in ((1, 0) if call.batch_first
                                                                 else (0, 1)))
    # weight_hh_l0: (gates x hidden, hidden or proj_size)
    rows, output = (_compat.size_hint(d, 1) for d in example_tensor(call.params[1]).shape)
    lstm = call.mode == "lstm"
    hidden = rows // (4 if lstm else 3)
    per_step = (5 if lstm else 4) * hidden * call.layers + output * (call.layers - 1)
    directions = 2 if call.bidirectional else 1
    return per_step * directions * steps * batch * xv.element_size()


def recompute_whole_rnns(gm: fx.GraphModule, allow=lambda: True) -> Verdicts:
    """Replace each ``torch.lstm`` / ``torch.gru`` call of ``gm`` by the recomputing op
    (those ``allow`` accepts); the verdicts: per mode the calls replaced and the plain saved
    bytes they removed (:func:`removed_saved_bytes`), per call left its reason."""
    return replace_whole_rnns(
        gm, torch.ops.fxopt.recompute_rnn.default, PASS,
        lambda call, states, grad: (call.x, states, call.params, call.mode, call.has_biases,
                                    call.layers, call.bidirectional, call.batch_first),
        replays=True, allow=allow, saved_bytes=removed_saved_bytes)


def recompute_rnn(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    verdicts = recompute_whole_rnns(gm, ctx.rewrites.allow)
    removed = sum(m.bytes for m in verdicts.matched.values())
    return PassResult(gm, bool(verdicts.matched), verdicts, {REMOVED_SAVED_BYTES: removed})
