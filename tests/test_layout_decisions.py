"""Decisions made in one place (issue 31), checked on the package's source: the code
generator is resolved only by fxopt/codegen.py (no other module compares a generator's name
or reads ``options.codegen``; they read the resolved ``Codegen``'s properties)."""

import ast
import re
from pathlib import Path

import fxopt

PACKAGE = Path(fxopt.__file__).parent
RESOLUTION = PACKAGE / "codegen.py"
# `== "inductor"` and its spellings; config.py's check of the option's own value against
# "fx" (inductor_max_autotune needs Inductor) is validation of what the user gave, not a
# decision about the generator
_NAME_TEST = re.compile(r"""[!=]=\s*["']inductor["']|["']inductor["']\s*[!=]="""
                        r"""|\bin\s*\([^)]*["']inductor["']""")


def generator_name_tests(source: str) -> list[str]:
    """The lines of ``source`` that compare a value with Inductor's name."""
    return [line.strip() for line in source.splitlines() if _NAME_TEST.search(line)]


def codegen_option_reads(source: str) -> list[str]:
    """``options.codegen`` (any ``...options.codegen``, ``getattr(options, "codegen")``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "codegen":
            owner = node.value.attr if isinstance(node.value, ast.Attribute) else (
                node.value.id if isinstance(node.value, ast.Name) else "")
            if "options" in owner:
                found.append(ast.unparse(node))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "getattr" and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and node.args[1].value == "codegen"):
            found.append(ast.unparse(node))
    return found


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p != RESOLUTION)


def test_no_module_but_the_resolution_tests_a_generators_name():
    found = [f"{p.relative_to(PACKAGE.parent)}: {line}" for p in _modules()
             for line in generator_name_tests(p.read_text())]
    assert not found, ("compare the resolved Codegen's properties (fxopt/codegen.py), not "
                       "its name:\n" + "\n".join(found))


def test_no_module_but_the_resolution_reads_the_codegen_option():
    found = [f"{p.relative_to(PACKAGE.parent)}: {use}" for p in _modules()
             for use in codegen_option_reads(p.read_text())]
    assert not found, ("read ctx.codegen (resolved once by fxopt.codegen.resolve_codegen), "
                       "not options.codegen:\n" + "\n".join(found))


def test_the_checks_see_each_spelling():
    source = ('fusible = ctx.options.codegen == "inductor"\n'
              "if 'inductor' != name: pass\n"
              'if codegen in ("fx", "inductor"): pass\n'
              'x = getattr(options, "codegen")\n'
              'y = self.codegen.fuses_pointwise\n')
    assert len(generator_name_tests(source)) == 3
    assert sorted(codegen_option_reads(source)) == [
        "ctx.options.codegen", "getattr(options, 'codegen')"]
