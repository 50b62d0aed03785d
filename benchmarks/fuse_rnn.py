"""Benchmark of fuse_rnn: one training step (forward + backward) of LSTM language models.

Two models of the same sizes (EcoRNN's kind of workload; on a GPU: 2 layers, hidden 1024,
batch 64, sequence 50, vocabulary 10000): one built on ``nn.LSTM``, one on two
``nn.LSTMCell`` stepped in a Python loop (`fxopt.bench.workloads`' LSTMLanguageModel and
LSTMCellLoopLM; the step is their next-token loss's backward). In one run, interleaved
(`fxopt.bench.timing.interleaved`: one step of each per round, the order rotated; on the
CPU on one thread), it times the baselines a user would pick and fxopt:

    lstm/eager           nn.LSTM, eager (cuDNN on a GPU, oneDNN on the CPU)
    lstm/inductor        nn.LSTM compiled by Inductor (AOTAutograd's per-step decomposition)
    lstm/fxopt           nn.LSTM compiled by fxopt with fuse_rnn (Dynamo's allow_rnn on)
    lstm/fxopt-library   ... with library_rnn=True: the library's call, run once (CUDA's
                         default without a budget)
    lstm/fxopt-budget    ... with memory_budget=0.5: recompute_rnn's library call, run
                         again in the backward
    loop/eager           the LSTMCell loop, eager
    loop/inductor        the loop compiled by Inductor (torch.compile's default backend)
    loop/fxopt-nofuse    the loop compiled by fxopt without fuse_rnn
    loop/fxopt           the loop compiled by fxopt with fuse_rnn (Inductor: fusible cells)
    loop/fxopt-fx        the same under codegen="fx" (the fused-cell custom ops)

and prints each median step time with its spread, its ratio to the eager loop and to eager
nn.LSTM, the seconds of its first step (the compile, for a compiled variant), the bytes
autograd keeps for backward (exact, on any device) and, on CUDA, the peak memory of a
step. ``--smoke`` runs tiny sizes (for a CPU: it proves the script works; its times say
nothing about a GPU). ``--out FILE`` also writes the table with the device, versions and
command.

    python benchmarks/fuse_rnn.py                 # on a CUDA machine
    python benchmarks/fuse_rnn.py --hidden 256 --batch 16 --seq 32 --vocab 2000   # a CPU
    TRITON_INTERPRET=1 python benchmarks/fuse_rnn.py --smoke
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import platform
import sys
from collections.abc import Callable

import torch
from torch import nn

from fxopt.analysis import measure_saved_bytes
from fxopt.bench import timing
from fxopt.bench.workloads import LSTMCellLoopLM, LSTMLanguageModel
from fxopt.compiler import Backend


def measure(variants: dict[str, tuple[nn.Module, Callable, Backend | None]],
            tokens: torch.Tensor, warmup: int, rounds: int
            ) -> dict[str, tuple[timing.Timing, int, int | None]]:
    """Per variant: its interleaved step times, the bytes autograd keeps for backward (its
    parameters and the tokens excluded) and, on CUDA, the peak bytes of one step."""
    device = tokens.device
    steps = {name: (lambda f=compiled: f(tokens).backward())
             for name, (_, compiled, _) in variants.items()}
    times = timing.interleaved(steps, device, warmup=warmup, rounds=rounds)
    results = {}
    for name, (model, compiled, _) in variants.items():
        saved = measure_saved_bytes(lambda f=compiled: f(tokens),
                                    exclude=[*model.parameters(), tokens]).bytes
        timing.reset_peak(device)
        steps[name]()
        results[name] = (times[name], saved, timing.peak_above(device, 0))
    return results


def variants(vocab: int, hidden: int, layers: int, device: torch.device
             ) -> dict[str, tuple[nn.Module, Callable, Backend | None]]:
    """Each variant's model (from one set of initial weights per model kind), what a step
    calls and, for fxopt's, its backend (to report whether fuse_rnn fired)."""
    torch.manual_seed(0)
    lstm = LSTMLanguageModel(vocab, hidden, layers).to(device)
    loop = LSTMCellLoopLM(vocab, hidden, layers).to(device)

    def compiled(model: nn.Module, **options: object) -> tuple[nn.Module, Callable, Backend]:
        model = copy.deepcopy(model)
        backend = Backend(options)
        return model, torch.compile(model, backend=backend), backend

    def inductor(model: nn.Module) -> tuple[nn.Module, Callable, None]:
        model = copy.deepcopy(model)
        return model, torch.compile(model), None

    return {
        "lstm/eager": (lstm, lstm, None),
        "lstm/inductor": inductor(lstm),
        "lstm/fxopt": compiled(lstm, fuse_rnn=True),
        "lstm/fxopt-library": compiled(lstm, library_rnn=True),
        "lstm/fxopt-budget": compiled(lstm, memory_budget=0.5),
        "loop/eager": (loop, loop, None),
        "loop/inductor": inductor(loop),
        "loop/fxopt-nofuse": compiled(loop, fuse_rnn=False),
        "loop/fxopt": compiled(loop, fuse_rnn=True),
        "loop/fxopt-fx": compiled(loop, fuse_rnn=True, codegen="fx"),
    }


