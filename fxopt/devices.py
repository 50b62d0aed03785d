"""One device normalisation for every ``torch.cuda`` call: a CUDA device with its index.

``torch.device("cuda")`` names "the current CUDA device" without saying which. Some
``torch.cuda`` functions accept it (the memory counters resolve it), others reject it
(``set_per_process_memory_fraction`` on torch 2.11: "Expected a torch.device with a
specified index"), and which do changes between releases. fxopt therefore passes
``torch.cuda`` only devices that carry their index: :func:`indexed` of whatever it was
given, or a tensor's or a stream's own device, which always does. ``tests/test_layout.py``
checks the sources for it. A leaf module (no fxopt imports), so any layer may use it.
"""

from __future__ import annotations

import torch

__all__ = ["indexed"]


def indexed(device: torch.device | str | int | None) -> torch.device:
    """``device`` as a ``torch.device`` with an index when it is a CUDA device (the current
    one for ``"cuda"`` or None); any other device unchanged. Where CUDA is unavailable an
    unindexed CUDA device is returned as it is: the caller's CUDA call then raises torch's
    own error, which says so."""
    if device is None:
        device = torch.device("cuda")
    elif isinstance(device, int):
        device = torch.device("cuda", device)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device
