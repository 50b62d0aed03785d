"""Every Triton kernel fxopt emits, compiled ahead of time for sm_80 and sm_90 with no GPU
(fxopt.kernels.aot), and the memory traffic of the generated pointwise kernels.

Kernels: the handwritten tempo GELU and LSTM/GRU cell kernels in fp32, bf16 and fp16; the
pointwise kernels fuse_elementwise generates for a corpus: one training step of each
benchmark workload's smoke model (GPT-2, BERT, Llama-style, ResNet, LSTM LM) in fp32 and
in bf16, and random regions drawn from the property test's generator
(tests/**/test_fuse_elementwise_property.py). The corpus is collected on the CPU under
Triton's interpreter, then every kernel is compiled for CUDA in a child process.

Table 1: registers per thread, spill bytes, shared memory, global loads and stores by
width (``count x bits``, from the PTX) and bytes issued per element. Table 2, generated
kernels only: bytes issued per element against the region's minimum (each linearly
addressed input read once, each output written once; a broadcast input's per-element
reads, which its cache mostly serves, are listed apart) and whether every access of the contiguous
fp32/bf16/fp16 kernels is 128 bits wide. Exits 1 on a compile error, a spill, more than
255 registers, or a generated kernel above 1.05x its minimum.

    TRITON_INTERPRET=1 python benchmarks/aot_kernels.py > benchmarks/results/aot_kernels.txt
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

import torch

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT]

import fxopt  # noqa: E402 - from this checkout (the path above), not an installed copy
from fxopt.kernels import aot  # noqa: E402
from fxopt.kernels.pointwise import codegen  # noqa: E402
from fxopt.kernels.pointwise.codegen import autotune_configs  # noqa: E402

_VECTOR_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _workload_step(name: str, dtype: torch.dtype) -> None:
    from fxopt.bench.workloads import WORKLOADS
    from fxopt.profile import default_loss

    workload = WORKLOADS[name]
    torch.manual_seed(0)
    model = workload.build(True).to(dtype)
    inputs = workload.inputs(model, workload.smoke_batch, True, torch.device("cpu"))
    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype) if t.is_floating_point() else t

    compiled = torch.compile(model, backend=fxopt.backend(fuse_elementwise=True))
    if isinstance(inputs, dict):
        output = compiled(**{k: cast(v) for k, v in inputs.items()})
    else:
        output = compiled(*map(cast, inputs))
    default_loss(output).float().backward()


def _property_generator():
    """The property test's module (found by its unique basename, wherever tests live)."""
    path, = glob.glob(os.path.join(_ROOT, "tests", "**", "test_fuse_elementwise_property.py"),
                      recursive=True)
    spec = importlib.util.spec_from_file_location("fuse_property", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def collect_corpus(workloads: list[str], random_regions: int, seed: int) -> list[tuple]:
    """(program, layout, origin) of every kernel the corpus makes fuse_elementwise emit."""
    corpus = []

    def take(origin: str) -> None:
        for key in codegen.cached_programs():
            if key not in {c[:2] for c in corpus}:
                corpus.append((*key, origin))

    for name in workloads:
        for dtype in (torch.float32, torch.bfloat16):
            torch._dynamo.reset()
            _workload_step(name, dtype)
            take(f"{name} {str(dtype)[6:]}")
    module, rng = _property_generator(), random.Random(seed)
    for index in range(random_regions):
        torch._dynamo.reset()
        _random_region(module, rng)
        take(f"random #{index}")
    return corpus


def _dtypes(program) -> str:
    names = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16",
             torch.bool: "b", torch.int64: "i64", torch.float64: "f64"}
    ins = ",".join(names.get(d, str(d)[6:]) for d in program.inputs)
    outs = ",".join(names.get(d, str(d)[6:]) for d in program.output_dtypes)
    return f"{ins}->{outs}"


def traffic_table(reports, corpus_by_label) -> tuple[str, list[str]]:
    header = (f"{'kernel':<46} {'arch':>5} {'dtypes':<30} {'layout':<9} {'B/elem':>7} "
              f"{'min':>5} {'bcast':>5} {'ratio':>6} {'all 128-bit':>11}")
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
        wide = r.operand_widths == [128]
        vector = ("yes" if wide else "NO") if contiguous else "n/a"
        lines.append(f"{r.label:<46} {'sm_' + str(r.arch):>5} {_dtypes(program):<30} "
                     f"{'strided' if layout.any_strided else 'linear':<9} "
                     f"{r.bytes_per_element:>7.2f} {r.min_bytes_per_element:>5.0f} "
                     f"{broadcast:>5} {ratio:>6.2f} {vector:>11}")
        if ratio > 1.05 or vector == "NO":
            failures.append(f"{r.label} sm_{r.arch}: {r.bytes_per_element:.2f} B/elem for a "
                            f"minimum of {bound:.0f}, 128-bit: {vector}")
    return "\n".join(lines), failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=["gpt2-small", "bert-base",
                                                           "llama-style", "resnet50",
                                                           "lstm-lm"])
    parser.add_argument("--random-regions", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1: the corpus is collected on the CPU")
    import triton

    print(f"# {' '.join(sys.argv)}\n# torch {torch.__version__}, triton {triton.__version__},"
          f" {platform.machine()}, no GPU; archs {', '.join(f'sm_{a}' for a in aot.ARCHS)}")
    start = time.perf_counter()
    corpus = collect_corpus(args.workloads, args.random_regions, args.seed)
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
    print(f"# {len(specs)} kernels ({len(corpus)} generated) x {len(aot.ARCHS)} archs; corpus "
          f"{collected:.0f} s, compile {time.perf_counter() - start - collected:.0f} s\n")
    print(aot.format_table(reports))
    table, failures = traffic_table(reports, corpus_by_label)
    print("\nGenerated kernels: bytes issued per element vs the minimum (min: linear inputs"
          " read once, outputs written once; bcast: broadcast inputs' per-element reads)\n")
    print(table)
    failures = [p for r in reports for p in aot.problems(r)] + failures
    print(f"\n{len(failures)} problem(s)" + "".join(f"\n  {f}" for f in failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
