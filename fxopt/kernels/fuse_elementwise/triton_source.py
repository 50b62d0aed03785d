"""Triton source for a fused pointwise region, generated from the region's program.

A :class:`Program` is the region as plain data: the dtypes of its tensor inputs, one
:class:`Instr` per op (template name, operands, dtypes) and the values it writes. A
:class:`Layout` says how each tensor is addressed for one call: linearly (its strides are
the contiguous strides of the iteration shape) or through index arithmetic with its own
strides (broadcast dims read with stride 0, so expanded and non-contiguous inputs are read
exactly). One kernel is generated per (program, layout) and cached for the process, so the
twelve identical layers of a transformer, or a forward and a backward that share a chain,
compile one kernel.

The source is registered in :mod:`linecache` under a made-up file name, which is all
``triton.jit`` needs to read it back; nothing is written to disk by fxopt.
"""

from __future__ import annotations

import itertools
import linecache
import math
from dataclasses import dataclass
from typing import Any

import torch

from fxopt.kernels import triton_interpreting
from fxopt.kernels.fuse_elementwise.ops import EXPRESSIONS

__all__ = ["Instr", "Layout", "Program", "Ref", "autotune_configs", "cached_kernels",
           "cached_programs", "get_kernel", "kernel_source", "vector_elements"]

# ("in", i): the i-th tensor input; ("v", j): the j-th instruction's value; ("c", x): a number
Ref = tuple[str, Any]

_TL = {
    torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32",
    torch.float64: "tl.float64", torch.bool: "tl.int1", torch.int8: "tl.int8",
    torch.uint8: "tl.uint8", torch.int16: "tl.int16", torch.int32: "tl.int32",
    torch.int64: "tl.int64",
}
_BOOL_RESULT = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
                          "logical_xor", "logical_not"})
_ROUNDED = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Instr:
    """One op: ``name`` in :data:`EXPRESSIONS`, operands converted to ``compute``, the
    result rounded to ``dtype`` (the node's dtype)."""

    name: str
    operands: tuple[Ref, ...]
    params: tuple[Any, ...]
    compute: torch.dtype
    dtype: torch.dtype


@dataclass(frozen=True)
class Program:
    """A fused region as plain data; hashable, it is the kernel cache's key."""

    inputs: tuple[torch.dtype, ...]
    instrs: tuple[Instr, ...]
    outputs: tuple[int, ...]  # indices of the instructions whose values are written

    @property
    def output_dtypes(self) -> tuple[torch.dtype, ...]:
        return tuple(self.instrs[j].dtype for j in self.outputs)


@dataclass(frozen=True)
class Layout:
    """How one call addresses its tensors; part of the cache key."""

    ndim: int
    strided_inputs: tuple[bool, ...]
    strided_outputs: tuple[bool, ...]
    wide: bool  # int64 offsets: more than 2**31 elements or a far stride

    @property
    def any_strided(self) -> bool:
        return any(self.strided_inputs) or any(self.strided_outputs)


