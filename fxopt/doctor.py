"""``fxopt doctor``: one self-test a user runs on their machine and pastes into a bug report.

Each check returns a :class:`Check` (ok, failed or skipped, a one-line detail, and numbers
for the JSON report). Every check has a criterion it can fail; each function's docstring
states it. On a CUDA device every check runs:

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

import contextlib
import itertools
import logging
import math
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fxopt.devices import indexed

__all__ = ["CHECKS", "OVERLAP_FLOOR", "PREDICTION_TOLERANCE", "RELEASE_SLACK_BYTES",
           "SAVING_FLOOR", "SAVING_TOLERANCE", "SPEED_MARGIN", "Check", "format_report",
           "memory_problems", "offload_problems", "overlap_problem", "report_json",
           "run_doctor", "speed_problem"]

log = logging.getLogger(__name__)

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


@dataclass
class Check:
    name: str
    status: str  # "ok", "failed" or "skipped"
    detail: str
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)


class _Skip(Exception):
    """A check that cannot run here; the message says why."""


class _Failed(AssertionError):
    """A check's criterion not met: the message says which, ``data`` keeps what it measured
    for the report."""

    def __init__(self, message: str, data: dict[str, Any]) -> None:
        super().__init__(message)
        self.data = data


def _cuda_only(device: torch.device) -> None:
    if device.type != "cuda":
        raise _Skip("needs a CUDA device")


# ---------------------------------------------------------------- the models it runs

class _NormMLP(nn.Module):
    """LayerNorm -> Linear -> GELU -> Linear -> RMSNorm: tempo's GELU and both norms."""

    def __init__(self, width: int = 37) -> None:
        super().__init__()
        self.norm, self.rms = nn.LayerNorm(width), nn.RMSNorm(width)
        self.up, self.down = nn.Linear(width, 3 * width), nn.Linear(3 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rms(self.down(F.gelu(self.up(self.norm(x)), approximate="tanh")))


class _LSTMModel(nn.Module):
    def __init__(self, width: int = 37, cell: type = nn.LSTM) -> None:
        super().__init__()
        self.rnn, self.head = cell(width, width, batch_first=True), nn.Linear(width, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0])


def _pointwise_chain(x: torch.Tensor, y: torch.Tensor, b: torch.Tensor) -> tuple:
    z = torch.sigmoid(x * y + b)
    return F.gelu(z) * torch.tanh(x) - z, z


def _deep_mlp(width: int) -> nn.Module:
    layers = [m for _ in range(6) for m in (nn.Linear(width, width), nn.GELU())]
    return nn.Sequential(*layers, nn.Linear(width, 8))


# ---------------------------------------------------------------- the checks

def check_kernels(device: torch.device) -> dict[str, Any]:
    """Each kernel family through its pass at odd shapes against eager, with gradients.
    Fails, naming the family, when its outputs or gradients are not close to eager's
    (`fxopt.testing`'s tolerances; TF32 off for both, :func:`_without_tf32`) or its pass
    did not fire."""
    from fxopt._compat import dynamo_allow_rnn
    from fxopt.kernels import triton_runs_on
    from fxopt.testing import assert_same_as_eager

    def tokens(dtype: torch.dtype) -> tuple:
        return (torch.randn(3, 7, 37, device=device, dtype=dtype),)

    def chain_inputs(dtype: torch.dtype) -> tuple:
        return tuple(torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
                     for shape in ((13, 101), (13, 101), (101,)))

    # tempo: GELU's derivative comes from a fitted polynomial (relative error below 1e-3,
    # the fit's bar); bf16: each op rounds to bf16 (4e-3), seven ops (the property test's)
    fitted, rounded = {torch.float32: (1e-3, 1e-3)}, {torch.bfloat16: (5e-2, 3e-2)}
    cases = [("tempo", "LayerNorm+GELU+RMSNorm", _NormMLP, tokens, torch.float32, fitted),
             ("fuse_rnn", "LSTM", _LSTMModel, tokens, torch.float32, {}),
             ("fuse_rnn", "GRU", lambda: _LSTMModel(cell=nn.GRU), tokens, torch.float32, {})]
    if triton_runs_on(device):  # the generated kernels need Triton (or its interpreter)
        cases += [("fuse_elementwise", "pointwise chain", lambda: _pointwise_chain,
                   chain_inputs, dtype, rounded) for dtype in (torch.float32, torch.bfloat16)]
    results = {"kernels": "Triton" if triton_runs_on(device) else "torch references"}
    if not triton_runs_on(device):
        results["not run"] = ("generated pointwise kernels (no Triton on this device; on a "
                              "CPU, TRITON_INTERPRET=1 runs them)")
    for name, label, build, inputs, dtype, tolerances in cases:
        model = build()
        if isinstance(model, nn.Module):
            model = model.to(device=device, dtype=dtype)
        torch.compiler.reset()
        torch.manual_seed(0)
        family = f"{label} {str(dtype)[6:]}"
        try:
            with dynamo_allow_rnn(), _without_tf32():
                comparison = assert_same_as_eager(model, inputs(dtype),
                                                  {name: True, "strict": True},
                                                  tolerances=tolerances)
        except AssertionError as error:
            raise _Failed(f"{family} ({name}) not close to eager without TF32: "
                          f"{str(error).strip().splitlines()[0]}", results) from error
        if not comparison.fired(name):
            raise _Failed(f"{family}: {name} did not fire", results)
        results[family] = "equal to eager"
    return results


