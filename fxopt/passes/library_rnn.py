"""library_rnn: whole ``nn.LSTM`` / ``nn.GRU`` calls run once by the library, as eager runs
them, before autograd.

A whole call in Dynamo's graph (traced under ``torch._dynamo.config.allow_rnn``) that
fuse_rnn does not fuse (it is off, or under ``"auto"`` the cost model left the call to
cuDNN, :mod:`fxopt.passes.fuse_rnn.choice`) would be decomposed by AOTAutograd into per-step
ops: 6.6x cuDNN's step on the H100's table. recompute_rnn keeps the library call but runs
its forward again in the backward, which pays only under a memory budget (the H200 measured
that step at 26.7 ms against eager's 20.6, at 492 MiB against 685). So without a budget each
call becomes :func:`fxopt.kernels.library_rnn.library_rnn`: the library's call, run once
under autograd, its graph kept for the backward. The step's time and bytes are then eager's
call's (cuDNN's reserve space included), plus one copy of the sequence the op takes to keep
the code generator off the buffer it reads in the backward (the kernel's doc).

It is on by default on CUDA, where the library is cuDNN, unless ``fuse_rnn=False`` (leave
RNN calls alone) or a memory budget or plan is set: the bytes the library keeps are out of
the graph's sight, so a budget's plan could not account for them, and recompute_rnn takes
the calls instead (it runs first; ``library_rnn=True`` under a budget takes only what
recompute_rnn declines). On the CPU the library is oneDNN, and ``library_rnn=True`` asks for
it. It takes the calls recompute_rnn would, and inter-layer dropout while training too (its
masks are drawn once); the declines are :mod:`fxopt.passes.whole_rnn_calls`'s.
"""

from __future__ import annotations

import torch
import torch.fx as fx

import fxopt.kernels.library_rnn  # noqa: F401  (registers the ops)
from fxopt.passes.base import PassContext, PassResult
from fxopt.passes.whole_rnn_calls import replace_whole_rnns

__all__ = ["library_rnn"]

PASS = "library_rnn"


def library_rnn(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    verdicts = replace_whole_rnns(
        gm, torch.ops.fxopt.library_rnn.default, PASS,
        lambda call, states, grad: (call.x, states, call.params, call.mode,
                                    call.has_biases, call.layers, call.dropout, call.train,
                                    call.bidirectional, call.batch_first, grad),
        replays=False, allow=ctx.rewrites.allow)
    return PassResult(gm, bool(verdicts.matched), verdicts)
