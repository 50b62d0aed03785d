"""Every Triton kernel fxopt emits, compiled ahead of time for sm_80 and sm_90 with no GPU
(fxopt.kernels.aot), and the memory traffic of the generated pointwise kernels.

Kernels: the handwritten tempo GELU and LSTM/GRU cell kernels in fp32, bf16 and fp16; the
pointwise kernels fuse_elementwise generates for a corpus: one training step of each
benchmark workload's smoke model (GPT-2 with its tanh GELU, BERT, Llama-style, ResNet, LSTM
LM) on the CPU graph (fp32, the model cast to bf16, fp32 under CPU bf16 autocast) and on
the CUDA graph traced on fake CUDA tensors (fp32, fp32 under CUDA bf16 autocast:
tests/kernels/fake_cuda_regions.py), and random regions drawn from the property test's
generator (tests/**/test_fuse_elementwise_property.py). The corpus is collected on the CPU
under Triton's interpreter, then every kernel is compiled for CUDA in a child process, with
every pointer and integer argument specialized as divisible by 16.

Table 1: registers per thread, spill bytes, shared memory, global loads and stores by
width (``count x bits``, from the PTX), bytes issued per element and the layout
conversions left in the TTGIR. Table 2, generated kernels only: bytes issued per element
against the region's minimum (each linearly addressed input read once, each output written
once; a broadcast input's per-element reads, which its cache mostly serves, are listed
apart) and whether every access of the contiguous fp32/bf16/fp16 kernels is as wide as the
kernel's one layout allows. Exits 1 on a compile error, a spill, more than 255 registers,
a layout conversion in a generated kernel (Triton 3.6 miscompiled one: h100-2026-11-26.md),
a generated kernel above 1.05x its minimum or with a narrower access.

    pip install --no-deps --target /tmp/triton36 triton==3.6.0   # the oldest supported
    TRITON_INTERPRET=1 python benchmarks/aot_kernels.py --also-triton /tmp/triton36 \
        > benchmarks/results/aot_kernels.txt
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import importlib.util
import os
import platform
import random
import sys
import time
from typing import Any

import torch

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT]

import fxopt  # noqa: E402 - from this checkout (the path above), not an installed copy
from fxopt.kernels import aot  # noqa: E402
from fxopt.kernels.fuse_elementwise import triton_source  # noqa: E402
from fxopt.kernels.fuse_elementwise.triton_source import autotune_configs, vector_elements  # noqa: E402

_VECTOR_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# how each workload's step is captured: the CPU graph of a real step (fp32, the model cast
# to bf16, fp32 under CPU bf16 autocast) and the CUDA graph traced on fake CUDA tensors
# (fp32, fp32 under CUDA bf16 autocast: tests/kernels/fake_cuda_regions.py)
SETTINGS = ("cpu fp32", "cpu bf16", "cpu autocast-bf16", "cuda fp32", "cuda autocast-bf16")


def _model_and_inputs(name: str, dtype: torch.dtype) -> tuple[torch.nn.Module, Any]:
    from fxopt.bench.workloads import WORKLOADS

    workload = WORKLOADS[name]
    torch.manual_seed(0)
    model = workload.build(True).to(dtype)
    inputs = workload.inputs(model, workload.smoke_batch, True, torch.device("cpu"))

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype) if t.is_floating_point() else t

    if isinstance(inputs, dict):
        return model, {k: cast(v) for k, v in inputs.items()}
    return model, tuple(map(cast, inputs))


def _call(compiled: Any, inputs: Any) -> Any:
    return compiled(**inputs) if isinstance(inputs, dict) else compiled(*inputs)


def _workload_step(name: str, setting: str) -> list[str]:
    """Run (CPU) or capture (CUDA) one training step of the workload's smoke model; the
    kernels it generates land in the generator's cache. Returns the graphs skipped."""
    from fxopt.profile import default_loss

    device, kind = setting.split()
    model, inputs = _model_and_inputs(name, torch.bfloat16 if kind == "bf16" else torch.float32)
    autocast = torch.bfloat16 if kind == "autocast-bf16" else None
    if device == "cuda":
        def run(backend: Any) -> None:
            with torch.autocast("cpu", torch.bfloat16, enabled=autocast is not None):
                _call(torch.compile(model, backend=backend), inputs)

        return _fake_cuda().cuda_regions(run, autocast)[1]
    compiled = torch.compile(model, backend=fxopt.backend(fuse_elementwise=True))
    with torch.autocast("cpu", torch.bfloat16, enabled=autocast is not None):
        output = _call(compiled, inputs)
        loss = default_loss(output).float()
    loss.backward()
    return []


