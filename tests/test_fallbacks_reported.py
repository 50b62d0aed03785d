"""No silent eager (issue 17): every fallback is warned with what was lost, kept on the
graph's record (never overwritten by a later one), listed by explain, and raises under
strict (a pass failing, Inductor failing)."""

import pytest
import torch
from models import MLP

import fxopt
from fxopt.passes import PassSpec, Stage
from fxopt.testing import extra_passes


def broken(gm, ctx):
    raise RuntimeError("deliberate failure")


BROKEN = PassSpec(name="broken", stages=(Stage.JOINT,), description="test pass", run=broken,
                  default=lambda ctx: True, default_text="on")


def test_a_failed_pass_is_warned_as_lost_and_listed_by_explain():
    with extra_passes(BROKEN), pytest.warns(
            UserWarning, match=r"graph g\d+/joint runs without broken \(the pass is skipped"):
        report = fxopt.explain(MLP(), torch.randn(3, 13))
    (fallback,) = report.fallbacks
    assert fallback.startswith("pass 'broken' on g") and "failed: RuntimeError" in fallback
    assert "fallbacks: 1" in str(report) and f"FALLBACK: {fallback}" in str(report)


def _broken_inductor(*args, **kwargs):
    raise RuntimeError("no lowering")


def test_inductor_failing_on_forward_and_backward_keeps_both_fallbacks(monkeypatch):
    monkeypatch.setattr(fxopt._compat, "inductor_compile", _broken_inductor)
    with pytest.warns(UserWarning, match="runs without Inductor"):
        report = fxopt.explain(MLP(), torch.randn(3, 13), options={"codegen": "inductor"})
    assert [f.split(" runs")[0] for f in report.fallbacks] == [
        f"graph {report.graphs[0].name}/forward", f"graph {report.graphs[0].name}/backward"]
    assert all("Inductor failed: RuntimeError: no lowering" in f for f in report.fallbacks)


def test_strict_raises_when_inductor_fails(monkeypatch):
    monkeypatch.setattr(fxopt._compat, "inductor_compile", _broken_inductor)
    compiled = torch.compile(MLP(), backend=fxopt.backend(codegen="inductor", strict=True))
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="no lowering"):
        compiled(torch.randn(3, 13))



@pytest.mark.parametrize("failure", ["pass", "inductor"])
def test_strict_raises_even_when_dynamo_suppresses_errors(monkeypatch, failure):
    """Dynamo's suppress_errors=True swallows a backend's compile error and runs the frame
    eagerly; under strict the error is raised when the graph runs instead."""
    from fxopt.compiler import StrictCompileError

    options, passes, message = {"strict": True}, (BROKEN,), "deliberate failure"
    if failure == "inductor":
        monkeypatch.setattr(fxopt._compat, "inductor_compile", _broken_inductor)
        options, passes, message = {"strict": True, "codegen": "inductor"}, (), "no lowering"
    compiled = torch.compile(MLP(), backend=fxopt.backend(**options))
    with extra_passes(*passes), torch._dynamo.config.patch(suppress_errors=True), \
            pytest.raises(StrictCompileError, match=message) as info:
        compiled(torch.randn(3, 13))
    assert "strict=True" in str(info.value) and "suppress_errors" in str(info.value)


def test_without_strict_suppress_errors_still_warns_the_fallback():
    compiled = torch.compile(MLP(), backend=fxopt.backend())
    with extra_passes(BROKEN), torch._dynamo.config.patch(suppress_errors=True), \
            pytest.warns(UserWarning, match="runs without broken"):
        out = compiled(torch.randn(3, 13))
    assert out.shape == (3, 5)
