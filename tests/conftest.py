"""Shared fixtures: a clean Dynamo state per test, a pass made unavailable, and the `gpu`
marker's skip."""

import dataclasses

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


@pytest.fixture
def unavailable_pass():
    """The name of a pass that is listed but not built. Every pass is built today, so this
    makes one unavailable (``run=None``) for the test, to check that its flag is still
    reported rather than ignored."""
    from fxopt.passes import PIPELINE

    index = next(i for i, s in enumerate(PIPELINE) if s.name == "offload_optimizer")
    original = PIPELINE[index]
    PIPELINE[index] = dataclasses.replace(original, run=None)
    yield original.name
    PIPELINE[index] = original


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
