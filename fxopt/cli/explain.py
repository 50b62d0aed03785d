"""``fxopt explain TARGET``: compile one training step of a script's model and print what
each pass did (`fxopt.explain`'s report).

TARGET is ``script.py[:function]`` or ``package.module[:function]`` (default function:
``setup``), returning ``(model, inputs[, ...])`` as for ``fxopt profile``; one forward and
backward of ``model(*inputs)`` runs, as `fxopt.explain` does. Exit status 2 with a message
on standard error when the target cannot be loaded or an option is refused.
"""

from __future__ import annotations

import argparse
import json
import sys

from fxopt.cli.targets import TargetError, load_function

__all__ = ["add_explain_command", "run_explain"]


def add_explain_command(commands: argparse._SubParsersAction) -> None:
    """Register ``explain`` on the ``fxopt`` command's subparsers."""
    parser = commands.add_parser(
        "explain", help="compile one training step of a script's model and say what each "
        "pass did", description=__doc__.split("\n\n")[1])
    parser.add_argument("target", help="script.py[:function] or package.module[:function]")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                        help="an fxopt option, e.g. tempo=1 or memory_budget=6GiB "
                        "(repeat for several)")
    parser.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    parser.set_defaults(run=run_explain)


def run_explain(args: argparse.Namespace) -> int:
    """The ``explain`` subcommand; returns the exit status."""
    from fxopt.explain import explain

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
