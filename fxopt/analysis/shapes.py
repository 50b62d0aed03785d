"""Fake values on graph nodes, and their byte sizes.

Every fxopt analysis reads ``node.meta["val"]``: the FakeTensor (or tuple of them, SymInt,
None) that AOTAutograd's tracing left on each node. A pass that creates nodes may leave
them without one; :func:`ensure_fake_values` re-propagates fake values through the whole
graph with the fake mode (and so the shape environment) of the values already there, so
the symbols of a ``dynamic=True`` graph stay the same symbols.

Sizes can be symbolic (SymInt). Byte counts are plans, not guards, so they resolve each
size with its *optimization* hint (the example input's value) and never add a guard.

Private torch APIs (through :mod:`fxopt._compat` where it has them):
``torch._guards.detect_fake_mode`` (``_compat.fake_mode_of``) to find the fake mode.
Size hints of SymInts come from ``_compat.size_hint`` (named differently across torch
releases).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch
from torch import fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from fxopt import _compat

__all__ = ["ensure_fake_values", "nbytes", "numel", "size_hint", "storage_nbytes",
           "tensor_values"]

log = logging.getLogger(__name__)

# An unbacked size (data-dependent, e.g. the length of nonzero()) has no hint; plan with
# the same stand-in inductor uses (config.unbacked_symint_fallback).
UNBACKED_FALLBACK = 8192


def size_hint(size: int | torch.SymInt) -> int:
    """A concrete int for a possibly symbolic size, without adding a guard."""
    if isinstance(size, int):
        return size
    return _compat.size_hint(size, fallback=UNBACKED_FALLBACK)


def tensor_values(node: fx.Node, key: str = "val") -> list[torch.Tensor]:
    """The tensors a node produces, in output order (multi-output ops flattened, non-tensors
    such as SymInts and None skipped). ``key="example_value"`` reads Dynamo's graph, whose
    nodes keep their fake values there."""
    return [v for v in _flat(node.meta.get(key)) if isinstance(v, torch.Tensor)]


def numel(t: torch.Tensor) -> int:
    """Number of elements, symbolic sizes resolved by their hints."""
    count = 1
    for s in t.shape:
        count *= size_hint(s)
    return count


def nbytes(t: Any) -> int:
    """numel x itemsize of a tensor (its logical size); 0 for anything that is not one."""
    if not isinstance(t, torch.Tensor):
        return 0
    return numel(t) * t.element_size()


def storage_nbytes(t: Any) -> int:
    """Bytes of the storage a freshly allocated tensor needs: the span its strides reach.
    Equals :func:`nbytes` for dense tensors; differs for padded or overlapping layouts."""
    if not isinstance(t, torch.Tensor):
        return 0
    sizes = [size_hint(s) for s in t.shape]
    if any(s == 0 for s in sizes):
        return 0
    strides = [size_hint(s) for s in t.stride()]
    span = 1 + sum((size - 1) * abs(stride) for size, stride in zip(sizes, strides))
    return (size_hint(t.storage_offset()) + span) * t.element_size()


def ensure_fake_values(gm: fx.GraphModule) -> bool:
    """Give every node a ``meta["val"]``; returns True when values had to be propagated.

    Values that exist are recomputed too (one propagation through the whole graph), which
    keeps them consistent with the new nodes. Raises ValueError when no node carries a fake
    value to take the fake mode from (then there is no shape environment to reuse).
    """
    missing = [n for n in gm.graph.nodes if n.op != "output" and "val" not in n.meta]
    if not missing:
        return False
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    vals = [v for n in gm.graph.nodes for v in _flat(n.meta.get("val"))]
    fake_mode = _compat.fake_mode_of(vals)
    if fake_mode is None:
        raise ValueError("ensure_fake_values: no node carries a fake value to take the "
                         f"fake mode from; missing on {[n.name for n in missing[:5]]}")
    if any("val" not in p.meta for p in placeholders):
        raise ValueError("ensure_fake_values: placeholders need meta['val'] to propagate from")
    log.debug("re-propagating fake values: %d nodes lacked one", len(missing))
    # FakeTensorProp converts real inputs with the mode; our inputs are already its fakes,
    # so they are used as they are (same tensors, same symbols).
    FakeTensorProp(gm, mode=fake_mode).propagate_dont_convert_inputs(
        *[p.meta["val"] for p in placeholders])
    return True


def _flat(val: Any) -> Iterable[Any]:
    if isinstance(val, (tuple, list)):
        for v in val:
            yield from _flat(v)
    else:
        yield val
