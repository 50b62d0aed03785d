"""``fxopt explain TARGET``: a script's model explained from the command line."""

import json
import textwrap

from fxopt.__main__ import main

SCRIPT = textwrap.dedent("""
    import torch

    def setup():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.GELU(),
                                    torch.nn.Linear(9, 3))
        return model, torch.randn(4, 6)

    def not_a_step():
        return 42
    """)


def test_explain_a_script_with_options_and_json(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out_json = tmp_path / "report.json"
    assert main(["explain", str(script), "--option", "strict=1",
                 "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "fxopt explain: 1 graph(s), 0 graph break(s), forward+backward" in out
    assert "options: {'strict': True}" in out
    assert json.loads(out_json.read_text())["graphs"][0]["dynamo_nodes"] > 0


def test_explain_bad_target_or_option_exits_2(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    assert main(["explain", f"{script}:not_a_step"]) == 2
    assert "must return (model, inputs" in capsys.readouterr().err
    assert main(["explain", str(script), "--option", "tmpo=1"]) == 2
    assert "tmpo" in capsys.readouterr().err
    assert main(["explain", str(script), "--option", "tempo"]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err
