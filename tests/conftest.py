"""Shared fixtures: a clean Dynamo state and a seeded RNG per test, no silent fallback to
eager, fx code generation where the default would take Inductor on the CPU, and the `gpu`
marker's skip."""

import pytest
import torch

import fxopt.codegen


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch: no cache hits or recompile limits from earlier tests."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _seeded():
    """Each test draws the same random numbers whichever worker runs it, after whichever
    tests: a test that forgets to seed cannot pass or fail by the order of the suite."""
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _no_silent_fallback(request):
    """A fallback to eager would make an equality test pass without testing fxopt: every
    test fails on one unless it expects it (and says so with pytest.warns)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=r"fxopt: graph \S+ runs uncompiled")
        warnings.filterwarnings("error", message=r"fxopt: graph \S+ runs without Inductor")
        yield


# codegen="auto" takes Inductor on the CPU (fxopt/codegen.py), whose compile takes 10-60 s
# here against fx's 1-5: wherever a test leaves codegen unset it compiles with fx code
# generation, so the suite stays within its time, except under a fraction memory_budget
# without tempo, a saved plan or force_swap (Inductor's budgeted min-cut, which those tests
# are about).
# The pin sits in the one resolution, so every caller (compilation, `fxopt plan`'s capture,
# session-scoped fixtures built before any function fixture) sees it. A test of the default
# as users get it is marked ``default_codegen``; one that names a code generator gets it.
_PIN_FX_ON_THE_CPU = {"on": True}
_choose = fxopt.codegen._choose


def _fx_on_the_cpu(options, device):
    name, reason = _choose(options, device)
    budget = options.memory_budget
    # force_swap's fraction bounds the peak with fxopt's swap plan, not min-cut's bytes
    min_cut = (budget is not None and budget.fraction is not None and options.plan is None
               and options.tempo not in (True, "auto") and not options.force_swap)
    if (_PIN_FX_ON_THE_CPU["on"] and name == "inductor" and options.codegen == "auto"
            and device.type == "cpu" and not min_cut and not options.inductor_max_autotune):
        return "fx", "auto, pinned to fx on the CPU by tests/conftest.py"
    return name, reason


fxopt.codegen._choose = _fx_on_the_cpu


@pytest.fixture(autouse=True)
def _fx_where_the_default_takes_inductor_on_the_cpu(request):
    """Lifts the pin above for a test marked ``default_codegen``."""
    marked = request.node.get_closest_marker("default_codegen") is not None
    _PIN_FX_ON_THE_CPU["on"] = not marked
    yield
    _PIN_FX_ON_THE_CPU["on"] = True


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
