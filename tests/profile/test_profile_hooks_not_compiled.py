"""fxopt.profile_memory's saved-tensor hooks are not compiled by Dynamo: a compiled model
whose graph breaks (here at nn.LSTM) calls them from eager code that Dynamo watches, and
Dynamo used to trace them as frames, guard on the tensor's dtype and the hook's list, and
recompile them until its recompile_limit warning."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import torch
import fxopt
from models import LSTMModel

torch.manual_seed(0)
model = torch.compile(LSTMModel(), backend="fxopt")
tokens = torch.randint(0, 23, (2, 9))
fxopt.profile_memory(model, tokens, steps=1)
print("profiled")
"""


def test_a_compiled_model_with_a_graph_break_does_not_recompile_the_hooks():
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TORCH_LOGS": "recompiles",
           "FXOPT_CODEGEN": "fx",  # a quick compile (tests/conftest.py pins in-process ones)
           "PYTHONPATH": os.pathsep.join([str(tests), str(tests.parent)])}
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                            env=env, timeout=300, check=False)
    assert result.returncode == 0 and "profiled" in result.stdout, result.stderr[-3000:]
    assert "Recompiling function pack" not in result.stderr, result.stderr[-3000:]
    assert "recompile_limit" not in result.stderr
