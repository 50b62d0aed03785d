"""The step's peak memory of fxopt's defaults against plain ``torch.compile`` (issue 29, 1).

Models as users run them: transformers GPT-2 and Llama with their real vocabularies
(50257, 32000), 2 layers x 128, seq 128, batch 4, SDPA attention (transformers' default),
the model's own loss, forward and backward under ``torch.autocast(bfloat16)``. Per model
and configuration: a fresh model (seed 0), ``torch._dynamo.reset()``, then
``fxopt.profile_memory`` (one warm-up step, which compiles, then 2 recorded steps; the
allocator's records: exact bytes on any CPU). Columns: the step's peak and the bytes
kept for backward at the peak, both in MiB, and the peak against plain torch.compile's.

Configurations: ``eager``; ``torch.compile`` (Inductor, plain); ``fxopt`` (defaults:
``codegen="auto"``), ``fxopt tempo`` (``tempo=True``), and the two code generators forced
(``codegen="fx"``, ``codegen="inductor"``), each with and without tempo.

``--pad`` turns on Inductor's comprehensive padding on the CPU
(``torch._inductor.config.disable_padding_cpu = False``): on CUDA it is on by default, so
this shows on the CPU what Inductor does to the strides of a graph's outputs on a GPU
(a 50257-wide logits tensor padded to 50272 columns).

Usage (the command of each results file is in its header):
    PYTHONPATH=. python benchmarks/default_peak.py [--models gpt2 llama] [--pad]
        [--configs eager compile fxopt ...]
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

import torch

import fxopt

CONFIGS = {
    "eager": None,
    "compile": "inductor",
    "fxopt": {},
    "fxopt tempo": {"tempo": True},
    "fxopt fx": {"codegen": "fx"},
    "fxopt fx tempo": {"codegen": "fx", "tempo": True},
    "fxopt inductor": {"codegen": "inductor"},
    "fxopt inductor tempo": {"codegen": "inductor", "tempo": True},
}
MIB = 2 ** 20


def build(name: str) -> tuple[torch.nn.Module, dict]:
    """The model (training mode, SDPA) and its inputs (labels = the input ids)."""
    import transformers as tf

    torch.manual_seed(0)
    if name == "gpt2":
        model = tf.GPT2LMHeadModel(tf.GPT2Config(
            vocab_size=50257, n_positions=256, n_embd=128, n_layer=2, n_head=2))
    else:
        model = tf.LlamaForCausalLM(tf.LlamaConfig(
            vocab_size=32000, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256))
    model.config._attn_implementation = "sdpa"
    model.config.use_cache = False
    ids = torch.randint(0, model.config.vocab_size, (4, 128),
                        generator=torch.Generator().manual_seed(0))
    return model.train(), {"input_ids": ids, "labels": ids}


def measure(name: str, config: str) -> tuple[float, float, float]:
    """(peak MiB, activations MiB at the peak, first step's seconds)."""
    model, inputs = build(name)
    torch._dynamo.reset()
    backend = CONFIGS[config]
    if backend is not None:
        backend = backend if isinstance(backend, str) else fxopt.backend(**backend)
        model = torch.compile(model, backend=backend)
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        profile = fxopt.profile_memory(model, inputs)
    seconds = time.perf_counter() - start
    return (profile.peak_bytes / MIB, profile.peak_categories["activations"] / MIB, seconds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "llama"],
                        choices=["gpt2", "llama"])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--pad", action="store_true",
                        help="Inductor's comprehensive padding on the CPU (as on CUDA)")
    args = parser.parse_args(argv)
    if args.pad:
        torch._inductor.config.disable_padding_cpu = False
    print(f"# command: PYTHONPATH=. python benchmarks/default_peak.py {shlex.join(sys.argv[1:])}")
    print(f"# torch {torch.__version__}, CPU, bf16 autocast, SDPA, 2 layers x 128, seq 128, "
          f"batch 4{', comprehensive padding on' if args.pad else ''}")
    print("| model | configuration | peak MiB | / compile | activations MiB | first step s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in args.models:
        reference = None
        for config in args.configs:
            peak, kept, seconds = measure(name, config)
            if config == "compile":
                reference = peak
            ratio = f"{peak / reference:.3f}" if reference else "-"
            print(f"| {name} | {config} | {peak:.1f} | {ratio} | {kept:.1f} | {seconds:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
