"""Benchmark behind codegen="auto" without a memory budget: fx vs Inductor code generation
on the CPU (under a fraction budget see benchmarks/budget_frontier.py).

For transformers' GPT-2, BERT and Llama (training mode, dropout on) it measures, per
configuration, the training step time (forward + backward) and the compile time:

- ``fxopt-fx``: fxopt with ``codegen="fx"`` (strict, so a fallback would fail the run);
- ``fxopt-inductor``: fxopt with ``codegen="inductor"`` (strict);
- ``torch.compile``: plain ``torch.compile`` (Inductor);
- ``eager``: for reference.

Sizes: ``smoke`` is the benchmark suite's CPU size (`fxopt bench --smoke`: 2 layers,
hidden 32, batch 2 x 32 tokens); ``medium`` is issue 17's measurement size (4 layers,
hidden 256, batch 4 x 64); ``suite`` is issue 17's done-when size (batch 4 x 128, used by
benchmarks/fast_path.py).

Step time: one thread, the configurations interleaved step by step (the order rotates each
round), median of ``--steps`` timed steps after two warm-up steps, with min-max spread.
Compile time: in a fresh subprocess per configuration with an empty Inductor cache
(``TORCHINDUCTOR_CACHE_DIR``), so nothing compiled by another configuration is reused: the
first step's time less the median of three later steps; imports and Dynamo's own start-up
are paid before (a trivial function compiled with the "eager" backend).

    python benchmarks/codegen_auto.py                      # smoke and medium sizes
    python benchmarks/codegen_auto.py --sizes smoke --steps 7
    python benchmarks/codegen_auto.py --compile-samples 2 --sizes medium --models gpt2

``--compile-samples N`` measures only the compile time of fxopt-inductor and torch.compile,
N fresh-process samples each, the order alternating per round, every sample printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from typing import Any

import torch

from fxopt.bench import timing

CONFIGS = ("fxopt-fx", "fxopt-inductor", "torch.compile", "eager")
MODELS = ("gpt2", "bert", "llama")
SIZES = {
    "smoke": {"layers": 2, "hidden": 32, "heads": 2, "vocab": 101, "positions": 64,
              "batch": 2, "seq": 32},
    "medium": {"layers": 4, "hidden": 256, "heads": 4, "vocab": 1000, "positions": 128,
               "batch": 4, "seq": 64},
    "suite": {"layers": 4, "hidden": 256, "heads": 4, "vocab": 1000, "positions": 128,
              "batch": 4, "seq": 128},
}


def build(kind: str, size: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    import transformers

    s = SIZES[size]
    torch.manual_seed(0)
    if kind == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=s["layers"], n_embd=s["hidden"], n_head=s["heads"],
            n_positions=s["positions"], vocab_size=s["vocab"], bos_token_id=0,
            eos_token_id=0, attn_implementation="eager"))
    elif kind == "bert":
        model = transformers.BertForMaskedLM(transformers.BertConfig(
            num_hidden_layers=s["layers"], hidden_size=s["hidden"],
            num_attention_heads=s["heads"], intermediate_size=4 * s["hidden"],
            max_position_embeddings=s["positions"], vocab_size=s["vocab"],
            attn_implementation="eager"))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            num_hidden_layers=s["layers"], hidden_size=s["hidden"],
            num_attention_heads=s["heads"], num_key_value_heads=s["heads"],
            intermediate_size=int(8 / 3 * s["hidden"]) // 16 * 16, attention_dropout=0.1,
            max_position_embeddings=s["positions"], vocab_size=s["vocab"],
            bos_token_id=0, eos_token_id=0))
    ids = torch.randint(0, s["vocab"], (s["batch"], s["seq"]))
    kwargs: dict[str, Any] = {"input_ids": ids, "labels": ids}
    if kind != "bert":
        kwargs["use_cache"] = False
    return model.train(), kwargs


def compiled(model: torch.nn.Module, config: str) -> Any:
    if config == "eager":
        return model
    if config == "torch.compile":
        return torch.compile(model)
    codegen = config.split("-")[1]
    return torch.compile(model, backend="fxopt", options={"codegen": codegen, "strict": True})


def step(fn: Any, model: torch.nn.Module, kwargs: dict[str, Any]) -> None:
    fn(**kwargs).loss.backward()
    for p in model.parameters():
        p.grad = None


def compile_time(kind: str, size: str, config: str) -> float:
    """In this (fresh) process: the first step's time less the median of later steps."""
    torch.set_num_threads(1)
    import transformers  # noqa: F401  (imports are not compile time)

    import fxopt  # noqa: F401
    torch.compile(lambda x: x.sin() + 1, backend="eager")(torch.randn(3))
    model, kwargs = build(kind, size)
    fn = compiled(model, config)
    taken = timing.time_steps(lambda: step(fn, model, kwargs), "cpu", warmup=0, steps=3)
    return taken.first_s - taken.median_ms / 1e3


