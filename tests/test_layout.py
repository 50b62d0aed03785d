"""The package's layout rules, checked on its source: fxopt's subpackages and top-level
modules import each other without a cycle, none imports the command line (fxopt.cli) but
``fxopt.__main__``, no module passes 600 lines, and private torch APIs are used only
through the adapters (the fxopt/_compat package, and the profiler's
fxopt/profile/_torch.py), and
``torch.cuda`` is given devices with their index (fxopt/devices.py)."""

import ast
from collections import defaultdict
from pathlib import Path

import fxopt

PACKAGE = Path(fxopt.__file__).parent
ADAPTERS = {*(PACKAGE / "_compat").glob("*.py"), PACKAGE / "profile" / "_torch.py"}
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
    assert not found, "private torch APIs outside fxopt/_compat:\n" + "\n".join(found)


def test_the_private_api_check_sees_each_spelling():
    source = ("import torch.utils._pytree as pytree\nfrom torch._dynamo import reset\n"
              "import torch\nx = torch._C._nn.linear(a, b)\nv = torch.__version__\n"
              "y = torch.nn.functional.gelu\n")
    assert private_torch_uses(source) == {
        "torch.utils._pytree", "torch._dynamo.reset", "torch._C._nn.linear"}


# torch.cuda functions that take a device, and the position of that argument
CUDA_DEVICE_ARGUMENT = dict.fromkeys((
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "reset_peak_memory_stats", "memory_stats", "memory_summary", "mem_get_info",
    "synchronize", "current_stream", "default_stream", "Stream", "get_device_name",
    "get_device_properties", "get_device_capability", "set_device", "device",
    "get_per_process_memory_fraction"), 0) | {"set_per_process_memory_fraction": 1}
# Calls the check cannot see are indexed, each with its reason.
INDEXED_BY_ORIGIN = {
    "fxopt/optim/runtime.py": {"torch.cuda.Stream(cuda[0])": "a parameter's own device"},
}


def _is_indexed_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and "indexed" in (
        getattr(node.func, "id", None), getattr(node.func, "attr", None))


def _is_indexed(node: ast.AST) -> bool:
    """``indexed(...)`` or ``indexed(...).index``."""
    if isinstance(node, ast.Attribute) and node.attr == "index":
        node = node.value
    return _is_indexed_call(node)


def unindexed_cuda_devices(source: str) -> list[str]:
    """``torch.cuda`` calls (line: call) whose device argument may be a CUDA device without
    an index. Accepted: no argument, an int or None, ``indexed(...)`` (fxopt.devices) or its
    ``.index``, a name the enclosing function bound to ``indexed(...)``, and the ``.device``
    of an object (a tensor's or a stream's, which carries its index; bench's ``Settings``
    normalises its own)."""
    tree = ast.parse(source)
    found = []
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in [tree, *scopes]:
        bound = {t.id for n in ast.walk(scope) if isinstance(n, ast.Assign)
                 and _is_indexed(n.value) for t in n.targets if isinstance(t, ast.Name)}
        for node in ast.walk(scope):
            name = _dotted(node.func) if isinstance(node, ast.Call) and isinstance(
                node.func, ast.Attribute) else None
            if not name or not name.startswith("torch.cuda.") or (
                    name.split(".")[-1] not in CUDA_DEVICE_ARGUMENT) or name.count(".") != 2:
                continue
            position = CUDA_DEVICE_ARGUMENT[name.split(".")[-1]]
            arg = next((k.value for k in node.keywords if k.arg == "device"),
                       node.args[position] if len(node.args) > position else None)
            if arg is None or (isinstance(arg, ast.Constant) and not isinstance(arg.value, str)):
                continue
            if _is_indexed(arg) or (isinstance(arg, ast.Attribute) and arg.attr == "device"):
                continue
            if isinstance(arg, ast.Name) and arg.id in bound:
                continue
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(set(found))


def test_torch_cuda_is_given_indexed_devices():
    """``torch.device("cuda")`` reaching ``set_per_process_memory_fraction`` raised on torch
    2.11 ("Expected a torch.device with a specified index"): every device fxopt hands
    ``torch.cuda`` goes through fxopt.devices.indexed or is a tensor's or stream's own."""
    found = [f"{name}:{call}" for path in sorted(PACKAGE.rglob("*.py"))
             for call in unindexed_cuda_devices(path.read_text())
             if call.split(": ", 1)[1] not in INDEXED_BY_ORIGIN.get(
                 name := str(path.relative_to(PACKAGE.parent)), {})]
    assert not found, "torch.cuda calls given a device that may lack its index:\n" + \
        "\n".join(found)


def test_the_cuda_device_check_sees_each_spelling():
    source = ("def f(device, settings, x):\n"
              "    torch.cuda.set_per_process_memory_fraction(0.5, device)\n"
              "    torch.cuda.synchronize('cuda')\n"
              "    torch.cuda.memory_allocated(device=torch.device('cuda'))\n"
              "    torch.cuda.synchronize(indexed(device))\n"
              "    torch.cuda.current_stream(x.device)\n"
              "    torch.cuda.Stream(device=indexed(device).index)\n"
              "    i = indexed(device).index\n"
              "    torch.cuda.Stream(i)\n"
              "    torch.cuda.synchronize()\n"
              "    d = indexed(device)\n"
              "    torch.cuda.reset_peak_memory_stats(d)\n"
              "    torch.cuda.set_per_process_memory_fraction(1.0, 0)\n")
    assert [line.split(":")[0] for line in unindexed_cuda_devices(source)] == ["2", "3", "4"]


def test_every_fxopt_op_the_package_names_is_registered_by_its_passes():
    """A pass that puts ``torch.ops.fxopt.<op>`` in a graph must import the kernel module
    that registers the op: in a fresh interpreter, once the pass registry is imported,
    every op the package names resolves (the tests' own imports of kernel modules would
    hide a missing one, as they hid recompute_rnn's until a benchmark ran the pass)."""
    import re
    import subprocess
    import sys

    names = sorted({name for path in PACKAGE.rglob("*.py")
                    for name in re.findall(r"torch\.ops\.fxopt\.(\w+)", path.read_text())})
    assert "recompute_rnn" in names and "library_rnn" in names
    check = (f"import torch, fxopt.passes; missing = [n for n in {names!r} "
             "if not hasattr(torch.ops.fxopt, n)]; print(missing); assert not missing")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          cwd=PACKAGE.parent, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
