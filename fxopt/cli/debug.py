"""``fxopt diff DIR [DIR2]``: what each pass did to each graph of a debug dump.

With one directory, each pass that changed a graph is compared with the graph it was
given; with two, each final graph of the first dump is compared with the second's. Exit
status 0 on success, 2 with a message on standard error for a missing or malformed dump,
a filter that matches nothing, or an output file that cannot be written.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fxopt.debug.diff import Dump, DumpError, Step, dump_comparisons, load_dump, pass_steps
from fxopt.debug.text import render_steps, unified

__all__ = ["add_diff_command", "run_diff"]


def add_diff_command(commands: argparse._SubParsersAction) -> None:
    """Register ``diff`` on the ``fxopt`` command's subparsers."""
    parser = commands.add_parser(
        "diff", help="per-pass graph diffs of a debug_dir dump (terminal or HTML)",
        description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", metavar="DIR",
                        help="a debug_dir; give two to compare them graph by graph")
    parser.add_argument("--graph", action="append",
                        help="only this graph (g0) or graph kind (g0/backward); repeatable")
    parser.add_argument("--pass", dest="pass_name", help="only this pass")
    parser.add_argument("--stat", action="store_true", help="only the per-pass summaries")
    parser.add_argument("--unified", action="store_true",
                        help="a unified diff of the two readable dumps of each pass")
    parser.add_argument("--html", metavar="OUT", help="write a self-contained HTML page")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                        help="colours: auto (on a terminal, unless NO_COLOR is set)")
    parser.set_defaults(run=run_diff)


def _use_colour(choice: str) -> bool:
    if choice != "auto":
        return choice == "always"
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


def _steps(args: argparse.Namespace) -> tuple[list[Step], list[str]]:
    """The steps to show, and notes: per graph that no pass changed, a line saying so;
    for two dumps with different numbers of graphs, which were compared."""
    if len(args.dirs) > 2:
        raise DumpError(f"give one or two debug dirs, not {len(args.dirs)}")
    dumps = [load_dump(d) for d in args.dirs]
    _check_graphs(dumps[0], args.graph or ())
    if len(dumps) == 2:
        if args.pass_name:
            raise DumpError("--pass applies to one dump; two dumps are compared by "
                            "their final graphs")
        counts = [len(d.graphs) for d in dumps]
        notes = [] if counts[0] == counts[1] else [
            f"A has {counts[0]} graphs, B has {counts[1]}: compared the first "
            f"{min(counts)} in capture order (a graph break differs?)"]
        return dump_comparisons(dumps[0], dumps[1], args.graph), notes
    dump = dumps[0]
    steps = pass_steps(dump, args.graph, args.pass_name)
    if args.pass_name:
        if not steps:
            changed = sorted({s.name for s in pass_steps(dump, args.graph)})
            raise DumpError(f"pass {args.pass_name!r} changed no graph in {dump.root}; "
                            f"passes that did: {', '.join(changed) or 'none'}")
        return steps, []
    return steps, _untouched(dump, steps, args.graph)


def _check_graphs(dump: Dump, names: list[str] | tuple[()]) -> None:
    """Every ``--graph`` names a graph (``g0``) or graph kind (``g0/forward``) of ``dump``
    (the first dump, when comparing two)."""
    known = set(dump.graphs) | {f"{g}/{k}" for g in dump.graphs for k in dump.chains(g)}
    for name in names:
        if name not in known:
            raise DumpError(f"no graph {name!r} in {dump.root}; graphs: "
                            f"{', '.join(sorted(known))}")


def _untouched(dump: Dump, steps: list[Step], graphs: list[str] | None) -> list[str]:
    """A line per shown graph that no pass changed, with its graphs' node counts."""
    changed = {step.graph for step in steps}
    lines = []
    for graph in dump.graphs:
        if graph in changed or (graphs is not None and graph not in graphs):
            continue
        sizes = ", ".join(f"{kind} {chain[-1].get('nodes', '?')} nodes"
                          for kind, chain in dump.chains(graph).items())
        lines.append(f"{graph}: no pass changed its graphs ({sizes})")
    return lines


def run_diff(args: argparse.Namespace) -> int:
    """The ``diff`` subcommand; returns the exit status."""
    try:
        steps, notes = _steps(args)
        if args.html:
            from fxopt.debug.html import write_html

            write_html(steps, Path(args.html), args.dirs)
            print(f"fxopt diff: wrote {args.html} ({len(steps)} diffs)")
            return 0
        if args.unified:
            lines = [line for step in steps for line in unified(step)]
        else:
            header = [f"A: {args.dirs[0]}", f"B: {args.dirs[1]}"] if len(args.dirs) == 2 else []
            lines = header + list(render_steps(steps, stat=args.stat,
                                               colour=_use_colour(args.color))) + notes
    except (DumpError, OSError) as exc:
        print(f"fxopt diff: {exc}", file=sys.stderr)
        return 2
    if lines:
        _print_to_a_pipe("\n".join(lines))
    return 0


def _print_to_a_pipe(text: str) -> None:
    """Print; a reader that stops early (``fxopt diff dbg | head``) ends the output
    quietly, as for any Unix tool, instead of a BrokenPipeError traceback."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at /dev/null so that flush is quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
