"""Measured live tensor bytes on any device, the CPU included: ground truth for the
predictions of :mod:`fxopt.analysis.memory`.

:class:`LiveStorageTracker` is a ``TorchDispatchMode``: every op's output storage that is
not one of the op's input storages (so not a view or an in-place result) is a new
allocation; its bytes are added, and a ``weakref.finalize`` on the ``UntypedStorage``
subtracts them when it dies. This relies on storage PyObject preservation (checked on
torch 2.13):
``t.untyped_storage() is t.untyped_storage()``, and the Python object lives as long as the
C++ storage, so the finalizer fires exactly when the memory is freed. Kernel workspaces
and allocations made outside the dispatcher (or before the mode was entered) are not seen.

What to measure. Dynamo refuses to run compiled code while a dispatch mode is active (it
runs the function eagerly instead), so a compiled step cannot be measured directly. Two
things can be: (a) the eager training step, and (b) the captured forward and backward
graphs run on real tensors by :func:`run_step_graphs`, which frees values as fx's code and
AOTAutograd's runtime do (each value after its last use; saved values and tangents handed
to the backward in a list it clears). (b) measures what fxopt's fx code generation
executes; (a) checks that the graphs themselves match what eager autograd keeps.

Private torch APIs, through :mod:`fxopt._compat`: ``TorchDispatchMode`` (documented, but in a
private module), the pytree utilities.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from fxopt._compat import TorchDispatchMode, tree_leaves
from fxopt.analysis.shapes import size_hint

__all__ = ["LiveStorageTracker", "MeasuredMemory", "SavedBytes", "measure_peak_memory",
           "measure_saved_bytes", "run_graph", "run_step_graphs"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MeasuredMemory:
    peak_bytes: int       # includes baseline_bytes
    baseline_bytes: int   # distinct storages of the baseline tensors
    final_bytes: int      # live when fn returned (its result still held), with baseline
    allocations: int      # new storages seen


class LiveStorageTracker(TorchDispatchMode):
    """Counts the bytes of live storages created by ops run under it (see module doc)."""

    def __init__(self, baseline_tensors: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        # Strong references: the baseline must not die (and its ids be reused) meanwhile.
        self._baseline = {id(s): s for s in _storages(baseline_tensors)}
        self.baseline_bytes = sum(s.nbytes() for s in self._baseline.values())
        self.current_bytes = self.baseline_bytes
        self.peak_bytes = self.baseline_bytes
        self.allocations = 0
        self._live: dict[int, weakref.finalize] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {id(s) for s in _storages(tree_leaves((args, kwargs)))}
        for storage in _storages(tree_leaves(out)):
            key = id(storage)
            if key in inputs or key in self._live or key in self._baseline:
                continue
            size = storage.nbytes()
            self._live[key] = weakref.finalize(storage, self._freed, key, size)
            self.allocations += 1
            self.current_bytes += size
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        return out

    def _freed(self, key: int, size: int) -> None:
        self._live.pop(key, None)
        self.current_bytes -= size

    def __exit__(self, *exc: object) -> Any:
        # Storages still alive stay so; stop counting them against this tracker.
        for finalizer in self._live.values():
            finalizer.detach()
        self._live.clear()
        return super().__exit__(*exc)


def measure_peak_memory(fn: Callable[[], Any], *,
                        baseline_tensors: Iterable[torch.Tensor] = ()) -> MeasuredMemory:
    """Run ``fn()`` under a :class:`LiveStorageTracker`. Pass every tensor that exists
    before and matters (parameters, buffers, inputs) as ``baseline_tensors``: their
    distinct storages count as baseline, and ops on them (views, in-place) as nothing new."""
    tracker = LiveStorageTracker(baseline_tensors)
    with tracker:
        result = fn()
        final = tracker.current_bytes
    del result
    measured = MeasuredMemory(tracker.peak_bytes, tracker.baseline_bytes, final,
                              tracker.allocations)
    log.debug("measured: %s", measured)
    return measured


@dataclass(frozen=True)
class SavedBytes:
    bytes: int     # distinct storages autograd kept for backward, the excluded ones left out
    tensors: int   # saved tensors seen (several may share a storage)


def measure_saved_bytes(fn: Callable[[], Any], *, exclude: Iterable[torch.Tensor] = ()
                        ) -> SavedBytes:
    """The bytes autograd keeps for backward while ``fn`` runs its forward, measured with
    ``torch.autograd.graph.saved_tensors_hooks``: this works around a compiled call too
    (AOTAutograd saves through ``save_for_backward``), where a dispatch mode cannot look.
    Storages of ``exclude`` (parameters, caller-owned inputs) are not counted, matching
    ``MemoryEstimate.activation_bytes``. Returns what ``fn`` saved; its result is dropped."""
    kept = _storages(exclude)  # held here, so their ids stay theirs while we compare
    excluded = {id(s) for s in kept}
    saved: dict[int, torch.UntypedStorage] = {}
    count = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal count
        count += 1
        storage = t.untyped_storage()
        if id(storage) not in excluded:
            saved.setdefault(id(storage), storage)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return SavedBytes(bytes=sum(s.nbytes() for s in saved.values()), tensors=count)


def run_graph(gm: fx.GraphModule, args: list[Any]) -> list[Any]:
    """Run a graph on real values the way fx's boxed code does: ``args`` is cleared once
    the placeholders are bound, and every value is dropped right after its last use
    (``fx.Interpreter.boxed_run``). Autograd is off, as in AOTAutograd's runtime: the
    graphs are already differentiated, and recording them would keep every intermediate
    alive."""
    with torch.no_grad():
        return list(fx.Interpreter(gm).boxed_run(args))


def run_step_graphs(fw_gm: fx.GraphModule, bw_gm: fx.GraphModule,
                    primals: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """One training step through partitioned graphs, as AOTAutograd's runtime runs it.

    Returns (forward outputs that are not saved, gradients); the caller holding them models
    ``out`` and ``.grad``. Tangents are ones, allocated as the backward starts; a scalar's
    (a loss's root gradient) is held until the backward returns, as
    ``torch.autograd.backward`` holds it."""
    bw_phs = [n for n in bw_gm.graph.nodes if n.op == "placeholder"]
    saved_phs = [p for p in bw_phs if not p.name.startswith("tangents")]
    tangent_phs = bw_phs[len(saved_phs):]
    fw_out_node = next(n for n in reversed(fw_gm.graph.nodes) if n.op == "output")
    fw_names = [getattr(a, "name", None) for a in fw_out_node.args[0]]
    outputs = run_graph(fw_gm, list(primals))
    num_user = len(outputs) - len(saved_phs)
    saved = dict(zip(fw_names[num_user:], outputs[num_user:]))
    user_outputs = outputs[:num_user]
    del outputs
    bw_args = [saved.pop(p.name) for p in saved_phs]
    saved.clear()
    tangents = [_ones_like_fake(p.meta["val"]) for p in tangent_phs]
    bw_args += tangents
    roots = [t for t in tangents if t.dim() == 0]  # held as torch.autograd.backward does
    del tangents
    grads = run_graph(bw_gm, bw_args)
    del roots
    return user_outputs, grads


def _ones_like_fake(val: torch.Tensor) -> torch.Tensor:
    """A real tensor of ones with the fake value's (hinted) sizes, strides and dtype."""
    t = torch.empty_strided([size_hint(s) for s in val.shape],
                            [size_hint(s) for s in val.stride()], dtype=val.dtype,
                            device=val.device)
    return t.fill_(1)


def _storages(values: Iterable[Any]) -> list[torch.UntypedStorage]:
    seen: dict[int, torch.UntypedStorage] = {}
    for v in values:
        if isinstance(v, torch.Tensor) and v.device.type != "meta":
            s = v.untyped_storage()
            seen.setdefault(id(s), s)
    return list(seen.values())
