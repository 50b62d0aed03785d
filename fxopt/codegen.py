"""Which code generator compiles a graph: ``codegen="auto"`` resolved for its device.

fx code generation runs the final graphs as fx Python calling aten ops (and fxopt's own
kernels): one kernel per op, readable, and the only path where fuse_elementwise's kernels
run. Inductor fuses pointwise ops into generated C++/Triton kernels. On CUDA that fusion
saves a launch and a memory round trip per pointwise op (the fx path keeps eager's execution
model), so "auto" takes Inductor there. On the CPU it was measured
(benchmarks/codegen_auto.py, benchmarks/results/codegen_auto_cpu.md): Inductor compiles
transformers 4-40x slower than fx code generation (GPT-2/BERT/Llama, 2-4 layers), for a step
1.0-1.3x faster at issue 17's size (4 layers, hidden 256, batch 4 x 64) and 1.6-1.8x faster
at the benchmark suite's tiny CPU sizes, where per-op overhead dominates. "auto" takes fx
there, for the compile time that short CPU runs (tests, debugging, smoke benchmarks) are
dominated by; a long CPU training run is faster with ``codegen="inductor"``.
"""

from __future__ import annotations

import torch

from fxopt.config import Options

__all__ = ["choose_codegen"]


def choose_codegen(options: Options, device: torch.device) -> tuple[str, str]:
    """The code generator for a graph on ``device`` and why, in words for explain."""
    if options.codegen != "auto":
        return options.codegen, "set by the codegen option"
    if options.inductor_max_autotune:
        return "inductor", "auto: inductor_max_autotune asks for Inductor's tuned kernels"
    if options.fuse_elementwise is True:
        return "fx", ("auto: fuse_elementwise=True asks for fxopt's fused kernels, which "
                      "run under fx code generation (Inductor fuses on its own)")
    if device.type == "cuda":
        return "inductor", ("auto: on CUDA Inductor's fused kernels make the step faster "
                            "than fx's one kernel per op")
    return "fx", (f"auto: on {device.type.upper()} fx compiles 4-40x faster than Inductor, "
                  "whose step is 1.0-1.8x faster (benchmarks/results/codegen_auto_cpu.md); "
                  "set codegen='inductor' for a long run")