def register_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a value is held in inside the kernel: fp16/bf16 compute in fp32."""
    return torch.float32 if dtype in _ROUNDED else dtype


def _convert(expr: str, source: torch.dtype, target: torch.dtype) -> str:
    if source == target:
        return expr
    if target == torch.bool:
        return f"({expr} != 0)"
    return f"{expr}.to({_TL[target]})"


def _literal(value: Any, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        raise ValueError("a number operand of a logical op")
    if not dtype.is_floating_point:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{value!r} in an {dtype} op")
        return str(int(value))
    value = float(value)
    text = repr(value) if math.isfinite(value) else f'float("{value}")'
    # a bare Python float is an fp32 constant in Triton
    return f"tl.full([1], {text}, tl.float64)" if dtype == torch.float64 else text


def _operand(ref: Ref, target: torch.dtype, registers: dict[Ref, torch.dtype]) -> str:
    kind, index = ref
    if kind == "c":
        return _literal(index, target)
    name = f"x{index}" if kind == "in" else f"v{index}"
    return _convert(name, registers[ref], target)


def _offset(prefix: str, strided: bool, ndim: int) -> str:
    if not strided:
        return "offs"
    return " + ".join(f"i{d} * {prefix}_s{d}" for d in range(ndim)) or "0"


def vector_elements(program: Program, layout: Layout) -> int | None:
    """Elements each thread moves per linear access, the same for every tensor of the
    kernel: 16 bytes of its widest linearly addressed dtype (None: nothing is linear).

    Triton's coalescing pass gives each load and store a layout from its own element
    width (8 bf16 or 4 fp32 elements per thread), so a kernel that reads bf16 and writes
    fp32 computes in two layouts joined by layout conversions; Triton 3.6's pass that
    removes them rematerializes values after their uses in such kernels ("operand does
    not dominate this use", GPT-2's GELU under CUDA bf16 autocast, h100-2026-11-26.md).
    Capping every linear access's contiguity at one count (``tl.max_contiguous``, a
    weaker promise than the true one) gives every access one layout and the kernel no
    conversion at all; the narrower dtypes then move 8 bytes per access instead of 16.
    """
    sizes = [d.itemsize for d, s in zip(program.inputs, layout.strided_inputs) if not s]
    sizes += [d.itemsize for d, s in zip(program.output_dtypes, layout.strided_outputs)
              if not s]
    return 16 // max(sizes) if sizes else None


def kernel_source(program: Program, layout: Layout, name: str) -> str:
    """The Triton source of ``program`` for ``layout`` (a ``@triton.jit`` function)."""
    ndim = layout.ndim
    params = [f"in{i}" for i in range(len(program.inputs))]
    params += [f"out{k}" for k in range(len(program.outputs))]
    params.append("numel")
    if layout.any_strided:
        params += [f"size{d}" for d in range(1, ndim)]
    for prefix, flags in (("in", layout.strided_inputs), ("out", layout.strided_outputs)):
        params += [f"{prefix}{i}_s{d}" for i, s in enumerate(flags) if s for d in range(ndim)]
    pid = "tl.program_id(0).to(tl.int64)" if layout.wide else "tl.program_id(0)"
    lines = ["@triton.jit", f"def {name}({', '.join(params)}, BLOCK: tl.constexpr):",
             f"    offs = {pid} * BLOCK + tl.arange(0, BLOCK)"]
    vector = vector_elements(program, layout)
    if vector:
        lines.append(f"    offs = tl.max_contiguous(offs, {vector})")
    lines.append("    mask = offs < numel")
    if layout.any_strided:
        lines.append("    rem = offs")
        for d in range(ndim - 1, 0, -1):
            lines += [f"    i{d} = rem % size{d}", f"    rem = rem // size{d}"]
        lines.append("    i0 = rem")
    registers: dict[Ref, torch.dtype] = {}
    for i, dtype in enumerate(program.inputs):
        offset = _offset(f"in{i}", layout.strided_inputs[i], ndim)
        loaded = f"tl.load(in{i} + {offset}, mask=mask)"
        lines.append(f"    x{i} = {_convert(loaded, dtype, register_dtype(dtype))}")
        registers[("in", i)] = register_dtype(dtype)
    for j, instr in enumerate(program.instrs):
        lines.append(f"    v{j} = {_instruction(instr, registers)}")
        registers[("v", j)] = register_dtype(instr.dtype)
    for k, j in enumerate(program.outputs):
        dtype = program.instrs[j].dtype
        offset = _offset(f"out{k}", layout.strided_outputs[k], ndim)
        value = _convert(f"v{j}", register_dtype(dtype), dtype)
        lines.append(f"    tl.store(out{k} + {offset}, {value}, mask=mask)")
    return "\n".join(lines) + "\n"


def _instruction(instr: Instr, registers: dict[Ref, torch.dtype]) -> str:
    operands = [_operand(ref, torch.bool if instr.name == "where" and n == 0 else instr.compute,
                         registers) for n, ref in enumerate(instr.operands)]
    expr = EXPRESSIONS[instr.name](operands, instr.params, instr.compute)
    result = torch.bool if instr.name in _BOOL_RESULT else instr.compute
    if instr.dtype in _ROUNDED:  # eager rounds each op's result to its dtype
        return _convert(_convert(expr, result, instr.dtype), instr.dtype, torch.float32)
    return _convert(expr, result, instr.dtype)


# ---------------------------------------------------------------------------- the cache

_kernels: dict[tuple[Program, Layout], Any] = {}
_names = itertools.count()


def cached_kernels() -> int:
    """How many kernels this process has generated."""
    return len(_kernels)


def autotune_configs(layout: Layout) -> tuple[tuple[int, int], ...]:
    """(BLOCK, num_warps) choices the GPU autotunes among. At least 8 elements per thread,
    so that bf16/fp16 operands move in 128-bit accesses, and at most 8 where offsets are
    computed (strided operands) or int64 (a > 2**31-element region). Index arithmetic
    with int64 offsets costs so many registers that those layouts stay at 4 (sm_90, a 4-D
    bf16 region: 112 registers at 4 elements per thread, 254 at 8, 2996 bytes of spills at
    16; a linear fp32 sin/cos region with int64 offsets spills 8 bytes at 16; measured by
    fxopt.kernels.aot, benchmarks/aot_kernels.py)."""
    if layout.wide and layout.any_strided:
        return (512, 4), (1024, 8)
    if layout.wide or layout.any_strided:
        return (512, 2), (1024, 4), (2048, 8)
    return (512, 2), (1024, 4), (2048, 8), (4096, 8)


def cached_programs() -> list[tuple[Program, Layout]]:
    """The program and layout of every kernel this process has generated."""
    return list(_kernels)


def get_kernel(program: Program, layout: Layout) -> tuple[Any, bool]:
    """The kernel for ``program`` and ``layout`` and whether it was generated just now."""
    key = (program, layout)
    if key in _kernels:
        return _kernels[key], False
    import triton
    import triton.language as tl

    name = f"fxopt_pointwise_{next(_names)}"
    source = kernel_source(program, layout, name)
    filename = f"<{name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"triton": triton, "tl": tl}
    exec(compile(source, filename, "exec"), namespace)
    kernel = namespace[name]
    if not triton_interpreting():
        # the GPU picks its block size and warps per element count (autotuned once per
        # count); the interpreter runs one fixed block (see launch_block)
        kernel = triton.autotune(
            configs=[triton.Config({"BLOCK": block}, num_warps=warps)
                     for block, warps in autotune_configs(layout)],
            key=["numel"])(kernel)
    _kernels[key] = kernel
    return kernel, True
