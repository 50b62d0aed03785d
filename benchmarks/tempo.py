"""Benchmark of the tempo pass: memory and throughput of transformer pre-training steps.

For each workload (BERT-large masked-LM with eager attention at seq 128 and 512, GPT-2
medium; tiny versions with ``--smoke``) and each configuration (eager, Inductor, fxopt
without tempo, fxopt with tempo), at the same batch: the bytes autograd keeps for backward
during one forward (measured with saved-tensor hooks, parameters excluded), the peak memory
of a training step (CUDA only) and steps per second (one over the median step of
`fxopt.bench.timing`); then (CUDA only, not with --smoke) the
largest batch whose training step fits under ``--memory-cap`` (GiB). Figures are printed
as a table with ratios to eager. Runs on CUDA at real sizes, on the CPU with ``--smoke``.

    python benchmarks/tempo.py                 # CUDA: BERT-large 128/512, GPT-2 medium
    python benchmarks/tempo.py --smoke         # CPU: tiny models, a few steps
"""

from __future__ import annotations

import argparse
import platform
from collections.abc import Callable
from dataclasses import dataclass

import torch

import fxopt
from fxopt.analysis import measure_saved_bytes
from fxopt.bench import timing

CONFIGS: dict[str, Callable[[], object]] = {
    "eager": lambda: None,
    "inductor": lambda: "inductor",
    "fxopt": lambda: fxopt.backend(),
    "fxopt+tempo": lambda: fxopt.backend(tempo=True),
}


@dataclass
class Workload:
    name: str
    build: Callable[[], torch.nn.Module]
    seq: int
    batch: int
    vocab: int
    extra: dict


def workloads(smoke: bool) -> list[Workload]:
    import transformers

    def bert(layers, hidden, heads, positions):
        config = transformers.BertConfig(
            num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
            intermediate_size=4 * hidden, max_position_embeddings=positions,
            vocab_size=30522 if not smoke else 101, attn_implementation="eager")
        return lambda: transformers.BertForMaskedLM(config)

    def gpt2(layers, hidden, heads, positions):
        config = transformers.GPT2Config(
            n_layer=layers, n_embd=hidden, n_head=heads, n_positions=positions,
            vocab_size=50257 if not smoke else 101, attn_implementation="eager")
        return lambda: transformers.GPT2LMHeadModel(config)

    if smoke:
        return [Workload("bert-tiny seq 32", bert(2, 64, 4, 64), 32, 4, 101, {}),
                Workload("gpt2-tiny seq 32", gpt2(2, 64, 4, 64), 32, 4, 101,
                         {"use_cache": False})]
    return [Workload("bert-large seq 128", bert(24, 1024, 16, 512), 128, 32, 30522, {}),
            Workload("bert-large seq 512", bert(24, 1024, 16, 512), 512, 8, 30522, {}),
            Workload("gpt2-medium seq 1024", gpt2(24, 1024, 16, 1024), 1024, 4, 50257,
                     {"use_cache": False})]


def _step_fn(model, backend):
    if backend is None:
        return model
    if backend == "inductor":
        return torch.compile(model)
    return torch.compile(model, backend=backend)


def _inputs(workload: Workload, batch: int, device: torch.device) -> dict:
    ids = torch.randint(0, workload.vocab, (batch, workload.seq), device=device)
    return {"input_ids": ids, "labels": ids, **workload.extra}


def measure(workload: Workload, config: str, batch: int, device: torch.device, steps: int,
            dtype: torch.dtype | None) -> dict[str, float]:
    """Saved bytes, peak step memory (CUDA) and steps/s of one configuration."""
    torch.manual_seed(0)
    model = workload.build().to(device).train()
    fn = _step_fn(model, CONFIGS[config]())
    kwargs = _inputs(workload, batch, device)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)

    def step():
        with autocast:
            loss = fn(**kwargs).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    step()  # compile
    with autocast:
        saved = measure_saved_bytes(lambda: fn(**kwargs),
                                    exclude=[*model.parameters(), *model.buffers(),
                                             kwargs["input_ids"]])
    taken = timing.time_steps(step, device, warmup=0, steps=steps,
                              before_timed=lambda: timing.reset_peak(device))
    seconds = taken.median_ms / 1e3
    peak = timing.peak_above(device, 0)
    peak = float("nan") if peak is None else peak
    return {"saved_MiB": saved.bytes / 2**20, "peak_MiB": peak / 2**20,
            "steps_per_s": 1.0 / seconds, "samples_per_s": batch / seconds}


def largest_batch(workload: Workload, config: str, device: torch.device, cap_gib: float,
                  dtype: torch.dtype | None, start: int) -> int:
    """Doubling then bisection on the batch size; a batch fits if a training step's peak
    allocated memory stays under the cap (and no out-of-memory error)."""
    def fits(batch: int) -> bool:
        try:
            result = measure(workload, config, batch, device, 1, dtype)
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            torch._dynamo.reset()
            torch.cuda.empty_cache()
        return result["peak_MiB"] <= cap_gib * 1024

    low, high = 0, start
    while fits(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny models on the CPU")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast")
    parser.add_argument("--memory-cap", type=float, default=16.0,
                        help="GiB for the largest-batch search (CUDA)")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    steps = args.steps or (3 if args.smoke else 20)
    dtype = torch.bfloat16 if args.bf16 else None
    configs = args.configs.split(",")
    name = torch.cuda.get_device_name() if device.type == "cuda" else platform.machine()
    print(f"# tempo benchmark on {device.type} ({name}), torch {torch.__version__}, "
          f"{'bf16 autocast' if dtype else 'fp32'}, {steps} timed steps")
    for workload in workloads(args.smoke):
        print(f"\n## {workload.name}, batch {workload.batch}")
        print(f"{'config':<12} {'saved MiB':>10} {'x eager':>8} {'peak MiB':>10} "
              f"{'x eager':>8} {'samples/s':>10} {'x eager':>8}")
        rows = {}
        for config in configs:
            rows[config] = measure(workload, config, workload.batch, device,
                                   steps, dtype)
            torch._dynamo.reset()
            base, row = rows.get("eager", rows[config]), rows[config]
            print(f"{config:<12} {row['saved_MiB']:>10.2f} "
                  f"{row['saved_MiB'] / base['saved_MiB']:>8.3f} {row['peak_MiB']:>10.1f} "
                  f"{row['peak_MiB'] / base['peak_MiB']:>8.3f} {row['samples_per_s']:>10.2f} "
                  f"{row['samples_per_s'] / base['samples_per_s']:>8.3f}")
        if device.type == "cuda":
            for config in configs:
                batch = largest_batch(workload, config, device, args.memory_cap, dtype,
                                      workload.batch)
                print(f"largest batch under {args.memory_cap} GiB, {config}: {batch}")


if __name__ == "__main__":
    main()
