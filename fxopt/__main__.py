"""The ``fxopt`` command line (also ``python -m fxopt``).

Subcommands: ``passes`` lists every pass with its stage, flag and default,
and the options with their documentation; ``diff`` shows what each pass did to each graph
of a ``debug_dir`` dump (`fxopt.cli.debug`); ``profile`` breaks a training step's memory
into categories (`fxopt.cli.profile`); ``bench`` runs the benchmark suite (`fxopt.cli.bench`);
``plan`` prints the planner's time-vs-memory frontier and ``calibrate`` measures the device
(`fxopt.cli.planner`); ``explain`` prints `fxopt.explain`'s report for a model a script
builds (`fxopt.cli.explain`); ``doctor`` runs the self-test for bug reports
(`fxopt.cli.doctor`). Every command's parser and printing lives in `fxopt.cli`; the
layered packages import none of it.
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fxopt", description="fxopt: a torch.compile backend that cuts training memory "
        "and time (torch.compile(model, backend='fxopt')).")
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("passes", help="list the passes, their stages and defaults")
    listing.add_argument("--options", action="store_true", help="also list every option")
    listing.set_defaults(run=_passes)
    from fxopt.cli.explain import add_explain_command

    add_explain_command(commands)
    from fxopt.cli.doctor import add_doctor_command

    add_doctor_command(commands)
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
