"""What fuse_rnn's tests share: the graph Dynamo captures for a call (RNN modules allowed,
as fuse_rnn's users compile them), and fuse_rnn run on such a graph by itself, outside a
compile, where a test looks at the rewrite rather than at a training step."""

import torch
from torch import fx

from fxopt.config import Options
from fxopt.passes import GraphKind, PassContext, PassResult, Stage
from fxopt.passes.fuse_rnn import fuse_rnn


def dynamo_graph(fn, *args) -> fx.GraphModule:
    """The one graph Dynamo captures for ``fn(*args)`` under ``allow_rnn`` (no autograd:
    the rewrite runs before it)."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True), torch.no_grad():
        torch.compile(fn, backend=capture)(*args)
    (gm,) = graphs
    return gm


def run_fuse_rnn(gm: fx.GraphModule, device: str = "cpu", **options) -> PassResult:
    """fuse_rnn on ``gm`` (in place) with ``options``, as the pipeline runs it on a
    Dynamo graph for ``device``."""
    ctx = PassContext(options=Options(**options), stage=Stage.PRE_AUTOGRAD,
                      graph_kind=GraphKind.DYNAMO, graph_name="g0", device=torch.device(device))
    return fuse_rnn(gm, ctx)
