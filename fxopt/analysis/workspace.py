"""Temporaries an op allocates and frees inside one call (its workspace), and bytes it keeps
past its return outside its outputs (what it holds for its backward), for the memory model.

The liveness simulation (:mod:`fxopt.analysis.memory`) sees a graph's values: each node's
outputs, and when they die. fxopt's own ops (tempo's and fuse_rnn's custom ops) run as one
dispatcher call whose implementation may allocate temporaries that die before it returns;
the step's measured peak includes them, the simulation did not. tempo's CPU GELU, for one,
at BERT's benchmark-suite size (4x128x1024): the forward's mask before packing (1.4 MiB
above its outputs), the backward's unpacked mask and chunked temporaries (3.1 MiB above its
2 MiB output); unseen, BERT's joint plans with tempo's GELU measured 2.6-3.4% over their
budget.

How: measured, not written down op by op (their implementations change, and a formula per
op would drift from them). Once per signature (op, shapes, strides, dtypes, device, other
arguments) the op runs on tensors of its node's shapes (normal values for floating point,
zeros otherwise; the RNG state restored afterwards, so planning never moves the user's
random stream) under a :class:`~fxopt.analysis.measure.LiveStorageTracker` that also sees
the ops run inside it (:func:`fxopt._compat.call_kernel`), with any active dispatch mode
suspended (planning runs inside Dynamo's fake mode). The workspace is the peak during
the call above the bytes live before it and the outputs it returns; the second of two calls
is measured, so a cache the op fills on its first call is not counted. Cost: a few
milliseconds per signature (six in a transformer with every tempo site), cached for the
process.

Held bytes: ``fxopt::library_rnn`` keeps the library's autograd graph (its copy of the
sequence, cuDNN's reserve space or oneDNN's workspace and saved states) in a table until its
backward op runs, out of the graph's sight but for the small handle it returns. The same
measurement counts what is still live when the op has returned, beyond its outputs (the
ops of :data:`HOLDING_OPS`); the simulation gives those bytes to the handle, which the
graph saves for the backward op, where the table lets them go.

Measured: the ops of :data:`MEASURED_OPS`, pure functions of their inputs. aten and prims
ops are not (their CPU kernels allocate their outputs only, except a few workspaces of
matmuls and convolutions, which the allocator hands out outside the dispatcher and which
no dispatch mode sees); swap's ops have side effects and are never run here.
"""

from __future__ import annotations

import functools
import logging
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from fxopt import _compat
from fxopt.analysis.measure import LiveStorageTracker
from fxopt.analysis.shapes import size_hint

__all__ = ["HOLDING_OPS", "MEASURED_OPS", "held_bytes", "workspace_bytes"]

log = logging.getLogger(__name__)

MEASURED_OPS = frozenset({
    "fxopt::tempo_gelu", "fxopt::tempo_gelu_backward",
    "fxopt::tempo_layer_norm", "fxopt::tempo_layer_norm_backward",
    "fxopt::tempo_layer_norm_cast",
    "fxopt::tempo_rms_norm", "fxopt::tempo_rms_norm_backward", "fxopt::tempo_rms_norm_cast",
    "fxopt::tempo_softmax_dropout_matmul", "fxopt::tempo_softmax_dropout_matmul_backward",
    "fxopt::lstm_cell", "fxopt::lstm_cell_backward",
    "fxopt::gru_cell", "fxopt::gru_cell_backward",
    "fxopt::lstm_sequence", "fxopt::lstm_sequence_backward",
    "fxopt::gru_sequence", "fxopt::gru_sequence_backward",
    "fxopt::linear_cross_entropy", "fxopt::linear_cross_entropy_backward",
    "fxopt::linear_cross_entropy_with_grads", "fxopt::library_rnn"})

# Ops that keep bytes for their backward outside their outputs (module doc); their handle
# is their last output.
HOLDING_OPS = frozenset({"fxopt::library_rnn"})


def workspace_bytes(node: fx.Node, args: tuple[Any, ...] | None = None) -> int:
    """The bytes ``node``'s op holds inside its call beyond its outputs (0 for an op not in
    :data:`MEASURED_OPS`, or one whose arguments are not all known); ``args``: its
    arguments instead of the node's (a candidate's, same shapes: a pass choosing one of its
    op's settings by the step's peak)."""
    return _measured_for(node, args).workspace


def held_bytes(node: fx.Node) -> int:
    """The bytes ``node``'s op keeps past its return for its backward, beyond its outputs
    (0 for an op not in :data:`HOLDING_OPS`, or one whose arguments are not all known)."""
    if node.op != "call_function" or not _compat.is_op_overload(node.target) \
            or node.target.name() not in HOLDING_OPS:
        return 0
    return _measured_for(node).held


@dataclass(frozen=True)
class _Measured:
    workspace: int = 0   # peak inside the call above its inputs and outputs
    held: int = 0        # still live once it returned, beyond its outputs


