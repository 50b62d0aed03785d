"""Ahead-of-time compile check: every Triton kernel fxopt can emit, compiled for CUDA
targets (sm_80, sm_90) on a machine with no GPU, and what the compiled code does.

Triton compiles to PTX and, with the ptxas it ships, to a cubin without a GPU or driver:
``triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))``. Each kernel is
compiled the way the JIT specializes a real call: ``tt.divisibility`` 16 on the pointers and
element counts (aligned tensors, counts that are multiples of 16), without which even a
contiguous add compiles to scalar loads. From the result this module reads registers per
thread (cuobjdump) and spill bytes (``ptxas -v``), shared memory (Triton's metadata) and
every global load and store instruction with its width in bits (the PTX), and from the
masked ones (operands, one per element) the bytes each kernel issues per element.

The compile runs in a child process without ``TRITON_INTERPRET``: in a process where the
interpreter is on, Triton's own library functions (``tl.zeros_like``, ``tl.sum``, ...) are
interpreter objects that its compiler cannot lower, so the test suite's process (which sets
``TRITON_INTERPRET=1``) cannot compile for CUDA itself. The child is this module's
``__main__``: jobs in as JSON on stdin, reports out as JSON on stdout.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from fxopt.kernels.fuse_elementwise.triton_source import (
    Layout,
    Program,
    autotune_configs,
    kernel_source,
)

__all__ = [
    "ARCHS",
    "KernelReport",
    "KernelSpec",
    "compile_jobs",
    "compile_specs",
    "format_table",
    "handwritten_specs",
    "linear_cross_entropy_specs",
    "pointwise_spec",
    "problems",
]

ARCHS = (80, 90)
MAX_REGISTERS = 255
_TRITON_TYPE = {
    torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
    torch.float64: "fp64", torch.bool: "i1", torch.int8: "i8", torch.uint8: "u8",
    torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class KernelSpec:
    """One kernel specialization to compile: a ``@triton.jit`` function found by module and
    attribute, or generated source; the argument types (Triton's signature strings), the
    constexpr values, and the arguments specialized as divisible by 16."""

    label: str
    signature: dict[str, str]
    constexprs: dict[str, Any]
    aligned: tuple[str, ...]
    elements_per_program: int
    module: str = ""
    attr: str = ""
    source: str = ""
    num_warps: int = 4
    min_bytes_per_element: float | None = None  # each input read once, each output written once
    one_layout: bool = False  # every tensor in one layout: no layout conversion may remain


@dataclass
class KernelReport:
    """What one kernel compiled to for one architecture (``error`` set if it did not)."""

    label: str
    arch: int
    registers: int = 0
    spill_bytes: int = 0
    shared_bytes: int = 0
    loads: dict[int, int] = field(default_factory=dict)   # width in bits -> instructions
    stores: dict[int, int] = field(default_factory=dict)
    bytes_per_element: float = 0.0  # of the masked (per-element operand) accesses
    operand_widths: list[int] = field(default_factory=list)  # widths of the masked ones
    min_bytes_per_element: float | None = None
    layout_conversions: int = 0  # ttg.convert_layout ops left in the TTGIR
    one_layout: bool = False
    error: str = ""


# ------------------------------------------------------------------ the kernels to compile

def _ptr(dtype: str) -> str:
    return f"*{dtype}"


def handwritten_specs(dtypes: tuple[str, ...] = tuple(DTYPES), hidden: int = 1024,
                      vocab: int = 50257) -> list[KernelSpec]:
    """The tempo GELU, the LSTM/GRU cell and the fused loss's block kernels, per activation
    dtype (the loss's as GPT-2's head calls them: :func:`linear_cross_entropy_specs`)."""
    from fxopt.kernels.fuse_rnn import _BLOCK as rnn_block
    from fxopt.kernels.tempo.gelu import gelu_tables
    from fxopt.kernels.tempo.gelu_coefficients import DEGREE
    from fxopt.kernels.tempo.gelu_triton import BLOCK as GELU_BLOCK

    specs = []
    gelu_module = "fxopt.kernels.tempo.gelu_triton"
    rnn_module = "fxopt.kernels.fuse_rnn"
    for name in dtypes:
        p = _ptr(name)
        for approximate in ("none", "tanh"):
            tables = gelu_tables(approximate, torch.device("cpu"))
            num_left = tables["num_left"]
            specs.append(KernelSpec(
                f"tempo_gelu_forward[{approximate}] {name}",
                {"x_ptr": p, "y_ptr": p, "packed_ptr": "*u8", "numel": "i32",
                 "num_bytes": "i32", "x_min": "fp32", "TANH": "constexpr",
                 "BLOCK": "constexpr"},
                {"TANH": approximate == "tanh", "BLOCK": GELU_BLOCK},
                ("x_ptr", "y_ptr", "packed_ptr", "numel", "num_bytes"), GELU_BLOCK * 8,
                module=gelu_module, attr="_gelu_forward_kernel"))
            specs.append(KernelSpec(
                f"tempo_gelu_backward[{approximate}] {name}",
                {"dy_ptr": p, "y_ptr": p, "packed_ptr": "*u8", "dx_ptr": p,
                 "starts_ptr": "*fp32", "scales_ptr": "*fp32", "coefficients_ptr": "*fp32",
                 "numel": "i32", "num_bytes": "i32", "y_min": "fp32", "left_end": "fp32",
                 "right_end": "fp32", "NUM_LEFT": "constexpr", "NUM_RIGHT": "constexpr",
                 "DEGREE": "constexpr", "BLOCK": "constexpr"},
                {"NUM_LEFT": num_left, "NUM_RIGHT": len(tables["starts"]) - num_left,
                 "DEGREE": DEGREE, "BLOCK": GELU_BLOCK},
                ("dy_ptr", "y_ptr", "packed_ptr", "dx_ptr", "starts_ptr", "scales_ptr",
                 "coefficients_ptr", "numel", "num_bytes"), GELU_BLOCK * 8,
                module=gelu_module, attr="_gelu_backward_kernel"))
        strides = {"n": "i32", "stride_a": "i32", "stride_b": "i32"}
        gates = {"H": hidden, "HAS_BIAS_A": True, "HAS_BIAS_B": True, "BLOCK": rnn_block}
        specs.append(KernelSpec(
            f"lstm_forward H={hidden} {name}",
            {**dict.fromkeys(("a_ptr", "b_ptr", "c_ptr", "bias_a_ptr", "bias_b_ptr", "h_out",
                              "c_out", "gates_out"), p), **strides, "stride_c": "i32",
             **dict.fromkeys(("H", "O0", "O1", "O2", "O3", "HAS_BIAS_A", "HAS_BIAS_B",
                              "BLOCK"), "constexpr")},
            {**gates, "O0": 0, "O1": 1, "O2": 2, "O3": 3},
            ("a_ptr", "b_ptr", "c_ptr", "bias_a_ptr", "bias_b_ptr", "h_out", "c_out",
             "gates_out", "n", "stride_a", "stride_b", "stride_c"), rnn_block,
            module=rnn_module, attr="_lstm_forward_kernel"))
        specs.append(_lstm_backward_spec(f"lstm_backward H={hidden} {name}", hidden, p,
                                         dc=p, d_pre="*fp32"))
        specs.append(KernelSpec(
            f"gru_forward H={hidden} {name}",
            {**dict.fromkeys(("a_ptr", "b_ptr", "h_ptr", "bias_a_ptr", "bias_b_ptr", "h_out",
                              "saved_out"), p), **strides, "stride_h": "i32",
             **dict.fromkeys(("H", "O0", "O1", "O2", "HAS_BIAS_A", "HAS_BIAS_B", "BLOCK"),
                             "constexpr")},
            {**gates, "O0": 0, "O1": 1, "O2": 2},
            ("a_ptr", "b_ptr", "h_ptr", "bias_a_ptr", "bias_b_ptr", "h_out", "saved_out", "n",
             "stride_a", "stride_b", "stride_h"), rnn_block,
            module=rnn_module, attr="_gru_forward_kernel"))
        specs.append(_gru_backward_spec(f"gru_backward H={hidden} {name}", hidden, p,
                                        grads="*fp32"))
        if name != "fp32":
            # the sequence ops' calls (fxopt.kernels.fuse_rnn_sequence): the gate gradients
            # and the hidden-state carry in the activations' dtype, the LSTM's cell-state
            # carry in fp32
            specs.append(_lstm_backward_spec(f"lstm_backward[sequence] H={hidden} {name}",
                                             hidden, p, dc="*fp32", d_pre=p))
            specs.append(_gru_backward_spec(f"gru_backward[sequence] H={hidden} {name}",
                                            hidden, p, grads=p))
        specs += linear_cross_entropy_specs(name, vocab)
    return specs


def _lstm_backward_spec(label: str, hidden: int, p: str, dc: str, d_pre: str) -> KernelSpec:
    """The LSTM cell's backward kernel with activations of pointer type ``p``, the incoming
    cell-state gradient ``dc`` and the gate gradients ``d_pre`` (the carry out: fp32)."""
    from fxopt.kernels.fuse_rnn import _BLOCK as rnn_block

    return KernelSpec(
        label,
        {"dh_ptr": p, "dc_ptr": dc, **dict.fromkeys(("gates_ptr", "c_ptr", "c_new_ptr"), p),
         "d_pre_out": d_pre, "dc_prev_out": "*fp32", "n": "i32", "stride_c": "i32",
         **dict.fromkeys(("H", "O0", "O1", "O2", "O3", "BLOCK"), "constexpr")},
        {"H": hidden, "O0": 0, "O1": 1, "O2": 2, "O3": 3, "BLOCK": rnn_block},
        ("dh_ptr", "dc_ptr", "gates_ptr", "c_ptr", "c_new_ptr", "d_pre_out", "dc_prev_out",
         "n", "stride_c"), rnn_block,
        module="fxopt.kernels.fuse_rnn", attr="_lstm_backward_kernel")


def _gru_backward_spec(label: str, hidden: int, p: str, grads: str) -> KernelSpec:
    """The GRU cell's backward kernel with activations of pointer type ``p`` and the three
    gradients it writes (both sides' gate gradients, the hidden-state carry) of ``grads``."""
    from fxopt.kernels.fuse_rnn import _BLOCK as rnn_block

    return KernelSpec(
        label,
        {"dh_ptr": p, "saved_ptr": p, "h_ptr": p, "da_out": grads, "db_out": grads,
         "dh_prev_out": grads, "n": "i32", "stride_h": "i32",
         **dict.fromkeys(("H", "O0", "O1", "O2", "BLOCK"), "constexpr")},
        {"H": hidden, "O0": 0, "O1": 1, "O2": 2, "BLOCK": rnn_block},
        ("dh_ptr", "saved_ptr", "h_ptr", "da_out", "db_out", "dh_prev_out", "n",
         "stride_h"), rnn_block,
        module="fxopt.kernels.fuse_rnn", attr="_gru_backward_kernel")


def linear_cross_entropy_specs(dtype: str, vocab: int, softcap: bool = False
                               ) -> list[KernelSpec]:
    """``fxopt::linear_cross_entropy``'s two block kernels for ``dtype`` logits of ``vocab``
    columns, specialized as the JIT specializes the ops' calls on CUDA: aligned pointers,
    the rows padded to 16 bytes and read up to that span (``ALIGN`` elements of 16 bytes),
    and no integer divisible by 16 where the vocabulary is odd (GPT-2's 50257); with
    ``softcap``, the soft-capped kernels (Gemma 2's)."""
    module = "fxopt.kernels.fuse_linear_cross_entropy_triton"
    align = 16 // DTYPES[dtype].itemsize
    p, block = _ptr(dtype), 1024
    state = {"labels_ptr": "*i64", "m_ptr": "*fp32", "s_ptr": "*fp32", "sumz_ptr": "*fp32",
             "target_ptr": "*fp32"}
    rows = {"labels_ptr": "*i64", "lse_ptr": "*fp32", "scale_ptr": "*fp32"}
    counts = {"cols": "i32", "span_aligns": "i32", "v0": "i32"}
    capped = " softcap" if softcap else ""
    return [
        KernelSpec(f"lce_lse_block V={vocab} {dtype}{capped}",
                   {"z_ptr": p, "z_stride_aligns": "i32", **state, **counts, "softcap": "fp32",
                    "SMOOTH": "constexpr", "SOFTCAP": "constexpr", "ALIGN": "constexpr",
                    "BLOCK": "constexpr"},
                   {"SMOOTH": True, "SOFTCAP": softcap, "ALIGN": align, "BLOCK": block},
                   ("z_ptr", *state), block,
                   module=module, attr="_lse_block_kernel"),
        KernelSpec(f"lce_dlogits_block V={vocab} {dtype}{capped}",
                   {"z_ptr": p, "z_stride_aligns": "i32", "p_ptr": p, "p_stride_aligns": "i32",
                    **rows, **counts, "smooth_each": "fp32", "hit": "fp32", "softcap": "fp32",
                    "SOFTCAP": "constexpr", "ALIGN": "constexpr", "BLOCK": "constexpr"},
                   {"SOFTCAP": softcap, "ALIGN": align, "BLOCK": block},
                   ("z_ptr", "p_ptr", *rows), block,
                   module=module, attr="_dlogits_block_kernel")]


def pointwise_spec(program: Program, layout: Layout, label: str,
                   config: tuple[int, int] | None = None) -> KernelSpec:
    """The generated kernel of ``program`` for ``layout`` at one of the autotuner's
    (BLOCK, num_warps) choices (default: the most elements per thread, the most registers).
    Its minimum traffic counts each output written once and each linearly addressed input
    read once (a broadcast input's reads, mostly served by the cache, are not counted).
    Every pointer and integer argument is specialized as divisible by 16, as the JIT
    specializes a call on aligned tensors whose sizes and strides are multiples of 16. A
    kernel whose tensors are all addressed linearly must compile to one layout (see
    ``codegen.vector_elements``); one that reads or writes by index arithmetic keeps a
    conversion between its scalar gathers and its vector accesses, which is reported."""
    name = "fxopt_aot_pointwise"
    index = "i64" if layout.wide else "i32"
    signature = {f"in{i}": _ptr(_TRITON_TYPE[d]) for i, d in enumerate(program.inputs)}
    signature |= {f"out{k}": _ptr(_TRITON_TYPE[d])
                  for k, d in enumerate(program.output_dtypes)}
    signature["numel"] = index
    if layout.any_strided:
        signature |= {f"size{d}": index for d in range(1, layout.ndim)}
    for prefix, flags in (("in", layout.strided_inputs), ("out", layout.strided_outputs)):
        signature |= {f"{prefix}{i}_s{d}": index for i, s in enumerate(flags) if s
                      for d in range(layout.ndim)}
    signature["BLOCK"] = "constexpr"
    linear = [d for d, s in zip(program.inputs, layout.strided_inputs) if not s]
    linear += list(program.output_dtypes)
    aligned = tuple(n for n in signature if signature[n] != "constexpr")
    block, warps = config or max(autotune_configs(layout), key=lambda c: c[0] / c[1])
    return KernelSpec(f"{label} [{block}/{warps}w]", signature, {"BLOCK": block},
                      aligned, block,
                      source=kernel_source(program, layout, name), attr=name,
                      num_warps=warps,
                      min_bytes_per_element=float(sum(d.itemsize for d in linear)),
                      one_layout=not layout.any_strided)


# ------------------------------------------------------------------ compiling (the child)

_MEMORY = re.compile(r"(@!?%p\d+\s+)?\b(ld|st)\.global((?:\.[\w:]+)*)")
_WIDTH = re.compile(r"^[bufs](\d+)$")


def _global_accesses(ptx: str, masked_only: bool = False) -> tuple[Counter, Counter]:
    """Global load and store instructions in ``ptx`` by access width in bits; with
    ``masked_only``, only the predicated ones (a masked ``tl.load``/``tl.store`` of an
    operand; unmasked loads read lookup tables such as libdevice's sin/cos reduction
    table on a slow path, or the GELU fit's)."""
    counts = {"ld": Counter(), "st": Counter()}
    for predicate, kind, suffix in _MEMORY.findall(ptx):
        if masked_only and not predicate:
            continue
        parts = suffix.strip(".").split(".")
        vector = next((int(p[1:]) for p in parts if p in ("v2", "v4", "v8")), 1)
        bits = next((int(m.group(1)) for p in parts if (m := _WIDTH.match(p))), 0)
        counts[kind][vector * bits] += 1
    return counts["ld"], counts["st"]


def _nvidia_tool(name: str, arch: int) -> str:
    """The path of a CUDA tool shipped with Triton (its ptxas differs per arch on 3.9)."""
    from triton import knobs
    from triton.backends.nvidia import compiler

    if name == "ptxas":
        try:
            return compiler.get_ptxas(arch).path
        except TypeError:  # Triton before 3.9: one ptxas for every arch
            return compiler.get_ptxas().path
    return getattr(knobs.nvidia, name).path


def _resource_usage(ptx: str, cubin: bytes, arch: int) -> tuple[int, int]:
    """(registers per thread from cuobjdump of Triton's cubin, spill bytes stored + loaded
    from ``ptxas -v`` on the same PTX)."""
    target = re.search(r"^\.target\s+(\w+)", ptx, re.MULTILINE).group(1)
    with tempfile.TemporaryDirectory() as folder:
        source, binary = os.path.join(folder, "k.ptx"), os.path.join(folder, "k.cubin")
        with open(source, "w") as f:
            f.write(ptx)
        with open(binary, "wb") as f:
            f.write(cubin)
        verbose = subprocess.run([_nvidia_tool("ptxas", arch), "-v", f"--gpu-name={target}",
                                  source, "-o", os.path.join(folder, "v.cubin")],
                                 capture_output=True, text=True, check=True)
        usage = subprocess.run([_nvidia_tool("cuobjdump", arch), "--dump-resource-usage",
                                binary], capture_output=True, text=True, check=True).stdout
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)",
                                            verbose.stdout + verbose.stderr))
    return int(re.search(r"REG:(\d+)", usage).group(1)), spills


