"""What fuse_rnn's tests share: the graph Dynamo captures for a call (RNN modules allowed,
as fuse_rnn's users compile them), and fuse_rnn run on such a graph by itself, outside a
compile, where a test looks at the rewrite rather than at a training step."""

import torch
from torch import fx

from fxopt.config import Options
from fxopt.passes import GraphKind, PassContext, PassResult, Stage
from fxopt.passes.fuse_rnn import fuse_rnn


class _Captured(Exception):
    """Raised by :func:`dynamo_graph`'s backend once it holds the graph."""


def dynamo_graph(fn, *args) -> fx.GraphModule:
    """The one graph Dynamo captures for ``fn(*args)`` under ``allow_rnn`` (no autograd:
    the rewrite runs before it). The graph is not run: eager nn.LSTM under bf16 autocast
    is oneDNN's, which raises on a CPU without AVX-512 ("could not create a primitive
    descriptor"), and these tests look at the graph only."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        raise _Captured

    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True, suppress_errors=False), torch.no_grad():
        try:
            torch.compile(fn, backend=capture)(*args)
        except Exception:  # noqa: BLE001 - Dynamo wraps _Captured, raised with the graph held
            if not graphs:
                raise
    (gm,) = graphs
    return gm


def run_fuse_rnn(gm: fx.GraphModule, device: str = "cpu", **options) -> PassResult:
    """fuse_rnn on ``gm`` (in place) with ``options``, as the pipeline runs it on a
    Dynamo graph for ``device``."""
    ctx = PassContext(options=Options(**options), stage=Stage.PRE_AUTOGRAD,
                      graph_kind=GraphKind.DYNAMO, graph_name="g0", device=torch.device(device))
    return fuse_rnn(gm, ctx)
