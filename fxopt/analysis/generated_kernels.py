"""What Inductor would launch on a GPU, read on the CPU: its Triton code for a step's graphs.

Inductor generates the same Triton code for a graph whichever device it targets: the
scheduler's fusion decisions, the kernels' kinds (pointwise, looped or persistent
reduction), their loads and stores are the SIMD code generator's, not the GPU's. So with
Inductor told to generate Triton for the CPU (``_compat.inductor_triton_code_on_cpu``,
which compiles nothing), one training step on the CPU shows, per compiled graph:

- each generated kernel, its launches, Inductor's own estimate of the bytes it moves
  (``kernel_num_gb``: every buffer it reads and writes, once) and its indirect loads
  (gathers: an address computed from a loaded value);
- the extern calls the graph makes (cuBLAS's GEMMs on CUDA, ``mm``/``addmm``/``bmm``
  here) and the aten ops it falls back to.

That is what a GPU step's launches and elementwise traffic come from, countable exactly
before any GPU is lent (issue 30.5: the cost model's per-block launches and bytes).
Where CPU and CUDA differ: attention, whose CPU kernel takes no dropout (compare with
attention dropout 0, where both call one fused kernel), and the device properties that
size split reductions (the SM count: bytes and kernel counts of a reduction split in two
may differ). Run the model's step with its attention dropout off for a like-for-like
count.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fxopt import _compat

__all__ = ["GeneratedCode", "GeneratedKernel", "generated_code", "read_output_code"]

KINDS = {"poi": "pointwise", "red": "reduction", "per": "persistent reduction",
         "tem": "template", "for": "foreach"}

_KERNEL = re.compile(r"^(\w+) = async_compile\.triton\('(\w+)', '''(.*?)'''", re.S | re.M)
_NUM_GB = re.compile(r"'kernel_num_gb': ([0-9.e+-]+)")
_LOAD_INDEX = re.compile(r"tl\.load\(\w+ \+ \((.*?)\), ")
_EXTERN = re.compile(r"\bextern_kernels\.(\w+)\(")
_FALLBACK = re.compile(r"\btorch\.ops\.(\w+\.\w+)\.\w+\(")


@dataclass(frozen=True)
class GeneratedKernel:
    """One generated Triton kernel of a graph."""

    name: str
    kind: str             # a value of KINDS
    launches: int         # in the graph's wrapper, per call of the graph
    bytes: float          # Inductor's estimate per launch: each buffer read or written once
    indirect_loads: int   # loads whose address comes from a loaded value (gathers)


@dataclass
class GeneratedCode:
    """One compiled graph's generated code, summarized."""

    kernels: list[GeneratedKernel]
    backward: bool = False  # the graph is a backward (Inductor compiled it as one)
    extern_calls: Counter[str] = field(default_factory=Counter)
    fallback_calls: Counter[str] = field(default_factory=Counter)

    @property
    def launches(self) -> int:
        return sum(k.launches for k in self.kernels)

    @property
    def bytes(self) -> float:
        """Bytes the generated kernels move per call of the graph (Inductor's estimates)."""
        return sum(k.launches * k.bytes for k in self.kernels)

    @property
    def indirect_loads(self) -> int:
        return sum(k.launches * k.indirect_loads for k in self.kernels)


def read_output_code(source: str, backward: bool = False) -> GeneratedCode:
    """The kernels and calls of one graph's Inductor output code (Triton); ``backward``:
    the graph is a backward."""
    bodies = {name: body for _, name, body in _KERNEL.findall(source)}
    # What is left is the wrapper: the calls of the graph (and of its partitions)
    wrapper = _KERNEL.sub("", source)
    if "async_compile = AsyncCompile()" not in wrapper or "def call(" not in wrapper:
        raise ValueError("not Inductor output code: no wrapper with `def call(`")
    launched = Counter(re.findall(r"^\s+(\w+)\.run\(", wrapper, re.M))
    kernels = []
    for name, body in bodies.items():
        num_gb = _NUM_GB.search(body)
        indirect = sum("tmp" in index for index in _LOAD_INDEX.findall(body))
        kernels.append(GeneratedKernel(
            name=name, kind=KINDS.get(name.split("_")[1], "other"),
            launches=launched[name], bytes=float(num_gb.group(1)) * 1e9 if num_gb else 0.0,
            indirect_loads=indirect))
    return GeneratedCode(kernels, backward, Counter(_EXTERN.findall(wrapper)),
                         Counter(_FALLBACK.findall(wrapper)))


def generated_code(step: Callable[[], Any]) -> list[GeneratedCode]:
    """Run ``step`` (which compiles with fxopt's backend or
    ``_compat.inductor_backend``, on the CPU, afresh: after ``torch._dynamo.reset()``),
    Inductor generating Triton code for each graph it compiles and running the graph
    uncompiled; the graphs' code in compilation order, each marked forward or backward."""
    with _compat.inductor_triton_code_on_cpu() as sources:
        step()
    if not sources:
        raise RuntimeError("fxopt: no graph was compiled during the step, so no generated "
                           "code was read: call torch._dynamo.reset() before the compiled "
                           "model's first call, and compile with Inductor")
    return [read_output_code(source, backward) for source, backward in sources]
