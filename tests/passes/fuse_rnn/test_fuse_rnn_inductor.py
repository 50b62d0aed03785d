"""fuse_rnn under Inductor: the fusible cells become generated kernels, one per step each way.

Under ``codegen="fx"`` a fused step is the ``fxopt::lstm_cell`` / ``fxopt::gru_cell`` op,
which Inductor could only call as a Python extern op, one per step each way (on the H100
table, 170 us of host time each: the LSTMCell loop host-bound at 21 ms). Under Inductor the
pass inserts the fusible forms instead; these tests read Inductor's generated code (the
CPU's; CUDA's scheduler fuses pointwise ops alike) and count, per step: forward one GEMM
(the hidden projection; the input's is hoisted into one GEMM for all steps) and one
generated kernel; backward one generated kernel and two GEMMs (the hidden state's gradient,
the hidden weight's gradient accumulated); no fxopt op anywhere. Plain torch.compile runs
two GEMMs forward and four backward per step, counted the same way.
"""

import re

import pytest
import torch
from models import BF16Autocast
from torch import nn

from fxopt.compiler import Backend
from fxopt.testing import assert_same_as_eager

IN, H, B = 11, 37, 3
INDUCTOR = {"fuse_rnn": True, "codegen": "inductor", "strict": True}


class CellLoop(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.cell = (nn.LSTMCell if kind == "lstm" else nn.GRUCell)(IN, H)

    def forward(self, x, h, c):
        outputs = []
        for t in range(x.shape[0]):
            if self.kind == "lstm":
                h, c = self.cell(x[t], (h, c))
            else:
                h = self.cell(x[t], h)
            outputs.append(h)
        return torch.stack(outputs)


def _inputs(steps):
    torch.manual_seed(0)
    return (torch.randn(steps, B, IN, requires_grad=True), torch.randn(B, H, requires_grad=True),
            torch.randn(B, H, requires_grad=True))


def _launches(code):
    """(generated kernels, GEMMs, fxopt ops) called by one of Inductor's graphs."""
    body = code[code.index("def call("):]
    return (len(re.findall(r"^\s+cpp_fused\w*\(", body, re.M)),
            len(re.findall(r"^\s+extern_kernels\.(?:mm|addmm|bmm)\(", body, re.M)),
            body.count("torch.ops.fxopt."))


def _per_step_launches(kind, backend):
    """Per step (from 3 and 5 steps): generated kernels and GEMMs forward, then backward;
    and the fxopt ops found in the generated code. ``backend`` None: plain torch.compile."""
    from torch._inductor.utils import run_and_get_code

    counts, fxopt_ops = {}, 0
    for steps in (3, 5):
        torch._dynamo.reset()
        chosen = backend() if backend else "inductor"
        compiled = torch.compile(CellLoop(kind), backend=chosen)
        inputs = _inputs(steps)
        _, codes = run_and_get_code(lambda f=compiled, args=inputs: f(*args).sum().backward())
        (forward, backward) = codes  # its forward's, then its backward's
        if backend:
            (record,) = [r for g in chosen.graphs for r in g.passes if r.name == "fuse_rnn"]
            assert record.fired and record.stats["form"] == "fusible"
        counts[steps] = _launches(forward)[:2] + _launches(backward)[:2]
        fxopt_ops += _launches(forward)[2] + _launches(backward)[2]
    return [(b - a) / 2 for a, b in zip(counts[3], counts[5])], fxopt_ops


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_each_step_is_one_generated_kernel_each_way(kind):
    per_step, fxopt_ops = _per_step_launches(kind, lambda: Backend(INDUCTOR))
    assert fxopt_ops == 0 and per_step == [1, 1, 1, 2], per_step


def _distinct_kernels(code):
    """How many distinct generated kernels (by source) one of Inductor's graphs defines."""
    return len({part.split("async_compile.")[0]
                for part in code.split("async_compile.cpp_pybinding(")[1:]})


def test_every_steps_lstm_kernel_is_one_kernel():
    """The cell sums the hoisted input projection's step and the recurrent product first,
    which Inductor folds into the recurrent GEMM (``addmm``, the step as its C operand):
    no generated kernel reads a step-dependent offset, so the forward defines as many
    kernels at 5 steps as at 3 (each a compile: on a fresh H200 the 64-step loop's first
    step took 75.7 s against plain torch.compile's 15.3 when every step had its own)."""
    from torch._inductor.utils import run_and_get_code

    distinct = []
    for steps in (3, 5):
        torch._dynamo.reset()
        compiled = torch.compile(CellLoop("lstm"), backend=Backend(INDUCTOR))
        inputs = _inputs(steps)
        _, (forward, _) = run_and_get_code(
            lambda f=compiled, args=inputs: f(*args).sum().backward())
        distinct.append(_distinct_kernels(forward))
        assert forward.count("extern_kernels.addmm(") >= steps  # a step: one, the C its step
    assert distinct[0] == distinct[1], distinct


def test_plain_torch_compile_runs_three_more_gemms_per_step():
    """The count of the cost model's "plain" form (fxopt.planner.forms.rnn_call_work): two
    GEMMs forward and four backward per step, and at least a generated kernel each way
    (measured 1 and 1.5 here: Inductor's fusion of the backward varies with the graph; the
    form counts one)."""
    per_step, _ = _per_step_launches("lstm", None)
    kernels_forward, gemms_forward, kernels_backward, gemms_backward = per_step
    assert (gemms_forward, gemms_backward) == (2, 4), per_step
    assert kernels_forward >= 1 and kernels_backward >= 1, per_step


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_fusible_cells_train_like_eager(kind):
    comparison = assert_same_as_eager(CellLoop(kind), _inputs(5), INDUCTOR)
    assert comparison.fired("fuse_rnn")
    assert all(g.codegen.name == "inductor" for g in comparison.graphs)


def test_fusible_cells_in_another_gate_order_with_a_dynamic_batch():
    """A hand-written LSTM (gates i, f, o, g: the op's ``order``) under a symbolic batch."""
    from test_fuse_rnn import HandLSTM

    comparison = assert_same_as_eager(HandLSTM(hidden_bias=True), _inputs(4), INDUCTOR,
                                      dynamic=True)
    assert comparison.fired("fuse_rnn")


@pytest.mark.slow
def test_fusible_cells_under_bf16_autocast():
    """The fusible form computes in fp32 and returns eager's dtype, as the op does; the
    bf16 bound is test_fuse_rnn.py's AUTOCAST_TOLERANCES (both sides carry bf16 GEMMs)."""
    from test_fuse_rnn import AUTOCAST_TOLERANCES

    comparison = assert_same_as_eager(BF16Autocast(CellLoop("lstm")), _inputs(5), INDUCTOR,
                                      tolerances=AUTOCAST_TOLERANCES)
    assert comparison.fired("fuse_rnn")
