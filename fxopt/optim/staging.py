"""Deep Optimizer States' staged device updates: host-resident state updated on the device.

A "staged" subgroup (:mod:`fxopt.optim.model`) keeps its optimizer state in host memory
(pinned on CUDA) between steps and updates on the device with the kernel a "gpu" subgroup
uses: the internal optimizer is the user's class and settings over the parameters
themselves, so the update is the plain optimizer's, bit for bit where the same kernel runs
on the same device. Per step and staged subgroup, in plan order, :meth:`Staging.update`:

1. copies the subgroup's state host->device into one of the staging buffers (on the upload
   stream, once that buffer's last write-back is done), as views laid out in the buffer;
2. points the internal optimizer's state at those views and steps it (on the current
   stream, after the copy);
3. copies the views device->host (on the write-back stream, after the update) and points
   the state back at the host tensors.

Two buffers alternate, so on CUDA subgroup k+1's copy in and k-1's write-back overlap k's
update; the host thread only queues work. The parameters and gradients never leave the
device. On a CPU device the same steps run one after another (CPU-to-CPU copies), which is
how the tests exercise the path.

Which state is staged: every tensor the internal optimizer keeps on the parameter's device
(Adam's moments; its ``step`` where torch keeps it there: fused, capturable, a CPU device).
What torch keeps on the host anyway (an unfused CUDA Adam's ``step``) stays where it is.
State is created or loaded where torch puts it, on the device (the first update of a
parameter, ``load_state_dict``), and :meth:`Staging.settle` moves it to the host right
after, one subgroup at a time: the first step and a load hold up to one subgroup's state
on the device beyond the buffers; every later step holds exactly the buffers.

Each buffer is one flat byte tensor as large as the largest staged subgroup's state (the
plan's ``staging_bytes``, counted in its ``gpu_state_bytes``); views are laid out with the
widest dtypes first, so every view is aligned to its own itemsize without padding and the
bytes are exactly the state's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from fxopt.devices import indexed

__all__ = ["Staging"]


def _view(buffer: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """A view of ``like``'s dtype, shape and strides at byte ``offset`` of ``buffer``."""
    nbytes = like.numel() * like.element_size()
    return buffer.narrow(0, offset, nbytes).view(like.dtype).as_strided(like.shape,
                                                                         like.stride())


class Staging:
    """The staging buffers and copy streams of one offloaded optimizer's staged subgroups.

    ``buffer_bytes``: each buffer's size; ``count``: how many (two, one for a single staged
    subgroup); ``pin``: whether host copies are pinned (CUDA)."""

    def __init__(self, device: torch.device, buffer_bytes: int, count: int, pin: bool) -> None:
        self.buffers = [torch.empty(buffer_bytes, dtype=torch.uint8, device=device)
                        for _ in range(count)]
        self._pin = pin
        cuda = device.type == "cuda"
        # (host->device, device->host)
        self._streams = ((torch.cuda.Stream(indexed(device)), torch.cuda.Stream(indexed(device)))
                         if cuda else None)
        for buffer in self.buffers if cuda else ():
            for stream in self._streams:  # the allocator keeps them until these are done
                buffer.record_stream(stream)
        self._free: list[Any] = [None] * count  # CUDA event: the buffer's last write-back

    @contextmanager
    def _on(self, which: int, after: Any) -> Iterator[None]:
        """Run the block on copy stream ``which`` (0: in, 1: back) after event ``after``."""
        if self._streams is None:
            yield
            return
        stream = self._streams[which]
        if after is not None:
            stream.wait_event(after)
        with torch.cuda.stream(stream):
            yield

    @torch.no_grad()
    def update(self, sg: Any, position: int) -> None:
        """Stage, update and write back subgroup ``sg`` (a runtime ``_Subgroup``), the
        ``position``-th staged subgroup of this step (which buffer it uses)."""
        which = position % len(self.buffers)
        buffer = self.buffers[which]
        entries = []  # (state dict, key, host tensor), widest dtypes first
        for tensor, keys in zip(sg.tensors, sg.parked):
            state = sg.optimizer.state.get(tensor, {})
            entries += [(state, key, state[key]) for key in sorted(keys)]
        entries.sort(key=lambda e: -e[2].element_size())  # stable
        needed = sum(host.numel() * host.element_size() for _, _, host in entries)
        if needed > buffer.numel():
            raise RuntimeError(
                f"fxopt.optim: a staged subgroup's state ({needed} bytes) exceeds its staging "
                f"buffer ({buffer.numel()} bytes): the plan's states_per_param or "
                f"counter_bytes do not describe this optimizer")
        staged, offset = [], 0
        with self._on(0, self._free[which]):
            for state, key, host in entries:
                view = _view(buffer, offset, host)
                offset += host.numel() * host.element_size()
                view.copy_(host, non_blocking=True)
                state[key] = view
                staged.append((state, key, view, host))
            uploaded = self._record()
        if uploaded is not None:
            torch.cuda.current_stream(buffer.device).wait_event(uploaded)
        sg.optimizer.step()
        with self._on(1, self._record()):
            for state, key, view, host in staged:
                current = state[key]  # the view, unless the optimizer replaced it
                host.copy_(current, non_blocking=True)
                if current is not view and self._streams is not None:
                    current.record_stream(self._streams[1])
                state[key] = host
            self.settle(sg)  # state the update created (a parameter's first), to the host
            self._free[which] = self._record()

    def _record(self) -> Any:
        """A CUDA event at the end of the current stream; None on a CPU device."""
        if self._streams is None:
            return None
        return torch.cuda.current_stream(self.buffers[0].device).record_event()

    @torch.no_grad()
    def settle(self, sg: Any, reset: bool = False) -> None:
        """Move the state ``sg``'s optimizer keeps on the parameters' device, and that is
        not staged yet, to the host (``reset``: all of it, after ``load_state_dict``
        replaced it). Copies run on the current stream, so, outside :meth:`update`, wait
        with :meth:`wait` (``load_state_dict`` does)."""
        if reset:
            sg.parked = [set() for _ in sg.tensors]
        for tensor, keys in zip(sg.tensors, sg.parked):
            state = sg.optimizer.state.get(tensor, {})
            for key, value in state.items():
                if (key in keys or not isinstance(value, torch.Tensor)
                        or value.device != tensor.device):
                    continue
                if value.device.type == "cpu" and not self._pin:
                    host = value  # already host memory: adopted as it is
                else:
                    host = torch.empty_like(value, device="cpu", pin_memory=self._pin)
                    host.copy_(value, non_blocking=True)
                    if self._streams is not None:
                        value.record_stream(torch.cuda.current_stream(value.device))
                state[key] = host
                keys.add(key)

    def wait(self) -> None:
        """Block until every write-back (and copy to the host) queued so far is done, so
        the host state is current."""
        if self._streams is None:
            return
        for stream in self._streams:
            stream.synchronize()
        torch.cuda.current_stream(self.buffers[0].device).synchronize()