RNN_PASSES = ("fuse_rnn", "library_rnn", "recompute_rnn")


def _fired(backend: Backend | None) -> str:
    """The RNN passes that fired for a variant of fxopt's ("none" if none did)."""
    if backend is None:
        return "-"
    fired = [name for name in RNN_PASSES if any(
        r.fired for g in backend.graphs for r in g.pass_records(name))]
    return ",".join(fired) or "none"


def run(args: argparse.Namespace) -> str:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.smoke:
        vocab, hidden, layers, batch, seq, warmup, rounds = 23, 37, 2, 3, 5, 1, 3
    else:
        vocab, hidden, layers, batch, seq = args.vocab, args.hidden, 2, args.batch, args.seq
        warmup, rounds = args.warmup, args.iters
    torch._dynamo.config.allow_rnn = True  # lets Dynamo trace nn.LSTM (else: graph break)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    tokens = torch.randint(0, vocab, (batch, seq + 1), device=device)
    chosen = variants(vocab, hidden, layers, device)
    threads = timing.one_thread() if device.type == "cpu" else contextlib.nullcontext()
    with threads:
        results = measure(chosen, tokens, warmup, rounds)
    device_name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else platform.processor() or "cpu")
    lines = [
        f"fuse_rnn benchmark: training step of a {layers}-layer LSTM LM, hidden {hidden}, "
        f"batch {batch}, sequence {seq}, vocabulary {vocab}"
        + (" (SMOKE: tiny sizes, not a performance figure)" if args.smoke else ""),
        f"device: {device.type} ({device_name}{', one thread' if device.type == 'cpu' else ''}"
        f"); torch {torch.__version__}; python {platform.python_version()}; {rounds} "
        f"interleaved rounds",
        "command: " + " ".join([sys.executable, *sys.argv]),
        "",
        f"{'variant':<18} {'ms/step (min-max)':>24} {'vs loop/eager':>14} "
        f"{'vs lstm/eager':>14} {'first s':>8} {'saved MiB':>10} {'peak MiB':>9}  "
        f"RNN passes fired",
    ]
    loop_eager = results["loop/eager"][0].median_ms
    lstm_eager = results["lstm/eager"][0].median_ms
    for name, (taken, saved, peak) in results.items():
        peak_text = f"{peak / 2**20:9.1f}" if peak is not None else f"{'-':>9}"
        lines.append(f"{name:<18} {taken.text(2):>24} {loop_eager / taken.median_ms:13.2f}x "
                     f"{lstm_eager / taken.median_ms:13.2f}x {taken.first_s:8.1f} "
                     f"{saved / 2**20:10.2f} "
                     f"{peak_text}  {_fired(chosen[name][2])}")
    lines.append("(ratios: how many times faster than the baseline; > 1 is faster)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CPU check)")
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq", type=int, default=50)
    parser.add_argument("--vocab", type=int, default=10000)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20, help="interleaved rounds")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args(argv)
    report = run(args)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    main()
