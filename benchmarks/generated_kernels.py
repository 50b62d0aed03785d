"""What Inductor would launch on a GPU for GPT-2's step, per configuration, read on the CPU.

Inductor generates Triton (its CUDA code generator) for the step's graphs while the step
runs uncompiled (:mod:`fxopt.analysis.generated_kernels`), so the kernels, their launches,
Inductor's own byte estimates and their gathers are counted exactly without a GPU. Per
block figures are the difference of the model at 2 layers and at 1 (the embedding, final
norm, head and loss cancel); "rest" is the 1-layer model less one block.

Model: transformers GPT-2 at the GPU table's width (hidden 768, 12 heads, seq 1024,
batch 8, vocabulary 50257), SDPA, bf16 autocast, residual and embedding dropout 0.1, its
own loss, transformers' logging break left in. Attention dropout is 0: the CPU's SDPA
kernel takes none (with it, SDPA is decomposed into generated kernels), while on CUDA the
flash/cuDNN kernel draws it inside, so both call one extern kernel.

The predicted column prices each generated kernel launch at max(bytes / bandwidth,
launch latency) with the H200 profile (``fxopt.planner.hardware.KNOWN_GPUS``): the
elementwise and reduction part of the step, not its GEMMs or attention.

Rows: plain torch.compile, fxopt's defaults, tempo, the fraction budget against Inductor's
own activation_memory_budget (issue 29.4's GPU bar compares those two), and with
transformers' logging break ignored plain torch.compile against the fused loss with
fxopt.drop_logits (issue 29.3's). The fused loss's op is one call to fxopt's own op
(Triton kernels on CUDA, priced by ``fxopt.planner.forms.linear_cross_entropy_work``), so
its row counts what Inductor generates around it.

Usage:
    PYTHONPATH=. python benchmarks/generated_kernels.py [--hidden 768 --seq 1024 --batch 8]
        [--out benchmarks/results/generated_kernels_cpu.md]
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import fxopt
from fxopt import _compat
from fxopt.analysis.generated_kernels import GeneratedCode, generated_code
from fxopt.bench import workloads
from fxopt.planner import forms
from fxopt.planner.hardware import KNOWN_GPUS


@dataclass(frozen=True)
class Config:
    """A row: fxopt's options (None: plain torch.compile), a context around the step (the
    logging break ignored, Inductor's activation budget), the model wrapped by
    :func:`fxopt.drop_logits` or not."""

    options: dict | None = None
    context: Callable[[], Any] = contextlib.nullcontext
    drop_logits: bool = False


UNBROKEN = fxopt.ignore_transformers_logging
CONFIGS = {
    "torch.compile": Config(),
    "fxopt defaults (Inductor)": Config({"codegen": "inductor"}),
    "fxopt tempo=True": Config({"codegen": "inductor", "tempo": True}),
    "fxopt memory_budget=0.5": Config({"codegen": "inductor", "memory_budget": 0.5}),
    "Inductor activation_memory_budget=0.5": Config(
        context=lambda: _compat.activation_memory_budget(0.5)),
    # issue 29.3's bar compares these: the head and the loss in one graph
    "torch.compile, logging break ignored": Config(context=UNBROKEN),
    "fxopt fuse_linear_cross_entropy=True, drop_logits, logging break ignored": Config(
        {"codegen": "inductor", "fuse_linear_cross_entropy": True}, UNBROKEN, True),
}


def gpt2(layers: int, hidden: int, seq: int, batch: int, vocab: int):
    """The GPU check's GPT-2 (``fxopt.bench.workloads.gpt2``, dropout 0.1) in training mode,
    its attention dropout off (the module doc), and its input ids."""
    torch.manual_seed(0)
    model = workloads.gpt2(layers, hidden, max(1, hidden // 64), vocab, seq).train()
    for module in model.modules():
        if hasattr(module, "attn_dropout"):
            module.attn_dropout.p = 0.0
    ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids, "labels": ids}


def step_code(config: Config, layers: int, size: dict) -> list[GeneratedCode]:
    torch._dynamo.reset()
    model, kwargs = gpt2(layers, **size)
    if config.drop_logits:
        model = fxopt.drop_logits(model)
    backend = (_compat.inductor_backend if config.options is None
               else fxopt.backend(**config.options))
    compiled = torch.compile(model, backend=backend)

    def step() -> None:
        with config.context(), torch.autocast("cpu", torch.bfloat16):
            loss = compiled(**kwargs).loss
        loss.backward()

    return generated_code(step)


class Totals:
    """One model's generated code summed, forward graphs and backward graphs apart."""

    def __init__(self, codes: list[GeneratedCode]):
        self.parts = {"forward": [code for code in codes if not code.backward],
                      "backward": [code for code in codes if code.backward]}

    def sum(self, part: str, what: str) -> float:
        return sum(getattr(code, what) for code in self.parts[part])

    def calls(self, part: str) -> Counter[str]:
        total: Counter[str] = Counter()
        for code in self.parts[part]:
            total.update(code.extern_calls)
            total.update(code.fallback_calls)
        return total

    def seconds(self, part: str) -> float:
        """The generated kernels' device time on the H200 profile, priced as the cost model
        prices a chain of kernels: each launch at least the launch latency."""
        hw = KNOWN_GPUS["H200"]
        work = forms.Work(chain=[(k.launches, k.bytes / hw.memory_bandwidth)
                                 for code in self.parts[part] for k in code.kernels])
        return forms.predict(work, hw).device_s


