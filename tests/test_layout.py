"""The package's layout rules, checked on its source: fxopt's subpackages and top-level
modules import each other without a cycle, none imports the command line (fxopt.cli) but
``fxopt.__main__``, no module passes 600 lines, and private torch APIs are used only
through the adapters (fxopt/_compat.py, and the profiler's fxopt/profile/_torch.py)."""

import ast
from collections import defaultdict
from pathlib import Path

import fxopt

PACKAGE = Path(fxopt.__file__).parent
ADAPTERS = {PACKAGE / "_compat.py", PACKAGE / "profile" / "_torch.py"}
MAX_LINES = 600
# Modules allowed past MAX_LINES, each with its reason. None today.
LONG_MODULES: dict[str, str] = {}


def _unit(module: str) -> str:
    """The part of fxopt a module belongs to: its subpackage or top-level module
    (``fxopt.passes.tempo.sites`` -> ``passes``, ``fxopt.compiler`` -> ``compiler``),
    ``fxopt`` for the package's own ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "fxopt"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """unit -> the other units it imports (at module level or inside functions)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        source = _unit(_module_name(path))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [f"{node.module}.{a.name}" if node.module == "fxopt" else node.module
                         for a in node.names]
            else:
                continue
            for name in names:
                if name == "fxopt" or name.startswith("fxopt."):
                    target = _unit(name)
                    if target != source:
                        graph[source].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (a path that returns to its start), or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(unit: str) -> list[str] | None:
        state[unit] = "open"
        path.append(unit)
        for target in sorted(graph.get(unit, ())):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[unit] = "done"
        path.pop()
        return None

    for unit in sorted(graph):
        if unit not in state and (cycle := visit(unit)):
            return cycle
    return None


def test_no_import_cycle_among_the_subpackages():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_only_main_imports_the_command_line():
    importers = sorted(u for u, targets in import_graph().items()
                       if "cli" in targets and u != "__main__")
    assert not importers, f"import fxopt.cli (command-line code): {importers}"


def test_the_cycle_check_finds_a_cycle():
    graph = {"debug": {"pipeline"}, "pipeline": {"passes"}, "passes": {"planner"},
             "planner": {"debug", "units"}}
    assert find_cycle(graph) == ["debug", "pipeline", "passes", "planner", "debug"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None


def test_no_module_passes_the_line_budget():
    long = {str(path.relative_to(PACKAGE.parent)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    unexplained = {path: n for path, n in long.items() if path not in LONG_MODULES}
    assert not unexplained, (f"modules over {MAX_LINES} lines (split them, or list them in "
                             f"LONG_MODULES with the reason): {unexplained}")


def _is_private(dotted: str) -> bool:
    """``torch._dynamo``, ``torch.utils._pytree``, ``torch._C._nn.linear``; not dunders."""
    parts = dotted.split(".")
    return parts[0] == "torch" and any(
        p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts[1:])


def _dotted(node: ast.Attribute) -> str | None:
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(names)]) if isinstance(node, ast.Name) else None


def private_torch_uses(source: str) -> set[str]:
    """The private torch names ``source`` imports or reads (whole attribute chains)."""
    tree = ast.parse(source)
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    uses = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            uses |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            uses |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Attribute) and id(node) not in inner:
            uses.add(_dotted(node) or "")
    return {use for use in uses if _is_private(use)}


def test_private_torch_apis_only_through_the_adapters():
    found = [f"{path.relative_to(PACKAGE.parent)}: {use}"
             for path in sorted(PACKAGE.rglob("*.py")) if path not in ADAPTERS
             for use in sorted(private_torch_uses(path.read_text()))]
    assert not found, "private torch APIs outside fxopt/_compat.py:\n" + "\n".join(found)


def test_the_private_api_check_sees_each_spelling():
    source = ("import torch.utils._pytree as pytree\nfrom torch._dynamo import reset\n"
              "import torch\nx = torch._C._nn.linear(a, b)\nv = torch.__version__\n"
              "y = torch.nn.functional.gelu\n")
    assert private_torch_uses(source) == {
        "torch.utils._pytree", "torch._dynamo.reset", "torch._C._nn.linear"}
