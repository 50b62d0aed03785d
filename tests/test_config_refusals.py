"""Options that would silently do nothing are refused with one line naming the option
(issue 19 item 8, issue 20 item 3)."""

import subprocess
import sys
from pathlib import Path

import pytest

import fxopt
from fxopt import config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("options, words", [
    ({"memory_budget": 0.5, "swap_recompute": False},
     "'memory_budget' is carried out by the swap_recompute pass"),
    ({"planner": True}, "option 'planner' decides under a memory budget"),
    ({"force_swap": True}, "option 'force_swap' applies under a memory budget"),
    ({"inductor_max_autotune": True, "codegen": "fx"},
     "'inductor_max_autotune' tunes Inductor's kernels .* set codegen='inductor'"),
    ({"memory_budget": "0.0000001KB"}, "'0.0000001KB' rounds to 0 bytes"),
])
def test_options_that_would_do_nothing_are_refused(options, words):
    """(``inductor_max_autotune`` alone is not among them: it makes codegen='auto' choose
    Inductor, see tests/test_codegen_auto.py.)"""
    with pytest.raises(ValueError, match=words) as info:
        config.resolve(options)
    assert "\n" not in str(info.value)


def test_options_that_do_something_together_are_accepted():
    assert config.resolve({"planner": True, "memory_budget": 0.5}).planner_enabled
    assert config.resolve({"force_swap": True, "memory_budget": "1GiB"}).force_swap
    assert config.resolve({"memory_budget": 0.5, "swap_recompute": True}).swap_recompute
    assert config.resolve(mode="max-autotune").inductor_max_autotune


def test_a_misspelled_pass_in_rewrite_limit_is_refused_like_a_misspelled_option():
    with pytest.raises(ValueError, match="unknown pass 'tmpo' in rewrite_limit. Did you mean "
                                         "'tempo'"):
        fxopt.backend(rewrite_limit={"tmpo": 3})
    with pytest.raises(ValueError, match="unknown pass 'fuse_elementwis'"):
        fxopt.backend(rewrite_limit="fuse_elementwis=2")
    fxopt.backend(rewrite_limit={"tempo": 3})


def test_an_unknown_environment_variable_is_refused(monkeypatch):
    monkeypatch.setenv("FXOPT_TEMPOO", "1")
    with pytest.raises(ValueError, match="unknown option variable 'FXOPT_TEMPOO' in the "
                                         "environment. Did you mean 'FXOPT_TEMPO'"):
        config.resolve()


@pytest.mark.parametrize("variable, value, error, words", [
    ("FXOPT_TEMPO", "maybe", TypeError, "FXOPT_TEMPO='maybe': option 'tempo' must be"),
    ("FXOPT_MEMORY_BUDGET", "6 gigs", ValueError, "FXOPT_MEMORY_BUDGET='6 gigs': cannot read"),
    ("FXOPT_CODEGEN", "c", ValueError, "FXOPT_CODEGEN='c': option 'codegen' must be one of"),
])
def test_an_environment_error_names_the_variable(monkeypatch, variable, value, error, words):
    monkeypatch.setenv(variable, value)
    with pytest.raises(error, match=words):
        config.resolve()


def test_a_bad_option_through_torch_compile_ends_in_one_clear_line():
    script = ("import torch, fxopt\n"
              "m = torch.compile(torch.nn.Linear(2, 2), backend='fxopt', "
              "options={'tempoo': True})\n"
              "m(torch.randn(1, 2))\n")
    result = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True,
                            text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 1
    # Dynamo wraps the backend's error and appends its own hint (TORCHDYNAMO_VERBOSE); the
    # line above that hint is fxopt's, whole.
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("Set TORCHDYNAMO_VERBOSE"), lines[-3:]
    assert lines[-2].startswith("ValueError: fxopt: unknown option 'tempoo' in options. Did "
                                "you mean 'tempo'?"), lines[-3:]
