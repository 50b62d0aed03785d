"""The quickstart runs end to end with every option set its docstring documents (and its
default), under ``strict`` so that any fallback (a pass failed or unavailable, Inductor or
AOTAutograd failing) raises, and its explain report says no fallback happened."""

import importlib.util
import re
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
