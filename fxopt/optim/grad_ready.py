"""Gradients announced where a compiled backward produces them, not where it returns them.

A compiled graph's backward is one autograd node: every gradient it computes reaches
autograd (``AccumulateGrad``, then ``register_post_accumulate_grad_hook``) only when the
whole graph has run. An offloaded optimizer that copies gradients to the host from those
hooks therefore copies after the graph's backward instead of during it: the overlap
torchao's ``CPUOffloadOptimizer`` loses when the model is compiled whole (issue 30.3).

So the ``offload_optimizer`` pass puts ``fxopt::grad_ready(grad, graph, input)`` into the
backward graph right after the node that produces the gradient of forward input ``input``
of compiled graph ``graph``. At run time the op calls the listener registered for that
(graph, input), if any (:func:`listen`); without one it does nothing. A graph's first call
tells the watchers first (:func:`watch_new_graphs`), so a graph compiled later than its
listeners were set up can still be listened to. The offloaded optimizer listens for its
host-updated parameters and starts each gradient's copy to the host there, on its copy
stream (:mod:`fxopt.optim.host_grads`).

The schema says the op mutates ``grad``, though it only reads it: a mutating op is kept by
every dead-code elimination (fx's, AOTAutograd's, Inductor's) in every supported torch,
and orders after the gradient's last write, where an op with no outputs and no declared
effect would be dropped. The listener must not keep the tensor (a reference held past the
graph would make ``AccumulateGrad`` copy the gradient instead of taking it).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable

import torch

__all__ = ["GRAD_READY", "Registration", "grad_ready", "listen", "new_graph_id",
           "watch_new_graphs"]

_graph_ids = itertools.count()
_listeners: dict[tuple[int, int], Callable[[torch.Tensor], None]] = {}
_watchers: list[Callable[[], None]] = []
_seen_graphs: set[int] = set()
_lock = threading.Lock()


def new_graph_id() -> int:
    """A number naming one compiled backward graph for its ``grad_ready`` calls."""
    return next(_graph_ids)


@torch.library.custom_op("fxopt::grad_ready", mutates_args=("grad",))
def grad_ready(grad: torch.Tensor, graph: int, input: int) -> None:
    """Call the listener of (``graph``, ``input``) with ``grad``, if one is registered; the
    first call of a graph first tells the watchers (:func:`watch_new_graphs`)."""
    if graph not in _seen_graphs:
        with _lock:
            _seen_graphs.add(graph)
            watchers = list(_watchers)
        for watcher in watchers:
            watcher()
    listener = _listeners.get((graph, input))
    if listener is not None:
        listener(grad)


@grad_ready.register_fake
def _grad_ready_fake(grad: torch.Tensor, graph: int, input: int) -> None:
    return None


GRAD_READY = torch.ops.fxopt.grad_ready.default


class Registration:
    """The handle of :func:`listen` and :func:`watch_new_graphs`: ``remove()`` unregisters
    (idempotent), as a hook's handle does."""

    def __init__(self, undo: Callable[[], None]) -> None:
        self._undo: Callable[[], None] | None = undo

    def remove(self) -> None:
        undo, self._undo = self._undo, None
        if undo is not None:
            with _lock:
                undo()


def watch_new_graphs(watcher: Callable[[], None]) -> Registration:
    """Call ``watcher()`` when a graph's first ``grad_ready`` call comes, before its
    listener is looked up: a graph compiled after its gradients' listeners were set up
    (Dynamo's recompile for a new shape) can be listened to there."""
    with _lock:
        _watchers.append(watcher)
    return Registration(lambda: _watchers.remove(watcher))


def listen(sources: Iterable[tuple[int, int]],
           callback: Callable[[torch.Tensor], None]) -> Registration:
    """Call ``callback(grad)`` whenever a compiled backward produces the gradient of one of
    ``sources`` ((graph id, forward input position) pairs). A source has one listener: a
    later ``listen`` for it replaces the earlier (the newest optimizer wrapping a
    parameter is the one that steps it)."""
    keys = list(sources)
    with _lock:
        for key in keys:
            _listeners[key] = callback

    def undo() -> None:
        for key in keys:
            if _listeners.get(key) is callback:  # not a later listener's
                del _listeners[key]
    return Registration(undo)
