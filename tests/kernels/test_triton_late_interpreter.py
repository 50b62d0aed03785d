"""TRITON_INTERPRET=1 set after triton was imported (as a notebook does): Triton's own
library is then compiled for a GPU and its interpreter cannot run a kernel. fxopt decides
once, at the first kernel call, and runs the torch references with one warning, instead of
crashing in training. Run in a subprocess: the variable must be unset when triton imports."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import os, warnings
import torch, triton, fxopt
from torch import nn
from fxopt.kernels import fuse_rnn
from fxopt.testing import TEMPO_TOLERANCES, assert_same_as_eager

torch.manual_seed(0)  # TEMPO_TOLERANCES hold for this input, not for every one
os.environ["TRITON_INTERPRET"] = "1"  # too late: triton is imported
warnings.simplefilter("always")
model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 8))
with warnings.catch_warnings(record=True) as caught:
    comparison = assert_same_as_eager(model, (torch.randn(3, 8),),
                                      {"tempo": True, "fuse_elementwise": True},
                                      tolerances=TEMPO_TOLERANCES)
    a, b, c = torch.randn(2, 12), torch.randn(2, 12), torch.randn(2, 3)
    got = fuse_rnn.lstm_forward(a, b, c, None, None, fuse_rnn.LSTM_ORDER)
    want = fuse_rnn.lstm_forward_reference(a, b, c, None, None, fuse_rnn.LSTM_ORDER)
assert all(torch.equal(x, y) for x, y in zip(got, want))
assert comparison.fired("tempo"), "tempo did not rewrite the model"
late = [str(w.message) for w in caught if "TRITON_INTERPRET" in str(w.message)]
assert len(late) == 1, late
print("REFERENCE:", late[0])
"""


def test_interpreter_set_after_triton_import_falls_back_with_one_warning():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", SCRIPT], check=False, capture_output=True,
                            text=True, cwd=ROOT, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "set after triton was imported" in result.stdout
