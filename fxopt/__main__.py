"""The ``fxopt`` command line (also ``python -m fxopt``).

Subcommands: ``passes`` lists every pass with its stage, flag, default and availability,
and the options with their documentation; ``diff`` shows what each pass did to each graph
of a ``debug_dir`` dump (`fxopt.debug.cli`); ``profile`` breaks a training step's memory
into categories (`fxopt.profile.cli`); ``bench`` runs the benchmark suite (`fxopt.bench.cli`);
``plan`` prints the planner's time-vs-memory frontier and ``calibrate`` measures the device
(`fxopt.planner.cli`); ``doctor`` runs the self-test for bug reports (`fxopt.doctor`).
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
        default = spec.default_text if spec.available else f"not available yet ({spec.issue})"
        rows.append((spec.name, "/".join(s.value for s in spec.stages), spec.flag or "-",
                     default, spec.description))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4])
    if args.options:
        print("\noptions (torch.compile(..., backend='fxopt', options={...}); "
              "environment: FXOPT_<NAME>):")
        for name, doc in option_docs().items():
            print(f"  {name:<22}{doc}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    import json

    from fxopt.doctor import CHECKS, format_report, report_json, run_doctor

    unknown = sorted(set(args.only or ()) - set(CHECKS))
    if unknown:
        print(f"fxopt doctor: unknown check(s) {unknown}; choose from {sorted(CHECKS)}")
        return 2
    checks = run_doctor(args.device, args.only)
    print(format_report(checks))
    with open(args.json, "w") as f:
        json.dump(report_json(checks), f, indent=1, default=str)
    print(f"\nwrote {args.json}: paste it into the bug report")
    return 1 if any(c.status == "failed" for c in checks) else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fxopt", description="fxopt: a torch.compile backend that cuts training memory "
        "and time (torch.compile(model, backend='fxopt')).")
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("passes", help="list the passes, their stages and defaults")
    listing.add_argument("--options", action="store_true", help="also list every option")
    listing.set_defaults(run=_passes)
    doctor = commands.add_parser("doctor", help="self-test on this machine (GPU: every check)"
                                 ", for a bug report")
    doctor.add_argument("--device", help="cuda or cpu (default: cuda when there is one)")
    doctor.add_argument("--only", nargs="+", metavar="CHECK", help="run only these checks")
    doctor.add_argument("--json", default="fxopt_doctor.json", help="where to write the report")
    doctor.set_defaults(run=_doctor)
    from fxopt.debug.cli import add_diff_command

    add_diff_command(commands)
    from fxopt.planner.cli import add_planner_commands

    add_planner_commands(commands)
    from fxopt.profile.cli import add_profile_command

    add_profile_command(commands)
    from fxopt.bench.cli import add_bench_command

    add_bench_command(commands)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
