"""fxopt.drop_logits on transformers GPT-2, Llama, Cohere, Gemma 2 or BART compiled as users
compile them (``torch.compile(model)``, the step ``model(ids, labels=ids).loss.backward()``):
the step's measured peak and time with the logits returned and dropped, under plain Inductor
and under fxopt with the fused loss, in one process.

Each configuration compiles its own copy of the model (``model.loss_type = "ForCausalLM"``,
the loss transformers falls back to, so GPT-2 has no logging graph break); fp32, one thread.
Peak: ``fxopt.profile_memory`` (every allocation, exact on the CPU), in the two ways users
write the step: ``model(...).loss.backward()`` drops the output once the loss is taken, so
the logits a step returns die before the backward; ``out = model(...)`` then
``out.loss.backward()`` holds them through it ("output held"). Time:
``fxopt.bench.timing.interleaved``, the configurations stepped in turn, median and min-max.

    PYTHONPATH=. python benchmarks/drop_logits.py [--model gpt2] [--batch 4] [--seq 128]
        [--steps 7] [--codegen inductor]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import torch
from torch import nn

import fxopt
from fxopt.bench.timing import interleaved
from fxopt.units import format_mib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fuse_linear_cross_entropy import build  # noqa: E402

CONFIGS = ("inductor", "inductor, drop_logits", "fxopt fused loss",
           "fxopt fused loss, drop_logits")


def _compiled(config: str, model: nn.Module, codegen: str) -> nn.Module:
    if "drop_logits" in config:
        model = fxopt.drop_logits(model)
    if config.startswith("inductor"):
        return torch.compile(model)
    return torch.compile(model, backend="fxopt", options={
        "fuse_linear_cross_entropy": True, "codegen": codegen, "strict": True})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2", choices=["gpt2", "llama", "cohere", "gemma2",
                                                               "bart"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--codegen", default="inductor", choices=["fx", "inductor"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    ids = torch.randint(0, 32000, (args.batch, args.seq),
                        generator=torch.Generator().manual_seed(1))
    peaks, held, steps = {}, {}, {}
    for config in CONFIGS:
        model = build(args.model, args.seq)
        model.loss_type = "ForCausalLM"
        compiled = _compiled(config, model, args.codegen)
        peaks[config] = fxopt.profile_memory(
            compiled, {"input_ids": ids, "labels": ids}, steps=1,
            loss_fn=lambda out: out.loss).peak_bytes
        outputs: list = []
        held[config] = fxopt.profile_memory(
            compiled, {"input_ids": ids, "labels": ids}, steps=1,
            loss_fn=lambda out, outputs=outputs: (outputs.append(out), out.loss)[1]
        ).peak_bytes
        outputs.clear()
        steps[config] = functools.partial(_step, model, compiled, ids)
    times = interleaved(steps, "cpu", warmup=1, rounds=args.steps)
    print(f"# {args.model}, batch {args.batch} x seq {args.seq}, fxopt codegen {args.codegen}, "
          f"1 thread, {args.steps} interleaved steps, torch {torch.__version__}")
    print("| configuration | measured peak MiB | / inductor's | peak MiB, output held | "
          "/ inductor's | step ms median (min-max) | / inductor's |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for config in CONFIGS:
        print(f"| {config} | {format_mib(peaks[config])} | "
              f"{peaks[config] / peaks['inductor']:.2f} | {format_mib(held[config])} | "
              f"{held[config] / held['inductor']:.2f} | {times[config].text(1)} | "
              f"{times[config].median_ms / times['inductor'].median_ms:.2f} |")


def _step(model: nn.Module, compiled, ids: torch.Tensor) -> None:
    compiled(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
