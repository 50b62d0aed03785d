"""Benchmark: fxopt's memory_budget (swap_recompute) against the alternatives a user would pick.

For GPT-2 medium (transformers, random weights) and a ResNet-50-class net (bottleneck
blocks [3, 4, 6, 3], written here: no torchvision), at activation budgets from 100% down
to 30%, one training step (forward, backward, gradients zeroed; no optimizer) with:

- ``eager`` and ``inductor`` (plain ``torch.compile``): the unbudgeted references;
- ``fxopt``: ``backend="fxopt", options={"memory_budget": f}``;
- ``inductor-budget``: Inductor with ``torch._functorch.config.activation_memory_budget = f``;
- ``checkpoint``: eager with ``torch.utils.checkpoint`` on the first ``round((1-f)*blocks)``
  blocks;
- ``offload-hooks``: eager with ``torch.autograd.graph.save_on_cpu(pin_memory=True)``
  (the saved-tensor-hooks offload torchtune uses; budget-independent).

On CUDA it prints, per method and budget, the measured ``torch.cuda.max_memory_allocated``
of a step, the step time, and ratios against eager: peak, and throughput. For fxopt it
also prints the bound the budget stands for (``budget_bytes`` of the pass) and measured
peak / bound (the target is <= 1.05). On a CPU (``--smoke``: tiny models, a few steps,
seconds) there is no allocator peak to read, so it prints the bytes kept for backward
(saved-tensor hooks) instead: a check that everything runs, not performance figures.

    python benchmarks/swap_recompute.py                 # CUDA, the real sizes
    python benchmarks/swap_recompute.py --smoke         # CPU, tiny, seconds
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import sys
import warnings

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import fxopt
from fxopt.analysis import measure_saved_bytes
from fxopt.bench import timing
from fxopt.bench.workloads import ResNet


def _gpt2(smoke: bool) -> tuple[nn.Module, dict, list[nn.Module]]:
    import transformers

    size = dict(n_layer=2, n_embd=64, n_head=4) if smoke else dict(n_layer=24, n_embd=1024,
                                                                       n_head=16)
    config = transformers.GPT2Config(vocab_size=1000 if smoke else 50257, n_positions=1024,
                                     attn_implementation="eager", use_cache=False, **size)
    model = transformers.GPT2LMHeadModel(config).train()
    batch, seq = (8, 64) if smoke else (8, 512)
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    return model, {"input_ids": ids, "labels": ids}, list(model.transformer.h)


def _resnet(smoke: bool) -> tuple[nn.Module, dict, list[nn.Module]]:
    """The benchmark suite's ResNet-50 layout (fxopt.bench.workloads), returning its loss."""
    model = ResNet((1, 1, 1, 1), base=8, classes=10) if smoke else ResNet()
    batch, size = (2, 32) if smoke else (64, 224)
    inputs = {"images": torch.randn(batch, 3, size, size),
              "labels": torch.randint(0, model.classes, (batch,))}
    return model.train(), inputs, list(model.blocks)


def _loss(out) -> torch.Tensor:
    return out.loss if hasattr(out, "loss") else out


@contextlib.contextmanager
def _checkpointed(blocks: list[nn.Module], count: int):
    """Run the first ``count`` blocks under torch.utils.checkpoint."""
    originals = [b.forward for b in blocks[:count]]
    for block, forward in zip(blocks[:count], originals):
        block.forward = lambda *a, _f=forward, **k: checkpoint(_f, *a, use_reentrant=False, **k)
    try:
        yield
    finally:
        for block, forward in zip(blocks[:count], originals):
            block.forward = forward


def _methods(budget: float, blocks: list[nn.Module]):
    """name -> (wrap(model) -> callable, context manager factory)."""
    null = contextlib.nullcontext

    def inductor_budget():
        import torch._functorch.config as functorch_config

        return functorch_config.patch(activation_memory_budget=budget)

    methods = {
        "fxopt": (lambda m: torch.compile(m, backend="fxopt",
                                          options={"memory_budget": budget}), null),
        "inductor-budget": (lambda m: torch.compile(m), inductor_budget),
        "checkpoint": (lambda m: m,
                       lambda: _checkpointed(blocks, round((1 - budget) * len(blocks)))),
    }
    if budget == 1.0:
        methods = {"eager": (lambda m: m, null), "inductor": (lambda m: torch.compile(m), null),
                   "offload-hooks": (lambda m: m, lambda: torch.autograd.graph.save_on_cpu(
                       pin_memory=torch.cuda.is_available())), **methods}
    return methods


