"""``fxopt doctor``: the self-test a user runs and pastes into a bug report.

It runs `fxopt.doctor`'s checks on this machine (every check on a GPU; the CPU subset
elsewhere, listing what it skipped), prints the table a row at a time as each check ends,
and writes the report as JSON after each one, so a run stopped part-way (a first run on a GPU
compiles for minutes) keeps what it found. Exit status 1 when a check failed, 2 for an
unknown check name.
"""

from __future__ import annotations

import argparse
import json

__all__ = ["add_doctor_command", "run_doctor_command"]


def add_doctor_command(commands: argparse._SubParsersAction) -> None:
    """Register ``doctor`` on the ``fxopt`` command's subparsers."""
    parser = commands.add_parser(
        "doctor", help="self-test on this machine (GPU: every check), for a bug report",
        description=__doc__.split("\n\n")[1])
    parser.add_argument("--device", help="cuda or cpu (default: cuda when there is one)")
    parser.add_argument("--only", nargs="+", metavar="CHECK", help="run only these checks")
    parser.add_argument("--json", default="fxopt_doctor.json", help="where to write the report")
    parser.set_defaults(run=run_doctor_command)


def run_doctor_command(args: argparse.Namespace) -> int:
    """The ``doctor`` subcommand; returns the exit status."""
    from fxopt.doctor import CHECKS, run_doctor
    from fxopt.doctor.report import format_footer, format_header, format_line, report_json

    unknown = sorted(set(args.only or ()) - set(CHECKS))
    if unknown:
        print(f"fxopt doctor: unknown check(s) {unknown}; choose from {sorted(CHECKS)}")
        return 2
    print(format_header(), flush=True)

    def report(check, done) -> None:
        print(format_line(check), flush=True)
        with open(args.json, "w") as f:
            json.dump(report_json(done), f, indent=1, default=str)

    checks = run_doctor(args.device, args.only, on_check=report)
    footer = format_footer(checks)
    if footer:
        print(footer)
    print(f"\nwrote {args.json}: paste it into the bug report")
    return 1 if any(c.status == "failed" for c in checks) else 0
