"""``fxopt profile TARGET``: profile the memory of a training step defined in a script.

TARGET is ``path/to/script.py`` or ``package.module``, optionally followed by
``:function`` (default ``setup``). The function takes no arguments and returns
``(model, inputs)``, ``(model, inputs, optimizer)`` or ``(model, inputs, optimizer,
loss_fn)``, the arguments of `fxopt.profile_memory`. ``--compile`` wraps the model in
``torch.compile`` first. Prints the table; writes ``memory_profile.json`` and (with
matplotlib) ``memory_profile.png`` to ``--out``. Exit status 2 with a message on standard
error when the target cannot be loaded or does not follow this contract.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fxopt.cli.targets import TargetError, load_function

__all__ = ["add_profile_command", "run_profile"]

DEFAULT_FUNCTION = "setup"


def add_profile_command(commands: argparse._SubParsersAction) -> None:
    """Register ``profile`` on the ``fxopt`` command's subparsers."""
    parser = commands.add_parser(
        "profile", help="memory of a training step by category (table, JSON, chart)",
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[1])
    parser.add_argument("target", help="script.py[:function] or package.module[:function]")
    parser.add_argument("--steps", type=int, default=2, help="profiled steps (default 2)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="unprofiled steps first (default 1)")
    parser.add_argument("--compile", choices=("none", "inductor", "fxopt"), default="none",
                        help="torch.compile the model with this backend first")
    parser.add_argument("--out", default=".", help="directory for the JSON and PNG")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.set_defaults(run=run_profile)


def _unpack(result: Any, target: str) -> tuple[Any, Any, Any, Any]:
    if not isinstance(result, (tuple, list)) or not 2 <= len(result) <= 4:
        raise TargetError(f"{target} must return (model, inputs[, optimizer[, loss_fn]]), "
                          f"not {type(result).__name__}")
    model, inputs, optimizer, loss_fn = (*result, None, None)[:4]
    return model, inputs, optimizer, loss_fn


def run_profile(args: argparse.Namespace) -> int:
    """The ``profile`` subcommand; returns the exit status."""
    import torch

    from fxopt.profile.profiler import profile_memory

    try:
        setup = load_function(args.target, DEFAULT_FUNCTION)
        model, inputs, optimizer, loss_fn = _unpack(setup(), args.target)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
    except (TargetError, OSError) as exc:
        print(f"fxopt profile: {exc}", file=sys.stderr)
        return 2
    if args.compile != "none":
        if args.compile == "fxopt":
            import fxopt

            model = torch.compile(model, backend=fxopt.backend())
        else:
            model = torch.compile(model, backend="inductor")
    try:
        result = profile_memory(model, inputs, optimizer, steps=args.steps,
                                warmup=args.warmup, loss_fn=loss_fn)
    except (TypeError, ValueError) as exc:
        print(f"fxopt profile: {exc}", file=sys.stderr)
        return 2
    print(result.table())
    written = [result.save_json(out / "memory_profile.json")]
    if not args.no_plot:
        try:
            written.append(result.plot(out / "memory_profile.png", title=args.target))
        except RuntimeError as exc:
            print(f"fxopt profile: {exc}", file=sys.stderr)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0
