"""Which code generator compiles a graph: ``codegen="auto"`` resolved for its device.

fx code generation runs the final graphs as fx Python calling aten ops (and fxopt's own
kernels): one kernel per op, readable, and the only path where fuse_elementwise's kernels
run. Inductor fuses pointwise ops into generated C++/Triton kernels. Where each wins was
measured (benchmarks/codegen_auto.py, results in benchmarks/results/codegen_auto_cpu.md):
on the CPU Inductor's training step is no faster than fx's on transformers at the
benchmark suite's sizes while its compile is several times slower, so "auto" takes fx
there; on CUDA, fusion saves the launches and memory round trips of every pointwise op
(eager's execution model, which fx code generation keeps), so "auto" takes Inductor.
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
    return "fx", (f"auto: on {device.type.upper()} Inductor's step is no faster than fx's "
                  "and it compiles several times slower "
                  "(benchmarks/results/codegen_auto_cpu.md)")
