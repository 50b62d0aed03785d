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
wrong type or range raises ``TypeError``/``ValueError`` saying what was expected (naming the
environment variable when it came from one, and an ``FXOPT_*`` variable that is no option is
refused like a misspelled key). Options that would silently do nothing together
(``memory_budget`` with ``swap_recompute=False``, ``planner=True`` or ``force_swap=True``
without a budget, ``inductor_max_autotune`` with ``codegen='fx'``) are refused when the
:class:`Options` record is built. Checks that need the passes or the planner (pass names in
``rewrite_limit``, the plan file's contents) are the compiler's (``fxopt.compiler``).
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

from fxopt.units import UNITS, format_bytes, parse_bytes

__all__ = ["MODES", "MemoryBudget", "OptionError", "Options", "option_docs", "patch", "resolve"]

PASS_FLAGS = ("tempo", "fuse_elementwise", "fuse_rnn", "library_rnn", "swap_recompute",
              "offload_optimizer", "fuse_linear_cross_entropy")
CODEGENS = ("auto", "fx", "inductor")

# `torch.compile(mode=...)` presets. torch.compile refuses `mode` and `options` together,
# so a mode is a named set of options. fxopt never uses CUDA graphs (its swap and offload
# runtimes need side streams and host copies), hence no "reduce-overhead".
MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "max-autotune": {"codegen": "inductor"},
    "max-autotune-no-cudagraphs": {"codegen": "inductor"},
}

_FRACTION_RE = re.compile(r"^\s*[0-9]*\.[0-9]+\s*$")
_PERCENT_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*%\s*$")
_ENV_PREFIX = "FXOPT_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class OptionError(ValueError):
    """An option the user gave cannot be honoured as given (a plan saved for another graph).

    The pass runner and the compiler raise it instead of falling back: the user asked for
    exactly this, so running without it would be a silent wrong answer."""


@dataclass(frozen=True)
class MemoryBudget:
    """A memory budget, one type with one meaning per kind: ``fraction`` bounds the bytes a
    step keeps for backward to that share of plain autograd's (the model's, shared by its
    graphs); ``bytes`` bounds the step's predicted peak.

    Exactly one of ``bytes`` and ``fraction`` is set. The planner, its ledger and its
    solvers take this value; each conversion to bytes is a named method here
    (:meth:`saved_bytes_bound`, :meth:`peak_bytes_bound`).
    """

    bytes: int | None = None
    fraction: float | None = None

    def __post_init__(self) -> None:
        if (self.bytes is None) == (self.fraction is None):
            raise ValueError(f"fxopt: a MemoryBudget is bytes or a fraction, exactly one; "
                             f"got bytes={self.bytes!r}, fraction={self.fraction!r}")

    def saved_bytes_bound(self, plain_bytes: int) -> int:
        """A fraction's bound on the bytes kept for backward: ``fraction`` x plain
        autograd's ``plain_bytes``."""
        if self.fraction is None:
            raise ValueError(f"fxopt: {self} bounds the peak, not the saved bytes")
        return int(self.fraction * plain_bytes)

    def peak_bytes_bound(self, keep_all_peak: int, activation_bytes: int) -> int:
        """The bound on the step's predicted peak: the bytes, or for a fraction ``f`` (where
        only swaps are offered, which free the device at the peak, not saved bytes) the
        peak when only ``f`` of the activations stay resident:
        ``keep_all_peak - (1 - f) * activation_bytes``."""
        if self.bytes is not None:
            return self.bytes
        return int(keep_all_peak - (1 - self.fraction) * activation_bytes)

    def __str__(self) -> str:
        if self.bytes is not None:
            return format_bytes(self.bytes)
        return f"{self.fraction:g} of activation memory"


@dataclass(frozen=True)
class Options:
    """Resolved fxopt options (immutable). Build one with :func:`resolve`."""

    tempo: bool | str | None = field(default=None, metadata={
        "doc": "Tempo's memory-lean GELU, LayerNorm/RMSNorm and attention softmax-dropout; "
               "'auto' (with memory_budget): only the site kinds that pay under the budget"})
    fuse_elementwise: bool | None = field(default=None, metadata={
        "doc": "fuse chains of pointwise ops into generated Triton kernels"})
    fuse_rnn: bool | str | None = field(default=None, metadata={
        "doc": "EcoRNN-style fused LSTM/GRU cells in Triton; 'auto': on CUDA, whole "
               "nn.LSTM/nn.GRU calls stay with cuDNN where the cost model predicts it faster"})
    library_rnn: bool | None = field(default=None, metadata={
        "doc": "whole nn.LSTM/nn.GRU calls fuse_rnn left run once by the library (cuDNN), "
               "as eager runs them, instead of AOTAutograd's per-step decomposition "
               "(default: on CUDA unless fuse_rnn=False or memory_budget, which recomputes "
               "them)"})
    swap_recompute: bool | None = field(default=None, metadata={
        "doc": "DELTA-style swap or recompute of saved activations"})
    offload_optimizer: bool | None = field(default=None, metadata={
        "doc": "Deep Optimizer States-style optimizer-state offload"})
    fuse_linear_cross_entropy: bool | None = field(default=None, metadata={
        "doc": "an LM head's Linear and its cross_entropy as one op that never stores the "
               "logits (default: on with memory_budget)"})
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
    codegen: str = field(default="auto", metadata={
        "doc": "'auto' (Inductor, except fx with fuse_elementwise=True; explain says "
               "which and why), "
               "'fx' (fx Python calling aten ops and fxopt kernels) or 'inductor'"})
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

    def __post_init__(self) -> None:
        """Refuse combinations in which an option would silently do nothing."""
        if self.swap_recompute is False:
            for name in ("memory_budget", "plan"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"fxopt: option {name!r} is carried out by the swap_recompute pass, "
                        "which swap_recompute=False turns off; drop one of the two")
        if self.memory_budget is None:
            if self.tempo == "auto":
                raise ValueError("fxopt: tempo='auto' lets the planner take tempo's rewrites "
                                 "where they pay under a memory budget; set memory_budget "
                                 "too (e.g. 0.5 or '6GiB'), or tempo=True")
            if self.planner is True:
                raise ValueError("fxopt: option 'planner' decides under a memory budget; "
                                 "set memory_budget too (e.g. 0.5 or '6GiB')")
            if self.force_swap and self.plan is None:
                raise ValueError("fxopt: option 'force_swap' applies under a memory budget; "
                                 "set memory_budget too (e.g. 0.5 or '6GiB')")
        if self.inductor_max_autotune and self.codegen == "fx":
            raise ValueError("fxopt: option 'inductor_max_autotune' tunes Inductor's kernels "
                             "and does nothing with codegen='fx'; set codegen='inductor'")

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


