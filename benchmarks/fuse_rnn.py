"""Benchmark of fuse_rnn: one training step (forward + backward) of LSTM language models.

Two models of the same sizes (EcoRNN's kind of workload; on a GPU: 2 layers, hidden 1024,
batch 64, sequence 50, vocabulary 10000): one built on ``nn.LSTM``, one on two
``nn.LSTMCell`` stepped in a Python loop (`fxopt.bench.workloads`' LSTMLanguageModel and
LSTMCellLoopLM; the step is their next-token loss's backward, timed by
`fxopt.bench.timing`). In one run it times the baselines a user would
pick and fxopt:

    lstm/eager           nn.LSTM, eager (cuDNN on a GPU)
    lstm/fxopt           nn.LSTM compiled by fxopt with fuse_rnn (Dynamo's allow_rnn on)
    loop/eager           the LSTMCell loop, eager
    loop/inductor        the loop compiled by Inductor (torch.compile's default backend)
    loop/fxopt-nofuse    the loop compiled by fxopt without fuse_rnn
    loop/fxopt           the loop compiled by fxopt with fuse_rnn

and prints the median step time, its ratio to the eager loop and to eager nn.LSTM, and (on
CUDA) the peak memory of a step. ``--smoke`` runs tiny sizes (for a CPU: it proves the
script works; its times say nothing about a GPU). ``--out FILE`` also writes the table
with the device, versions and command.

    python benchmarks/fuse_rnn.py                 # on a CUDA machine
    TRITON_INTERPRET=1 python benchmarks/fuse_rnn.py --smoke
"""

from __future__ import annotations

import argparse
import copy
import platform
import sys
from collections.abc import Callable

import torch
from torch import nn

from fxopt.bench import timing
from fxopt.bench.workloads import LSTMCellLoopLM, LSTMLanguageModel
from fxopt.compiler import Backend


def time_step(model: Callable, tokens: torch.Tensor, warmup: int,
              iters: int) -> tuple[float, int | None]:
    """Median seconds of a training step (fxopt.bench.timing: CUDA events on a GPU), and
    the peak bytes of one (CUDA only)."""
    device = tokens.device
    taken = timing.time_steps(lambda: model(tokens).backward(), device,
                              warmup=max(0, warmup - 1), steps=iters,
                              before_timed=lambda: timing.reset_peak(device))
    return taken.median_ms / 1e3, timing.peak_above(device, 0)


def variants(vocab: int, hidden: int, layers: int, device: torch.device
             ) -> dict[str, tuple[Callable, Backend | None]]:
    """Each variant's model (from one set of initial weights per model kind) and, for
    fxopt's, its backend (to report whether fuse_rnn fired)."""
    torch.manual_seed(0)
    lstm = LSTMLanguageModel(vocab, hidden, layers).to(device)
    loop = LSTMCellLoopLM(vocab, hidden, layers).to(device)

    def fxopt_compiled(model: nn.Module, fuse: bool) -> tuple[Callable, Backend]:
        backend = Backend({"fuse_rnn": fuse})
        return torch.compile(copy.deepcopy(model), backend=backend), backend

    return {
        "lstm/eager": (lstm, None),
        "lstm/fxopt": fxopt_compiled(lstm, True),
        "loop/eager": (loop, None),
        "loop/inductor": (torch.compile(copy.deepcopy(loop)), None),
        "loop/fxopt-nofuse": fxopt_compiled(loop, False),
        "loop/fxopt": fxopt_compiled(loop, True),
    }


def _fired(backend: Backend | None) -> str:
    if backend is None:
        return "-"
    return "yes" if any(r.fired for g in backend.graphs for r in g.passes
                        if r.name == "fuse_rnn") else "no"


def run(args: argparse.Namespace) -> str:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.smoke:
        vocab, hidden, layers, batch, seq, warmup, iters = 23, 37, 2, 3, 5, 2, 3
    else:
        vocab, hidden, layers, batch, seq = args.vocab, args.hidden, 2, args.batch, args.seq
        warmup, iters = args.warmup, args.iters
    torch._dynamo.config.allow_rnn = True  # lets Dynamo trace nn.LSTM (else: graph break)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    tokens = torch.randint(0, vocab, (batch, seq + 1), device=device)
    results = {}
    for name, (model, backend) in variants(vocab, hidden, layers, device).items():
        results[name] = (*time_step(model, tokens, warmup, iters), _fired(backend))
    device_name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else platform.processor() or "cpu")
    lines = [
        f"fuse_rnn benchmark: training step of a {layers}-layer LSTM LM, hidden {hidden}, "
        f"batch {batch}, sequence {seq}, vocabulary {vocab}"
        + (" (SMOKE: tiny sizes, not a performance figure)" if args.smoke else ""),
        f"device: {device.type} ({device_name}); torch {torch.__version__}; "
        f"python {platform.python_version()}",
        "command: " + " ".join([sys.executable, *sys.argv]),
        "",
        f"{'variant':<20} {'ms/step':>10} {'vs loop/eager':>14} {'vs lstm/eager':>14} "
        f"{'peak MiB':>9} {'fuse_rnn fired':>15}",
    ]
    loop_eager, lstm_eager = results["loop/eager"][0], results["lstm/eager"][0]
    for name, (seconds, peak, fired) in results.items():
        peak_text = f"{peak / 2**20:9.1f}" if peak is not None else f"{'-':>9}"
        lines.append(f"{name:<20} {seconds * 1e3:10.3f} {loop_eager / seconds:13.2f}x "
                     f"{lstm_eager / seconds:13.2f}x {peak_text} {fired:>15}")
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
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args(argv)
    report = run(args)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    main()
