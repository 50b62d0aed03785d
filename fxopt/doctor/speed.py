"""``fxopt doctor``'s speed check on CUDA: a small GPT-2's step under eager, Inductor and
fxopt's defaults, interleaved (judged by :func:`fxopt.doctor.criteria.speed_problem`)."""

from __future__ import annotations

import statistics
from typing import Any

import torch

from fxopt.doctor.criteria import speed_problem
from fxopt.doctor.report import Failed, cuda_only

__all__ = ["check_speed"]


def check_speed(device: torch.device) -> dict[str, Any]:
    """Step time of the benchmark suite's small GPT-2 under eager, Inductor and fxopt's
    defaults, interleaved: fails on :func:`speed_problem`."""
    cuda_only(device)
    from fxopt.bench import timing
    from fxopt.bench.workloads import WORKLOADS
    from fxopt.compiler import Backend
    from fxopt.profile import default_loss

    workload = WORKLOADS["gpt2-small"]
    torch.compiler.reset()
    steps = {}
    for name in ("eager", "torch.compile", "fxopt"):
        torch.manual_seed(0)
        model = workload.build(True).to(device)
        inputs = workload.inputs(model, 8, True, device)
        backend = {"eager": None, "torch.compile": "inductor", "fxopt": Backend({})}[name]
        run = model if backend is None else torch.compile(model, backend=backend)
        steps[name] = lambda run=run, inputs=inputs: default_loss(run(**inputs)).backward()
    samples = {name: [1e3 * s for s in t.times_s]
               for name, t in timing.interleaved(steps, device, warmup=3).items()}
    results = {f"{name} ms/step": round(statistics.median(times), 3)
               for name, times in samples.items()}
    problem = speed_problem(samples)
    if problem:
        raise Failed(problem, results)
    return results