def parse_memory_budget(value: Any, name: str = "memory_budget") -> MemoryBudget | None:
    """Parse a budget: int bytes, "6GiB"/"512 MB"/"50%", or a float fraction in (0, 1].
    ``name`` is what errors call the value (a command-line flag, say)."""
    if value is None or isinstance(value, MemoryBudget):
        return value
    hint = "give bytes as an int, a string like '6GiB' or '512MB', or a fraction in (0, 1]"
    if isinstance(value, bool):
        raise TypeError(f"fxopt: {name} must not be a bool; {hint}")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"fxopt: {name} must be positive, got {value}; {hint}")
        return MemoryBudget(bytes=value)
    if isinstance(value, float):
        if not 0.0 < value <= 1.0:
            raise ValueError(
                f"fxopt: a float {name} is a fraction of activation memory in (0, 1], "
                f"got {value}; {hint}")
        return MemoryBudget(fraction=value)
    if isinstance(value, str):
        if m := _PERCENT_RE.match(value):
            return parse_memory_budget(float(m.group(1)) / 100.0, name)
        if _FRACTION_RE.match(value):
            return parse_memory_budget(float(value), name)  # "0.5" from an environment variable
        try:
            count = parse_bytes(value)
        except ValueError:
            units = ", ".join(u for u in UNITS if u)
            raise ValueError(f"fxopt: cannot read {name} {value!r}; {hint} "
                             f"(units: {units}, or N%)") from None
        if count == 0 and re.search(r"[1-9]", value):
            raise ValueError(f"fxopt: {name} {value!r} rounds to 0 bytes; give at least 1 "
                             "byte, or a fraction such as 0.5")
        return parse_memory_budget(count, name)
    raise TypeError(f"fxopt: {name} has type {type(value).__name__}; {hint}")


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
    if os.path.isdir(value):
        raise ValueError(f"fxopt: option 'plan': {os.fspath(value)!r} is a folder; give a plan "
                         "JSON file in it (a debug_dir's plans end in .plan.json)")
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


# What "auto" means for each pass flag that takes it, in the error for a bad value.
_AUTO_MEANS = {
    "tempo": "the planner takes the sites that pay under memory_budget",
    "fuse_rnn": ("on CUDA, whole nn.LSTM/nn.GRU calls go to cuDNN where the cost model "
                 "predicts it faster"),
}


def _parse_flag_or_auto(name: str, value: Any) -> bool | str | None:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return _parse_flag(name, value, optional=True)
    except TypeError:
        raise TypeError(f"fxopt: option {name!r} must be True, False, None or 'auto' "
                        f"({_AUTO_MEANS[name]}), got {value!r}") from None


def _parse(name: str, value: Any) -> Any:
    if name in _AUTO_MEANS:
        return _parse_flag_or_auto(name, value)
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


def check_names(keys: Iterable[str], valid: Iterable[str], what: str, where: str) -> None:
    """Raise for the first of ``keys`` not in ``valid``, with a did-you-mean."""
    valid = tuple(valid)
    for key in keys:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            suggestion = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"fxopt: unknown {what} {key!r} in {where}.{suggestion} "
                f"Valid {what}s: {', '.join(valid)}.")


def _check_known(keys: Iterable[str], where: str) -> None:
    check_names(keys, _valid_names(), "option", where)


# ---------------------------------------------------------------------------- layers

_patches: list[dict[str, Any]] = []


def _from_environment() -> dict[str, Any]:
    variables = {key: value for key, value in os.environ.items() if key.startswith(_ENV_PREFIX)}
    check_names(variables, [_ENV_PREFIX + name.upper() for name in _valid_names()],
                "option variable", "the environment")
    parsed = {}
    for variable, value in variables.items():
        name = variable[len(_ENV_PREFIX):].lower()
        try:
            parsed[name] = _parse(name, value)
        except (TypeError, ValueError) as error:
            reason = str(error).removeprefix("fxopt: ")
            raise type(error)(f"fxopt: environment variable {variable}={value!r}: "
                              f"{reason}") from None
    return parsed


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
