"""Analyses of fx graphs: fake values and sizes, per-op costs, and step memory.

- :mod:`~fxopt.analysis.shapes`: ``meta["val"]`` on every node, byte sizes with symbolic
  sizes resolved by their hints.
- :mod:`~fxopt.analysis.cost`: FLOPs and bytes per node, by kind (matmul, pointwise, ...).
- :mod:`~fxopt.analysis.memory`: peak and activation memory of a training step, predicted by
  a liveness simulation of the forward then backward graphs (or of the joint graph).
- :mod:`~fxopt.analysis.measure`: the same quantities measured on real tensors on any
  device, the ground truth the predictions are tested against.
- :mod:`~fxopt.analysis.generated_kernels`: the kernels Inductor's Triton code generator
  makes for a step's graphs (launches, bytes, gathers, GEMM calls), read on the CPU.

shapes, cost and memory are pure functions of the graph: they read node metadata and
never change a graph (except :func:`ensure_fake_values`, whose job is to fill in missing
``meta["val"]``); measure and generated_kernels run it.
"""

from fxopt.analysis.cost import (
    KINDS,
    GraphCost,
    NodeCost,
    graph_cost,
    is_view_op,
    node_cost,
)
from fxopt.analysis.measure import (
    LiveStorageTracker,
    MeasuredMemory,
    SavedBytes,
    measure_peak_memory,
    measure_saved_bytes,
    run_graph,
    run_step_graphs,
)
from fxopt.analysis.memory import (
    MemoryEstimate,
    estimate_forward_memory,
    estimate_joint_memory,
    estimate_partitioned_memory,
    estimate_step_memory,
)
from fxopt.analysis.shapes import (
    ensure_fake_values,
    nbytes,
    size_hint,
    storage_nbytes,
    tensor_values,
)

__all__ = [
    "KINDS", "GraphCost", "LiveStorageTracker", "MeasuredMemory", "MemoryEstimate", "NodeCost",
    "SavedBytes", "ensure_fake_values", "estimate_forward_memory", "estimate_joint_memory",
    "estimate_partitioned_memory", "estimate_step_memory", "graph_cost", "is_view_op",
    "measure_peak_memory", "measure_saved_bytes", "nbytes", "node_cost", "run_graph",
    "run_step_graphs", "size_hint", "storage_nbytes", "tensor_values",
]
