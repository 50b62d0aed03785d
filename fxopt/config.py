"""fxopt's options: one typed record, parsed and validated in one place.

Every option a user can set lives in :class:`Options`; its fields' metadata is the
documentation (`fxopt passes`, the README table and error messages read it from here, so
defaults are written once). Values come from four layers, later ones winning:

1. the defaults below;
2. environment variables ``FXOPT_<NAME>`` (e.g. ``FXOPT_STRICT=1``,
   ``FXOPT_DEBUG_DIR=dbg``, ``FXOPT_MEMORY_BUDGET=6GiB``), read when options are resolved;
3. :func:`patch`, a context manager and decorator for scoped changes;
4. the ``options`` dict given to ``torch.compile(..., backend="fxopt", options=...)``.

Unknown keys raise ``ValueError`` naming the key and listing the valid ones; a value of the
wrong type or range raises ``TypeError``/``ValueError`` saying what was expected.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MemoryBudget", "Options", "patch", "resolve", "option_docs", "MODES"]

PASS_FLAGS = ("tempo", "fuse_elementwise", "fuse_rnn", "swap_recompute", "offload_optimizer")
CODEGENS = ("fx", "inductor")

# `torch.compile(mode=...)` presets. torch.compile refuses `mode` and `options` together,
# so a mode is a named set of options. fxopt never uses CUDA graphs (its swap and offload
# runtimes need side streams and host copies), hence no "reduce-overhead".
MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "max-autotune": {"codegen": "inductor"},
    "max-autotune-no-cudagraphs": {"codegen": "inductor"},
}

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_BUDGET_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
_PERCENT_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*%\s*$")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class MemoryBudget:
    """A memory budget: absolute bytes, or a fraction of plain autograd's activation memory.

    Exactly one of ``bytes`` and ``fraction`` is set. The swap/recompute pass and the planner
    turn a fraction into bytes once they know the graph's activation memory.
    """

    bytes: int | None = None
    fraction: float | None = None

    def __str__(self) -> str:
        if self.bytes is not None:
            return _format_bytes(self.bytes)
        return f"{self.fraction:g} of activation memory"


@dataclass(frozen=True)
class Options:
    """Resolved fxopt options (immutable). Build one with :func:`resolve`."""

    tempo: bool | None = field(default=None, metadata={
        "doc": "Tempo's memory-lean GELU, LayerNorm/RMSNorm and attention softmax-dropout"})
    fuse_elementwise: bool | None = field(default=None, metadata={
        "doc": "fuse chains of pointwise ops into generated Triton kernels"})
    fuse_rnn: bool | None = field(default=None, metadata={
        "doc": "EcoRNN-style fused LSTM/GRU cells in Triton"})
    swap_recompute: bool | None = field(default=None, metadata={
        "doc": "DELTA-style swap or recompute of saved activations"})
    offload_optimizer: bool | None = field(default=None, metadata={
        "doc": "Deep Optimizer States-style optimizer-state offload"})
    memory_budget: MemoryBudget | None = field(default=None, metadata={
        "doc": "a fraction f in (0, 1] or 'N%': keep for backward at most f x the bytes "
               "plain autograd keeps (saved-tensor hooks, parameters excluded; like "
               "Inductor's activation_memory_budget); bytes (int, '6GiB'): a bound on the "
               "step's predicted peak"})
    force_swap: bool = field(default=False, metadata={
        "doc": "swap_recompute: offer only swapping, on any device (exercises the swap "
               "runtime on a CPU, where swapping frees nothing)"})
    planner: bool | None = field(default=None, metadata={
        "doc": "let the planner choose the passes' parameters (default: on when "
               "memory_budget is set)"})
    plan: str | None = field(default=None, metadata={
        "doc": "a plan JSON file (from `fxopt plan --save` or a debug_dir's "
               "*_swap_recompute.plan.json): replay its decisions instead of solving"})
    codegen: str = field(default="fx", metadata={
        "doc": "'fx' (fx Python calling aten ops and fxopt kernels) or 'inductor'"})
    strict: bool = field(default=False, metadata={
        "doc": "raise on a pass failure instead of warning and skipping that pass"})
    debug_dir: str | None = field(default=None, metadata={
        "doc": "dump every stage's and pass's graph and an index.json there"})
    rewrite_limit: Mapping[str, int] | None = field(default=None, metadata={
        "doc": "debugging: apply only the first N rewrites of a pass, e.g. "
               "{'tempo': 3} or 'tempo=3' (bisects a bad rewrite)"})
    inductor_max_autotune: bool = field(default=False, metadata={
        "doc": "with codegen='inductor': let Inductor autotune its kernels "
               "(set by mode='max-autotune')"})

    @property
    def planner_enabled(self) -> bool:
        """The planner runs when asked to, and by default whenever a budget is given."""
        return self.planner if self.planner is not None else self.memory_budget is not None

    def as_dict(self) -> dict[str, Any]:
        """Plain-data view (budget as text), for reports and the debug index."""
        out = dataclasses.asdict(self)
        out["memory_budget"] = None if self.memory_budget is None else str(self.memory_budget)
        out["rewrite_limit"] = None if self.rewrite_limit is None else dict(self.rewrite_limit)
        return out


def option_docs() -> dict[str, str]:
    """The documented options, name -> one-line description (for `fxopt passes`, errors)."""
    return {f.name: f.metadata["doc"] for f in dataclasses.fields(Options)}


def _valid_names() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(Options))


# ---------------------------------------------------------------------------- parsing


def _format_bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def parse_memory_budget(value: Any) -> MemoryBudget | None:
    """Parse a budget: int bytes, "6GiB"/"512 MB"/"50%", or a float fraction in (0, 1]."""
    if value is None or isinstance(value, MemoryBudget):
        return value
    hint = "give bytes as an int, a string like '6GiB' or '512MB', or a fraction in (0, 1]"
    if isinstance(value, bool):
        raise TypeError(f"fxopt: memory_budget must not be a bool; {hint}")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"fxopt: memory_budget must be positive, got {value}; {hint}")
        return MemoryBudget(bytes=value)
    if isinstance(value, float):
        if not 0.0 < value <= 1.0:
            raise ValueError(
                f"fxopt: a float memory_budget is a fraction of activation memory in (0, 1], "
                f"got {value}; {hint}")
        return MemoryBudget(fraction=value)
    if isinstance(value, str):
        if m := _PERCENT_RE.match(value):
            return parse_memory_budget(float(m.group(1)) / 100.0)
        m = _BUDGET_RE.match(value)
        if m is None or m.group(2).lower() not in _UNITS:
            units = ", ".join(u for u in _UNITS if u)
            raise ValueError(
                f"fxopt: cannot read memory_budget {value!r}; {hint} (units: {units}, or N%)")
        number, unit = float(m.group(1)), m.group(2).lower()
        if not unit and "." in m.group(1):
            return parse_memory_budget(number)  # "0.5" read from an environment variable
        return parse_memory_budget(int(number * _UNITS[unit]))
    raise TypeError(f"fxopt: memory_budget has type {type(value).__name__}; {hint}")


def _parse_flag(name: str, value: Any, *, optional: bool) -> bool | None:
    if value is None and optional:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    allowed = "True, False or None" if optional else "True or False"
    raise TypeError(f"fxopt: option {name!r} must be {allowed}, got {value!r}")


def _parse_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"fxopt: option {name!r} must be one of {choices}, got {value!r}")
    return value


def _parse_debug_dir(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)) and str(value):
        return os.fspath(value)
    raise TypeError(f"fxopt: option 'debug_dir' must be a path (str), got {value!r}")


def _parse_plan_path(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise TypeError(f"fxopt: option 'plan' must be a path to a plan JSON file, got {value!r}")
    if not os.path.isfile(value):
        raise ValueError(f"fxopt: option 'plan': no such file {os.fspath(value)!r}")
    return os.fspath(value)


def _parse_rewrite_limit(value: Any) -> Mapping[str, int] | None:
    if value is None:
        return None
    if isinstance(value, str):  # "tempo=3,fuse_elementwise=10", as in FXOPT_REWRITE_LIMIT
        try:
            value = {k.strip(): int(v) for k, v in
                     (item.split("=") for item in value.split(",") if item.strip())}
        except ValueError:
            raise ValueError(
                f"fxopt: rewrite_limit must look like 'pass=N[,pass=N]', got {value!r}") from None
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in value.items()):
        raise TypeError(
            f"fxopt: rewrite_limit must map pass names to counts >= 0, got {value!r}")
    return dict(value)


def _parse(name: str, value: Any) -> Any:
    if name in PASS_FLAGS or name == "planner":
        return _parse_flag(name, value, optional=True)
    if name in ("strict", "inductor_max_autotune", "force_swap"):
        return _parse_flag(name, value, optional=False)
    if name == "memory_budget":
        return parse_memory_budget(value)
    if name == "codegen":
        return _parse_choice(name, value, CODEGENS)
    if name == "debug_dir":
        return _parse_debug_dir(value)
    if name == "plan":
        return _parse_plan_path(value)
    if name == "rewrite_limit":
        return _parse_rewrite_limit(value)
    raise AssertionError(f"no parser for option {name!r}")  # every field has one above


def _check_known(keys: Iterable[str], where: str) -> None:
    valid = _valid_names()
    for key in keys:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            suggestion = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"fxopt: unknown option {key!r} in {where}.{suggestion} "
                f"Valid options: {', '.join(valid)}.")


# ---------------------------------------------------------------------------- layers

_patches: list[dict[str, Any]] = []


def _from_environment() -> dict[str, Any]:
    raw = {name: os.environ[f"FXOPT_{name.upper()}"] for name in _valid_names()
           if f"FXOPT_{name.upper()}" in os.environ}
    return {name: _parse(name, value) for name, value in raw.items()}


def mode_options(mode: str | None) -> dict[str, Any]:
    """The options a `torch.compile(mode=...)` preset stands for."""
    if mode is None:
        return {}
    if mode not in MODES:
        raise ValueError(
            f"fxopt: unsupported mode {mode!r}; valid modes: {', '.join(MODES)} "
            "(fxopt does not use CUDA graphs, so 'reduce-overhead' is not offered)")
    preset = dict(MODES[mode])
    if mode == "max-autotune":
        preset["inductor_max_autotune"] = True
    return preset


def resolve(options: Mapping[str, Any] | None = None, mode: str | None = None) -> Options:
    """Validate ``options`` and merge them over patches, environment and defaults."""
    if options is not None and not isinstance(options, Mapping):
        raise TypeError(f"fxopt: options must be a dict, got {type(options).__name__}")
    options = dict(options or {})
    _check_known(options, "options")
    merged: dict[str, Any] = {**_from_environment()}
    for layer in _patches:
        merged.update(layer)
    merged.update({k: _parse(k, v) for k, v in mode_options(mode).items()})
    merged.update({k: _parse(k, v) for k, v in options.items()})
    return Options(**merged)


class patch(contextlib.ContextDecorator):
    """Scoped option changes: ``with fxopt.config.patch(strict=True): ...`` or as a decorator.

    Values are validated when the patch is created; a patch applies to graphs compiled while
    it is active (compilation happens on a compiled model's first call, not at torch.compile).
    """

    def __init__(self, **values: Any) -> None:
        _check_known(values, "fxopt.config.patch")
        self._values = {k: _parse(k, v) for k, v in values.items()}
        self._depth: list[int] = []

    def __enter__(self) -> patch:
        self._depth.append(len(_patches))
        _patches.append(self._values)
        return self

    def __exit__(self, *exc: object) -> None:
        del _patches[self._depth.pop():]
