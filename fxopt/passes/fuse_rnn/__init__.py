"""fuse_rnn: recurrent cells become fused LSTM/GRU steps with their own backward (EcoRNN).

Runs at PRE_AUTOGRAD on Dynamo's torch-level graph and rewrites, in this order:
1. whole ``nn.LSTM`` / ``nn.GRU`` calls (`modules`): per layer and direction the input
   projection of the whole sequence as one GEMM and one sequence op
   (``fxopt::lstm_sequence`` / ``fxopt::gru_sequence`` of `fxopt.kernels.fuse_rnn_sequence`)
   that steps the fused cells through time;
2. ``nn.LSTMCell`` / ``nn.GRUCell`` calls (`cells`), the input projection hoisted when an
   unrolled loop steps through one sequence;
3. hand-written LSTM and GRU cells (`handwritten`, `handwritten_gru`);

and hoists the input projections of unrolled loops into one GEMM each (`hoist`).

Each other fused step is the ``fxopt::lstm_cell`` / ``fxopt::gru_cell`` custom op of
`fxopt.kernels.fuse_rnn` (Triton forward and backward kernels where Triton runs, the torch
reference elsewhere, so the pass fires on every device), or under Inductor its fusible form,
which Inductor generates and launches from compiled code. Stats: ``fused`` counts per form,
``declined`` counts per form and reason, ``hoisted_input_projections``, and ``form``: the
cells' form, "fusible" (under Inductor) or "custom_ops" (as tempo's stats name it).
"""

from __future__ import annotations

import torch.fx as fx

from fxopt.passes.base import PassContext, PassResult
from fxopt.passes.fuse_rnn.cells import rewrite_builtin_cells
from fxopt.passes.fuse_rnn.graph import Rewrite
from fxopt.passes.fuse_rnn.handwritten import rewrite_handwritten_lstm
from fxopt.passes.fuse_rnn.handwritten_gru import rewrite_handwritten_gru
from fxopt.passes.fuse_rnn.modules import rewrite_modules

__all__ = ["fuse_rnn"]


def fuse_rnn(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    """Replace the recurrent cells of a Dynamo graph by fused cell ops."""
    rw = Rewrite(gm, ctx)
    rewrite_modules(rw)
    rewrite_builtin_cells(rw)
    rewrite_handwritten_lstm(rw)
    rewrite_handwritten_gru(rw)
    return PassResult(gm, bool(rw.verdicts.matched), rw.verdicts, rw.stats())
