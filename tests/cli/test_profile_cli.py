"""``fxopt profile TARGET``: a script's setup function, its outputs and its errors."""

import json
import textwrap

import pytest

from fxopt.__main__ import main

SCRIPT = textwrap.dedent("""
    import torch

    def setup():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(),
                                    torch.nn.Linear(64, 4))
        return model, torch.randn(8, 16), torch.optim.Adam(model.parameters())

    def not_a_step():
        return 42
    """)


def test_profile_a_script(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    assert main(["profile", str(script), "--out", str(tmp_path / "out"), "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "activations" in out and "optimizer_state" in out and "memory_profile.png" in out
    data = json.loads((tmp_path / "out" / "memory_profile.json").read_text())
    assert data["peak_categories"]["parameters"] == (16 * 64 + 64 + 64 * 4 + 4) * 4
    assert (tmp_path / "out" / "memory_profile.png").stat().st_size > 0


def test_profile_a_module_function_compiled(tmp_path, capsys, monkeypatch):
    (tmp_path / "mysteps.py").write_text(SCRIPT)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["profile", "mysteps:setup", "--compile", "fxopt", "--no-plot",
                 "--out", str(tmp_path)]) == 0
    assert "memory_profile.json" in capsys.readouterr().out


@pytest.mark.parametrize("target, message", [
    ("missing.py", "no such script"),
    ("no_such_module_xyz", "cannot import"),
    ("{script}:nothing", "no function 'nothing'"),
    ("{script}:not_a_step", "must return (model, inputs"),
])
def test_bad_targets_exit_2_with_a_message(tmp_path, capsys, target, message):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    assert main(["profile", target.format(script=script), "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
