"""The fused LSTM/GRU cell ops against autograd on plain torch math.

Every test runs twice, through the Triton kernels (skipped where Triton cannot run on the
CPU, i.e. without ``TRITON_INTERPRET=1``) and through the torch reference (forced), and
checks that the path it meant to test is the one that ran. Odd sizes (batch 3, hidden 37),
a gate order other than PyTorch's, biases on one side only, and rows with a stride (a time
step of a batch-first projection).
"""

import pytest
import torch

from fxopt.kernels import fuse_rnn, triton_runs_on

B, H = 3, 37
_REFERENCES = ("lstm_forward_reference", "lstm_backward_reference", "gru_forward_reference",
               "gru_backward_reference")


@pytest.fixture(autouse=True, params=["triton", "reference"])
def path(request, monkeypatch):
    """Runs the test through one path; afterwards, asserts that path ran: the reference
    functions are called exactly when the reference path is tested."""
    if request.param == "triton" and not triton_runs_on("cpu"):
        pytest.skip("Triton kernels run on the CPU only with TRITON_INTERPRET=1")
    if request.param == "reference":
        monkeypatch.setattr(fuse_rnn, "_use_triton", lambda *tensors: False)
    called = []

    def counting(name, original):
        def counted(*args):
            called.append(name)
            return original(*args)
        return counted

    for name in _REFERENCES:
        monkeypatch.setattr(fuse_rnn, name, counting(name, getattr(fuse_rnn, name)))
    yield request.param
    assert bool(called) == (request.param == "reference"), (
        f"meant to test the {request.param} path; torch reference calls: {called}")


def _leaves(*shapes, dtype=torch.float32):
    return [torch.randn(*s, dtype=dtype, requires_grad=True) for s in shapes]


def _lstm_eager(a, b, c, bias_a, order):
    chunks = (a + bias_a + b).chunk(4, 1)
    i, f, g, o = (chunks[k] for k in order)
    c_new = f.sigmoid() * c + i.sigmoid() * g.tanh()
    return o.sigmoid() * c_new.tanh(), c_new


def _gru_eager(a, b, h, bias_b, order):
    ax, bx = a.chunk(3, 1), (b + bias_b).chunk(3, 1)
    r = (ax[order[0]] + bx[order[0]]).sigmoid()
    z = (ax[order[1]] + bx[order[1]]).sigmoid()
    n = (ax[order[2]] + r * bx[order[2]]).tanh()
    return (1 - z) * n + z * h


def _check(fused_fn, eager_fn, leaves):
    twins = [t.detach().clone().requires_grad_() for t in leaves]
    actual, expected = fused_fn(*leaves), eager_fn(*twins)
    weights = [torch.randn_like(e) for e in expected]
    sum((a * w).sum() for a, w in zip(actual, weights)).backward()
    sum((e * w).sum() for e, w in zip(expected, weights)).backward()
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)
    for leaf, twin in zip(leaves, twins):
        torch.testing.assert_close(leaf.grad, twin.grad)


@pytest.mark.parametrize("order", [(0, 1, 2, 3), (2, 0, 3, 1)])
def test_lstm_cell_op_matches_autograd(order):
    torch.manual_seed(0)
    a_wide, b, c, bias_a = _leaves((B, 2, 4 * H), (B, 4 * H), (B, H), (4 * H,))

    def fused(a_wide, b, c, bias_a):
        h, c_new, _ = fuse_rnn.lstm_cell(a_wide[:, 1], b, c, bias_a, None, list(order))
        return h, c_new

    _check(fused, lambda a_wide, b, c, bias_a: _lstm_eager(a_wide[:, 1], b, c, bias_a, order),
           [a_wide, b, c, bias_a])


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 0, 1)])
def test_gru_cell_op_matches_autograd(order):
    torch.manual_seed(0)
    leaves = _leaves((B, 3 * H), (B, 3 * H), (B, H), (3 * H,))

    def fused(a, b, h, bias_b):
        return (fuse_rnn.gru_cell(a, b, h, None, bias_b, list(order))[0],)

    _check(fused, lambda a, b, h, bias_b: (_gru_eager(a, b, h, bias_b, order),), leaves)


def test_lstm_cell_op_in_bfloat16_keeps_a_float32_state():
    """bf16 projections with an fp32 cell state give fp32 results, as eager's promotion."""
    torch.manual_seed(0)
    a, b = (torch.randn(B, 4 * H, dtype=torch.bfloat16) for _ in range(2))
    c = torch.randn(B, H)
    h, c_new, gates = fuse_rnn.lstm_cell(a, b, c, None, None, list(fuse_rnn.LSTM_ORDER))
    h_ref, c_ref = _lstm_eager(a.float(), b.float(), c, torch.zeros(4 * H), fuse_rnn.LSTM_ORDER)
    assert h.dtype == c_new.dtype == torch.float32
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(c_new, c_ref)


def test_lstm_cell_op_all_bfloat16():
    """Everything bf16 (a state cast under CUDA autocast): bf16 results within one bf16
    rounding of the fp32 math."""
    torch.manual_seed(0)
    a, b = (torch.randn(B, 4 * H, dtype=torch.bfloat16) for _ in range(2))
    c = torch.randn(B, H, dtype=torch.bfloat16)
    bias = torch.randn(4 * H, dtype=torch.bfloat16)
    h, c_new, _ = fuse_rnn.lstm_cell(a, b, c, None, bias, list(fuse_rnn.LSTM_ORDER))
    h_ref, c_ref = _lstm_eager(b.float(), a.float(), c.float(), bias.float(), fuse_rnn.LSTM_ORDER)
    assert h.dtype == c_new.dtype == torch.bfloat16
    torch.testing.assert_close(h.float(), h_ref, rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(c_new.float(), c_ref, rtol=1.6e-2, atol=1e-2)
