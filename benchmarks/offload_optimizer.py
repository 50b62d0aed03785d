"""Benchmark of optimizer-state offload: step time and device peak of three ways to train.

A Llama-style model (about 1.1B parameters in bf16 on CUDA, like TinyLlama; a tiny fp32 one
with ``--smoke``), or with ``--model gpt2`` the GPT-2 of the H100 table
(``benchmarks/results/offload_optimizer-h100-2026-11-26.md``: 6 x 768, batch 4 x 1024, fp32
parameters under bf16 autocast on CUDA), compiled with fxopt (``offload_optimizer=True``,
which records the gradient order) for every configuration alike (the table's plain row used
another backend, whose activations confounded its peaks), trained with AdamW in three
configurations:

- ``all-gpu``: the plain ``torch.optim.AdamW`` (fused on CUDA), all state on the device;
- ``all-cpu``: ``fxopt.optim.offload(..., cpu_fraction=1.0)``: every subgroup's fp32 master
  weights and state on the host, updated there (the ZeRO-Offload approach, fxopt's all-CPU
  mode; DeepSpeed's CPU Adam is not installed here);
- ``interleaved``: ``fxopt.optim.offload`` with a GPU state budget of ``--state-budget`` of
  what all-GPU AdamW state would take: the plan keeps what fits on the device and updates the
  rest on the host while the device updates its share (``--cpu-fraction`` forces the share);
- ``staged``: all state on the host in ``--staged-subgroups`` subgroups (default 32), the
  plan splitting them between host updates and Deep Optimizer States' staged device
  updates (on the CPU, where the plan never stages, half are staged by force, to exercise
  the path).

It prints, per configuration, the median step time and the optimizer step's share of it,
the device peak (CUDA: ``max_memory_allocated`` over the timed steps, state included), the
device bytes saved against ``all-gpu`` (CUDA: the peaks' difference; CPU: the same from
``fxopt.profile_memory``'s device peak, the host category left out) beside the plan's
predicted saving, the plan's predicted optimizer-step time and whether it says the host
keeps up, and ratios to ``all-gpu`` and ``all-cpu``. Runs on CUDA at real size, on the CPU
with ``--smoke``.

    python benchmarks/offload_optimizer.py                 # CUDA: 1.1B Llama-style, bf16
    python benchmarks/offload_optimizer.py --model gpt2 --cpu-fraction 0.5   # the H100 table
    python benchmarks/offload_optimizer.py --smoke         # CPU: tiny model, a few steps
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import platform
import statistics
import time
from dataclasses import dataclass

import torch

import fxopt
from fxopt.devices import indexed
from fxopt.profile import profile_memory


@dataclass
class Result:
    config: str
    step_seconds: float
    optimizer_seconds: float
    peak_bytes: float
    cpu_share: float
    staged_share: float
    predicted_seconds: float
    device_peak_bytes: float      # CUDA: the peak; CPU: the profiler's device peak
    predicted_saving: float       # the plan's device bytes freed against all on the device
    keeps_up: bool | None


def build_model(smoke: bool, device: torch.device, dtype: torch.dtype,
                name: str = "llama") -> torch.nn.Module:
    import transformers

    if name == "gpt2":
        size = ({"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 64, "vocab_size": 128}
                if smoke else {"n_layer": 6, "n_embd": 768, "n_head": 12, "n_positions": 1024})
        config = transformers.GPT2Config(**size, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0)
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(config).to(device)  # fp32: autocast runs bf16
    if smoke:
        config = transformers.LlamaConfig(
            vocab_size=128, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    else:  # TinyLlama-1.1B's shape
        config = transformers.LlamaConfig(
            vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
            num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(config: str, args: argparse.Namespace, device: torch.device,
        dtype: torch.dtype) -> Result:
    torch._dynamo.reset()  # each configuration compiles from scratch, with nothing cached
    gc.collect()
    model = build_model(args.smoke, device, dtype, args.model)
    backend = fxopt.backend(offload_optimizer=True)
    compiled = torch.compile(model, backend=backend)
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size

    def batch() -> torch.Tensor:
        return torch.randint(0, vocab, (args.batch, args.seq), generator=generator).to(device)

    def autocast() -> contextlib.AbstractContextManager:
        return (torch.autocast("cuda", torch.bfloat16)
                if args.model == "gpt2" and device.type == "cuda" else contextlib.nullcontext())

    def loss_of(ids: torch.Tensor) -> torch.Tensor:
        with autocast():
            return compiled(input_ids=ids, labels=ids).loss

    loss_of(batch()).backward()  # compile; the pass records the gradient order
    model.zero_grad(set_to_none=True)
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    optimizer: torch.optim.Optimizer = adamw
    plan = None
    if config == "all-cpu":
        optimizer = fxopt.optim.offload(adamw, backend, model=compiled, cpu_fraction=1.0)
    elif config == "staged":
        optimizer = fxopt.optim.offload(adamw, backend, model=compiled, cpu_fraction=1.0,
                                        subgroups=args.staged_subgroups,
                                        staged=0.5 if device.type == "cpu" else None)
    elif config == "interleaved":
        state = sum(2 * p.numel() * p.element_size() for p in model.parameters())
        # on a CPU device a budget never offloads (host and device are one memory): the
        # smoke run forces the share instead, to exercise the path
        fraction = args.cpu_fraction if args.cpu_fraction is not None else (
            args.state_budget if device.type == "cpu" else None)
        planning = ({"cpu_fraction": fraction} if fraction is not None
                    else {"gpu_state_budget_bytes": int(args.state_budget * state)})
        optimizer = fxopt.optim.offload(adamw, backend, model=compiled, **planning)
    if isinstance(optimizer, fxopt.optim.OffloadedOptimizer):
        plan = optimizer.plan

    steps, optimizer_times = [], []
    for step in range(args.warmup + args.steps):
        ids = batch()
        _sync(device)
        if step == args.warmup and device.type == "cuda":  # the state exists from here
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        loss_of(ids).backward()
        _sync(device)
        backward_end = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(device)
        end = time.perf_counter()
        if step >= args.warmup:
            steps.append(end - start)
            optimizer_times.append(end - backward_end)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else float("nan")
    if device.type == "cuda":
        device_peak = peak
    else:  # the host category left out of every point: what an accelerator would hold
        ids = batch()
        device_peak = profile_memory(compiled, {"input_ids": ids, "labels": ids}, optimizer,
                                     steps=1).device_peak_bytes()
    result = Result(config, statistics.median(steps), statistics.median(optimizer_times), peak,
                    plan.cpu_share if plan else 0.0, plan.staged_share if plan else 0.0,
                    plan.predicted_seconds if plan else float("nan"), device_peak,
                    plan.all_gpu_state_bytes - plan.gpu_state_bytes if plan else 0.0,
                    plan.keeps_up() if plan else True)
    if isinstance(optimizer, fxopt.optim.OffloadedOptimizer):
        optimizer.close()  # its thread, hooks and state go now, not at the next collection
    return result


CONFIGS = ("all-gpu", "all-cpu", "interleaved", "staged")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny model on the CPU")
    parser.add_argument("--model", choices=("llama", "gpt2"), default="llama",
                        help="gpt2: the H100 table's model (bf16 autocast on CUDA)")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--seq", type=int, default=None)
    parser.add_argument("--state-budget", type=float, default=0.5,
                        help="interleaved: GPU state budget as a share of all-GPU AdamW state")
    parser.add_argument("--cpu-fraction", type=float, default=None,
                        help="interleaved: force this share of subgroups onto the CPU")
    parser.add_argument("--staged-subgroups", type=int, default=32,
                        help="staged: how many subgroups (the buffers are two of them)")
    args = parser.parse_args(argv)
    device = (torch.device("cpu") if args.smoke or not torch.cuda.is_available()
              else indexed("cuda"))
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    args.steps = args.steps or (3 if args.smoke else 10)
    args.batch = args.batch or (2 if args.smoke else 4)
    args.seq = args.seq or (16 if args.smoke else 1024 if args.model == "gpt2" else 512)

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    precision = ("fp32 params, bf16 autocast" if args.model == "gpt2" and device.type == "cuda"
                 else str(dtype if args.model == "llama" else torch.float32).removeprefix("torch."))
    print(f"# offload_optimizer benchmark on {device.type} ({name}), torch {torch.__version__}, "
          f"{args.model}, {precision}, batch {args.batch} x seq {args.seq}, "
          f"{args.steps} timed steps, state budget {args.state_budget:g}"
          + (f", cpu_fraction {args.cpu_fraction:g}" if args.cpu_fraction is not None else ""))
    results = [run(config, args, device, dtype) for config in CONFIGS]
    base = {r.config: r for r in results}

    def ratio(a: float, b: float) -> float:
        return a / b if b else float("nan")

    print(f"{'config':<13}{'step ms':>10}{'optim ms':>10}{'peak GiB':>10}{'cpu share':>10}"
          f"{'staged':>8}"
          f"{'saved MiB':>11}{'pred. saved':>12}{'pred. optim ms':>16}{'keeps up':>10}"
          f"{'x all-gpu':>11}{'x all-cpu':>11}{'peak x gpu':>12}")
    for r in results:
        saved = base["all-gpu"].device_peak_bytes - r.device_peak_bytes
        print(f"{r.config:<13}{r.step_seconds * 1e3:>10.2f}{r.optimizer_seconds * 1e3:>10.2f}"
              f"{r.peak_bytes / 2**30:>10.2f}{r.cpu_share:>10.2f}{r.staged_share:>8.2f}"
              f"{saved / 2**20:>11.3f}{r.predicted_saving / 2**20:>12.3f}"
              f"{r.predicted_seconds * 1e3:>16.3f}{str(r.keeps_up):>10}"
              f"{ratio(r.step_seconds, base['all-gpu'].step_seconds):>11.3f}"
              f"{ratio(r.step_seconds, base['all-cpu'].step_seconds):>11.3f}"
              f"{ratio(r.peak_bytes, base['all-gpu'].peak_bytes):>12.3f}")


if __name__ == "__main__":
    main()
