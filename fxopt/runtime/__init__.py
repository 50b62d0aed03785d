"""What compiled code calls at run time: fxopt's swap runtime (:mod:`fxopt.runtime.swap`).

Importing this package registers the ``fxopt::swap_*`` custom ops, so a graph that holds
them can be run (or traced with fake tensors) on any device.
"""

from fxopt.runtime.swap import HostBufferPool, SwapRuntime, runtime

__all__ = ["HostBufferPool", "SwapRuntime", "runtime"]
