"""The package's layout rules, checked on its source: private torch APIs only through the
adapters (fxopt/_compat.py, and the profiler's fxopt/profile/_torch.py)."""

import ast
from pathlib import Path

import fxopt

PACKAGE = Path(fxopt.__file__).parent
ADAPTERS = {PACKAGE / "_compat.py", PACKAGE / "profile" / "_torch.py"}


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
