"""Declare fxopt's ``torch_dynamo_backends`` entry point for a checkout that is not installed.

``torch.compile(model, backend="fxopt")`` finds fxopt through that entry point, and only
an installed distribution declares one (``importlib.metadata`` reads it from a
``.dist-info`` folder on ``sys.path``). The GPU machine runs the checkout as it is, on
``PYTHONPATH=.``, with no install (no network, and the project's build backend may be
missing there); there every ``backend="fxopt"`` raised ``InvalidBackend``.

    python benchmarks/declare_entry_point.py FOLDER

When the entry point is not found, this writes ``FOLDER/fxopt-<version>.dist-info``
(``METADATA`` and ``entry_points.txt``, read from ``pyproject.toml``) and prints FOLDER,
to be put on ``PYTHONPATH``; when it is found (an installed fxopt), it writes and prints
nothing. ``benchmarks/gpu_session.sh`` runs it first.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, the parser tomllib came from (pytest needs it)
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
GROUP = "torch_dynamo_backends"


def declared(name: str = "fxopt") -> bool:
    """Whether ``backend=name`` can be found through an entry point now."""
    return bool(importlib.metadata.entry_points(group=GROUP, name=name))


def write_metadata(folder: Path, pyproject: Path = REPO / "pyproject.toml") -> Path:
    """Write the distribution metadata that declares ``pyproject``'s entry points into
    ``folder`` (replacing what an earlier call wrote); returns the ``.dist-info`` folder."""
    project = tomllib.loads(pyproject.read_text())["project"]
    name, version = project["name"], project["version"]
    groups = project.get("entry-points", {})
    if "fxopt" not in groups.get(GROUP, {}):
        raise ValueError(f"{pyproject} declares no {GROUP} entry point named fxopt")
    info = folder / f"{name}-{version}.dist-info"
    for earlier in folder.glob(f"{name}-*.dist-info"):
        shutil.rmtree(earlier)
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{key} = {value}\n" for key, value in points.items()) + "\n"
        for group, points in groups.items()))
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="where to write the .dist-info folder")
    folder = parser.parse_args(argv).folder.resolve()
    if not declared():
        write_metadata(folder)
        print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
