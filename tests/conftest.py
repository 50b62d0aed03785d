"""Shared fixtures: a clean Dynamo state per test, no silent fallback to eager, and the
`gpu` marker's skip."""

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


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