def _measured_for(node: fx.Node, args: tuple[Any, ...] | None = None) -> _Measured:
    if node.op != "call_function" or not _compat.is_op_overload(node.target) \
            or node.target.name() not in MEASURED_OPS:
        return _Measured()
    try:
        args = _spec(node.args if args is None else args)
        kwargs = tuple(sorted((k, _spec(v)) for k, v in node.kwargs.items()))
    except _Unknown as unknown:
        log.debug("workspace of %s not measured: %s has no value", node.name, unknown)
        return _Measured()
    return _measured(node.target, args, kwargs)


@functools.cache
def _measured(op: Any, args_spec: tuple, kwargs_spec: tuple) -> _Measured:
    """The workspace and held bytes of one signature (cached); a measurement that fails (an
    op that cannot run on this machine's tensors) warns once and counts none."""
    try:
        with _compat.modes_suspended():  # planning may run inside Dynamo's fake mode
            return _measure(op, args_spec, kwargs_spec)
    except Exception as error:  # noqa: BLE001 (any failure of a user-visible op: warned)
        warnings.warn(f"fxopt: the memory model could not measure {op}'s workspace "
                      f"({type(error).__name__}: {error}); predicted peaks leave it out",
                      stacklevel=2)
        return _Measured()


class _Unknown(Exception):
    """An argument the measurement cannot rebuild (a graph value without a meta value)."""


@dataclass(frozen=True)
class _TensorSpec:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: str

    def build(self) -> torch.Tensor:
        """A tensor of this layout with values in it; an expanded one (a stride of 0, as a
        zero gradient autograd broadcasts) is a view of its filled storage, which cannot
        be filled through the view itself."""
        span = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride)) \
            if all(self.shape) else 0
        storage = torch.empty(span, dtype=self.dtype, device=self.device)
        storage = storage.normal_() if storage.is_floating_point() else storage.zero_()
        return storage.as_strided(self.shape, self.stride)


def _spec(value: Any) -> Any:
    """A hashable stand-in for an argument: a tensor's layout, or the value itself."""
    if isinstance(value, fx.Node):
        val = value.meta.get("val")
        if isinstance(val, torch.Tensor):
            return _TensorSpec(tuple(size_hint(s) for s in val.shape),
                               tuple(size_hint(s) for s in val.stride()), val.dtype,
                               str(val.device))
        if isinstance(val, (int, float, bool, torch.SymInt)):
            return size_hint(val) if isinstance(val, torch.SymInt) else val
        raise _Unknown(value.name)
    if isinstance(value, (list, tuple)):
        return tuple(_spec(v) for v in value)
    return value


def _build(spec: Any) -> Any:
    if isinstance(spec, _TensorSpec):
        return spec.build()
    if isinstance(spec, tuple):
        return [_build(s) for s in spec]
    return spec


def _tensor_specs(spec: Any) -> list[_TensorSpec]:
    if isinstance(spec, _TensorSpec):
        return [spec]
    if isinstance(spec, tuple):
        return [t for s in spec for t in _tensor_specs(s)]
    return []


def _measure(op: Any, args_spec: tuple, kwargs_spec: tuple) -> _Measured:
    tensors = _tensor_specs((args_spec, kwargs_spec))
    device = torch.device(tensors[0].device if tensors else "cpu")
    if device.type == "meta":
        return _Measured()
    args = _build(args_spec)
    kwargs = {k: _build(v) for k, v in kwargs_spec}
    inputs = [t for t in _compat.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    rng = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=rng), torch.no_grad():
        for _ in range(2):  # the second call: a cache the op fills on its first is not counted
            tracker = _InsideOps(inputs, device.type)
            with tracker:
                out = op(*args, **kwargs)
                outputs = sum(s.nbytes() for s in {id(s): s for s in _storages(out)}.values()
                              if id(s) not in tracker.input_ids)
                peak = tracker.peak_bytes - tracker.baseline_bytes
                live = tracker.current_bytes - tracker.baseline_bytes
            del out
    # a holding op's held bytes are live from its return on (on its handle): not counted
    # again as the call's own temporaries
    held = max(0, live - outputs) if op.name() in HOLDING_OPS else 0
    measured = _Measured(workspace=max(0, peak - outputs - held), held=held)
    log.debug("workspace of %s: %s", op, measured)
    return measured


def _storages(value: Any) -> list[torch.UntypedStorage]:
    return [t.untyped_storage() for t in _compat.tree_leaves(value)
            if isinstance(t, torch.Tensor)]


class _InsideOps(LiveStorageTracker):
    """A tracker that runs fxopt's own ops' kernels with itself still active, so the
    storages their implementations allocate are counted too."""

    def __init__(self, inputs: list[torch.Tensor], device_type: str) -> None:
        super().__init__(inputs)
        self.input_ids = {id(s) for s in _storages(inputs)}
        self._device_type = device_type

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if func.namespace != "fxopt":  # aten, prims, TorchScript's prim::device, ...
            return super().__torch_dispatch__(func, types, args, kwargs)
        with self:
            return _compat.call_kernel(func, self._device_type, args, kwargs or {})
