"""write_repro on hand-built graphs: tensor attributes (nested ones included) travel in
the .pt beside the script, integer inputs stay valid indices, and a graph it cannot
reproduce is refused with a clear error."""

import runpy
import sys

import pytest
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from fxopt.debug.repro import write_repro


class Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.tensor([2.0, -1.0, 0.5]))


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.table = torch.nn.Parameter(torch.randn(4, 3))

    def forward(self, x, ids):
        return x * self.inner.scale + self.table[ids].sum(0)


def traced_with_values(*values):
    gm = fx.symbolic_trace(Scaled())
    for node, value in zip(gm.graph.find_nodes(op="placeholder"), values):
        node.meta["val"] = value
    return gm


def test_repro_carries_nested_tensor_attributes_and_runs(tmp_path, capsys, monkeypatch):
    gm = traced_with_values(torch.randn(5, 3), torch.zeros(7, dtype=torch.long))
    script = write_repro(gm, tmp_path, graph="g0", kind="forward", stage="forward")
    assert script.name == "repro_forward.py" and script.with_suffix(".pt").is_file()
    saved = torch.load(script.with_suffix(".pt"))
    assert set(saved) == {"inner.scale", "table"}
    torch.testing.assert_close(saved["inner.scale"], gm.inner.scale)
    monkeypatch.setattr(sys, "argv", [str(script), "--seed", "3"])
    runpy.run_path(str(script), run_name="__main__")
    assert capsys.readouterr().out == "output 0: float32[5, 3]\n"


def test_repro_saves_real_attributes_while_the_compilation_fake_mode_is_active(tmp_path):
    """The dump writes inside AOTAutograd's FakeTensorMode, whose graphs may read real
    constants (transformers 5.17's GPT-2 lifts a ``tensor(0.)``)."""
    gm = traced_with_values(torch.randn(5, 3), torch.zeros(7, dtype=torch.long))
    with FakeTensorMode():
        script = write_repro(gm, tmp_path, graph="g0", kind="forward", stage="forward")
    saved = torch.load(script.with_suffix(".pt"))
    assert not any(isinstance(value, FakeTensor) for value in saved.values())
    torch.testing.assert_close(saved["table"], gm.table.detach())


def test_graph_without_recorded_inputs_is_refused(tmp_path):
    gm = traced_with_values(torch.randn(5, 3), "not a tensor")
    with pytest.raises(ValueError, match="input ids has no recorded tensor or value"):
        write_repro(gm, tmp_path, graph="g0", kind="forward", stage="forward")
    assert not (tmp_path / "repro_forward.py").exists()


def test_graph_reading_a_submodule_is_refused(tmp_path):
    gm = traced_with_values(torch.randn(5, 3), torch.zeros(7, dtype=torch.long))
    output = next(iter(gm.graph.find_nodes(op="output")))
    with gm.graph.inserting_before(output):
        gm.graph.get_attr("inner")
    with pytest.raises(ValueError, match="reads attribute 'inner', a Module; only tensor"):
        write_repro(gm, tmp_path, graph="g0", kind="forward", stage="forward")
