"""The backend end to end: training, inference, dynamic shapes, graph breaks, buffer
mutation, autocast, both code generators; every case compared with eager."""


import pytest
import torch
import torch.nn.functional as F
from models import MLP, Block, ConvNet, LSTMModel
from torch import nn
from torch._dynamo.exc import BackendCompilerFailed

import fxopt
from fxopt.testing import assert_same_as_eager


def test_training_mlp_records_every_stage():
    comparison = assert_same_as_eager(MLP(), (torch.randn(7, 13, requires_grad=True),))
    (graph,) = comparison.graphs
    assert set(graph.graphs) == {"dynamo", "joint", "forward", "backward"}
    stages = {r.stage for r in graph.passes}
    assert stages == {"pre_autograd", "joint", "forward", "backward"}
    assert graph.memory["autograd"].activation_bytes > 0
    assert graph.memory["fxopt"].peak_bytes >= graph.memory["fxopt"].activation_bytes


def test_training_several_steps_transformer_block_with_dropout():
    block = Block(dropout=0.1).train()
    assert_same_as_eager(block, (torch.randn(3, 9, 32),), steps=3)


def test_inference_under_no_grad_uses_the_inference_graph():
    model = MLP()
    backend = fxopt.backend()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(5, 13)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)
    (graph,) = backend.graphs
    assert "inference" in graph.graphs and "backward" not in graph.graphs
    assert graph.memory["fxopt"].activation_bytes == 0


def test_dynamic_shapes_compile_once_for_many_sizes():
    model = MLP()
    backend = fxopt.backend()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    for batch in (3, 6, 11):
        x = torch.randn(batch, 13, requires_grad=True)
        out = compiled(x)
        out.sum().backward()
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-6)
    assert len(backend.graphs) == 1
    (graph,) = backend.graphs
    symbolic = [p for p in graph.graphs["forward"].graph.find_nodes(op="placeholder")
                if isinstance(p.meta.get("val"), torch.SymInt)]
    assert symbolic, "dynamic=True should give a SymInt batch size"
    assert graph.memory["fxopt"].peak_bytes > 0


def test_a_compile_dynamo_restarts_leaves_no_record():
    """Under dynamic=True Dynamo makes a float argument symbolic; a layer_norm eps cannot
    stay one, so Dynamo restarts the analysis from inside the backend with the float
    specialized. The first compile made no graph: one record, of the graph that runs."""
    backend = fxopt.backend(codegen="fx")
    compiled = torch.compile(lambda x, eps: F.layer_norm(x, (8,), eps=eps).sum(),
                             backend=backend, dynamic=True)
    x = torch.randn(4, 8, requires_grad=True)
    compiled(x, 1e-5).backward()
    assert len(backend.graphs) == 1 and backend.graphs[0].graphs.get("forward") is not None


def test_dynamic_shapes_against_eager():
    assert_same_as_eager(Block(), (torch.randn(2, 7, 32),), dynamic=True)


class WithGraphBreak(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(11, 11), nn.Linear(11, 3)

    def forward(self, x):
        x = torch.tanh(self.a(x))
        torch._dynamo.graph_break()
        return self.b(x)


def test_graph_breaks_give_several_graphs():
    comparison = assert_same_as_eager(WithGraphBreak(), (torch.randn(4, 11),))
    assert len(comparison.graphs) == 2
    assert all("backward" in g.graphs for g in comparison.graphs)


def test_batchnorm_running_stats_are_updated_like_eager():
    # assert_same_as_eager also compares buffers after every step
    assert_same_as_eager(ConvNet().train(), (torch.randn(4, 3, 10, 10),), steps=2)


def test_batchnorm_eval_mode():
    assert_same_as_eager(ConvNet().eval(), (torch.randn(2, 3, 9, 9),))


class Autocast(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = MLP()

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.inner(x)


def test_autocast_bf16():
    comparison = assert_same_as_eager(Autocast(), (torch.randn(6, 13, requires_grad=True),))
    assert comparison.compiled_output.dtype == torch.bfloat16


def test_lstm_model():
    """Under ``allow_rnn``, which Dynamo needs to trace nn.LSTM at all."""
    with torch._dynamo.config.patch(allow_rnn=True):
        comparison = assert_same_as_eager(LSTMModel(), (torch.randint(0, 23, (3, 5)),))
    assert len(comparison.graphs) == 1


def test_plain_function_with_input_grads():
    def fn(x, y):
        return (x.sin() * y).sum(-1), F.relu(y)

    args = (torch.randn(5, 6, requires_grad=True), torch.randn(5, 6, requires_grad=True))
    assert_same_as_eager(fn, args)


def test_inductor_codegen():
    assert_same_as_eager(Block(), (torch.randn(2, 5, 32),), {"codegen": "inductor"})


def test_inductor_codegen_inference_and_dropout():
    model = Block(dropout=0.2).train()
    with torch._inductor.config.patch(fallback_random=True):
        assert_same_as_eager(model, (torch.randn(2, 5, 32),), {"codegen": "inductor"})
    compiled = torch.compile(model.eval(), backend=fxopt.backend(codegen="inductor"))
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


def test_max_autotune_mode_selects_inductor():
    backend = fxopt.Backend(mode="max-autotune")
    compiled = torch.compile(MLP(), backend=backend)
    compiled(torch.randn(2, 13)).sum().backward()
    assert backend.graphs[0].codegen.name == "inductor"


def test_string_backend_and_options_reach_fxopt(tmp_path):
    model = MLP()
    compiled = torch.compile(model, backend="fxopt", options={"debug_dir": str(tmp_path)})
    x = torch.randn(3, 13)
    torch.testing.assert_close(compiled(x), model(x))
    assert (tmp_path / "index.json").is_file()  # the option reached fxopt's dumper


def test_bad_option_through_torch_compile_raises_clearly():
    compiled = torch.compile(MLP(), backend="fxopt", options={"memory_budget": "6 gigs"})
    with pytest.raises(BackendCompilerFailed) as info:  # Dynamo wraps the backend's error
        compiled(torch.randn(2, 13))
    assert isinstance(info.value.inner_exception, ValueError)
    assert "cannot read memory_budget '6 gigs'" in str(info.value)


def test_failure_outside_the_passes_falls_back_to_eager(monkeypatch):
    def broken_aot(**kwargs):
        raise RuntimeError("AOTAutograd cannot trace this")

    monkeypatch.setattr(fxopt._compat, "aot_autograd", broken_aot)
    with pytest.warns(UserWarning, match=r"graph g\d+ runs uncompiled \(eager"):
        comparison = assert_same_as_eager(MLP(), (torch.randn(3, 13),))
    assert "AOTAutograd cannot trace this" in comparison.graphs[0].fallback
    compiled = torch.compile(MLP(), backend=fxopt.backend(strict=True))
    with pytest.raises(BackendCompilerFailed, match="AOTAutograd cannot trace this"):
        compiled(torch.randn(3, 13))


def test_inductor_failure_falls_back_to_fx_codegen(monkeypatch):
    def broken_inductor(*args, **kwargs):
        raise RuntimeError("no lowering")

    monkeypatch.setattr(fxopt._compat, "inductor_compile", broken_inductor)
    with pytest.warns(UserWarning,
                      match=r"graph g\d+/(forward|backward) runs without Inductor"):
        comparison = assert_same_as_eager(Block(), (torch.randn(2, 5, 32),),
                                          {"codegen": "inductor"})
    assert "no lowering" in comparison.graphs[0].fallback
    assert "(fx code generation, unfused)" in comparison.graphs[0].fallback