def _jit_function(spec: KernelSpec) -> Any:
    import importlib
    import linecache

    import triton
    import triton.language as tl

    if spec.module:
        return getattr(importlib.import_module(spec.module), spec.attr)
    namespace: dict[str, Any] = {"triton": triton, "tl": tl}
    filename = f"<{spec.attr}>"
    linecache.cache[filename] = (len(spec.source), None, spec.source.splitlines(True), filename)
    exec(compile(spec.source, filename, "exec"), namespace)  # noqa: S102 (fxopt's own codegen)
    return namespace[spec.attr]


def compile_one(spec: KernelSpec, arch: int) -> KernelReport:
    """Compile ``spec`` for ``sm_<arch>`` in this process (which must not interpret)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    report = KernelReport(spec.label, arch, min_bytes_per_element=spec.min_bytes_per_element,
                          one_layout=spec.one_layout)
    try:
        fn = _jit_function(spec)
        names = list(spec.signature)
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in spec.aligned}
        kernel = triton.compile(
            ASTSource(fn=fn, signature=spec.signature, constexprs=spec.constexprs,
                      attrs=attrs),
            target=GPUTarget("cuda", arch, 32), options={"num_warps": spec.num_warps})
        ptx = kernel.asm["ptx"]
        report.registers, report.spill_bytes = _resource_usage(ptx, kernel.asm["cubin"], arch)
    except Exception as error:  # noqa: BLE001 (reported per kernel; the check fails on it)
        report.error = f"{type(error).__name__}: {str(error).strip().splitlines()[-1]}"
        return report
    report.shared_bytes = kernel.metadata.shared
    report.layout_conversions = kernel.asm["ttgir"].count("ttg.convert_layout")
    loads, stores = _global_accesses(ptx)
    report.loads, report.stores = dict(loads), dict(stores)
    threads = spec.num_warps * 32
    masked_loads, masked_stores = _global_accesses(ptx, masked_only=True)
    issued_bits = sum(w * n for w, n in (masked_loads + masked_stores).items())
    report.operand_widths = sorted(set(masked_loads) | set(masked_stores))
    report.bytes_per_element = issued_bits / 8 * threads / spec.elements_per_program
    return report


def compile_specs(specs: list[KernelSpec], archs: tuple[int, ...] = ARCHS,
                  timeout: float = 1800, triton_path: str | None = None) -> list[KernelReport]:
    """Compile every spec for every arch (see :func:`compile_jobs`)."""
    return compile_jobs([(s, a) for s in specs for a in archs], timeout, triton_path)


def compile_jobs(jobs: list[tuple[KernelSpec, int]], timeout: float = 1800,
                 triton_path: str | None = None) -> list[KernelReport]:
    """Compile each (spec, arch) in one child process without Triton's interpreter; with
    ``triton_path``, a folder holding another Triton (``pip install --target``), with that
    one (fxopt supports Triton 3.6 and later: the oldest is checked this way)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, said aloud
    if triton_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (triton_path, env.get("PYTHONPATH"))
                                            if p)
    payload = json.dumps([{"spec": asdict(s), "arch": a} for s, a in jobs])
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    result = subprocess.run([sys.executable, "-m", "fxopt.kernels.aot"], input=payload, check=False,
                            capture_output=True, text=True, env=env, timeout=timeout,
                            cwd=package_root)  # this fxopt, not another one installed
    if result.returncode:
        raise RuntimeError(f"fxopt AOT compile child failed:\n{result.stderr[-4000:]}")
    reports = []
    for row in json.loads(result.stdout):
        row["loads"] = {int(k): v for k, v in row["loads"].items()}
        row["stores"] = {int(k): v for k, v in row["stores"].items()}
        reports.append(KernelReport(**row))
    return reports