@contextlib.contextmanager
def _without_tf32() -> Iterator[None]:
    """fp32 matrix products in fp32, restored afterwards. Eager's cuDNN RNNs run TF32 by
    default (``torch.backends.cudnn.allow_tf32``, a 10-bit mantissa): as a reference for an
    fp32 kernel they are off by TF32's rounding, not by the kernel's."""
    cudnn, matmul = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = cudnn, matmul


def check_host_sync(device: torch.device) -> dict[str, Any]:
    """A tiny GPT-2's second training step with every pass on: fails on any call that waits
    for the device (recorded while the step runs, or found in the compiled graphs)."""
    from fxopt.analysis.host_sync import HostSyncRecorder, graph_syncs
    from fxopt.bench.workloads import WORKLOADS
    from fxopt.compiler import Backend
    from fxopt.profile import default_loss

    workload = WORKLOADS["gpt2-small"]
    torch.compiler.reset()
    torch.manual_seed(0)
    model = workload.build(True).to(device)
    inputs = workload.inputs(model, workload.smoke_batch, True, device)
    backend = Backend({"tempo": True, "fuse_rnn": True, "fuse_elementwise": True,
                       "memory_budget": 0.5})
    compiled = torch.compile(model, backend=backend)
    default_loss(compiled(**inputs)).backward()
    with HostSyncRecorder(device.type) as recorder:
        default_loss(compiled(**inputs)).backward()
    # the model's own code makes none (tests/analysis/test_host_sync.py): every call counts
    fxopt_calls = [str(c) for c in recorder.calls]
    static = [str(s) for g in backend.graphs for kind in ("forward", "backward")
              if kind in g.graphs for s in graph_syncs(g.graphs[kind])]
    if fxopt_calls or static:
        raise AssertionError("host syncs: " + "; ".join(fxopt_calls + static))
    fired = sorted({r.name for g in backend.graphs for r in g.passes if r.fired})
    return {"passes fired": ", ".join(fired), "host syncs": 0}


def check_aot(device: torch.device) -> dict[str, Any]:
    """Representative kernels compiled for sm_80 and sm_90 here, with no GPU needed: fails
    on any compile error, spill or excess of registers (`fxopt.kernels.aot.problems`)."""
    if device.type == "cuda":
        raise _Skip("the kernels check compiled and ran them on this GPU")
    from fxopt.kernels import aot, triton_installed

    if not triton_installed():
        raise _Skip("Triton is not installed")
    specs = [s for s in aot.handwritten_specs(("bf16",)) if "[tanh]" in s.label
             or s.label.startswith("lstm")]
    reports = aot.compile_specs(specs)
    problems = [p for r in reports for p in aot.problems(r)]
    if problems:
        raise AssertionError("; ".join(problems))
    return {r.label + f" sm_{r.arch}": f"{r.registers} registers, no spill" for r in reports}


