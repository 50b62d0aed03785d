"""The offloaded optimizer's lifecycle: its host-update thread and what it attached to the
parameters, released when the optimizer is closed or dropped.

An :class:`~fxopt.optim.runtime.OffloadedOptimizer` attaches a gradient hook to each
host-updated parameter and runs host updates on a thread. Neither may hold the optimizer:
a parameter keeps its hooks in C++ (autograd's metadata), where Python's cycle collector
cannot see them, so a hook closing over the optimizer (which holds the parameter) is a
cycle that is never collected: the model, its gradients and the optimizer's state stay
alive (on CUDA, the whole model's device memory) after the user dropped them. So the
hooks reach the optimizer through a weak reference, the thread only sees the tasks it is
given, and :func:`release` (run by ``close()``, the ``with`` block's end, or a
``weakref.finalize`` when the optimizer is collected) removes the hooks and stops the
thread.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["THREAD_PREFIX", "HostWorker", "release"]

# Every worker thread's name starts with this (then a per-optimizer number).
THREAD_PREFIX = "fxopt-offload"
_numbers = itertools.count()


class HostWorker:
    """One thread that runs host updates in submission order, started at the first
    :meth:`submit` (an optimizer never stepped has none). It keeps no reference to the
    optimizer: tasks are handed over per call and dropped once run."""

    def __init__(self) -> None:
        self.name = f"{THREAD_PREFIX}-{next(_numbers)}"
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._stopped = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        if self._stopped:
            raise RuntimeError("fxopt.optim: the offloaded optimizer's worker is stopped")
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, self.name)
        return self._executor.submit(fn, *args)

    def stop(self, wait: bool = True) -> None:
        """Stop the thread once its queued tasks are done (dropping those not started).
        ``wait``: join it, unless called from the thread itself."""
        self._stopped = True
        if self._executor is not None:
            # the executor names its thread "<name>_0"
            own = threading.current_thread().name.startswith(self.name + "_")
            self._executor.shutdown(wait=wait and not own, cancel_futures=True)
            self._executor = None


def release(hooks: list[Any], worker: HostWorker, wait: bool = False) -> None:
    """Remove the gradient hooks and stop the worker (idempotent). Holds no optimizer:
    ``weakref.finalize`` calls it with these two only."""
    for handle in hooks:
        handle.remove()
    hooks.clear()
    worker.stop(wait=wait)