def _calls(counter: Counter[str]) -> str:
    return ", ".join(f"{name} {count:g}" for name, count in sorted(counter.items())
                     if count) or "-"


def rows(name: str, one: Totals, two: Totals) -> list[str]:
    lines = []
    for part in ("forward", "backward"):
        block = {what: two.sum(part, what) - one.sum(part, what)
                 for what in ("launches", "bytes", "indirect_loads")}
        rest = {what: one.sum(part, what) - block[what] for what in block}
        one_layer = one.calls(part)
        calls = two.calls(part)
        calls.subtract(one_layer)
        block_ms = (two.seconds(part) - one.seconds(part)) * 1e3
        lines.append(
            f"| {name} | {part} | {block['launches']:.0f} | {block['bytes'] / 2**20:.0f} "
            f"| {block['indirect_loads']:.0f} | {_calls(calls)} | {block_ms:.3f} "
            f"| {rest['launches']:.0f} | {rest['bytes'] / 2**20:.0f} "
            f"| {_calls(one_layer - calls)} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS),
                        metavar="CONFIG", help="rows, by name (default: all)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    size = dict(hidden=args.hidden, seq=args.seq, batch=args.batch, vocab=args.vocab)
    command = "PYTHONPATH=. python benchmarks/generated_kernels.py " + shlex.join(
        argv if argv is not None else sys.argv[1:])
    lines = [
        "# Inductor's generated kernels for GPT-2's training step, read on the CPU",
        "",
        f"Command: `{command}`; torch {torch.__version__}. GPT-2 {size}, SDPA, bf16 "
        "autocast, dropout 0.1 (attention's 0), its own loss, the logging break left in.",
        "Per block: the model at 2 layers less at 1. Launches and bytes of the kernels "
        "Inductor generates (GEMMs and attention are extern calls, listed apart); "
        "gathers: indirect loads; H200 ms: each launch at max(bytes / bandwidth, launch "
        "latency), the H200 profile.",
        "",
        "| configuration | pass | launches / block | MiB / block | gathers / block "
        "| extern and fallback calls / block | H200 ms / block | launches, rest "
        "| MiB, rest | calls, rest |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |",
    ]
    for name in args.configs:
        one, two = (Totals(step_code(CONFIGS[name], layers, size)) for layers in (1, 2))
        lines += rows(name, one, two)
        print("\n".join(lines[-2:]), flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
