"""fxopt's kernels: Triton kernels and the pure-torch references they must equal.

Triton runs on CUDA devices, and on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1``, which is how the tests run every kernel). Everywhere else (a CPU
without the interpreter, or no Triton installed) a pass that needs Triton declines with a
reason in its stats, and a custom op runs its torch reference instead.

:func:`triton_runs_on` is the one place that decides, once per device type and interpreter
setting, at the first kernel call (or pass) that asks. ``TRITON_INTERPRET=1`` set after
triton was imported (as a notebook does) leaves Triton's own library compiled for a GPU, so
its interpreter cannot run a kernel: that is detected here and answered with the torch
reference and one warning, never a crash in training.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings

import torch

__all__ = ["triton_installed", "triton_interpreting", "triton_runs_on"]


@functools.cache
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_interpreting() -> bool:
    """Whether Triton kernels run in its CPU interpreter (read when a kernel is defined)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_runs_on(device: torch.device | str) -> bool:
    """Whether a Triton kernel can run on tensors of ``device`` (decided once, see above)."""
    key = (torch.device(device).type, triton_interpreting())
    if key not in _decisions:
        _decisions[key] = _decide(*key)
    return _decisions[key]


_decisions: dict[tuple[str, bool], bool] = {}


def _decide(device_type: str, interpreting: bool) -> bool:
    if not triton_installed():
        return False
    if device_type == "cuda":
        return True
    if device_type != "cpu" or not interpreting:
        return False
    if not _interpreter_ready():
        warnings.warn(
            "fxopt: TRITON_INTERPRET=1 was set after triton was imported, so Triton's "
            "interpreter cannot run kernels in this process; fxopt's kernels use their torch "
            "reference instead. Set TRITON_INTERPRET=1 before importing torch, triton or "
            "fxopt to run the kernels.", stacklevel=3)
        return False
    return True


def _interpreter_ready() -> bool:
    """Triton decides at ``@triton.jit`` time whether a function is interpreted; its own
    library (``tl.sigmoid`` and the like, which kernels call) was decorated at import."""
    from triton.language import standard

    return type(standard.sigmoid).__name__ == "InterpretedFunction"
