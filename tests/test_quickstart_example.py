"""The quickstart runs end to end with every option set its docstring documents (and its
default), under ``strict`` so that any fallback (a pass failed or unavailable, Inductor or
AOTAutograd failing) raises, and its explain report says no fallback happened."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fxopt

QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"


def _quickstart():
    spec = importlib.util.spec_from_file_location("quickstart_example", QUICKSTART)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _documented_options():
    return [None] + re.findall(r"--options '(\{.*?\})'", _quickstart().__doc__)


def test_the_docstring_documents_the_inductor_and_the_plain_runs():
    assert _documented_options() == [None, '{"codegen": "inductor"}', "{}"]


@pytest.mark.slow
@pytest.mark.parametrize("options", _documented_options(), ids=["default", "inductor", "empty"])
def test_quickstart_runs_its_documented_options_without_fallback(options, monkeypatch, capsys):
    argv = ["quickstart.py", "--steps", "2", "--batch", "4", "--device", "cpu"]
    monkeypatch.setattr(sys, "argv", argv + (["--options", options] if options else []))
    with fxopt.config.patch(strict=True):
        _quickstart().main()
    out = capsys.readouterr().out
    assert "step    2  loss" in out
    assert "fallbacks: none" in out and "FALLBACK" not in out



@pytest.mark.slow
def test_the_quickstart_never_peaks_above_plain_autograd_without_saying_why():
    """Issue 29: the quickstart (tempo, a 0.7 budget) predicted kept activations falling
    5.59 -> 2.49 MiB while the peak rose above plain autograd's, 6.43 -> 7.10 MiB,
    unexplained. swap_recompute never plans a peak above the graph it is given; where the
    passes before autograd left that graph higher than plain autograd's (tempo's CPU
    forms, as the README's quickstart runs them: without TRITON_INTERPRET, which this
    suite sets), explain says so, with the numbers."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(QUICKSTART.parents[1])
    out = subprocess.run([sys.executable, str(QUICKSTART), "--steps", "1", "--device", "cpu"],
                         env=env, capture_output=True, text=True, timeout=600, check=True).stdout
    plain, ours = (float(re.search(rf"predicted memory, {who}: peak ([\d.]+) MiB", out)[1])
                   for who in ("plain autograd", "fxopt"))
    row = re.search(r"swap_recompute +changed .* ([\d.]+)->([\d.]+) / ", out)
    assert row and float(row[2]) <= float(row[1])  # never above the graph it was given
    if ours > plain:
        said = re.search(r"fxopt's peak is ([\d.]+) MiB above plain autograd's: the joint "
                         r"graph the passes before autograd left \(tempo", out)
        # the difference of the exact bytes, against that of two figures rounded to 0.01
        assert said and abs(float(said[1]) - (ours - plain)) <= 0.01 + 1e-9
        assert f"peaks at {row[1]} MiB, and the joint passes took it to {ours:.2f} MiB" in out
