"""``fxopt doctor``'s kernel checks: every Triton kernel family through its pass against
eager (without TF32), and the library's RNN call that library_rnn keeps (cuDNN on CUDA), a
training step's host syncs, and the ahead-of-time compile of representative kernels for
sm_80/sm_90 where there is no GPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fxopt.doctor.report import Failed, Skip

__all__ = ["check_aot", "check_host_sync", "check_kernels"]


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
    # fuse_rnn's cells: under the default generator (Inductor) their fusible forms, under
    # fx the custom ops' own Triton kernels
    fx = {"codegen": "fx"}
    cases = [("tempo", "LayerNorm+GELU+RMSNorm", _NormMLP, tokens, torch.float32, fitted, {}),
             ("fuse_rnn", "LSTM", _LSTMModel, tokens, torch.float32, {}, {}),
             ("fuse_rnn", "LSTM", _LSTMModel, tokens, torch.float32, {}, fx),
             ("fuse_rnn", "GRU", lambda: _LSTMModel(cell=nn.GRU), tokens, torch.float32, {},
              {}),
             ("fuse_rnn", "GRU", lambda: _LSTMModel(cell=nn.GRU), tokens, torch.float32,
              {}, fx),
             # the library's whole call run once (CUDA's default for a traced nn.LSTM)
             ("library_rnn", "LSTM library call", _LSTMModel, tokens, torch.float32, {}, {})]
    if triton_runs_on(device):  # the generated kernels need Triton (or its interpreter)
        cases += [("fuse_elementwise", "pointwise chain", lambda: _pointwise_chain,
                   chain_inputs, dtype, rounded, {})
                  for dtype in (torch.float32, torch.bfloat16)]
    results = {"kernels": "Triton" if triton_runs_on(device) else "torch references"}
    if not triton_runs_on(device):
        results["not run"] = ("generated pointwise kernels (no Triton on this device; on a "
                              "CPU, TRITON_INTERPRET=1 runs them)")
    for name, label, build, inputs, dtype, tolerances, options in cases:
        model = build()
        if isinstance(model, nn.Module):
            model = model.to(device=device, dtype=dtype)
        torch.compiler.reset()
        torch.manual_seed(0)
        family = f"{label} {str(dtype)[6:]}" + "".join(f", {k}={v}" for k, v in options.items())
        try:
            with dynamo_allow_rnn(), _without_tf32():
                comparison = assert_same_as_eager(model, inputs(dtype),
                                                  {name: True, "strict": True, **options},
                                                  tolerances=tolerances)
        except AssertionError as error:
            raise Failed(f"{family} ({name}) not close to eager without TF32: "
                          f"{str(error).strip().splitlines()[0]}", results) from error
        if not comparison.fired(name):
            raise Failed(f"{family}: {name} did not fire", results)
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
        raise Skip("the kernels check compiled and ran them on this GPU")
    from fxopt.kernels import aot, triton_installed

    if not triton_installed():
        raise Skip("Triton is not installed")
    specs = [s for s in aot.handwritten_specs(("bf16",)) if "[tanh]" in s.label
             or s.label.startswith("lstm")]
    reports = aot.compile_specs(specs)
    problems = [p for r in reports for p in aot.problems(r)]
    if problems:
        raise AssertionError("; ".join(problems))
    return {r.label + f" sm_{r.arch}": f"{r.registers} registers, no spill" for r in reports}
