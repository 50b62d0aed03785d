"""The criteria ``fxopt doctor``'s checks must meet, as pure functions of what a check
measured, so each can be shown failing without a GPU (tests/cli/test_doctor.py)."""

from __future__ import annotations

import itertools
import statistics
from typing import Any

__all__ = ["OVERLAP_FLOOR", "PREDICTION_TOLERANCE", "RELEASE_SLACK_BYTES", "SAVING_FLOOR",
           "SAVING_TOLERANCE", "SPEED_MARGIN", "memory_problems", "offload_problems",
           "overlap", "overlap_problem", "speed_problem"]

# The criteria. OVERLAP_FLOOR: the share of swap-copy time hidden under compute; copies
# serialised with compute hide none, a working copy stream most (the first H100 run's
# figure is in ../shared/gpu/h100-2026-11-26.md). PREDICTION_TOLERANCE: |predicted -
# measured| / measured of a step's peak; what the simulation leaves out (kernels' own
# workspaces, the allocator's rounding) is small beside this model's peak (the CPU's
# figures and the H100's, compared: benchmarks/results/doctor_memory_cpu.md).
# SPEED_MARGIN: fxopt's defaults compile with Inductor on CUDA, so beyond GPU timing noise
# (medians of interleaved steps) they should cost nothing: at most 1 + this of Inductor's.
# SAVING_FLOOR, SAVING_TOLERANCE: an offloaded optimizer's host state must leave the device
# (at least this share of it, and within this of the plan's prediction: the criteria of
# the GPU test in tests/optim/test_optim_accounting.py). RELEASE_SLACK_BYTES: the caching
# allocator rounds each block up to 512 bytes; eight such units, far below what a leaked
# round keeps (the check's model's parameters alone are over 90 KiB).
OVERLAP_FLOOR = 0.25
PREDICTION_TOLERANCE = 0.10
SPEED_MARGIN = 0.10
SAVING_FLOOR = 0.9
SAVING_TOLERANCE = 0.05
RELEASE_SLACK_BYTES = 8 * 512


def overlap(copies: list[tuple[float, float]], compute: list[tuple[float, float]]
             ) -> float:
    """Time of ``copies`` covered by the union of ``compute`` intervals."""
    merged: list[list[float]] = []
    for start, end in sorted(compute):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return sum(max(0.0, min(end, m_end) - max(start, m_start))
               for start, end in copies for m_start, m_end in merged)


def overlap_problem(copies: list[tuple[float, float]], compute: list[tuple[float, float]],
                    floor: float = OVERLAP_FLOOR) -> tuple[dict[str, Any], str | None]:
    """(what the timeline shows, the problem or None): no copies at all, or less than
    ``floor`` of the copy time overlapped by compute."""
    copy_us = sum(end - start for start, end in copies)
    if not copy_us:
        return {"copies": 0}, "no copies in the timeline: swap_recompute swapped nothing"
    share = overlap(copies, compute) / copy_us
    data = {"copies": len(copies), "copy ms": round(copy_us / 1e3, 3),
            "overlapped": f"{share:.0%}"}
    if share < floor:
        return data, (f"{share:.0%} of {copy_us / 1e3:.3g} ms of copies overlapped compute, "
                      f"below the floor of {floor:.0%}: the copies run serialised")
    return data, None


def memory_problems(rows: list[tuple[float, int, int]],
                    tolerance: float = PREDICTION_TOLERANCE) -> list[str]:
    """The problems in (budget, measured bytes, predicted bytes) rows: a measured peak that
    rises as the budget falls (a lower budget must never cost memory), and a prediction off
    the measured peak by more than ``tolerance`` of it."""
    mib = 2**20
    rows = sorted(rows, key=lambda row: -row[0])
    problems = [f"budget {low}: measured {m_low / mib:.0f} MiB, above budget {high}'s "
                f"{m_high / mib:.0f} MiB" for (high, m_high, _), (low, m_low, _)
                in itertools.pairwise(rows) if m_low > m_high]
    problems += [f"budget {fraction}: predicted {predicted / mib:.0f} MiB, measured "
                 f"{measured / mib:.0f} MiB ({predicted / measured - 1:+.0%}, more than "
                 f"{tolerance:.0%} off)" for fraction, measured, predicted in rows
                 if abs(predicted - measured) > tolerance * measured]
    return problems


def offload_problems(measured: dict[str, Any], floor: float = SAVING_FLOOR,
                     tolerance: float = SAVING_TOLERANCE,
                     slack: int = RELEASE_SLACK_BYTES) -> list[str]:
    """The problems in what :func:`check_offload_optimizer` measured, one per criterion
    not met: ``close`` false (a parameter off plain AdamW's beyond fp32 rounding;
    ``difference`` the largest difference); ``alive`` (a dropped optimizer still
    referenced); ``released`` (CUDA: ``memory_allocated`` after each round) above the
    first round's by more than ``slack``; ``host state`` zero (nothing placed on the
    host: nothing to measure), or ``saving`` (plain minus offloaded device peak) below
    ``floor`` of it or more than ``tolerance`` off ``predicted`` (the plan's
    ``all_gpu_state_bytes - gpu_state_bytes``)."""
    kib, problems = 2**10, []
    if not measured["close"]:
        problems.append(f"parameters differ from plain AdamW's by up to "
                        f"{measured['difference']:.3g} (beyond fp32 rounding)")
    if measured["alive"]:
        problems.append("a dropped offloaded optimizer is still referenced: it keeps its "
                        "model and state alive")
    rounds = measured.get("released")
    if rounds and rounds[-1] > rounds[0] + slack:
        problems.append(f"dropping it left {(rounds[-1] - rounds[0]) / kib:.1f} KiB more "
                        f"allocated after round {len(rounds)} than after round 1 (slack "
                        f"{slack / kib:.0f} KiB)")
    saving, host, predicted = (measured[k] for k in ("saving", "host state", "predicted"))
    if host <= 0:
        problems.append("the plan placed no state on the host")
    elif saving < floor * host:
        problems.append(f"the device peak fell by {saving / kib:.1f} KiB, below {floor:.0%} "
                        f"of the {host / kib:.1f} KiB of state placed on the host")
    if host > 0 and abs(saving - predicted) > tolerance * predicted:
        problems.append(f"the device peak fell by {saving / kib:.1f} KiB, the plan predicted "
                        f"{predicted / kib:.1f} KiB (more than {tolerance:.0%} off)")
    return problems


def speed_problem(samples: dict[str, list[float]], margin: float = SPEED_MARGIN
                  ) -> str | None:
    """The problem in interleaved step times (ms per configuration), or None: fxopt's
    defaults' median slower than Inductor's by more than ``margin``. fxopt's defaults on
    CUDA compile with Inductor, so a larger gap is fxopt's own cost."""
    fxopt_ms, inductor_ms = (statistics.median(samples[k]) for k in ("fxopt", "torch.compile"))
    if fxopt_ms > (1 + margin) * inductor_ms:
        return (f"fxopt's defaults take {fxopt_ms:.3g} ms/step, {fxopt_ms / inductor_ms - 1:.0%} "
                f"more than Inductor's {inductor_ms:.3g} (margin {margin:.0%})")
    return None
