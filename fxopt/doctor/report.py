"""What ``fxopt doctor`` reports: a :class:`Check` per check (ok, failed or skipped, a
one-line detail, the numbers it measured), the exceptions a check raises to skip or fail,
and the report as a table and as JSON."""

from __future__ import annotations

import math
import platform
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

__all__ = ["Check", "Failed", "Skip", "cuda_only", "environment", "format_footer",
           "format_header", "format_line", "format_report", "report_json"]


@dataclass
class Check:
    """One check's outcome: ``status`` "ok", "failed" or "skipped"; ``detail`` why it failed
    or skipped; ``data`` what it measured."""

    name: str
    status: str  # "ok", "failed" or "skipped"
    detail: str
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)


class Skip(Exception):
    """A check that cannot run here; the message says why."""


class Failed(AssertionError):
    """A check's criterion not met: the message says which, ``data`` keeps what it measured
    for the report."""

    def __init__(self, message: str, data: dict[str, Any]) -> None:
        super().__init__(message)
        self.data = data


def cuda_only(device: torch.device) -> None:
    """Skip a check that measures what only a CUDA device has."""
    if device.type != "cuda":
        raise Skip("needs a CUDA device")


def environment() -> dict[str, Any]:
    info = {"python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform(), "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


def report_json(checks: list[Check]) -> dict[str, Any]:
    return {"environment": environment(), "checks": [asdict(c) for c in checks]}


def _summary(data: dict[str, Any]) -> str:
    parts = []
    for key, value in data.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        elif isinstance(value, float) and not math.isnan(value):
            value = f"{value:.3g}"
        parts.append(f"{key}: {value}")
    return "; ".join(parts)


def format_header() -> str:
    """The report's first lines: the environment, then the table's column names."""
    env = environment()
    return "\n".join([" ".join(f"{k} {v}" for k, v in env.items()), "",
                      f"{'check':<18} {'status':<8} {'seconds':>7}  result"])


def format_line(check: Check) -> str:
    """One check's row: status, seconds, what it found or why it skipped or failed."""
    return (f"{check.name:<18} {check.status:<8} {check.seconds:>7.1f}  "
            f"{check.detail or _summary(check.data)}")


def format_footer(checks: list[Check]) -> str:
    """What the table leaves to say: the checks skipped here ("" when none was)."""
    skipped = [c.name for c in checks if c.status == "skipped"]
    return f"\nskipped here: {', '.join(skipped)} (run fxopt doctor on a GPU)" if skipped else ""


def format_report(checks: list[Check]) -> str:
    """A table: one line per check (status, seconds, what it found or why it skipped)."""
    lines = [format_header(), *map(format_line, checks)]
    footer = format_footer(checks)
    return "\n".join(lines + [footer] if footer else lines)
