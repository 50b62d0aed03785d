"""Command-line targets: the code that builds a model for ``fxopt plan`` and ``fxopt profile``.

A target is ``path/to/script.py[:function]`` or ``package.module[:function]``; the function
takes no arguments and returns the model and its inputs (each command says what else it
accepts). A script's folder, or the working directory for a module, goes on ``sys.path``
as ``python script.py`` or ``python -m`` would put it, so the target's own imports work
when the module loads and when the function runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["TargetError", "load_function"]


class TargetError(ValueError):
    """A target that cannot be loaded or does not keep its command's contract."""


def load_function(target: str, default: str) -> Callable[[], Any]:
    """The function ``target`` names (``default`` when it names none)."""
    location, _, name = target.partition(":")
    name = name or default
    if location.endswith(".py"):
        path = Path(location)
        if not path.is_file():
            raise TargetError(f"no such script: {location}")
        _importable(str(path.resolve().parent))
        spec = importlib.util.spec_from_file_location(f"_fxopt_target_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        _importable(os.getcwd())
        try:
            module = importlib.import_module(location)
        except ImportError as exc:
            raise TargetError(f"cannot import {location!r}: {exc}") from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise TargetError(f"{location} has no function {name!r} (give script.py:function)")
    return fn


def _importable(folder: str) -> None:
    if folder not in sys.path:
        sys.path.insert(0, folder)
