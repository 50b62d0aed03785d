"""fxopt's kernels: Triton kernels and the pure-torch references they must equal.

Triton runs on CUDA devices, and on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1``, which is how the tests run every kernel). Everywhere else (a CPU
without the interpreter, or no Triton installed) a pass that needs Triton declines with a
reason in its stats, and a custom op runs its torch reference instead.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

__all__ = ["triton_installed", "triton_interpreting", "triton_runs_on"]


@functools.cache
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_interpreting() -> bool:
    """Whether Triton kernels run in its CPU interpreter (read when a kernel is defined)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_runs_on(device: torch.device | str) -> bool:
    """Whether a Triton kernel can run on tensors of ``device``."""
    device = torch.device(device)
    if not triton_installed():
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and triton_interpreting()
