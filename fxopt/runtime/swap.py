"""The swap runtime: move a saved activation to host memory and bring it back, overlapped.

The ``swap_recompute`` pass puts four custom ops into the joint graph for each swapped
tensor ``x``; the partitioner then saves the host copy instead of ``x``:

- forward, after the last use of ``x``: ``token = fxopt::swap_offload_start(x)`` starts
  the copy to a host buffer;
- forward, once the compute the plan counts on to hide that copy has been issued:
  ``h = fxopt::swap_offload_finish(token, x, after)`` returns the host copy ``h``. It takes
  ``x``, so that ``x`` stays allocated until the copy has read it, and ``after`` (the last
  of those hiding nodes' tensors), so that no scheduler hoists it above them;
- backward, ``prefetch distance`` ahead of the first use:
  ``token = fxopt::swap_prefetch_start(h, device, after)`` starts the copy back;
- backward, just before the first use:
  ``x2 = fxopt::swap_prefetch_wait(token, h, device, after)`` returns the device tensor,
  once its copy is done.

Each ``after`` is the output of the node just before the call's place (or empty): the call
cannot run before it. Inductor's scheduler would otherwise hoist every call whose inputs
are ready, since nothing else orders it (checked on the CPU: every prefetch started and
waited for at the backward's first line, all swapped tensors back on the device at once).

On CUDA the copies run on one dedicated copy stream, ordered against the compute stream by
events, so they overlap with compute; lifetimes are stream-ordered, under fx code and
under Inductor's generated code alike (which reuses a dead buffer's memory for a later
kernel without the caching allocator, so ``record_stream`` could not protect ``x``):

- offload: the copy stream waits for the compute stream (``x`` is written), copies into a
  pinned buffer and records an event; ``finish`` makes the compute stream wait for that
  event, and ``x`` dies after ``finish``, so whatever reuses its memory is ordered after
  the copy;
- prefetch: the device buffer is allocated on the compute stream; the copy stream waits for
  the compute stream (the allocation is ordered after earlier frees), copies, and records an
  event; ``wait`` makes the compute stream wait for that event before anything reads the
  buffer, so its later free on the compute stream is ordered after the copy;
- host buffers come from :class:`HostBufferPool` and go back when the host tensor dies; the
  next step's offload into the same buffer is issued on the same copy stream, so it is
  ordered after the previous step's prefetch that read it. After the first step no pinned
  memory is allocated.

On a CPU device (where the pass only swaps when forced, to exercise this path) the same
ops copy synchronously into pooled pageable buffers: same graph, same semantics.

The buffer between a ``start`` and its ``finish`` or ``wait`` lives in a table keyed by the
token (a one-element int64 CPU tensor holding a slot number); the token's death clears the
slot, so a backward that never runs leaks nothing. The ops are registered with ``register_fake``,
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
    tensor: torch.Tensor                 # the copy's destination
    event: torch.cuda.Event | None       # recorded on the copy stream after the copy
    device: torch.device                 # whose compute stream waits for the event


class SwapRuntime:
    """The process's copy stream (one per CUDA device), host pool and copies in flight."""

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

    def _copy(self, destination: torch.Tensor, source: torch.Tensor,
              device: torch.device) -> torch.Tensor:
        """Copy ``source`` into ``destination`` (on ``device``'s copy stream after
        everything queued on its compute stream; at once on a CPU device); returns the
        token of the copy in flight."""
        event = None
        if device.type == "cuda":
            stream = self.copy_stream(device)
            stream.wait_stream(torch.cuda.current_stream(indexed(device)))
            with torch.cuda.stream(stream):
                destination.copy_(source, non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
        else:
            destination.copy_(source)
        slot = next(self._slots)
        token = torch.tensor([slot], dtype=torch.int64)
        self._pending[slot] = _Pending(destination, event, device)
        weakref.finalize(token, self._pending.pop, slot, None)
        return token

    def _take(self, token: torch.Tensor, what: str) -> torch.Tensor:
        """The destination of the copy of ``token``, once the compute stream waits for it."""
        pending = self._pending.pop(int(token[0]), None)
        if pending is None:
            raise RuntimeError(f"fxopt: {what} on a copy that was never started or was "
                               f"already consumed")
        if pending.event is not None:
            torch.cuda.current_stream(indexed(pending.device)).wait_event(pending.event)
        return pending.tensor

    def offload_start(self, x: torch.Tensor) -> torch.Tensor:
        self.offloads += 1
        host = self.pool.acquire(x, pinned=x.device.type == "cuda")
        return self._copy(host, x, x.device)

    def offload_finish(self, token: torch.Tensor) -> torch.Tensor:
        return self._take(token, "swap_offload_finish")

    def prefetch_start(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        self.prefetches += 1
        out = torch.empty_strided(host.shape, host.stride(), dtype=host.dtype, device=device)
        token = self._copy(out, host, device)
        if device.type == "cuda":
            out.record_stream(self.copy_stream(device))  # freed unwaited (no backward): safe
        return token

    def prefetch_wait(self, token: torch.Tensor) -> torch.Tensor:
        return self._take(token, "swap_prefetch_wait")

    @property
    def in_flight(self) -> int:
        return len(self._pending)


runtime = SwapRuntime()


@torch.library.custom_op("fxopt::swap_offload_start", mutates_args=())
def swap_offload_start(x: torch.Tensor) -> torch.Tensor:
    """Start copying ``x`` to a host buffer (pinned, on the copy stream on CUDA); returns a
    token for :func:`swap_offload_finish`."""
    return runtime.offload_start(x)


@swap_offload_start.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(1, dtype=torch.int64, device="cpu")


@torch.library.custom_op("fxopt::swap_offload_finish", mutates_args=())
def swap_offload_finish(token: torch.Tensor, x: torch.Tensor,
                        after: list[torch.Tensor]) -> torch.Tensor:
    """The host copy of a started offload of ``x``; the compute stream waits for the copy.
    ``x`` and ``after`` are read by nobody: they order the call (see the module doc)."""
    return runtime.offload_finish(token)


@swap_offload_finish.register_fake
def _(token: torch.Tensor, x: torch.Tensor, after: list[torch.Tensor]) -> torch.Tensor:
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cpu")


@torch.library.custom_op("fxopt::swap_prefetch_start", mutates_args=())
def swap_prefetch_start(host: torch.Tensor, device: torch.device,
                        after: list[torch.Tensor]) -> torch.Tensor:
    """Start copying ``host`` to ``device``; returns a token for :func:`swap_prefetch_wait`.
    ``after`` is read by nobody: it orders the call (see the module doc)."""
    return runtime.prefetch_start(host, device)


@swap_prefetch_start.register_fake
def _(host: torch.Tensor, device: torch.device, after: list[torch.Tensor]) -> torch.Tensor:
    return torch.empty(1, dtype=torch.int64, device="cpu")


@torch.library.custom_op("fxopt::swap_prefetch_wait", mutates_args=())
def swap_prefetch_wait(token: torch.Tensor, host: torch.Tensor, device: torch.device,
                       after: list[torch.Tensor]) -> torch.Tensor:
    """The device tensor of a started prefetch, usable on the current stream. ``after``
    is read by nobody: it orders the call (see the module doc)."""
    return runtime.prefetch_wait(token)


@swap_prefetch_wait.register_fake
def _(token: torch.Tensor, host: torch.Tensor, device: torch.device,
      after: list[torch.Tensor]) -> torch.Tensor:
    return torch.empty_strided(host.shape, host.stride(), dtype=host.dtype, device=device)
