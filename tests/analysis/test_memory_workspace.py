"""Op workspaces in the memory model (:mod:`fxopt.analysis.workspace`): the temporaries
tempo's CPU GELU allocates inside one call are part of the measured peak, so the
simulation counts them while the node runs.

An MLP whose peak is at the GELU's backward (hidden 512 x 256 rows, fp32), measured when
written: without workspaces the simulation was 61% under the profiler's measurement of the
compiled step (4704520 bytes; what put BERT's joint plans with tempo's GELU 2.6-3.4% over
their budgets, issue 16); with them it is 0.7% over.
"""

import pytest
import torch
from torch import nn

import fxopt.analysis.memory as memory
import fxopt.kernels.tempo.gelu as tempo_gelu
from fxopt.analysis import estimate_step_memory, workspace
from fxopt.analysis.workspace import workspace_bytes
from fxopt.compiler import Backend
from fxopt.profile import profile_memory

TOLERANCE = 0.05  # issue 16: predicted peak within 5% of measured


def test_tempo_gelu_workspace_makes_the_peak_prediction_match_the_measurement(monkeypatch):
    # the CPU reference ops (what the CPU benchmarks run), not Triton's interpreter
    monkeypatch.setattr(tempo_gelu, "triton_runs_on", lambda device: False)
    workspace._measured.cache_clear()  # measured again under this implementation
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 512), nn.GELU(), nn.Linear(512, 32))
    x = torch.randn(256, 32)
    backend = Backend({"tempo": True, "codegen": "fx"})
    compiled = torch.compile(model, backend=backend)
    measured = profile_memory(compiled, (x,), steps=1,
                              loss_fn=lambda out: out.square().sum()).peak_bytes
    torch._dynamo.reset()
    (record,) = backend.graphs
    assert record.pass_records("tempo")[0].fired
    fw, bw = record.graphs["forward"], record.graphs["backward"]
    gelu_backward = [n for n in bw.graph.nodes if "tempo_gelu_backward" in str(n.target)]
    assert gelu_backward and workspace_bytes(gelu_backward[0]) > 0
    predicted = estimate_step_memory(fw, bw).peak_bytes
    assert predicted == pytest.approx(measured, rel=TOLERANCE)
    monkeypatch.setattr(memory, "workspace_bytes", lambda node: 0)  # the model before
    assert estimate_step_memory(fw, bw).peak_bytes < (1 - TOLERANCE) * measured
    workspace._measured.cache_clear()


@pytest.mark.parametrize("shape,stride", [((3, 5), (5, 1)), ((3, 5), (0, 1)),
                                          ((2, 3, 4), (0, 0, 1)), ((4, 3), (1, 4)),
                                          ((0, 3), (3, 1)), ((), ())])
def test_a_measured_ops_arguments_are_rebuilt_with_their_layout_expanded_ones_too(shape, stride):
    """An expanded argument (stride 0: a zero gradient autograd broadcast to fuse_rnn's
    sequence backward) failed to build, and the op's workspace went unmeasured, warned."""
    spec = workspace._TensorSpec(shape, stride, torch.float32, "cpu")
    built = spec.build()
    assert (tuple(built.shape), built.stride()) == (shape, stride)
    assert torch.isfinite(built).all()
