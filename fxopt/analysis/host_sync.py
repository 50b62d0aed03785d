"""Host synchronisation inside a training step: calls that make the host wait for the device.

Reading device data on the host (``.item()``, ``.tolist()``, ``bool(t)``, ``nonzero`` and
other ops whose output shape depends on the data) blocks the host until every queued
kernel has run: it stops issuing work, and copies scheduled behind compute lose their
overlap. No graph fxopt produces and no runtime path it adds may do that during a step.

Two checks, both usable without a GPU:

- static, :func:`graph_syncs`: the nodes of an fx graph (Dynamo's, or the forward and
  backward graphs fxopt compiles) that call such an op;
- at run time, :class:`HostSyncRecorder`: a dispatch mode that records every such op
  while it is active, plus the Tensor methods that read data on the host (``item``,
  ``bool``, ``tolist``, ``nonzero``), each with the innermost frame outside torch that
  made the call. On the CPU
  nothing actually waits, but the calls are the same, so tests catch them here.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from fxopt._compat import TorchDispatchMode

__all__ = ["SYNC_OPS", "HostSync", "HostSyncRecorder", "graph_syncs"]

aten = torch.ops.aten

# aten ops that read device data on the host, or whose output shape depends on it
SYNC_OPS = frozenset({
    aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default,
    aten.nonzero.default, aten.masked_select.default, aten.equal.default,
    aten.repeat_interleave.Tensor, aten._unique2.default, aten.unique_dim.default,
    aten.unique_consecutive.default,
})
_SYNC_METHODS = frozenset({"item", "tolist", "nonzero", "__bool__", "numpy"})


@dataclass(frozen=True)
class HostSync:
    """One call that waits for the device: the op and where it was made."""

    op: str
    where: str

    def __str__(self) -> str:
        return f"{self.op} at {self.where}"


def graph_syncs(gm: fx.GraphModule) -> list[HostSync]:
    """The calls in ``gm``'s graph that synchronise with the host."""
    found = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in SYNC_OPS:
            found.append(HostSync(str(node.target), f"node {node.name}"))
        elif node.op == "call_method" and node.target in _SYNC_METHODS:
            found.append(HostSync(f"Tensor.{node.target}", f"node {node.name}"))
    return found


def _caller() -> str:
    """The innermost frame outside torch (and this module): who asked for the value."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = frame.filename.replace("\\", "/")
        if "/torch/" not in path and frame.filename != __file__:
            return f"{path}:{frame.lineno} ({frame.name})"
    return "inside torch"


# Tensor methods that read device data on the host, recorded at the Python level too: a
# dispatch mode does not see the ops that a custom op's Python implementation runs (the
# mode is off while it handles the custom op), and ``tolist`` dispatches no op at all.
_WRAPPED_METHODS = ("item", "__bool__", "tolist", "nonzero")


class HostSyncRecorder(TorchDispatchMode):
    """Records every host-synchronising call while active: ``with HostSyncRecorder() as r:``
    then ``r.calls``. ``device`` limits it to calls reading tensors on that device type
    (on a GPU run, "cuda": a CPU scalar's ``.item()`` waits for nothing).

    Higher-order operators (the RNG-state replay of a recomputed dropout,
    ``run_and_save_rng_state`` / ``run_with_rng_state``) pass through whole: their bodies
    are the random op they wrap, which reads nothing back to the host."""

    supports_higher_order_operators = True

    def __init__(self, device: str | None = None) -> None:
        super().__init__()
        self.device = device
        self.calls: list[HostSync] = []
        self._originals: dict[str, Any] = {}
        self._in_method = False

    def _reads_device(self, args: Any) -> bool:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        return self.device is None or any(t.device.type == self.device for t in tensors)

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Off while torch.compile traces, on while its compiled code runs: without this,
        Dynamo skips compiling under the mode and the step it records would be eager's."""
        return True

    def _record(self, op: str) -> None:
        self.calls.append(HostSync(op, _caller()))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._in_method:
            pass  # already recorded as the Tensor method that dispatched this op
        elif func in SYNC_OPS and self._reads_device(args):
            self._record(str(func))
        elif (func in (aten._to_copy.default, aten.copy_.default) and self.device
              and self.device != "cpu" and _blocking_copy_to_host(func, args, kwargs)):
            self._record(f"{func} to the host")
        return func(*args, **kwargs)

    def _wrap(self, name: str) -> Any:
        original = self._originals[name]

        def recorded(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if self._in_method or not self._reads_device([tensor]):
                return original(tensor, *args, **kwargs)
            self._record(f"Tensor.{name}")
            self._in_method = True
            try:
                return original(tensor, *args, **kwargs)
            finally:
                self._in_method = False
        return recorded

    def __enter__(self) -> HostSyncRecorder:
        for name in _WRAPPED_METHODS:
            self._originals[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._wrap(name))
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        for name, original in self._originals.items():
            setattr(torch.Tensor, name, original)
        super().__exit__(*exc)


def _blocking_copy_to_host(func: Any, args: Any, kwargs: dict[str, Any]) -> bool:
    if kwargs.get("non_blocking") or (func is aten.copy_.default and len(args) > 2 and args[2]):
        return False
    if func is aten.copy_.default:
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"
    target = kwargs.get("device")
    return target is not None and torch.device(target).type == "cpu" and (
        args[0].device.type != "cpu")
