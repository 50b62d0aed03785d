"""Benchmark of the fuse_elementwise pass: prints figures, asserts nothing.

(a) A chain of pointwise ops on tensors far larger than L2 (CUDA: 2**26 fp32 elements,
    256 MiB per tensor): achieved bandwidth (bytes read + written once / time) as a fraction
    of the device's measured copy bandwidth (``dst.copy_(src)``).
(b) The same chain run eagerly, by Inductor (``torch.compile`` default) and by fxopt with
    ``fuse_elementwise``, in one run, as time ratios to eager.
(c) Kernel-launching calls per training step (forward + backward graphs) of a GPT-2-small
    shaped transformer block, without and with the pass (counted in the compiled graphs).

    python benchmarks/fuse_elementwise.py                # CUDA, real sizes
    TRITON_INTERPRET=1 python benchmarks/fuse_elementwise.py --smoke   # CPU, tiny sizes

On the CPU the figures only prove that the script runs: the Triton interpreter is numpy.
"""

from __future__ import annotations

import argparse
import math
import operator
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F

# the checkout this script lives in (fxopt, and the tests' models), not an installed copy
_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests")]

import fxopt  # noqa: E402


def chain(x, y, b):
    """Seven pointwise ops, three inputs (one broadcast), two outputs."""
    z = torch.sigmoid(x * y + b)
    return F.gelu(z) * torch.tanh(x) - z, z


def timed(fn, *args, repeat: int) -> float:
    """Median seconds per call, after two warm-up calls."""
    sync = torch.cuda.synchronize if args[0].is_cuda else (lambda: None)
    for _ in range(2):
        fn(*args)
    sync()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args)
        sync()
        samples.append(time.perf_counter() - start)
    return sorted(samples)[len(samples) // 2]


def chain_figures(device: torch.device, numel: int, repeat: int, inductor: bool) -> None:
    rows = int(math.sqrt(numel))
    cols = numel // rows
    x, y = (torch.randn(rows, cols, device=device) for _ in range(2))
    b = torch.randn(cols, device=device)
    moved = (x.nelement() * 2 + b.nelement() + x.nelement() * 2) * 4  # 2 read, 2 written
    src, dst = torch.randn(rows, cols, device=device), torch.empty(rows, cols, device=device)
    copy_s = timed(lambda s, d: d.copy_(s), src, dst, repeat=repeat)
    copy_bw = 2 * src.nelement() * 4 / copy_s
    print(f"(a,b) chain of 7 pointwise ops on {rows}x{cols} fp32 ({x.nelement() * 4 / 2**20:.0f}"
          f" MiB per tensor) on {device}")
    print(f"  copy bandwidth: {copy_bw / 1e9:.1f} GB/s")
    candidates = {"eager": chain}
    backend = fxopt.backend(fuse_elementwise=True, strict=True)
    candidates["fxopt fuse_elementwise"] = torch.compile(chain, backend=backend)
    if inductor:
        candidates["inductor"] = torch.compile(chain)
    eager_s = None
    with torch.no_grad():
        for name, fn in candidates.items():
            try:
                seconds = timed(fn, x, y, b, repeat=repeat)
            except Exception as exc:  # e.g. no C++ compiler for Inductor on this CPU
                print(f"  {name:24s} failed: {type(exc).__name__}: {str(exc)[:100]}")
                continue
            eager_s = eager_s or seconds
            print(f"  {name:24s} {seconds * 1e3:9.3f} ms  {moved / seconds / 1e9:8.1f} GB/s "
                  f"({moved / seconds / copy_bw:6.1%} of copy)  speed vs eager "
                  f"{eager_s / seconds:5.2f}x")
    fired = [{**r.verdicts.counts(), **r.stats} for g in backend.graphs for r in g.passes
             if r.name == "fuse_elementwise" and r.fired]
    print(f"  fxopt stats: {fired}")


def _launches(gm: torch.fx.GraphModule) -> int:
    """Calls that launch work: everything but getitem and views (a rough count)."""
    from fxopt.analysis.cost import is_view_op

    return sum(1 for n in gm.graph.nodes if n.op == "call_function"
               and n.target is not operator.getitem and not is_view_op(n))


def launch_figures(device: torch.device, dim: int, tokens: int) -> None:
    from models import Block

    print(f"(c) calls per training step, transformer block dim={dim}, {tokens} tokens, "
          f"on {device}")
    for options in ({}, {"fuse_elementwise": True}):
        torch.manual_seed(0)
        model = Block(dim=dim, heads=max(dim // 64, 2)).to(device)
        backend = fxopt.backend(**options)
        compiled = torch.compile(model, backend=backend)
        compiled(torch.randn(1, tokens, dim, device=device)).sum().backward()
        graphs = backend.graphs[0].graphs
        count = sum(_launches(graphs[k]) for k in ("forward", "backward"))
        print(f"  {str(options or 'fxopt, no fusion'):32s} {count} calls "
              "(forward + backward graphs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, runs on the CPU")
    parser.add_argument("--no-inductor", action="store_true", help="skip the Inductor column")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    print(f"torch {torch.__version__}, python {platform.python_version()}, device "
          f"{torch.cuda.get_device_name() if device.type == 'cuda' else platform.machine()}"
          f", TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')}")
    if args.smoke:
        chain_figures(device, numel=3 * 37 * 11, repeat=3, inductor=not args.no_inductor)
        launch_figures(device, dim=32, tokens=7)
    else:
        chain_figures(device, numel=2**26, repeat=20, inductor=not args.no_inductor)
        launch_figures(device, dim=768, tokens=1024)


if __name__ == "__main__":
    main()
