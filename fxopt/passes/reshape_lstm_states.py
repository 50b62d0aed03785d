"""reshape_lstm_states: eager's ``h_n`` and ``c_n`` for the ``nn.LSTM`` calls left to torch's
decomposition on torch 2.11 and 2.12, before autograd.

Those releases decompose a whole ``torch.lstm`` call (Dynamo's fake tensors and AOTAutograd
trace it so wherever oneDNN does not run it: training, CUDA, ``proj_size``) into steps whose
final states come out (layers * directions, 1, batch, hidden), where eager's are
(layers * directions, batch, hidden): their ``one_layer_lstm`` squeezes dim 1 of the last
step's (1, batch, hidden) state, not dim 0 (torch 2.13 fixed it;
:func:`fxopt._compat.decomposed_lstm_states_misshapen` reads which torch this is). Plain
``torch.compile`` under ``allow_rnn`` returns them so; fxopt's fuse_rnn, recompute_rnn and
library_rnn, which run before this pass, return eager's for the calls they take.

For each call still in the graph, each read of its ``h_n`` or ``c_n`` whose example value has
that extra dimension is followed by ``flatten(1, 2)``, which merges the size-1 dimension into
the batch one, exactly eager's shape and values; the ops after it then compute what eager's
do. It is the one pass that changes the shapes of the graph's outputs (rule 4 of README.md
here): from Dynamo's misshapen ones to eager's. A batch of 1 traces eager's shape already
(the wrong squeeze then removes the batch dimension, which is 1) and is left alone. What
Dynamo derived from the wrong shape while tracing (a ``.shape`` read, an error in an op that
needed eager's shape) is before any backend and beyond repair here.

Internal: no flag, on exactly where the decomposition misshapes the states.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from fxopt.passes.base import PassContext, PassResult, Verdicts
from fxopt.passes.torch_calls import example_tensor

__all__ = ["reshape_lstm_states"]

PASS = "reshape_lstm_states"
_STATES = (1, 2)  # torch.lstm's result: (output, h_n, c_n)


def reshape_lstm_states(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    verdicts = Verdicts()
    for node in list(gm.graph.find_nodes(op="call_function", target=torch.lstm)):
        for read in [u for u in node.users  # Dynamo reads a call's results by index
                     if u.target is operator.getitem and u.args[1] in _STATES]:
            value = example_tensor(read)
            if value is None or value.dim() != 4 or not ctx.rewrites.allow():
                continue  # eager's shape already (a batch of 1), or not allowed
            with gm.graph.inserting_after(read):
                merged = gm.graph.call_function(torch.flatten, (read, 1, 2))
            read.replace_all_uses_with(merged,
                                       delete_user_cb=lambda user, new=merged: user is not new)
            merged.meta["example_value"] = value.flatten(1, 2)
            merged.meta["fxopt"] = {"pass": PASS, "replaces": [read.name]}
            verdicts.match("h_n" if read.args[1] == 1 else "c_n")
    return PassResult(gm, bool(verdicts.matched), verdicts)
