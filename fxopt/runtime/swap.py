"""The swap runtime: move a saved activation to host memory and bring it back, overlapped.

The ``swap_recompute`` pass puts three custom ops into the joint graph for each swapped
tensor ``x``; the partitioner then saves the host copy instead of ``x``:

- forward, after the last use of ``x``: ``h = fxopt::swap_offload(x)``: a host copy;
- backward, ``prefetch distance`` ahead of the first use:
  ``token = fxopt::swap_prefetch_start(h, device)`` starts the copy back;
- backward, just before the first use: ``x2 = fxopt::swap_prefetch_wait(token, h, device)``
  returns the device tensor, once its copy is done.

On CUDA the copies run on one dedicated copy stream, ordered against the compute stream by
events, so they overlap with compute; lifetimes are stream-ordered:

- offload: the copy stream waits for the compute stream (``x`` is written), copies into a
  pinned buffer, and ``x.record_stream(copy stream)`` keeps the caching allocator from
  reusing ``x``'s memory before the copy has read it, although the graph drops ``x`` at once;
- prefetch: the device buffer is allocated on the compute stream; the copy stream waits for
  the compute stream (the allocation is ordered after earlier frees), copies, and records an
  event; ``wait`` makes the compute stream wait for that event before anything reads the
  buffer, so its later free on the compute stream is ordered after the copy;
- with Inductor's code generation the offload is ``blocking``: Inductor reuses a dead
  buffer's memory for a later kernel inside its generated code, without the caching
  allocator, so ``record_stream`` cannot protect ``x``; the compute stream then waits for
  the copy (the prefetch still overlaps);
- host buffers come from :class:`HostBufferPool` and go back when the host tensor dies; the
  next step's offload into the same buffer is issued on the same copy stream, so it is
  ordered after the previous step's prefetch that read it. After the first step no pinned
  memory is allocated.

On a CPU device (where the pass only swaps when forced, to exercise this path) the same
ops copy synchronously into pooled pageable buffers: same graph, same semantics.

The device buffer between ``start`` and ``wait`` lives in a table keyed by the token (a
one-element int64 CPU tensor holding a slot number); the token's death clears the slot, so
a backward that never runs leaks nothing. The ops are registered with ``register_fake``,
so Dynamo, AOTAutograd, the partitioner and Inductor see ordinary nodes. They have no
autograd formula: the pass inserts them after AOTAutograd has built the backward.
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from dataclasses import dataclass

import torch

from fxopt.devices import indexed

__all__ = ["HostBufferPool", "SwapRuntime", "runtime"]

log = logging.getLogger(__name__)

_Key = tuple[tuple[int, ...], tuple[int, ...], torch.dtype, bool, str]


class HostBufferPool:
    """Host buffers by (shape, strides, dtype, pinned, source device), reused across steps.

    :meth:`acquire` hands out a tensor that shares a pooled buffer's storage; when that
    tensor dies the buffer returns to the free list. ``allocations`` counts buffers ever
    created (it stops growing after the first step of a fixed-shape training loop).
    """

    def __init__(self) -> None:
        self._free: dict[_Key, list[torch.Tensor]] = {}
        self._lock = threading.Lock()
        self.allocations = 0
        self.allocated_bytes = 0

    def acquire(self, like: torch.Tensor, *, pinned: bool) -> torch.Tensor:
        # keyed by the source device too: each device's copies run on its own stream, and
        # stream order is what makes reusing a buffer safe
        key: _Key = (tuple(like.shape), tuple(like.stride()), like.dtype, pinned,
                     str(like.device))
        with self._lock:
            free = self._free.setdefault(key, [])
            buffer = free.pop() if free else None
        if buffer is None:
            buffer = torch.empty_strided(like.shape, like.stride(), dtype=like.dtype,
                                         device="cpu", pin_memory=pinned)
            self.allocations += 1
            self.allocated_bytes += buffer.untyped_storage().nbytes()
            log.debug("fxopt swap: new host buffer %s (%d so far)", key, self.allocations)
        handed = torch.empty(0, dtype=like.dtype).set_(
            buffer.untyped_storage(), buffer.storage_offset(), buffer.shape, buffer.stride())
        weakref.finalize(handed, self._release, key, buffer)
        return handed

    def _release(self, key: _Key, buffer: torch.Tensor) -> None:
        with self._lock:
            self._free.setdefault(key, []).append(buffer)

    def clear(self) -> None:
        """Drop the free buffers (buffers in use return to the pool when they die)."""
        with self._lock:
            self._free.clear()


@dataclass
class _Pending:
    tensor: torch.Tensor
    event: torch.cuda.Event | None


class SwapRuntime:
    """The process's copy stream (one per CUDA device), host pool and in-flight prefetches."""

    def __init__(self) -> None:
        self.pool = HostBufferPool()
        self._streams: dict[int, torch.cuda.Stream] = {}
        self._pending: dict[int, _Pending] = {}
        self._slots = itertools.count()
        self.offloads = 0
        self.prefetches = 0

    def copy_stream(self, device: torch.device) -> torch.cuda.Stream:
        index = indexed(device).index
        if index not in self._streams:
            self._streams[index] = torch.cuda.Stream(device=index)
        return self._streams[index]

    def offload(self, x: torch.Tensor, blocking: bool) -> torch.Tensor:
        self.offloads += 1
        cuda = x.device.type == "cuda"
        host = self.pool.acquire(x, pinned=cuda)
        if not cuda:
            host.copy_(x)
            return host
        current = torch.cuda.current_stream(x.device)
        stream = self.copy_stream(x.device)
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            host.copy_(x, non_blocking=True)
        x.record_stream(stream)
        if blocking:
            current.wait_stream(stream)
        return host

    def prefetch_start(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        self.prefetches += 1
        out = torch.empty_strided(host.shape, host.stride(), dtype=host.dtype, device=device)
        event = None
        if device.type == "cuda":
            stream = self.copy_stream(device)
            stream.wait_stream(torch.cuda.current_stream(indexed(device)))
            with torch.cuda.stream(stream):
                out.copy_(host, non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
            out.record_stream(stream)  # freed unwaited (a backward that never ran): safe
        else:
            out.copy_(host)
        slot = next(self._slots)
        token = torch.tensor([slot], dtype=torch.int64)
        self._pending[slot] = _Pending(out, event)
        weakref.finalize(token, self._pending.pop, slot, None)
        return token

    def prefetch_wait(self, token: torch.Tensor) -> torch.Tensor:
        pending = self._pending.pop(int(token[0]), None)
        if pending is None:
            raise RuntimeError("fxopt: swap_prefetch_wait on a prefetch that was never "
                               "started or was already consumed")
        if pending.event is not None:
            torch.cuda.current_stream(pending.tensor.device).wait_event(pending.event)
        return pending.tensor

    @property
    def in_flight(self) -> int:
        return len(self._pending)


runtime = SwapRuntime()


@torch.library.custom_op("fxopt::swap_offload", mutates_args=())
def swap_offload(x: torch.Tensor, blocking: bool) -> torch.Tensor:
    """A host copy of ``x`` (pinned and asynchronous on CUDA; with ``blocking`` the compute
    stream waits for the copy before going on)."""
    return runtime.offload(x, blocking)


@swap_offload.register_fake
def _(x: torch.Tensor, blocking: bool) -> torch.Tensor:
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cpu")


@torch.library.custom_op("fxopt::swap_prefetch_start", mutates_args=())
def swap_prefetch_start(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Start copying ``host`` to ``device``; returns a token for :func:`swap_prefetch_wait`."""
    return runtime.prefetch_start(host, device)


@swap_prefetch_start.register_fake
def _(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    return torch.empty(1, dtype=torch.int64, device="cpu")


@torch.library.custom_op("fxopt::swap_prefetch_wait", mutates_args=())
def swap_prefetch_wait(token: torch.Tensor, host: torch.Tensor,
                       device: torch.device) -> torch.Tensor:
    """The device tensor of a started prefetch, usable on the current stream."""
    return runtime.prefetch_wait(token)


@swap_prefetch_wait.register_fake
def _(token: torch.Tensor, host: torch.Tensor, device: torch.device) -> torch.Tensor:
    return torch.empty_strided(host.shape, host.stride(), dtype=host.dtype, device=device)
