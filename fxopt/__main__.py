"""The ``fxopt`` command line (also ``python -m fxopt``).

Subcommands: ``passes`` lists every pass with its stage, flag and default,
and the options with their documentation; ``diff`` shows what each pass did to each graph
of a ``debug_dir`` dump (`fxopt.cli.debug`); ``profile`` breaks a training step's memory
into categories (`fxopt.cli.profile`); ``bench`` runs the benchmark suite (`fxopt.cli.bench`);
``plan`` prints the planner's time-vs-memory frontier and ``calibrate`` measures the device
(`fxopt.cli.planner`); ``explain`` prints `fxopt.explain`'s report for a model a script
builds (TARGET as for ``profile``, `fxopt.cli.targets`). Every command's parser and
printing lives in `fxopt.cli` or here; the layered packages import none of it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _passes(args: argparse.Namespace) -> int:
    from fxopt.config import option_docs
    from fxopt.passes import PIPELINE

    rows = [("pass", "stage", "flag", "default", "description")]
    for spec in PIPELINE:
        rows.append((spec.name, "/".join(s.value for s in spec.stages), spec.flag or "-",
                     spec.default_text, spec.description))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4])
    if args.options:
        print("\noptions (torch.compile(..., backend='fxopt', options={...}); "
              "environment: FXOPT_<NAME>):")
        for name, doc in option_docs().items():
            print(f"  {name:<22}{doc}")
    return 0


def _explain(args: argparse.Namespace) -> int:
    import json

    from fxopt.explain import explain
    from fxopt.cli.targets import TargetError, load_function

    try:
        options = dict(item.split("=", 1) for item in args.option)
    except ValueError:
        print(f"fxopt explain: --option takes NAME=VALUE, got {args.option}", file=sys.stderr)
        return 2
    try:
        result = load_function(args.target, "setup")()
        if not isinstance(result, (tuple, list)) or len(result) < 2:
            raise TargetError(f"{args.target} must return (model, inputs, ...), not "
                              f"{type(result).__name__}")
        model, inputs = result[0], result[1]
        report = explain(model, *(inputs if isinstance(inputs, (tuple, list)) else (inputs,)),
                         options=options)
    except (TargetError, TypeError, ValueError) as exc:
        print(f"fxopt explain: {exc}", file=sys.stderr)
        return 2
    print(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_dict(), f, indent=1)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fxopt", description="fxopt: a torch.compile backend that cuts training memory "
        "and time (torch.compile(model, backend='fxopt')).")
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("passes", help="list the passes, their stages and defaults")
    listing.add_argument("--options", action="store_true", help="also list every option")
    listing.set_defaults(run=_passes)
    explaining = commands.add_parser(
        "explain", help="compile one training step of a script's model and say what each "
        "pass did", description="TARGET is script.py[:function] or package.module[:function] "
        "(default function: setup), returning (model, inputs[, ...]) as for 'fxopt profile'; "
        "one forward and backward of model(*inputs) runs, as fxopt.explain does.")
    explaining.add_argument("target", help="script.py[:function] or package.module[:function]")
    explaining.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                            help="an fxopt option, e.g. tempo=1 or memory_budget=6GiB "
                            "(repeat for several)")
    explaining.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    explaining.set_defaults(run=_explain)
    from fxopt.cli.debug import add_diff_command

    add_diff_command(commands)
    from fxopt.cli.planner import add_planner_commands

    add_planner_commands(commands)
    from fxopt.cli.profile import add_profile_command

    add_profile_command(commands)
    from fxopt.cli.bench import add_bench_command

    add_bench_command(commands)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
