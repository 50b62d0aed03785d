"""Generated Triton kernels for fused pointwise regions (the `fuse_elementwise` pass).

- :mod:`.ops`: the aten ops the generator knows and the Triton expression of each;
- :mod:`.triton_source`: a region as plain data (:class:`Program`), its Triton source, and the
  process-wide kernel cache keyed by program and layout;
- :mod:`.fused`: :class:`FusedPointwise`, the callable a region becomes in the graph.

The reference a fused kernel must equal is the aten subgraph it replaces: the pass only
fuses where Triton runs (CUDA, or the CPU under ``TRITON_INTERPRET=1``) and otherwise
leaves the graph as it is.
"""

from fxopt.kernels.fuse_elementwise.fused import FusedPointwise
from fxopt.kernels.fuse_elementwise.ops import Op, Unsupported, lower
from fxopt.kernels.fuse_elementwise.triton_source import (
           Instr,
           Layout,
           Program,
           cached_kernels,
           get_kernel,
)

__all__ = ["FusedPointwise", "Instr", "Layout", "Op", "Program", "Unsupported",
           "cached_kernels", "get_kernel", "lower"]
