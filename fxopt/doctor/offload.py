"""``fxopt doctor``'s offloaded-optimizer check: the plain and the offloaded AdamW on the
same compiled model (the same steps; the device memory the host state frees), and
offloaded optimizers built and dropped in a loop (each freed). Judged by
:func:`fxopt.doctor.criteria.offload_problems`."""


from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fxopt.devices import indexed
from fxopt.doctor.criteria import offload_problems
from fxopt.doctor.report import Failed


def _mlp(width: int) -> nn.Module:
    """Six Linear+GELU layers: a few parameters per subgroup, each layer's gradient ready
    at a different time of the backward."""
    return nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(width, width), nn.GELU())])


def _allocated(device: torch.device) -> int | None:
    """What the CUDA allocator holds for tensors now; None on the CPU (no such count)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(indexed(device))
    return torch.cuda.memory_allocated(indexed(device))


def _forward_backward_peak(device: torch.device, model: Callable, x: torch.Tensor,
                           optimizer: torch.optim.Optimizer) -> int:
    """The device peak of a forward+backward, then the step: on CUDA
    ``max_memory_allocated``; on the CPU the profiler's, less the offloaded optimizer's
    host part (``optimizer_state_host``, host memory beside an accelerator:
    `fxopt.profile.MemoryProfile.device_peak_bytes`)."""
    from fxopt.profile import profile_memory

    optimizer.zero_grad(set_to_none=True)
    if device.type != "cuda":
        profile = profile_memory(model, (x,), optimizer, steps=1, warmup=0)
        return max(profile.device_peak_bytes(phase) for phase in ("forward", "backward"))
    torch.cuda.synchronize(indexed(device))
    torch.cuda.reset_peak_memory_stats(indexed(device))
    model(x).sum().backward()
    torch.cuda.synchronize(indexed(device))
    peak = torch.cuda.max_memory_allocated(indexed(device))
    optimizer.step()
    return peak


def _width(device: torch.device) -> int:
    """The MLP's width: on CUDA wide enough that the allocator's rounding of the
    biases' state (512-byte blocks) is far below the criteria's tolerance; on the CPU,
    where the profiler counts bytes exactly, small and fast."""
    return 512 if device.type == "cuda" else 64


def offload_side(device: torch.device, offloaded: bool, batch: int = 32, steps: int = 3
                 ) -> tuple[list[torch.Tensor], int, Any]:
    """One side of the comparison: the MLP compiled by the same backend options on
    both sides (their peaks then differ by the optimizer only; ``codegen='fx'``, quick to
    compile, as the optimizer runs outside the compiled graph), ``steps`` AdamW steps,
    plain or offloaded (half the state on the host); the last step's forward+backward is
    measured (the state exists: a steady step). Returns the parameters after (on the
    host), the peak above what was allocated before the side began, and the plan (None
    when plain). The side is dropped before returning."""
    from fxopt.compiler import Backend
    from fxopt.optim import offload

    torch.compiler.reset()
    start = _allocated(device) or 0
    torch.manual_seed(0)
    width = _width(device)
    model = _mlp(width).to(device)
    inputs = [torch.randn(batch, width, device=device) for _ in range(steps)]
    backend = Backend({"offload_optimizer": True, "codegen": "fx"})
    compiled = torch.compile(model, backend=backend)
    compiled(inputs[0]).sum().backward()  # compiles; the pass records the gradient order
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if offloaded:
        optimizer = offload(optimizer, backend, model=compiled, cpu_fraction=0.5)
    for x in inputs[:-1]:
        optimizer.zero_grad(set_to_none=True)
        compiled(x).sum().backward()
        optimizer.step()
    peak = _forward_backward_peak(device, compiled, inputs[-1], optimizer) - start
    after = [p.detach().cpu().clone() for p in model.parameters()]
    plan = getattr(optimizer, "plan", None)
    if offloaded:
        optimizer.close()
    return after, peak, plan


def release_rounds(device: torch.device, rounds: int = 2) -> tuple[bool, list[int]]:
    """Build an offloaded AdamW on a new model, step it twice and drop both (no
    ``close()``: dropping must free), ``rounds`` times. Returns whether a weak reference
    to any dropped optimizer is still alive, and on CUDA ``memory_allocated`` after each
    round (empty on the CPU)."""
    from fxopt.optim import offload

    refs, allocated = [], []
    for _ in range(rounds):
        model = _mlp(_width(device)).to(device)
        optimizer = offload(torch.optim.AdamW(model.parameters()), model, cpu_fraction=0.5)
        for _ in range(2):
            optimizer.zero_grad()
            model(torch.randn(32, _width(device), device=device)).sum().backward()
            optimizer.step()
        refs.append(weakref.ref(optimizer))
        del model, optimizer
        gc.collect()
        now = _allocated(device)
        if now is not None:
            allocated.append(now)
    return any(ref() is not None for ref in refs), allocated


def check_offload_optimizer(device: torch.device) -> dict[str, Any]:
    """The offloaded AdamW (half its parameters' state on the host) against the plain one;
    fails on any of :func:`offload_problems`:

    1. after 3 steps a parameter differs from plain AdamW's beyond fp32 rounding
       (rtol 1e-5, atol 1e-6);
    2. built, stepped and dropped twice: a weak reference to a dropped optimizer stays
       alive, or (CUDA) ``memory_allocated`` after the second round exceeds the first's by
       more than ``RELEASE_SLACK_BYTES``;
    3. the same model compiled by the same backend options for both: plain minus
       offloaded device peak of a steady forward+backward (CUDA: ``max_memory_allocated``;
       CPU: the profiler's, the host category left out) below ``SAVING_FLOOR`` of the state
       placed on the host, or more than ``SAVING_TOLERANCE`` off the plan's
       ``all_gpu_state_bytes - gpu_state_bytes``, or nothing placed on the host.

    Its report line carries ``plan.summary()``, on success and on failure."""
    plain, plain_peak, _ = offload_side(device, offloaded=False)
    params, peak, plan = offload_side(device, offloaded=True)
    close = all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(params, plain))
    alive, released = release_rounds(device)
    itemsize = plain[0].element_size()
    measured = {
        "close": close, "difference": max((a - b).abs().max().item()
                                          for a, b in zip(params, plain)),
        "alive": alive, "released": released, "saving": plain_peak - peak,
        "host state": sum(s.numel for s in plan.subgroups if s.placement == "cpu")
        * itemsize * plan.states_per_param,
        "predicted": plan.all_gpu_state_bytes - plan.gpu_state_bytes}
    results = {"plan": plan.summary(), "steps": 3,
               "largest difference": measured["difference"],
               "dropped optimizers alive": int(alive),
               "allocated after each round": released or "n/a (CPU)",
               **{f"{k} KiB": round(measured[k] / 2**10, 1)
                  for k in ("saving", "host state", "predicted")}}
    problems = offload_problems(measured)
    if problems:
        raise Failed("; ".join(problems) + f" (plan: {plan.summary()})", results)
    return results
