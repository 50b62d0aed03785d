"""Benchmark of fuse_linear_cross_entropy on the CPU: the LM head and loss that never store
the logits, against the same compile without the pass ("plain").

Two parts, for transformers' GPT-2 (vocabulary 50257, tied embeddings) and Llama
(vocabulary 32000), 2 layers x hidden 128, batch 4 x seq 128 (512 tokens; ``--batch``,
``--seq``), fp32:

1. **The loss part alone**: ``cross_entropy(linear(h, W).float().view(-1, V), labels)``
   with transformers 5's shifted labels (padded with -100), h (tokens x 128) requiring grad,
   W a parameter: the bytes kept for backward (saved-tensor hooks, W, h and labels
   excluded) and the peak of one forward + backward (``fxopt.profile_memory``; above the
   parameters and inputs, and also above the gradients, which both keep), under fx and
   under Inductor code generation.
2. **The whole model**, ``model(ids, labels=ids).loss`` under
   ``fxopt.ignore_transformers_logging()`` (one Dynamo graph): bytes kept for
   backward, step peak, and the step time (forward + backward) of plain Inductor
   (``torch.compile``), fxopt under Inductor without and with the pass, and fxopt under fx
   with the pass: the configurations interleaved step by step, median of ``--steps`` timed
   steps with min-max spread, on ``--threads`` threads.

    PYTHONPATH=. python benchmarks/fuse_linear_cross_entropy.py \\
        --out benchmarks/results/fuse_linear_cross_entropy_cpu.md
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import fxopt
from fxopt.analysis import measure_saved_bytes
from fxopt.graph_breaks import ignore_transformers_logging

PASS = "fuse_linear_cross_entropy"
MIB = 2**20


def build(name: str, positions: int = 128) -> nn.Module:
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if name == "gpt2":
        config = transformers.GPT2Config(vocab_size=50257, n_positions=positions, n_embd=128,
                                         n_layer=2, n_head=2)
        return transformers.GPT2LMHeadModel(config)
    if name == "cohere":  # its logits scaled by logit_scale; Command R's vocabulary
        return transformers.CohereForCausalLM(transformers.CohereConfig(
            vocab_size=256000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, intermediate_size=256, max_position_embeddings=positions,
            logit_scale=0.0625))
    if name == "gemma2":  # its logits soft-capped (cap * tanh(z / cap)); Gemma 2's vocabulary
        return transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
            vocab_size=256000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, head_dim=32, intermediate_size=256,
            max_position_embeddings=positions))
    if name == "bart":  # final_logits_bias added to its logits; BART's vocabulary
        return transformers.BartForConditionalGeneration(transformers.BartConfig(
            vocab_size=50265, d_model=128, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=256,
            decoder_ffn_dim=256, max_position_embeddings=positions))
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4,
                                      intermediate_size=256,
                                      max_position_embeddings=positions)
    return transformers.LlamaForCausalLM(config)


class LossPart(nn.Module):
    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab, hidden) * 0.02)

    def forward(self, h, labels):
        logits = F.linear(h, self.weight).float().view(-1, self.weight.shape[0])
        labels = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous().view(-1)
        return F.cross_entropy(logits, labels, ignore_index=-100)


class LossOnly(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(ids, labels=ids).loss


def _backend(codegen: str, on: bool):
    return fxopt.backend(codegen=codegen, strict=True, **{PASS: on})


def _peaks(module: nn.Module, inputs: tuple) -> tuple[int, int]:
    """(peak above parameters and inputs, the same less gradients) of one step."""
    profile = fxopt.profile_memory(module, inputs, steps=1, loss_fn=lambda out: out)
    categories = profile.peak_categories
    above = profile.peak_bytes - categories.get("parameters", 0) - categories.get("inputs", 0)
    return above, above - categories.get("gradients", 0)


def loss_part(name: str, shape: tuple[int, int], rows: list[str]) -> None:
    model = build(name)
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    del model
    h = torch.randn(*shape, hidden, requires_grad=True)
    labels = torch.randint(0, vocab, shape)
    results = {}
    for codegen in ("fx", "inductor"):
        for on in (False, True):
            torch._dynamo.reset()
            part = LossPart(vocab, hidden)
            compiled = torch.compile(part, backend=_backend(codegen, on))
            compiled(h, labels).backward()  # compile
            kept = measure_saved_bytes(lambda fn=compiled: fn(h, labels),
                                       exclude=[part.weight, h, labels]).bytes
            peak, peak_no_grads = _peaks(compiled, (h, labels))
            results[codegen, on] = (kept, peak, peak_no_grads)
    for codegen in ("fx", "inductor"):
        (pk, pp, pg), (fk, fp, fg) = results[codegen, False], results[codegen, True]
        rows.append(f"| {name} | {codegen} | {pk / MIB:.2f} | {fk / MIB:.3f} | "
                    f"{fk / pk:.4f} | {pp / MIB:.1f} | {fp / MIB:.1f} | {fp / pp:.3f} | "
                    f"{pg / MIB:.1f} | {fg / MIB:.2f} | {fg / pg:.3f} |")


def whole_model(name: str, shape: tuple[int, int], steps: int, rows: list[str],
                time_rows: list[str]) -> None:
    ids = torch.randint(0, 50000 if name == "gpt2" else 32000, shape,
                        generator=torch.Generator().manual_seed(1))
    configs = {"torch.compile (Inductor)": "inductor",
               "fxopt inductor, plain": _backend("inductor", False),
               "fxopt inductor + pass": _backend("inductor", True),
               "fxopt fx + pass": _backend("fx", True)}
    compiled = {}
    with ignore_transformers_logging():
        torch._dynamo.reset()  # once: a reset would drop the configurations compiled before
        for label, backend in configs.items():
            module = LossOnly(build(name, shape[1]))
            compiled[label] = (module, torch.compile(module, backend=backend))
            start = time.perf_counter()
            compiled[label][1](ids).backward()
            logging.info("%s %s: compiled in %.1f s", name, label, time.perf_counter() - start)
            kept = measure_saved_bytes(lambda fn=compiled[label][1]: fn(ids),
                                       exclude=list(module.parameters()) + [ids]).bytes
            peak, _ = _peaks(compiled[label][1], (ids,))
            rows.append(f"| {name} | {label} | {kept / MIB:.2f} | {peak / MIB:.1f} |")
        times = {label: [] for label in configs}
        labels = list(configs)
        for step in range(steps + 2):
            order = labels[step % len(labels):] + labels[:step % len(labels)]
            for label in order:
                module, fn = compiled[label]
                start = time.perf_counter()
                fn(ids).backward()
                elapsed = time.perf_counter() - start
                module.zero_grad(set_to_none=True)
                if step >= 2:
                    times[label].append(elapsed * 1e3)
    base = statistics.median(times["torch.compile (Inductor)"])
    for label, values in times.items():
        median = statistics.median(values)
        time_rows.append(f"| {name} | {label} | {median:.1f} | {min(values):.1f}-"
                         f"{max(values):.1f} | {median / base:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "llama"])
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    part_rows, model_rows, time_rows = [], [], []
    for name in args.models:
        loss_part(name, (args.batch, args.seq), part_rows)
        whole_model(name, (args.batch, args.seq), args.steps, model_rows, time_rows)
    text = "\n".join([
        "# fuse_linear_cross_entropy on the CPU",
        "",
        "Command: `PYTHONPATH=. python benchmarks/fuse_linear_cross_entropy.py "
        + " ".join(sys.argv[1:]) + "`",
        f"torch {torch.__version__}, {args.threads} threads, fp32, batch {args.batch} x seq "
        f"{args.seq}, "
        "2 layers x hidden 128. Bytes exact; times on a shared, loaded machine "
        "(2 cores, other jobs running): medians with min-max spread, not a speed claim.",
        "",
        "## The loss part alone (the head's Linear, upcast, view, cross_entropy)",
        "",
        "kept: bytes kept for backward (MiB); peak: one forward + backward above parameters "
        "and inputs (MiB), and the same less the gradients (W's, h's).",
        "",
        "| model | codegen | kept plain | kept pass | ratio | peak plain | peak pass | ratio "
        "| peak-grads plain | peak-grads pass | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *part_rows,
        "",
        "## The whole model (`model(ids, labels=ids).loss`, one graph)",
        "",
        "| model | configuration | kept for backward MiB | step peak MiB (above params, "
        "inputs) |",
        "| --- | --- | --- | --- |",
        *model_rows,
        "",
        "Step time (forward + backward), interleaved:",
        "",
        "| model | configuration | median ms | min-max | / torch.compile |",
        "| --- | --- | --- | --- | --- |",
        *time_rows,
        "",
    ])
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