def measure_compile(kind: str, size: str, config: str) -> float:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "OMP_NUM_THREADS": "1",
               "TORCHINDUCTOR_COMPILE_THREADS": "1"}
        out = subprocess.run([sys.executable, __file__, "--compile-one", kind, size, config],
                             env=env, check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def measure_steps(kind: str, size: str, steps: int) -> dict[str, list[float]]:
    """Each configuration's step times, interleaved in rounds (fxopt.bench.timing), after
    its compiling step and one warm-up."""
    runs = {}
    for config in CONFIGS:
        model, kwargs = build(kind, size)
        runs[config] = (compiled(model, config), model, kwargs)
    taken = timing.interleaved(
        {config: (lambda run=run: step(*run)) for config, run in runs.items()}, "cpu",
        warmup=1, rounds=steps)
    return {config: taken[config].times_s for config in CONFIGS}


def compile_samples(kinds: list[str], sizes: list[str], samples: int) -> None:
    """Fresh-process compile times only, ``samples`` per configuration, order alternating."""
    pair = ["torch.compile", "fxopt-inductor"]
    print("| model | size | round | config | compile s |")
    print("| --- | --- | ---: | --- | ---: |")
    for size in sizes:
        for kind in kinds:
            found: dict[str, list[float]] = {c: [] for c in pair}
            for i in range(samples):
                for config in pair if i % 2 == 0 else pair[::-1]:
                    found[config].append(measure_compile(kind, size, config))
                    print(f"| {kind} | {size} | {i} | {config} | {found[config][-1]:.1f} |",
                          flush=True)
            ratio = statistics.median(found["fxopt-inductor"]) / statistics.median(
                found["torch.compile"])
            print(f"\n{kind} {size}: median fxopt-inductor / torch.compile = {ratio:.2f}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="smoke,medium")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--compile-samples", type=int, default=0)
    parser.add_argument("--compile-one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compile_one:
        print(compile_time(*args.compile_one))
        return
    torch.set_num_threads(1)
    print(f"# codegen_auto: CPU ({platform.machine()}), torch {torch.__version__}, "
          f"1 thread, {args.steps} interleaved steps, dropout 0.1 in training mode")
    print(f"# command: python benchmarks/codegen_auto.py {' '.join(sys.argv[1:])}")
    if args.compile_samples:
        compile_samples(args.models.split(","), args.sizes.split(","), args.compile_samples)
        return
    print("| model | size | config | step ms (median) | spread (min-max) | step / torch.compile "
          "| compile s | compile / torch.compile |")
    print("| --- | --- | --- | ---: | --- | ---: | ---: | ---: |")
    results = []
    for size in args.sizes.split(","):
        for kind in args.models.split(","):
            times = measure_steps(kind, size, args.steps)
            compiles = {c: measure_compile(kind, size, c) for c in CONFIGS if c != "eager"}
            base_step = statistics.median(times["torch.compile"])
            for config in CONFIGS:
                median = statistics.median(times[config])
                compile_s = compiles.get(config)
                ratio = "" if compile_s is None else f"{compile_s / compiles['torch.compile']:.2f}"
                print(f"| {kind} | {size} | {config} | {median * 1e3:.2f} | "
                      f"{min(times[config]) * 1e3:.2f}-{max(times[config]) * 1e3:.2f} | "
                      f"{median / base_step:.2f} | "
                      f"{'' if compile_s is None else f'{compile_s:.1f}'} | {ratio} |",
                      flush=True)
                results.append({"model": kind, "size": size, "config": config,
                                "step_s": times[config], "compile_s": compile_s})
    print("\n<!-- raw: " + json.dumps(results) + " -->")


if __name__ == "__main__":
    main()
