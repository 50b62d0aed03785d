"""The whole-sequence LSTM/GRU ops against autograd on a plain torch loop of the same cell.

Every test runs through the Triton kernels (skipped where Triton cannot run on the CPU,
i.e. without ``TRITON_INTERPRET=1``) and through the torch reference (forced), and checks
that the path it meant to test ran. Odd sizes (3 steps, batch 3, hidden 13), both
directions, with and without ``b_hh``, the projection as a strided view (a batch-first
sequence made time-major), and the GEMMs each way counted: per step one forward and one
backward, and the recurrent weight's gradient as one GEMM, not one per step.
"""

from types import SimpleNamespace

import pytest
import torch
import torch.utils.flop_counter

from fxopt.kernels import fuse_rnn, triton_runs_on
from fxopt.kernels.fuse_rnn_sequence import gru_sequence, lstm_sequence

T, B, H = 3, 3, 13


@pytest.fixture(autouse=True, params=["triton", "reference"])
def path(request, monkeypatch):
    """Runs the test through one path and counts the Triton launches of each kernel;
    afterwards asserts that path ran."""
    if request.param == "triton" and not triton_runs_on("cpu"):
        pytest.skip("Triton kernels run on the CPU only with TRITON_INTERPRET=1")
    if request.param == "reference":
        monkeypatch.setattr(fuse_rnn, "_use_triton", lambda *tensors: False)
    launches, pointers = {}, {}

    class Counted:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            launches[self.name] = launches.get(self.name, 0) + 1

            def launch(*args, **kwargs):
                pointers.setdefault(self.name, set()).add(
                    tuple(x.dtype for x in args if isinstance(x, torch.Tensor)))
                return self.kernel[grid](*args, **kwargs)
            return launch

    for name in ("_lstm_forward_kernel", "_lstm_backward_kernel", "_gru_forward_kernel",
                 "_gru_backward_kernel"):
        if hasattr(fuse_rnn, name):
            monkeypatch.setattr(fuse_rnn, name, Counted(name, getattr(fuse_rnn, name)))
    yield SimpleNamespace(name=request.param, launches=launches, pointers=pointers)
    assert bool(launches) == (request.param == "triton"), launches


def _lstm_loop(a, h, c, w_hh, b_hh, reverse):
    outs = [None] * a.shape[0]
    for t in (reversed(range(a.shape[0])) if reverse else range(a.shape[0])):
        i, f, g, o = (a[t] + h @ w_hh.t() + (0 if b_hh is None else b_hh)).chunk(4, 1)
        c = f.sigmoid() * c + i.sigmoid() * g.tanh()
        h = o.sigmoid() * c.tanh()
        outs[t] = h
    return torch.stack(outs), h, c


def _gru_loop(a, h, w_hh, b_hh, reverse):
    outs = [None] * a.shape[0]
    for t in (reversed(range(a.shape[0])) if reverse else range(a.shape[0])):
        ar, az, an = a[t].chunk(3, 1)
        hr, hz, hn = (h @ w_hh.t() + (0 if b_hh is None else b_hh)).chunk(3, 1)
        r, z = (ar + hr).sigmoid(), (az + hz).sigmoid()
        h = (1 - z) * (an + r * hn).tanh() + z * h
        outs[t] = h
    return torch.stack(outs), h


def _leaf(*shape, dtype=torch.float32):
    return (torch.randn(*shape, dtype=dtype) * 0.5).requires_grad_()


def _inputs(gates, bias, batch_first):
    """(a, h0, c0, w_hh, b_hh); ``batch_first``: ``a`` a time-major view of [B, T, G]."""
    a = _leaf(B, T, gates * H).transpose(0, 1) if batch_first else _leaf(T, B, gates * H)
    return a, _leaf(B, H), _leaf(B, H), _leaf(gates * H, H), _leaf(gates * H) if bias else None


def _compare(got, expected, leaves):
    for x, y in zip(got, expected):
        torch.testing.assert_close(x, y)
    upstream = [torch.randn_like(y) for y in expected]
    got_grads = torch.autograd.grad(got, leaves, upstream)
    expected_grads = torch.autograd.grad(expected, leaves, upstream)
    for name, x, y in zip(("a", "h0", "c0|w_hh", "w_hh|b_hh", "b_hh"), got_grads,
                          expected_grads):
        torch.testing.assert_close(x, y, msg=name)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("bias,batch_first", [(True, False), (False, True)],
                         ids=["bias", "nobias-strided"])
def test_lstm_sequence_matches_autograd(path, reverse, bias, batch_first):
    a, h0, c0, w_hh, b_hh = _inputs(4, bias, batch_first)
    leaves = [t for t in (a, h0, c0, w_hh, b_hh) if t is not None]
    out, h_n, c_n, gates, cells = lstm_sequence(a, h0, c0, w_hh, b_hh, reverse)
    assert gates.shape == (T, B, 4 * H) and cells.shape == (T, B, H)
    _compare((out, h_n, c_n), _lstm_loop(a, h0, c0, w_hh, b_hh, reverse), leaves)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("bias,batch_first", [(True, True), (False, False)],
                         ids=["bias-strided", "nobias"])
