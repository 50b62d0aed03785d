"""``fxopt doctor``: one self-test a user runs on their machine and pastes into a bug report.

Each check returns a :class:`~fxopt.doctor.report.Check` (ok, failed or skipped, a one-line
detail, and numbers for the JSON report). Every check has a criterion it can fail, a pure
function of what it measured in :mod:`fxopt.doctor.criteria`; each check's docstring states
it. The checks live by what they measure: :mod:`~fxopt.doctor.kernels`,
:mod:`~fxopt.doctor.memory`, :mod:`~fxopt.doctor.offload`, :mod:`~fxopt.doctor.speed`; the
report's shape in :mod:`~fxopt.doctor.report`. On a CUDA device every check runs:

- ``kernels``: every Triton kernel family (tempo GELU and norms, the LSTM/GRU cells,
  generated pointwise kernels) through its pass, at odd shapes, against eager without TF32,
  with gradients; each pass must fire;
- ``host_sync``: a training step with every pass on makes no call that waits for the
  device (`fxopt.analysis.host_sync`);
- ``swap_overlap``: a swap-only run's timeline (torch.profiler): the share of the copy time
  that overlapped compute must reach ``OVERLAP_FLOOR``;
- ``memory``: ``torch.cuda.max_memory_allocated`` of a step at three budgets: it must not
  rise as the budget falls, and the planner's prediction must be within
  ``PREDICTION_TOLERANCE`` of it;
- ``offload_optimizer``: the offloaded optimizer against the plain one: the same steps,
  freed when dropped, and the device memory it saves (also on the CPU, by the profiler's
  placement categories), with its plan's summary;
- ``speed``: a small model's step time under eager, Inductor and fxopt's defaults, measured
  interleaved; fxopt's median may exceed Inductor's by at most ``SPEED_MARGIN``.

Without a GPU the CPU subset runs (kernels on the torch references, or on Triton's
interpreter under ``TRITON_INTERPRET=1``; the host-sync check; the offloaded optimizer's;
the ahead-of-time compile of representative kernels for sm_80/sm_90, `fxopt.kernels.aot`)
and the GPU-only checks are listed as skipped with the reason. The ``gpu``-marked tests
call these same functions.
Backends are passed as objects (:class:`fxopt.compiler.Backend`), never as the string
``"fxopt"``, so the checks work whether or not fxopt's entry point is installed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from fxopt.devices import indexed
from fxopt.doctor.criteria import (
    OVERLAP_FLOOR,
    PREDICTION_TOLERANCE,
    RELEASE_SLACK_BYTES,
    SAVING_FLOOR,
    SAVING_TOLERANCE,
    SPEED_MARGIN,
    memory_problems,
    offload_problems,
    overlap_problem,
    speed_problem,
)
from fxopt.doctor.kernels import check_aot, check_host_sync, check_kernels
from fxopt.doctor.memory import check_memory, check_swap_overlap
from fxopt.doctor.offload import check_offload_optimizer
from fxopt.doctor.report import Check, Failed, Skip, format_report, report_json
from fxopt.doctor.speed import check_speed

__all__ = ["CHECKS", "OVERLAP_FLOOR", "PREDICTION_TOLERANCE", "RELEASE_SLACK_BYTES",
           "SAVING_FLOOR", "SAVING_TOLERANCE", "SPEED_MARGIN", "Check", "format_report",
           "memory_problems", "offload_problems", "overlap_problem", "report_json",
           "run_doctor", "speed_problem"]

log = logging.getLogger(__name__)

CHECKS: dict[str, Callable[[torch.device], dict[str, Any]]] = {
    "kernels": check_kernels, "host_sync": check_host_sync, "aot_compile": check_aot,
    "swap_overlap": check_swap_overlap, "memory": check_memory,
    "offload_optimizer": check_offload_optimizer, "speed": check_speed,
}


def run_doctor(device: str | None = None, only: list[str] | None = None,
               on_check: Callable[[Check, list[Check]], None] | None = None) -> list[Check]:
    """Run the checks (all, or ``only`` these) on ``device`` (default: CUDA if present).

    ``on_check(check, done)`` is called as each check ends, with the checks done so far:
    a first run on a GPU compiles for minutes, and a report cut off by a time limit still
    shows what it had found."""
    device = indexed(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    checks = []
    for name, check in CHECKS.items():
        if only and name not in only:
            continue
        start = time.perf_counter()
        try:
            data = check(device)
            status, detail = "ok", ""
        except Skip as skip:
            data, status, detail = {}, "skipped", str(skip)
        except Exception as error:  # a failed check is the report's content
            data, status = getattr(error, "data", {}), "failed"
            detail = str(error).strip()[:400]  # a criterion not met says which
            if not isinstance(error, Failed):
                detail = f"{type(error).__name__}: {detail}"
            log.debug("doctor check %s failed", name, exc_info=True)
        checks.append(Check(name, status, detail, time.perf_counter() - start, data))
        if on_check is not None:
            on_check(checks[-1], checks)
    return checks
