"""fuse_linear_cross_entropy_chunks on a transformers LM (real vocabulary): the pieces each
bound buys, the step's predicted and measured peak, and the step time, against the ops'
default pieces, in one process.

Configurations, each its own compiled copy of the model (``model(ids, labels=ids).loss``
under ``fxopt.ignore_transformers_logging()``, fp32, ``fuse_linear_cross_entropy=True``):

- ``default``: the ops' default pieces (the pass held back by ``rewrite_limit``);
- ``flag``: the pass with no budget: the fewest pieces that keep the default's peak;
- ``budget+K``: a byte ``memory_budget`` of the default's predicted peak plus K MiB: the
  fewest pieces whose step is predicted within it.

Per configuration: the pieces of each sized op (default -> chosen), the predicted peak (the
pass's simulation of the step), the measured peak (``fxopt.profile_memory``: every
allocation, exact on the CPU) and the step time (``fxopt.bench.timing.interleaved``: one
thread, the configurations stepped in turn, median and min-max).

On the CPU the pass declines (the torch path runs larger pieces slower, which this script
measured): ``--on-cpu`` takes its decision there anyway (``larger_pieces_pay`` patched), to
measure what larger pieces do.

    PYTHONPATH=. python benchmarks/fuse_linear_cross_entropy_chunks.py --model gpt2 \\
        [--batch 4] [--seq 128] [--codegen fx] [--extra-mib 50 200] [--steps 7] [--on-cpu]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys

import torch
import transformers  # noqa: F401 (before ignore_transformers_logging, which wraps its logging)
from torch import nn

import fxopt
from fxopt.bench.timing import interleaved
from fxopt.graph_breaks import ignore_transformers_logging
from fxopt.units import format_mib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fuse_linear_cross_entropy import build  # noqa: E402
from fuse_linear_cross_entropy_step import loss_module  # noqa: E402

PASS = "fuse_linear_cross_entropy_chunks"


def _options(codegen: str, config: str, default_peak: int | None) -> dict:
    options = {"fuse_linear_cross_entropy": True, "codegen": codegen, "strict": True}
    if config == "default":
        options["rewrite_limit"] = {PASS: 0}
    elif config.startswith("budget+"):
        options["memory_budget"] = default_peak + int(config[len("budget+"):]) * 2**20
    return options


def _sizes(backend) -> list[dict]:
    return [row for graph in backend.graphs for record in graph.passes
            if record.name == PASS for row in record.stats.get("sizes", ())]


def _pieces(rows: list[dict], default: bool) -> str:
    return ", ".join(f"{r['form']} {r['default_pieces']}->"
                     f"{r['default_pieces'] if default else r['pieces']}" for r in rows) or \
        "(declined: default)"


def _predicted(rows: list[dict], default: bool) -> int | None:
    return max((r["peak_bytes_default"] if default or "peak_bytes" not in r
                else r["peak_bytes"] for r in rows), default=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2", choices=["gpt2", "llama"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--codegen", default="fx", choices=["fx", "inductor"])
    parser.add_argument("--extra-mib", type=int, nargs="*", default=[50, 200])
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--on-cpu", action="store_true")
    args = parser.parse_args()
    if args.on_cpu:
        module = importlib.import_module(f"fxopt.passes.{PASS}")
        module.larger_pieces_pay = lambda device: True
    torch.set_num_threads(1)
    ids = torch.randint(0, 32000, (args.batch, args.seq),
                        generator=torch.Generator().manual_seed(1))
    configs = ["default", "flag"] + [f"budget+{k}" for k in args.extra_mib]
    rows, steps, default_peak = {}, {}, None
    with ignore_transformers_logging():
        for config in configs:
            module = loss_module(config.replace("+", "_"), build(args.model, args.seq))
            backend = fxopt.backend(**_options(args.codegen, config, default_peak))
            compiled = torch.compile(module, backend=backend)
            measured = fxopt.profile_memory(compiled, (ids,), steps=1,
                                            loss_fn=lambda out: out).peak_bytes
            sizes = _sizes(backend)
            if config == "default":
                default_peak = _predicted(sizes, True) or measured
            rows[config] = (sizes, measured)
            steps[config] = functools.partial(_step, module, compiled, ids)
        times = interleaved(steps, "cpu", warmup=1, rounds=args.steps)
    print(f"# {args.model}, batch {args.batch} x seq {args.seq}, codegen {args.codegen}, "
          f"1 thread, {args.steps} interleaved steps, torch {torch.__version__}"
          + (", the pass's decision taken on the CPU (--on-cpu)" if args.on_cpu else ""))
    print("| configuration | budget MiB | pieces (default->chosen) | predicted peak MiB | "
          "measured peak MiB | step ms median (min-max) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for config in configs:
        sizes, measured = rows[config]
        budget = (format_mib(default_peak + int(config[len("budget+"):]) * 2**20)
                  if config.startswith("budget+") else "-")
        default = config == "default"
        print(f"| {config} | {budget} | {_pieces(sizes, default)} | "
              f"{format_mib(_predicted(sizes, default))} | {format_mib(measured)} | "
              f"{times[config].text(1)} |")


def _step(module: nn.Module, fn, ids: torch.Tensor) -> None:
    fn(ids).backward()
    module.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
