"""Shared fixtures: a clean Dynamo state per test, no silent fallback to eager, fx code
generation where the default would take Inductor on the CPU, and the `gpu` marker's skip."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch: no cache hits or recompile limits from earlier tests."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _no_silent_fallback(request):
    """A fallback to eager would make an equality test pass without testing fxopt: every
    test fails on one unless it expects it (and says so with pytest.warns)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=r"fxopt: graph \S+ runs uncompiled")
        warnings.filterwarnings("error", message=r"fxopt: graph \S+ runs without Inductor")
        yield


@pytest.fixture(autouse=True)
def _fx_where_the_default_takes_inductor_on_the_cpu(request, monkeypatch):
    """codegen="auto" takes Inductor on the CPU (fxopt/codegen.py), whose compile takes
    10-60 s here against fx's 1-5: a test that leaves codegen unset compiles with fx code
    generation, so the suite stays within its time. A test of the default as users get it
    is marked ``default_codegen``; one that names a code generator gets it."""
    if request.node.get_closest_marker("default_codegen"):
        return
    import fxopt.compiler
    from fxopt.codegen import INDUCTOR, Codegen

    resolve = fxopt.compiler.resolve_codegen

    def fx_on_the_cpu(options, device):
        chosen = resolve(options, device)
        if (chosen == INDUCTOR and options.codegen == "auto" and device.type == "cpu"
                and options.memory_budget is None and not options.inductor_max_autotune):
            return Codegen("fx", "auto, pinned to fx on the CPU by tests/conftest.py")
        return chosen

    monkeypatch.setattr(fxopt.compiler, "resolve_codegen", fx_on_the_cpu)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
