"""``fxopt bench``: the training benchmark suite from the command line (also
``python benchmarks/run.py``).

Runs the chosen workloads under the chosen configurations and writes ``results.json``,
``results.md`` and a time-vs-memory chart per workload to ``--out``; prints the markdown
report. ``--smoke`` runs tiny sizes (on the CPU in a few minutes): without
``--workloads`` or ``--configs``, every configuration on the first workload and the other
workloads under eager and fxopt (`fxopt.bench.runner.smoke_pairs`); with either, the
named cross product. Exit status 2 for an
unknown workload or configuration or a malformed cap; 1 when every run failed.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

__all__ = ["add_bench_command", "run_bench"]


def add_bench_command(commands: argparse._SubParsersAction) -> None:
    """Register ``bench`` on the ``fxopt`` command's subparsers."""
    parser = commands.add_parser("bench", help="the training benchmark suite",
                                 description=__doc__.split("\n\n")[1])
    add_bench_arguments(parser)
    parser.set_defaults(run=run_bench)


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes and few steps (CPU-friendly; not performance "
                        "figures); alone: each configuration on one workload, each workload "
                        "under eager and fxopt")
    parser.add_argument("--workloads", nargs="+", metavar="NAME",
                        help="workloads to run (default: all; with --smoke, all but "
                        "gpt2-medium and bert-large, whose tiny models are the small ones)")
    parser.add_argument("--configs", nargs="+", metavar="NAME",
                        help="configurations to run (default: all)")
    parser.add_argument("--out", default="bench-results", help="output directory")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--steps", type=int, help="timed steps (default 10; smoke 3)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default 3; smoke 1)")
    parser.add_argument("--memory-cap", metavar="BYTES",
                        help="search the largest batch under this cap, e.g. 16GiB "
                             "(default: half the GPU's memory; none on the CPU; 'none' skips)")
    parser.add_argument("--max-batch", type=int, help="largest batch tried (default 1024; "
                        "smoke 16)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--list", action="store_true",
                        help="list the workloads and configurations, and exit")


def _cap(text: str | None, device: torch.device) -> int | None:  # noqa: F821
    import torch

    from fxopt.config import parse_memory_budget
    from fxopt.devices import indexed

    if text is None:
        if device.type == "cuda":
            return torch.cuda.get_device_properties(indexed(device)).total_memory // 2
        return None
    if text == "none":
        return None
    budget = parse_memory_budget(text, "--memory-cap")
    if budget is None or budget.bytes is None:
        raise ValueError(f"--memory-cap takes bytes such as 16GiB or 512MB, not {text!r}")
    return budget.bytes


def run_bench(args: argparse.Namespace) -> int:
    """The ``bench`` subcommand; returns the exit status."""
    import torch

    from fxopt.bench.configs import all_configs, get_configs
    from fxopt.bench.measure import Settings
    from fxopt.bench.runner import all_pairs, run_suite, smoke_pairs
    from fxopt.bench.workloads import WORKLOADS, get_workloads

    if args.list:
        print("workloads:", ", ".join(WORKLOADS))
        print("configurations:", ", ".join(c.name for c in all_configs()))
        return 0
    try:
        workloads = get_workloads(args.workloads, smoke=args.smoke)
        configs = get_configs(args.configs)
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available")
        for name in ("steps", "warmup", "max_batch"):
            value = getattr(args, name)
            if value is not None and value < (0 if name == "warmup" else 1):
                raise ValueError(f"--{name.replace('_', '-')} must be positive, not {value}")
        settings = Settings(
            smoke=args.smoke, device=device,
            warmup=args.warmup if args.warmup is not None else (1 if args.smoke else 3),
            steps=args.steps or (3 if args.smoke else 10),
            memory_cap=_cap(args.memory_cap, device),
            max_batch=args.max_batch or (16 if args.smoke else 1024))
    except (ValueError, TypeError) as exc:
        print(f"fxopt bench: {str(exc).removeprefix('fxopt: ')}", file=sys.stderr)
        return 2
    command = "python -m fxopt bench " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["bench"]
                                                    else sys.argv[1:])
    covering = args.smoke and args.workloads is None and args.configs is None
    pairs = (smoke_pairs if covering else all_pairs)(workloads, configs)
    suite = run_suite(pairs, settings, Path(args.out), command=command,
                      progress=not args.no_progress)
    print(suite.report)
    print("wrote " + ", ".join(str(p) for p in [suite.json_path, suite.markdown_path,
                                                 *suite.charts]))
    return 0 if any(r.status == "ok" for r in suite.results) else 1
