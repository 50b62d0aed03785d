"""The way of a host-updated parameter's gradient to the host: :class:`HostParam` (the
parameter's host side) and :class:`GradientCopies` (when each gradient is copied).

A gradient is copied into its parameter's staging buffer (on a side stream on CUDA, at once
on a CPU device):

- where the compiled backward produces it, announced by the ``offload_optimizer`` pass's
  ``fxopt::grad_ready`` call (:mod:`fxopt.optim.grad_ready`), so the copy overlaps the rest
  of that graph's backward: a compiled graph hands its gradients to autograd only at its
  end;
- else when autograd has accumulated it (``register_post_accumulate_grad_hook``). The hook
  first checks that the ``.grad`` it accumulated is the tensor announced (autograd took it),
  and copies where it is not: a gradient added into an existing ``.grad`` (micro-batch
  accumulation, ``zero_grad(set_to_none=False)``), one autograd copied or summed from two
  graphs' contributions (a parameter both sides of a graph break use; its announcements
  are then no longer copied), a model the pass never saw. A graph compiled after the
  optimizer was built (a new batch size) is listened to at its first call;
- again at ``step()`` where it changed since (gradient clipping scales in place, which the
  version counter shows).

Neither the hooks nor the listeners hold the :class:`GradientCopies` (or anything holding
the parameters): a parameter keeps its hooks in C++, out of the cycle collector's sight
(see :mod:`fxopt.optim.worker`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fxopt import _compat
from fxopt.optim.grad_ready import listen, watch_new_graphs

__all__ = ["GradientCopies", "HostParam"]


@dataclass
class HostParam:
    """A "cpu" parameter's host side: fp32 master (``.grad`` is the fp32 gradient) and a
    pinned buffer in the parameter's dtype (gradient in, downcast parameter out)."""

    param: torch.Tensor
    master: torch.Tensor
    staging: torch.Tensor
    fresh_grad: Any = None        # the device gradient the staging buffer holds a copy of
    fresh_version: int = -1
    # where the gradient copied at its grad_ready call lives (_layout), until autograd's
    # hook checks that it is the gradient it accumulated; never the tensor itself, whose
    # extra reference would make autograd copy it instead of taking it as .grad
    announced: tuple[Any, ...] | None = None
    # False once autograd accumulated another tensor than the one announced (a parameter
    # two graphs use: autograd sums their contributions): its announcements are not copied
    copy_announced: bool = True
    # (version, data_ptr) of the parameter when it last agreed with ``master``; None: check
    synced: tuple[int, int] | None = None


def _layout(grad: torch.Tensor) -> tuple[Any, ...]:
    """Where a gradient's data lives. Within one backward pass, equal for the tensor a
    ``grad_ready`` call saw and the ``.grad`` autograd made of it exactly when autograd
    took that tensor: a copy is a new allocation while the original is still alive, so its
    address differs (a new ``.grad`` object is made either way, so identity cannot tell)."""
    return (grad.device, grad.untyped_storage().data_ptr(), grad.storage_offset(),
            tuple(grad.shape), grad.stride(), grad.dtype)


class GradientCopies:
    """The gradient copies of the host parameters ``host`` (optimizer index -> its host
    side) on ``stream`` (None: a CPU device). ``find_sources()``: per index, the (graph id,
    input) pairs of its ``grad_ready`` calls, asked again when a graph's first call comes
    (a graph compiled later). ``handles``: the hooks', listeners' and watcher's handles,
    which :func:`fxopt.optim.worker.release` removes."""

    def __init__(self, host: Mapping[int, HostParam], stream: Any,
                 find_sources: Callable[[], Mapping[int, Sequence[tuple[int, int]]]] | None
                 ) -> None:
        self._host, self._stream = host, stream
        self._forget_queued = False
        self._find_sources = find_sources
        self._listened: set[tuple[int, int]] = set()
        self.handles: list[Any] = [
            hp.param.register_post_accumulate_grad_hook(_weakly(self.accumulated, i))
            for i, hp in host.items()]
        if find_sources is not None:
            self.listen_to_new_sources()
            self.handles.append(watch_new_graphs(_weakly(self.listen_to_new_sources)))

    def listen_to_new_sources(self) -> None:
        """Listen to each host parameter's announcements not listened to yet (a parameter
        has one per compiled graph that computes its gradient: Dynamo's recompiles for new
        shapes, or graphs on both sides of a graph break that both use it)."""
        sources = self._find_sources()
        for i in self._host:
            new = [key for key in sources.get(i, ()) if key not in self._listened]
            if new:
                self._listened.update(new)
                self.handles.append(listen(new, _weakly(self.announced, i)))

    def copy(self, hp: HostParam) -> None:
        """Copy ``hp``'s current ``.grad`` (if any) and remember which tensor it was."""
        grad = hp.param.grad
        if grad is None:
            return
        self.start(hp, grad)
        hp.fresh_grad, hp.fresh_version = grad, grad._version

    def start(self, hp: HostParam, grad: torch.Tensor) -> None:
        """Copy ``grad`` into ``hp``'s staging buffer: queued on the copy stream after
        everything queued so far on CUDA, at once on a CPU device."""
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream(grad.device))
            with torch.cuda.stream(self._stream):
                hp.staging.copy_(grad.detach(), non_blocking=True)
            grad.record_stream(self._stream)
        else:
            hp.staging.copy_(grad.detach())

    def refresh(self, host: Iterable[HostParam]) -> None:
        """Copy again a gradient that changed since it was copied (e.g. clipped in place),
        or that nothing copied; on the calling thread's stream."""
        for hp in host:
            grad = hp.param.grad
            if grad is not None and (hp.fresh_grad is not grad
                                     or hp.fresh_version != grad._version):
                self.copy(hp)

    def wait(self) -> None:
        """Block until every queued copy has landed in its staging buffer."""
        if self._stream is not None:
            self._stream.synchronize()

    def accumulated(self, index: int, param: torch.Tensor) -> None:
        hp = self._host[index]
        announced, hp.announced = hp.announced, None
        grad = param.grad
        if grad is not None and announced is not None and _layout(grad) == announced:
            hp.fresh_grad, hp.fresh_version = grad, grad._version  # already copying
            return
        if announced is not None:
            # autograd accumulated another tensor: two graphs' contributions summed (a
            # parameter both sides of a graph break use), or a copy; the next steps would
            # waste their copies the same way
            hp.copy_announced = False
        self.copy(hp)

    def announced(self, index: int, grad: torch.Tensor) -> None:
        hp = self._host[index]
        if hp.param.grad is not None or not hp.copy_announced:
            # autograd will add this into the existing .grad (the hook copies the sum), or
            # it accumulated another tensor than the announced one before
            hp.announced = None
            return
        self.start(hp, grad)
        if not self._forget_queued:
            # an announcement holds for this backward only: in a later one another tensor
            # may have the same address
            try:
                _compat.queue_backward_callback(self._forget_announced)
            except RuntimeError:  # run outside a backward pass: no hook will check it
                return
            self._forget_queued = True
        hp.announced = _layout(grad)

    def _forget_announced(self) -> None:
        self._forget_queued = False
        for hp in self._host.values():
            hp.announced = None


def _weakly(method: Callable[..., None], *first: Any) -> Callable[..., None]:
    """``method`` (bound) called with ``first`` and then the caller's arguments, holding its
    object weakly: a hook or a listener must not keep the copies (module doc); once they
    are gone the call does nothing."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> None:
        bound = ref()
        if bound is not None:
            bound(*first, *args)
    return call