def _test_module(basename: str, name: str):
    """A module of the test suite (found by its unique basename, wherever tests live)."""
    path, = glob.glob(os.path.join(_ROOT, "tests", "**", basename), recursive=True)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_cuda():
    return _test_module("fake_cuda_regions.py", "fake_cuda_regions")


def _property_generator():
    """The property test's module, whose ``dags`` strategy draws the random regions."""
    return _test_module("test_fuse_elementwise_property.py", "fuse_property")


def _random_region(module, rng: random.Random) -> None:
    """One DAG drawn as the property test's ``dags`` strategy draws it, run fwd + bwd."""
    inputs = [(rng.choice(module.SHAPES[1:]) if i else module.SHAPES[0],
               rng.choice(module.DTYPES)) for i in range(rng.randint(2, 3))]
    steps = []
    for n in range(rng.randint(3, 6)):
        available = len(inputs) + n
        if rng.random() < 0.5:
            steps.append((rng.randrange(len(module.UNARY)), rng.randrange(available)))
        else:
            steps.append((rng.randrange(len(module.BINARY)), rng.randrange(available),
                          rng.randrange(available)))
    extra = rng.randrange(len(inputs) + len(steps))
    args = [torch.randn(shape).to(dtype).requires_grad_() for shape, dtype in inputs]
    compiled = torch.compile(module.build(steps, extra),
                             backend=fxopt.backend(fuse_elementwise=True))
    sum(o.float().sum() for o in compiled(*args)).backward()


def collect_corpus(workloads: list[str], random_regions: int, seed: int
                   ) -> tuple[list[tuple], list[str]]:
    """(program, layout, origin) of every kernel the corpus makes fuse_elementwise emit,
    and the CUDA graphs that could not be captured."""
    corpus, skipped = [], []

    def take(origin: str) -> None:
        for key in triton_source.cached_programs():
            if key not in {c[:2] for c in corpus}:
                corpus.append((*key, origin))

    for name in workloads:
        for setting in SETTINGS:
            torch._dynamo.reset()
            skipped += [f"{name} {setting} {g}" for g in _workload_step(name, setting)]
            take(f"{name} {setting}")
    module, rng = _property_generator(), random.Random(seed)
    for index in range(random_regions):
        torch._dynamo.reset()
        _random_region(module, rng)
        take(f"random #{index}")
    return corpus, skipped


def _dtypes(program) -> str:
    names = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16",
             torch.bool: "b", torch.int64: "i64", torch.float64: "f64"}
    ins = ",".join(names.get(d, str(d)[6:]) for d in program.inputs)
    outs = ",".join(names.get(d, str(d)[6:]) for d in program.output_dtypes)
    return f"{ins}->{outs}"


def traffic_table(reports, corpus_by_label) -> tuple[str, list[str]]:
    header = (f"{'kernel':<56} {'arch':>5} {'dtypes':<30} {'layout':<9} {'B/elem':>7} "
              f"{'min':>5} {'bcast':>5} {'ratio':>6} {'widths':>7} {'full':>4}")
    lines, failures = [header, "-" * len(header)], []
    for r in reports:
        region = r.label.rsplit(" [", 1)[0]  # less the [BLOCK/warps] suffix
        if region not in corpus_by_label or r.error:
            continue
        program, layout, _ = corpus_by_label[region]
        broadcast = sum(d.itemsize for d, s in zip(program.inputs, layout.strided_inputs) if s)
        bound = r.min_bytes_per_element + broadcast
        ratio = r.bytes_per_element / bound
        contiguous = not layout.any_strided and all(
            d in _VECTOR_DTYPES for d in (*program.inputs, *program.output_dtypes))
        # every access as wide as the kernel's one layout allows: 16 bytes of its widest
        # dtype, so a narrower dtype beside a wider one moves less than 128 bits
        vector = vector_elements(program, layout) or 0
        expected = sorted({vector * d.itemsize * 8
                           for d in (*program.inputs, *program.output_dtypes)})
        full = ("yes" if r.operand_widths == expected else "NO") if contiguous else "n/a"
        widths = ",".join(map(str, r.operand_widths))
        lines.append(f"{r.label:<56} {'sm_' + str(r.arch):>5} {_dtypes(program):<30} "
                     f"{'strided' if layout.any_strided else 'linear':<9} "
                     f"{r.bytes_per_element:>7.2f} {r.min_bytes_per_element:>5.0f} "
                     f"{broadcast:>5} {ratio:>6.2f} {widths:>7} {full:>4}")
        if ratio > 1.05 or full == "NO":
            failures.append(f"{r.label} sm_{r.arch}: {r.bytes_per_element:.2f} B/elem for a "
                            f"minimum of {bound:.0f}, access widths {widths} bits, expected "
                            f"{expected}")
    return "\n".join(lines), failures


