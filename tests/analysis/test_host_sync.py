"""No host synchronisation in a training step with every pass on: statically over the
graphs fxopt compiles, and at run time (fxopt.analysis.host_sync.HostSyncRecorder) over a
second step (the first compiles) of a tiny GPT-2, a tiny BERT and an LSTM language model."""

import pytest
import torch

import fxopt
from fxopt.analysis.host_sync import HostSync, HostSyncRecorder, graph_syncs
from fxopt.bench.workloads import WORKLOADS
from fxopt.kernels import triton_runs_on
from fxopt.profile import default_loss

pytestmark = pytest.mark.skipif(not triton_runs_on("cpu"),
                                reason="needs Triton's interpreter (TRITON_INTERPRET=1)")

EVERY_PASS = {"tempo": True, "fuse_rnn": True, "fuse_elementwise": True,
              "memory_budget": 0.5}
EXPECTED_PASSES = {"gpt2-small": {"tempo", "fuse_elementwise", "swap_recompute"},
                   "bert-base": {"tempo", "fuse_elementwise", "swap_recompute"},
                   "lstm-lm": {"fuse_rnn", "swap_recompute"}}


def _step(compiled, inputs):
    output = compiled(**inputs) if isinstance(inputs, dict) else compiled(*inputs)
    default_loss(output).backward()


@pytest.mark.parametrize("name", list(EXPECTED_PASSES))
def test_training_step_with_every_pass_never_waits_for_the_host(name):
    workload = WORKLOADS[name]
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = workload.build(True)
    inputs = workload.inputs(model, workload.smoke_batch, True, torch.device("cpu"))
    backend = fxopt.backend(**EVERY_PASS)
    compiled = torch.compile(model, backend=backend)
    with torch._dynamo.config.patch(allow_rnn=True):  # nn.LSTM reaches fuse_rnn
        _step(compiled, inputs)  # compiles
        with HostSyncRecorder() as recorder:
            _step(compiled, inputs)
    fired = {r.name for g in backend.graphs for r in g.passes if r.fired}
    assert EXPECTED_PASSES[name] <= fired, fired
    static = [s for g in backend.graphs for kind in ("forward", "backward")
              if kind in g.graphs for s in graph_syncs(g.graphs[kind])]
    assert static == []
    # every call counts: the models' own code makes none either, so one here is fxopt's
    # (its Python, or a compiled graph's code)
    assert recorder.calls == [], "\n".join(map(str, recorder.calls))


def test_recorder_and_static_check_see_each_kind_of_sync():
    x = torch.randn(5)
    with HostSyncRecorder() as recorder:
        x.sum().item()
        bool(x[0] > 0)
        x.nonzero()
        x.tolist()
        (x * 2).sum()  # no sync
        torch.ops.aten._local_scalar_dense(x[0])  # the op itself, as a graph calls it
    ops = [c.op for c in recorder.calls][:4]
    assert ops == ["Tensor.item", "Tensor.__bool__", "Tensor.nonzero", "Tensor.tolist"], ops
    assert [c.op for c in recorder.calls][4:] == ["aten._local_scalar_dense.default"]
    assert all(c.where.endswith("(test_recorder_and_static_check_see_each_kind_of_sync)")
               for c in recorder.calls), recorder.calls
    gm = torch.fx.symbolic_trace(lambda t: t.nonzero().sum().item())
    assert [s.op for s in graph_syncs(gm)] == ["Tensor.nonzero", "Tensor.item"]
    assert isinstance(graph_syncs(gm)[0], HostSync)
