"""``fxopt doctor``'s memory checks on CUDA: swap copies hidden under compute, and a
step's peak at three budgets against the planner's prediction (the criteria:
:mod:`fxopt.doctor.criteria`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fxopt.devices import indexed
from fxopt.doctor.criteria import memory_problems, overlap_problem
from fxopt.doctor.report import Failed, Skip, cuda_only

__all__ = ["check_memory", "check_swap_overlap", "deep_mlp", "step_peak"]


def deep_mlp(width: int) -> nn.Module:
    """Six Linear+GELU layers and a head: a chain a fraction budget recomputes."""
    layers = [m for _ in range(6) for m in (nn.Linear(width, width), nn.GELU())]
    return nn.Sequential(*layers, nn.Linear(width, 8))


def check_swap_overlap(device: torch.device) -> dict[str, Any]:
    """One step with swapping forced: the copies (on swap_recompute's copy stream) must
    overlap compute kernels for at least ``OVERLAP_FLOOR`` of their time. Skipped on the
    CPU, where a swap is a synchronous copy (no copy stream) and nothing can overlap."""
    if device.type != "cuda":
        raise Skip("no copy stream on the CPU: swaps copy synchronously")
    from torch.profiler import ProfilerActivity, profile

    from fxopt.compiler import Backend

    torch.compiler.reset()
    model = deep_mlp(2048).to(device)
    x = torch.randn(8192, 2048, device=device)
    backend = Backend({"memory_budget": 0.5, "force_swap": True})
    compiled = torch.compile(model, backend=backend)
    compiled(x).sum().backward()
    torch.cuda.synchronize(indexed(device))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        compiled(x).sum().backward()
        torch.cuda.synchronize(indexed(device))
    copies, compute = [], []
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        span = (event.time_range.start, event.time_range.end)
        (copies if "memcpy" in event.name.lower() else compute).append(span)
    data, problem = overlap_problem(copies, compute)
    if problem:
        raise Failed(problem, data)
    return data


def step_peak(device: torch.device, fraction: float, width: int = 2048,
               batch: int = 8192) -> tuple[int, int]:
    """(measured, predicted) peak bytes of the deep MLP's second step under ``fraction``,
    both above what the step starts with: on CUDA ``max_memory_allocated`` less what was
    allocated before it (parameters, the input; on the CPU `fxopt.profile_memory`'s peak
    less the same), and the planner's ``memory["fxopt"]`` peak less its baseline (the same
    parameters and input, which its ``peak_bytes`` includes)."""
    from fxopt.compiler import Backend
    from fxopt.profile import profile_memory

    torch.compiler.reset()
    torch.manual_seed(0)
    model = deep_mlp(width).to(device)
    x = torch.randn(batch, width, device=device)
    backend = Backend({"memory_budget": fraction})
    compiled = torch.compile(model, backend=backend)
    compiled(x).sum().backward()
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(indexed(device))
        torch.cuda.reset_peak_memory_stats(indexed(device))
        before = torch.cuda.memory_allocated(indexed(device))
        compiled(x).sum().backward()
        torch.cuda.synchronize(indexed(device))
        measured = torch.cuda.max_memory_allocated(indexed(device)) - before
    else:
        profile = profile_memory(compiled, (x,), steps=1, warmup=0)
        measured = profile.peak_bytes - sum(profile.peak_categories[category]
                                            for category in ("parameters", "inputs"))
    predicted = sum(g.memory["fxopt"].peak_bytes - g.memory["fxopt"].baseline_bytes
                    for g in backend.graphs if g.memory.get("fxopt"))
    return measured, predicted


def check_memory(device: torch.device) -> dict[str, Any]:
    """Peak memory of a step at budgets 1.0, 0.6 and 0.35 against the planner's prediction:
    fails on any of :func:`memory_problems`."""
    cuda_only(device)
    results, rows = {}, []
    for fraction in (1.0, 0.6, 0.35):
        measured, predicted = step_peak(device, fraction)
        rows.append((fraction, measured, predicted))
        results[f"budget {fraction}"] = {"measured MiB": round(measured / 2**20, 1),
                                         "predicted MiB": round(predicted / 2**20, 1)}
    problems = memory_problems(rows)
    if problems:
        raise Failed("; ".join(problems), results)
    return results