def _compile_again(specs: list[aot.KernelSpec], triton_path: str) -> list[str]:
    """Every kernel compiled again with another Triton; its problems, labelled with it."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (triton_path, os.environ.get("PYTHONPATH")) if p)}
    version = subprocess.run([sys.executable, "-c", "import triton; print(triton.__version__)"],
                             env=env, capture_output=True, text=True, check=True).stdout.strip()
    start = time.perf_counter()
    reports = aot.compile_specs(specs, triton_path=triton_path)
    found = [f"triton {version}: {p}" for r in reports for p in aot.problems(r)]
    conversions = sum(r.layout_conversions for r in reports if r.one_layout)
    print(f"\nThe same {len(specs)} kernels x {len(aot.ARCHS)} archs compiled with triton "
          f"{version} ({time.perf_counter() - start:.0f} s): {sum(bool(r.error) for r in reports)}"
          f" compile errors, {conversions} layout conversions in generated kernels, "
          f"{len(found)} problem(s)")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=["gpt2-small", "bert-base",
                                                           "llama-style", "resnet50",
                                                           "lstm-lm"])
    parser.add_argument("--random-regions", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--also-triton", metavar="DIR",
                        help="compile every kernel again with the Triton installed in DIR "
                             "(pip install --target DIR triton==3.6.0: the oldest supported)")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1: the corpus is collected on the CPU")
    import triton

    print(f"# {' '.join(sys.argv)}\n# torch {torch.__version__}, triton {triton.__version__},"
          f" {platform.machine()}, no GPU; archs {', '.join(f'sm_{a}' for a in aot.ARCHS)}")
    start = time.perf_counter()
    corpus, skipped = collect_corpus(args.workloads, args.random_regions, args.seed)
    corpus_by_label = {f"pw{i} {entry[2]}": entry for i, entry in enumerate(corpus)}
    specs = aot.handwritten_specs()
    # every autotuner choice of each generated kernel, and of its int64-offset variant
    # (more than 2**31 elements: every choice of a strided layout, the one with the most
    # elements per thread of a linear layout)
    for label, (p, layout, _) in list(corpus_by_label.items()):
        specs += [aot.pointwise_spec(p, layout, label, c) for c in autotune_configs(layout)]
        wide = dataclasses.replace(layout, wide=True)
        corpus_by_label[f"{label} int64"] = (p, wide, "")
        configs = autotune_configs(wide) if layout.any_strided else (None,)
        specs += [aot.pointwise_spec(p, wide, f"{label} int64", c) for c in configs]
    collected = time.perf_counter() - start
    reports = aot.compile_specs(specs)
    origins = sorted({entry[2].split(" #")[0] for entry in corpus if entry[2]})
    print(f"# {len(specs)} kernels ({len(corpus)} generated) x {len(aot.ARCHS)} archs; corpus "
          f"{collected:.0f} s, compile {time.perf_counter() - start - collected:.0f} s")
    print(f"# corpus: {', '.join(args.workloads)} x {', '.join(SETTINGS)}, "
          f"{args.random_regions} random regions; {len(origins)} origins gave a new kernel")
    print("# CUDA graphs not captured: " + ("; ".join(skipped) or "none") + "\n")
    print(aot.format_table(reports))
    table, failures = traffic_table(reports, corpus_by_label)
    print("\nGenerated kernels: bytes issued per element vs the minimum (min: linear inputs"
          " read once, outputs written once; bcast: broadcast inputs' per-element reads);"
          " widths: bits per operand access, full: each as wide as the kernel's one layout"
          " allows (16 bytes of its widest dtype)\n")
    print(table)
    failures = [p for r in reports for p in aot.problems(r)] + failures
    if args.also_triton:
        failures += _compile_again(specs, args.also_triton)
    print(f"\n{len(failures)} problem(s)" + "".join(f"\n  {f}" for f in failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