def _overlap(copies: list[tuple[float, float]], compute: list[tuple[float, float]]
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
    share = _overlap(copies, compute) / copy_us
    data = {"copies": len(copies), "copy ms": round(copy_us / 1e3, 3),
            "overlapped": f"{share:.0%}"}
    if share < floor:
        return data, (f"{share:.0%} of {copy_us / 1e3:.3g} ms of copies overlapped compute, "
                      f"below the floor of {floor:.0%}: the copies run serialised")
    return data, None


def check_swap_overlap(device: torch.device) -> dict[str, Any]:
    """One step with swapping forced: the copies (on swap_recompute's copy stream) must
    overlap compute kernels for at least ``OVERLAP_FLOOR`` of their time. Skipped on the
    CPU, where a swap is a synchronous copy (no copy stream) and nothing can overlap."""
    if device.type != "cuda":
        raise _Skip("no copy stream on the CPU: swaps copy synchronously")
    from torch.profiler import ProfilerActivity, profile

    from fxopt.compiler import Backend

    torch.compiler.reset()
    model = _deep_mlp(2048).to(device)
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
        raise _Failed(problem, data)
    return data


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


def _step_peak(device: torch.device, fraction: float, width: int = 2048,
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
    model = _deep_mlp(width).to(device)
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
    _cuda_only(device)
    results, rows = {}, []
    for fraction in (1.0, 0.6, 0.35):
        measured, predicted = _step_peak(device, fraction)
        rows.append((fraction, measured, predicted))
        results[f"budget {fraction}"] = {"measured MiB": round(measured / 2**20, 1),
                                         "predicted MiB": round(predicted / 2**20, 1)}
    problems = memory_problems(rows)
    if problems:
        raise _Failed("; ".join(problems), results)
    return results


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
    from fxopt import doctor_offload as measure

    plain, plain_peak, _ = measure.offload_side(device, offloaded=False)
    params, peak, plan = measure.offload_side(device, offloaded=True)
    close = all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(params, plain))
    alive, released = measure.release_rounds(device)
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
        raise _Failed("; ".join(problems) + f" (plan: {plan.summary()})", results)
    return results


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


def check_speed(device: torch.device) -> dict[str, Any]:
    """Step time of the benchmark suite's small GPT-2 under eager, Inductor and fxopt's
    defaults, interleaved: fails on :func:`speed_problem`."""
    _cuda_only(device)
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
        raise _Failed(problem, results)
    return results


CHECKS: dict[str, Callable[[torch.device], dict[str, Any]]] = {
    "kernels": check_kernels, "host_sync": check_host_sync, "aot_compile": check_aot,
    "swap_overlap": check_swap_overlap, "memory": check_memory,
    "offload_optimizer": check_offload_optimizer, "speed": check_speed,
}


def run_doctor(device: str | None = None, only: list[str] | None = None) -> list[Check]:
    """Run the checks (all, or ``only`` these) on ``device`` (default: CUDA if present)."""
    device = indexed(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    checks = []
    for name, check in CHECKS.items():
        if only and name not in only:
            continue
        start = time.perf_counter()
        try:
            data = check(device)
            status, detail = "ok", ""
        except _Skip as skip:
            data, status, detail = {}, "skipped", str(skip)
        except Exception as error:  # a failed check is the report's content
            data, status = getattr(error, "data", {}), "failed"
            detail = str(error).strip()[:400]  # a criterion not met says which
            if not isinstance(error, _Failed):
                detail = f"{type(error).__name__}: {detail}"
            log.debug("doctor check %s failed", name, exc_info=True)
        checks.append(Check(name, status, detail, time.perf_counter() - start, data))
    return checks


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


def format_report(checks: list[Check]) -> str:
    """A table: one line per check (status, seconds, what it found or why it skipped)."""
    env = environment()
    lines = [" ".join(f"{k} {v}" for k, v in env.items()), ""]
    lines.append(f"{'check':<18} {'status':<8} {'seconds':>7}  result")
    for c in checks:
        lines.append(f"{c.name:<18} {c.status:<8} {c.seconds:>7.1f}  "
                     f"{c.detail or _summary(c.data)}")
    skipped = [c.name for c in checks if c.status == "skipped"]
    if skipped:
        lines.append(f"\nskipped here: {', '.join(skipped)} (run fxopt doctor on a GPU)")
    return "\n".join(lines)
