"""`fxopt passes` (console script and python -m fxopt)."""

import subprocess
import sys

from fxopt.__main__ import main
from fxopt.passes import PIPELINE


def test_passes_lists_every_pass_with_stage_flag_and_default(capsys):
    assert main(["passes", "--options"]) == 0
    out = capsys.readouterr().out
    for spec in PIPELINE:
        line = next(line for line in out.splitlines() if line.startswith(spec.name + " "))
        assert (spec.flag or "-") in line and spec.stages[0].value in line
        assert spec.default_text in line
    assert "memory_budget" in out and "FXOPT_<NAME>" in out


def test_python_dash_m_and_unknown_command():
    result = subprocess.run([sys.executable, "-m", "fxopt", "passes"], capture_output=True,
                            text=True, check=True)
    assert "swap_recompute" in result.stdout
    bad = subprocess.run([sys.executable, "-m", "fxopt", "frobnicate"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