def _run(model, inputs, wrap, context, steps: int, device: torch.device):
    """Median seconds of a step (fxopt.bench.timing) after 3 warm-up steps (compile
    included: Dynamo settles after a few calls), and the step's peak bytes on CUDA (on the
    CPU, with no allocator peak, the bytes kept for backward)."""
    timing.release(device)
    run = wrap(model)

    def step():
        _loss(run(**inputs)).backward()
        model.zero_grad(set_to_none=True)

    with context(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        taken = timing.time_steps(step, device, warmup=2, steps=steps,
                                  before_timed=lambda: timing.reset_peak(device))
        seconds = taken.median_ms / 1e3
        memory = timing.peak_above(device, 0)
        if memory is None:  # no allocator peak on a CPU: the bytes kept for backward instead
            memory = measure_saved_bytes(lambda: run(**inputs),
                                         exclude=[*model.parameters(), *inputs.values()]).bytes
    return seconds, memory


def _fxopt_bound(model, inputs, budget: float) -> int | None:
    """The peak bound the budget stands for, read from the pass's stats (sum over graphs)."""
    torch._dynamo.reset()
    backend = fxopt.backend(memory_budget=budget)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _loss(torch.compile(model, backend=backend)(**inputs)).backward()
    model.zero_grad(set_to_none=True)
    bounds = [r.stats.get("budget_bytes") for g in backend.graphs
              for r in g.pass_records("swap_recompute") if r.ran]
    return max((b for b in bounds if b is not None), default=None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny models on the CPU")
    parser.add_argument("--models", default="gpt2,resnet50")
    parser.add_argument("--budgets", default="1.0,0.9,0.7,0.5,0.3")
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    steps = args.steps or (2 if args.smoke else 10)
    budgets = [float(b) for b in args.budgets.split(",")]
    memory_label = "peak MiB" if device.type == "cuda" else "saved MiB"
    smoke = " (CPU SMOKE RUN: not performance figures)" if args.smoke else ""
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else (
        platform.processor() or platform.machine())
    print(f"# swap_recompute benchmark{smoke}")
    print(f"device: {device_name}; torch {torch.__version__}; python {platform.python_version()}")
    print(f"command: python benchmarks/swap_recompute.py {' '.join(sys.argv[1:])}")
    builders = {"gpt2": _gpt2, "resnet50": _resnet}
    for name in args.models.split(","):
        torch.manual_seed(0)
        model, inputs, blocks = builders[name](args.smoke)
        model.to(device)
        inputs = {k: v.to(device) for k, v in inputs.items()}
        print(f"\n## {name}\n")
        print(f"| method | budget | {memory_label} | step ms | memory / eager | "
              "throughput / eager | fxopt peak / bound |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        reference = None
        for budget in budgets:
            for method, (wrap, context) in _methods(budget, blocks).items():
                try:
                    seconds, memory = _run(model, inputs, wrap, context, steps, device)
                except Exception as exc:  # a baseline that fails is reported, not fatal
                    print(f"| {method} | {budget:g} | failed: {type(exc).__name__}: "
                          f"{str(exc)[:80]} | | | | |")
                    continue
                if method == "eager":
                    reference = (seconds, memory)
                bound = ""
                if method == "fxopt" and device.type == "cuda":
                    limit = _fxopt_bound(model, inputs, budget)
                    bound = f"{memory / limit:.3f}" if limit else ""
                ratios = ("", "") if reference is None else (
                    f"{memory / max(reference[1], 1):.3f}", f"{reference[0] / seconds:.3f}")
                print(f"| {method} | {budget:g} | {memory / 2**20:.2f} | {seconds * 1e3:.2f} | "
                      f"{ratios[0]} | {ratios[1]} | {bound} |")


if __name__ == "__main__":
    main()
