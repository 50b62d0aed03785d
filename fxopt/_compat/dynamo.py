"""Dynamo's side of the adapter (:mod:`fxopt._compat`): what fxopt reads from Dynamo and
sets on it. Its protocol exceptions, graph-break counters and configuration (errors
suppressed, RNNs traced, logging functions ignored), the frame being compiled, the values
and sources it traced a graph's inputs with, its fake mode and a tracing context to compile
a graph again in. Re-exported by :mod:`fxopt._compat`, where callers find it; split from it
at 600 lines."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch.fx as fx

__all__ = [
    "dynamo_allow_rnn", "dynamo_frame_id", "dynamo_ignoring_functions",
    "dynamo_input_sources", "dynamo_reset",
    "dynamo_suppresses_errors", "dynamo_traces_rnn", "fake_mode_of", "graph_break_counts",
    "is_dynamo_protocol_error", "tracing_again",
]


def is_dynamo_protocol_error(exc: BaseException) -> bool:
    """Dynamo raises some exceptions through a backend on purpose (restart the analysis,
    skip the frame, unsupported construct); they are its to handle, never a reason for
    fxopt to fall back."""
    from torch._dynamo.exc import TorchDynamoException

    return isinstance(exc, TorchDynamoException)


def graph_break_counts() -> dict[str, int]:
    """Dynamo's graph-break reasons seen so far in this process, with counts."""
    from torch._dynamo.utils import counters

    return dict(counters["graph_break"])


def dynamo_suppresses_errors() -> bool:
    """Whether Dynamo swallows a backend's compile error and runs the frame eagerly
    (``torch._dynamo.config.suppress_errors``, which some users and libraries set)."""
    import torch._dynamo.config as dynamo_config

    return bool(dynamo_config.suppress_errors)


def dynamo_traces_rnn() -> bool:
    """Whether Dynamo traces ``nn.RNN``/``nn.LSTM``/``nn.GRU`` into its graph
    (``torch._dynamo.config.allow_rnn``); otherwise it breaks the graph at them."""
    import torch._dynamo.config as dynamo_config

    return bool(dynamo_config.allow_rnn)


def fake_mode_of(values: Sequence[Any]) -> Any:
    """The FakeTensorMode that made these values (None if none is fake)."""
    from torch._guards import detect_fake_mode

    return detect_fake_mode(list(values))


def dynamo_frame_id() -> int | None:
    """The Dynamo frame whose graph is being compiled now (``torch._guards.CompileId``'s
    ``frame_id``: a recompilation of the same code, for new guards or shapes, keeps it;
    the resume functions after a graph break get their own); None outside a compile."""
    from torch._guards import CompileContext

    compile_id = CompileContext.current_compile_id()
    return None if compile_id is None else compile_id.frame_id


def dynamo_input_sources(gm: fx.GraphModule) -> list[str | None]:
    """Per placeholder of a Dynamo graph, the user's value it stands for as Dynamo names it
    (``L['kwargs']['input_ids'].size()[1]`` for a size symbol), or None where unknown.
    torch 2.13's ``Source.name`` is a property, earlier releases' a method."""
    names: list[str | None] = []
    for placeholder in gm.graph.find_nodes(op="placeholder"):
        source = getattr(placeholder.meta.get("grapharg"), "source", None)
        name = getattr(source, "name", None)
        names.append((name() if callable(name) else name) if name is not None else None)
    return names


def tracing_again(example_values: Sequence[Any]) -> Any:
    """The context in which a Dynamo graph is compiled again after Dynamo's own compile of
    it returned, on the values Dynamo traced its inputs with (each placeholder's
    ``example_value``): a fresh tracing context with Dynamo's
    fake mode, as Dynamo gave the first compile, so that AOTAutograd traces the same
    symbols (on the call's real inputs it would specialize every size, and an int size
    input would reach the joint graph as a placeholder with no value)."""
    from torch._guards import TracingContext, tracing

    return tracing(TracingContext(fake_mode_of(example_values)))


def dynamo_reset() -> None:
    """Forget every compiled frame and Dynamo's caches (between two benchmark
    configurations)."""
    import torch._dynamo

    torch._dynamo.reset()


def dynamo_ignoring_functions(functions: set[Callable[..., Any]]) -> Any:
    """A context (and decorator) in which Dynamo treats ``functions`` (logging calls) as
    no-ops instead of breaking the graph at them, beside those already ignored. The option
    is ``ignore_logging_functions`` (torch 2.11's name), ``ignore_logger_methods`` before."""
    import torch._dynamo.config as dynamo_config

    name = "ignore_logging_functions" if hasattr(dynamo_config, "ignore_logging_functions") \
        else "ignore_logger_methods"
    return dynamo_config.patch(name, set(getattr(dynamo_config, name)) | set(functions))


def dynamo_allow_rnn() -> Any:
    """A context in which Dynamo traces ``nn.LSTM``/``nn.GRU`` (for fuse_rnn)."""
    import torch._dynamo

    return torch._dynamo.config.patch(allow_rnn=True)
