"""Decisions made in one place (issue 31), checked on the package's source: the code
generator is resolved only by fxopt/codegen.py (no other module compares a generator's name
or reads ``options.codegen``; they read the resolved ``Codegen``'s properties), and a step
is captured one way: AOTAutograd is called only by ``Codegen.trace`` and the pre-autograd
stage is run only by ``fxopt.pipeline.capture_step``, which compilation, ``fxopt plan``
and explain's plain baseline share; and a pass reports what it matched and declined only
through its ``Verdicts`` (no free-form "reason", "declined", "skipped" stats)."""

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


def calls(source: str, name: str) -> list[str]:
    """The calls of ``name`` in ``source`` (``name(...)`` or ``anything.name(...)``)."""
    return [ast.unparse(node) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and name in (
                getattr(node.func, "attr", None), getattr(node.func, "id", None))]


def pre_autograd_stages(source: str) -> list[str]:
    """The ``run_stage(Stage.PRE_AUTOGRAD, ...)`` calls of ``source``."""
    return [call for call in calls(source, "run_stage") if "PRE_AUTOGRAD" in call]


def test_one_capture_of_a_step():
    aot = {f"{p.relative_to(PACKAGE.parent)}": calls(p.read_text(), "aot_autograd")
           for p in sorted(PACKAGE.rglob("*.py")) if PACKAGE / "_compat" not in p.parents}
    assert {path for path, found in aot.items() if found} == {"fxopt/codegen.py"}, (
        "trace through fxopt.codegen.Codegen.trace (via fxopt.pipeline.capture_step with "
        "the pre-autograd passes), not AOTAutograd directly")
    stage = {f"{p.relative_to(PACKAGE.parent)}": pre_autograd_stages(p.read_text())
             for p in sorted(PACKAGE.rglob("*.py"))}
    assert {path: found for path, found in stage.items() if found} == {
        "fxopt/pipeline.py": ["run_stage(Stage.PRE_AUTOGRAD, gm, ctx, records, instruments)"]}


def test_the_capture_check_sees_each_spelling():
    source = ("aot = _compat.aot_autograd(fw_compiler=f)\nx = aot_autograd()\n"
              "gm = run_stage(Stage.PRE_AUTOGRAD, gm, ctx, [])\n"
              "gm = run_stage(Stage.JOINT, gm, ctx, [])\n")
    assert len(calls(source, "aot_autograd")) == 2
    assert pre_autograd_stages(source) == ["run_stage(Stage.PRE_AUTOGRAD, gm, ctx, [])"]


FREE_FORM_VERDICTS = {"reason", "declined", "skipped", "left_alone", "fused", "rewritten"}


def free_form_verdicts(source: str) -> list[str]:
    """``PassResult(...)`` calls whose stats spell a match or a decline as a key."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "PassResult":
            for value in [*node.args, *(k.value for k in node.keywords)]:
                if isinstance(value, ast.Dict) and {
                        k.value for k in value.keys if isinstance(k, ast.Constant)
                } & FREE_FORM_VERDICTS:
                    found.append(ast.unparse(node))
    return found


def test_every_pass_reports_through_the_verdicts():
    found = [f"{p.relative_to(PACKAGE.parent)}: {call}"
             for p in sorted((PACKAGE / "passes").rglob("*.py"))
             for call in free_form_verdicts(p.read_text())]
    assert not found, ("record matches and declines in Verdicts (fxopt/passes/README.md), "
                       "not in stats:\n" + "\n".join(found))
    assert free_form_verdicts('r = PassResult(gm, False, {"reason": "no budget"})\n')
    assert free_form_verdicts('r = PassResult(gm, False, stats={"skipped": {}})\n')
    assert not free_form_verdicts('r = PassResult(gm, True, v, {"plan": plan})\n')


# fxopt/kernels/ modules that serve no single pass: the ahead-of-time compile check of
# every kernel family
SHARED_KERNEL_MODULES = {"__init__.py", "aot.py"}


def test_a_pass_its_kernels_and_its_tests_are_found_by_its_name():
    """Every registered pass is ``fxopt/passes/<name>.py`` or ``fxopt/passes/<name>/``, its
    tests are ``tests/passes/<name>/test_<name>*.py``, and every kernel module is named for
    the pass it serves (``fxopt/kernels/<name>...``)."""
    from fxopt.passes import PIPELINE

    names = [spec.name for spec in PIPELINE]
    tests = PACKAGE.parent / "tests" / "passes"
    problems = []
    for name in names:
        if not ((PACKAGE / "passes" / f"{name}.py").is_file()
                or (PACKAGE / "passes" / name / "__init__.py").is_file()):
            problems.append(f"pass {name}: no fxopt/passes/{name}.py or package")
        if not list((tests / name).glob(f"test_{name}*.py")):
            problems.append(f"pass {name}: no tests/passes/{name}/test_{name}*.py")
    for entry in sorted((PACKAGE / "kernels").iterdir()):
        if entry.name in SHARED_KERNEL_MODULES or entry.name == "__pycache__":
            continue
        if not any(entry.name.startswith(name) for name in names):
            problems.append(f"fxopt/kernels/{entry.name} is named for no pass ({names})")
    assert not problems, "\n".join(problems)