def test_gru_sequence_matches_autograd(path, reverse, bias, batch_first):
    a, h0, _, w_hh, b_hh = _inputs(3, bias, batch_first)
    leaves = [t for t in (a, h0, w_hh, b_hh) if t is not None]
    out, h_n, saved = gru_sequence(a, h0, w_hh, b_hh, reverse)
    assert saved.shape == (T, B, 4 * H)
    _compare((out, h_n), _gru_loop(a, h0, w_hh, b_hh, reverse), leaves)


def _gemms(run):
    """``run()``'s result and the aten GEMMs it ran (the profiler sees inside the op)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        result = run()
    return result, sum(e.count for e in prof.key_averages()
                       if e.key in ("aten::mm", "aten::addmm"))


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_one_gemm_and_one_cell_kernel_per_step_each_way(path, kind):
    """Forward: T recurrent GEMMs. Backward: T GEMMs carrying the hidden gradient back
    (the last one to h0) and one for W_hh's gradient over the whole sequence. On the Triton
    path one cell kernel per step each way."""
    if kind == "lstm":
        a, h0, c0, w_hh, b_hh = _inputs(4, True, False)
        run = lambda: lstm_sequence(a, h0, c0, w_hh, b_hh, False)[0]  # noqa: E731
    else:
        a, h0, _, w_hh, b_hh = _inputs(3, True, False)
        run = lambda: gru_sequence(a, h0, w_hh, b_hh, False)[0]  # noqa: E731
    out, forward = _gemms(run)
    assert forward == T
    if path.name == "triton":
        assert path.launches == {f"_{kind}_forward_kernel": T}
    _, backward = _gemms(lambda: out.sum().backward())
    assert backward == T + 1
    if path.name == "triton":
        assert path.launches == {f"_{kind}_forward_kernel": T, f"_{kind}_backward_kernel": T}
    assert all(g is not None for g in (a.grad, h0.grad, w_hh.grad, b_hh.grad))


def test_lstm_sequence_in_bfloat16_matches_the_cell_op_step_by_step(path):
    """All bf16: the same math as fuse_rnn's cell op stepped in a loop, whose own bf16
    bound is tests/kernels/test_fuse_rnn_kernels.py's; the outputs round to the same bf16
    values (both compute the cell in fp32 and round once per step)."""
    a, h0, c0, w_hh, b_hh = (t.detach().to(torch.bfloat16) for t in _inputs(4, True, False))
    out, h_n, c_n, _, _ = lstm_sequence(a, h0, c0, w_hh, b_hh, False)
    h, c = h0, c0
    for t in range(T):
        h, c, _ = torch.ops.fxopt.lstm_cell(a[t], h @ w_hh.t(), c, None, b_hh, [0, 1, 2, 3])
        torch.testing.assert_close(out[t], h, rtol=0, atol=0)
    assert out.dtype == torch.bfloat16 and torch.equal(c_n, c) and torch.equal(h_n, h)


@pytest.mark.parametrize("path", ["triton"], indirect=True)  # the reference launches none
def test_bf16_launches_are_the_specializations_the_aot_check_compiles(path):
    """The pointer types each kernel is launched with in bf16 are those of the specs
    `fxopt.kernels.aot` compiles for sm_80/sm_90 (tests/kernels/test_kernels_aot.py): the
    forward kernels' as the cell ops call them, the backward kernels' as the sequence ops
    do (bf16 gate gradients, the LSTM's fp32 cell-state carry)."""
    from fxopt.kernels import aot

    for gates, op in ((4, lstm_sequence), (3, gru_sequence)):
        a, h0, c0, w_hh, b_hh = (t.detach().to(torch.bfloat16).requires_grad_()
                                 for t in _inputs(gates, True, False))
        out = (op(a, h0, c0, w_hh, b_hh, False) if op is lstm_sequence
               else op(a, h0, w_hh, b_hh, False))[0]
        out.float().sum().backward()
    names = {torch.bfloat16: "*bf16", torch.float32: "*fp32"}
    launched = {kernel: {tuple(names[d] for d in call) for call in calls}
                for kernel, calls in path.pointers.items()}
    specs = {s.label: s for s in aot.handwritten_specs(("bf16",))}
    for kernel, label in (("_lstm_forward_kernel", "lstm_forward H=1024 bf16"),
                          ("_lstm_backward_kernel", "lstm_backward[sequence] H=1024 bf16"),
                          ("_gru_forward_kernel", "gru_forward H=1024 bf16"),
                          ("_gru_backward_kernel", "gru_backward[sequence] H=1024 bf16")):
        signature = tuple(t for t in specs[label].signature.values() if t.startswith("*"))
        assert launched[kernel] == {signature}, (kernel, launched[kernel], signature)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_flops_are_the_recurrent_gemms(path, kind):
    """What the cost model prices a recompute of the op at: ``2 T B H G`` forward (G the
    gates' width), twice that backward."""
    gates = 4 if kind == "lstm" else 3
    a, h0, c0, w_hh, b_hh = _inputs(gates, True, False)
    with torch.utils.flop_counter.FlopCounterMode(display=False) as forward:
        out = (lstm_sequence(a, h0, c0, w_hh, b_hh, False) if kind == "lstm"
               else gru_sequence(a, h0, w_hh, b_hh, False))[0]
    with torch.utils.flop_counter.FlopCounterMode(display=False) as backward:
        out.sum().backward()
    one_pass = 2 * T * B * gates * H * H
    assert (forward.get_total_flops(), backward.get_total_flops()) == (one_pass, 2 * one_pass)
