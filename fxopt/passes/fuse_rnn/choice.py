"""Whether fuse_rnn fuses a whole ``nn.LSTM``/``nn.GRU`` call or leaves it to the library,
decided by the GPU cost model (:mod:`fxopt.planner.forms`, issue 30.2).

On CUDA the call's two forms are priced with the device's hardware profile: cuDNN's (one
launch per layer and direction from cuDNN's C++ loop, the recurrent GEMM and the cell
chained per step on the device) and fuse_rnn's sequence ops (the same device work, each
step's GEMM and cell kernel launched from the op's Python loop). ``fuse_rnn="auto"``
leaves the call to cuDNN when cuDNN is predicted faster; library_rnn then takes it (its
default on CUDA without a budget), so it runs as one library call, once, as eager's,
instead of AOTAutograd's per-step decomposition; under a memory budget recompute_rnn
takes it instead and runs its forward again in the backward. ``fuse_rnn=True`` fuses it
anyway, warning once per call with the predicted slowdown. Cells and hand-written loops
are always fused: the table shows the fused LSTMCell loop ahead of eager
(benchmarks/results/gpu_h100_2026-11-26.md), and the model predicts the fusible form ahead
of plain torch.compile's too. On other devices there is no library kernel to compare with
(the CPU's RNN is not cuDNN), and the call is fused as before.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import asdict, dataclass

import torch

from fxopt.planner import forms
from fxopt.planner.hardware import HardwareProfile, profile_for

__all__ = ["RnnChoice", "choose"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RnnChoice:
    """The two forms' predicted step times (forward and backward of the call alone)."""

    call: str
    library_ms: float
    fused_ms: float
    hardware: str
    keep_library: bool    # what "auto" does

    def as_stat(self) -> dict[str, object]:
        return asdict(self)

    def text(self) -> str:
        return (f"cuDNN predicted {self.library_ms:.2f} ms against {self.fused_ms:.2f} ms "
                f"fused ({self.hardware} profile)")


def choose(node_name: str, mode: str, batch: int, steps: int, input_size: int, hidden: int,
           layers: int, directions: int, dtype: torch.dtype, device: torch.device,
           hardware: HardwareProfile | None = None) -> RnnChoice | None:
    """The cost model's choice for one call, or None off CUDA (no library form to price)."""
    if device.type != "cuda":
        return None
    hw = hardware or profile_for(device)
    times = {form: forms.predict(forms.rnn_call_work(
        mode, batch, steps, input_size, hidden, layers, directions, form, hw,
        itemsize=dtype.itemsize), hw).ms for form in ("cudnn", "sequence")}
    return RnnChoice(node_name, times["cudnn"], times["sequence"], hw.name,
                     times["cudnn"] < times["sequence"])


def warn_forced(choice: RnnChoice) -> None:
    """fuse_rnn=True on a call the model predicts slower fused."""
    warnings.warn(f"fxopt: fuse_rnn=True fuses the RNN call {choice.call!r} although "
                  f"{choice.text()}, {choice.fused_ms / choice.library_ms:.1f}x slower; "
                  f"fuse_rnn='auto' leaves such calls to cuDNN", stacklevel=2)
