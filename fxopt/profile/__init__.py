"""The memory profiler: ``fxopt.profile_memory(model, inputs, optimizer)`` breaks the
memory of training steps into parameters, buffers, inputs, gradients, optimizer state,
activations (kept for backward) and temporaries, at the peak and over time, on the CPU
and on CUDA, for eager and compiled models. See `fxopt.profile.profiler` for how.
"""

from fxopt.profile.attribute import CATEGORIES
from fxopt.profile.profiler import default_loss, profile_memory
from fxopt.profile.report import MemoryProfile, format_bytes

__all__ = ["CATEGORIES", "MemoryProfile", "default_loss", "format_bytes", "profile_memory"]