# ------------------------------------------------------------------ judging and printing

def problems(report: KernelReport) -> list[str]:
    """Why ``report`` fails the check: a compile error, any spill, too many registers."""
    if report.error:
        return [f"{report.label} sm_{report.arch}: does not compile: {report.error}"]
    found = []
    if report.spill_bytes:
        found.append(f"{report.label} sm_{report.arch}: spills {report.spill_bytes} bytes")
    if report.registers > MAX_REGISTERS:
        found.append(f"{report.label} sm_{report.arch}: {report.registers} registers")
    if report.one_layout and report.layout_conversions:
        found.append(f"{report.label} sm_{report.arch}: {report.layout_conversions} layout "
                     "conversions (its tensors should share one layout)")
    return found


def _widths(counts: dict[int, int]) -> str:
    return " ".join(f"{n}x{w}" for w, n in sorted(counts.items(), reverse=True)) or "-"


def format_table(reports: list[KernelReport]) -> str:
    """One line per kernel and arch: registers, spills, shared memory, global accesses by
    width (``count x bits``), issued bytes per element against the minimum, layout
    conversions left in the TTGIR."""
    header = (f"{'kernel':<56} {'arch':>5} {'regs':>4} {'spill':>5} {'smem':>6}  "
              f"{'loads (n x bits)':<24} {'stores (n x bits)':<18} {'B/elem':>7} {'min':>5} "
              f"{'conv':>4}")
    lines = [header, "-" * len(header)]
    for r in reports:
        if r.error:
            lines.append(f"{r.label:<56} {'sm_' + str(r.arch):>5} ERROR {r.error[:80]}")
            continue
        minimum = "" if r.min_bytes_per_element is None else f"{r.min_bytes_per_element:.0f}"
        lines.append(f"{r.label:<56} {'sm_' + str(r.arch):>5} {r.registers:>4} "
                     f"{r.spill_bytes:>5} {r.shared_bytes:>6}  {_widths(r.loads):<24} "
                     f"{_widths(r.stores):<18} {r.bytes_per_element:>7.2f} {minimum:>5} "
                     f"{r.layout_conversions:>4}")
    return "\n".join(lines)


def _main() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise SystemExit("fxopt.kernels.aot compiles for CUDA: run it without TRITON_INTERPRET")
    reports = [compile_one(KernelSpec(**job["spec"]), job["arch"])
               for job in json.load(sys.stdin)]
    json.dump([asdict(r) for r in reports], sys.stdout)


if __name__ == "__main__":
    _main()
