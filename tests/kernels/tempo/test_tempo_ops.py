"""tempo's custom ops against eager PyTorch: outputs and every gradient at odd shapes, fp32
and bf16, gamma with zeros, dropout p in {0, 0.1}; the Triton kernels against the torch
references (under TRITON_INTERPRET=1 the ops run the kernels on the CPU); the GELU fit's
accuracy against the exact derivative."""

import math

import pytest
import torch
import torch.nn.functional as F

from fxopt.kernels import triton_runs_on
from fxopt.kernels.tempo import fusible
from fxopt.kernels.tempo import gelu as tempo_gelu_module
from fxopt.kernels.tempo.attention import tempo_softmax_dropout_matmul
from fxopt.kernels.tempo.bitmask import pack_bits, unpack_bits
from fxopt.kernels.tempo.gelu import tempo_gelu
from fxopt.kernels.tempo.gelu_coefficients import FITS
from fxopt.kernels.tempo.norm import (
    guard_capacity,
    tempo_layer_norm,
    tempo_rms_norm,
    tempo_rms_norm_cast,
)
from fxopt.testing import TOLERANCES

APPROXIMATIONS = ("none", "tanh")


def _grads(output, inputs, seed=0):
    generator = torch.Generator().manual_seed(seed)
    weights = torch.randn(output.shape, generator=generator)
    return torch.autograd.grad((output.float() * weights).sum(), inputs)


def _assert_close(actual, expected, tolerance=None):
    rtol, atol = tolerance or TOLERANCES[expected.dtype]
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("numel", [1, 7, 8, 9, 1000, 1029])
def test_bit_packing_round_trips(numel):
    mask = torch.rand(numel, generator=torch.Generator().manual_seed(numel)) > 0.5
    packed = pack_bits(mask.view(-1, 1))
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(numel / 8)
    assert torch.equal(unpack_bits(packed, (numel, 1)), mask.view(-1, 1))


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_gelu_derivative_fit_is_accurate_in_fp32(approximate):
    """The issue's bar: gradient relative error vs the exact derivative below 1e-3 in fp32;
    the pointwise error stays within the fit's recorded max error (y rounded to fp32)."""
    x = torch.linspace(-10, 10, 20_001, dtype=torch.float64)
    exact = torch.func.vmap(torch.func.grad(
        lambda t: F.gelu(t, approximate=approximate)))(x)
    y, packed = tempo_gelu(x.float(), approximate)
    right = unpack_bits(packed, y.shape)
    fitted = tempo_gelu_module.gelu_derivative_from_output(y, right, approximate).double()
    assert (fitted - exact).norm() / exact.norm() < 1e-3
    assert (fitted - exact).abs().max() <= 1.5 * FITS[approximate]["max_error_fp32"]


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_matches_eager(approximate, dtype):
    x = (3 * torch.randn(37, 29, generator=torch.Generator().manual_seed(1))).to(dtype)
    x.requires_grad_()
    expected = F.gelu(x, approximate=approximate)
    y, packed = tempo_gelu(x, approximate)
    # Triton's erf/tanh differ from ATen's in the last bit: one bf16 ulp at |y| < 8.
    _assert_close(y, expected, (1e-5, 1e-6) if dtype == torch.float32 else (0, 0.032))
    assert packed.numel() == math.ceil(x.numel() / 8)
    # Gradient from y: fp32 within 4x the fit's error times |dy| (< 4); in bf16 the
    # rounding of y near GELU's minimum dominates (fit_gelu.py: 1.6e-2 at most).
    tolerance = (1e-4, 2e-4) if dtype == torch.float32 else (1.6e-2, 0.07)
    (expected_grad,), (grad,) = _grads(expected, (x,)), _grads(y, (x,))
    _assert_close(grad, expected_grad, tolerance)


def test_gelu_reference_backward_in_chunks_equals_one_pass(monkeypatch):
    """The torch reference computes dx in chunks (bounding its temporaries): several
    chunks, the last one partial, give what one pass over the tensor gives."""
    x = 3 * torch.randn(3, 70, 41, generator=torch.Generator().manual_seed(4))
    y, packed = tempo_gelu_module._forward_reference(x, "tanh")
    dy = torch.randn_like(x)
    chunk = 1000  # the real chunk (64Ki elements) would need a large tensor
    assert x.numel() > 2 * chunk and x.numel() % chunk
    monkeypatch.setattr(tempo_gelu_module, "_REFERENCE_CHUNK", chunk)
    chunked = tempo_gelu_module._backward_reference(dy, y, packed, "tanh")
    monkeypatch.setattr(tempo_gelu_module, "_REFERENCE_CHUNK", x.numel())
    assert torch.equal(chunked, tempo_gelu_module._backward_reference(dy, y, packed, "tanh"))


@pytest.mark.skipif(not triton_runs_on("cpu"), reason="Triton kernels need TRITON_INTERPRET=1")
@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_gelu_triton_kernels_equal_the_reference(approximate):
    from fxopt.kernels.tempo import gelu_triton

    x = 3 * torch.randn(5, 211, generator=torch.Generator().manual_seed(2))
    y, packed = gelu_triton.forward(x, approximate)
    y_ref, packed_ref = tempo_gelu_module._forward_reference(x, approximate)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(packed, packed_ref)
    dy = torch.randn_like(x)
    torch.testing.assert_close(gelu_triton.backward(dy, y_ref, packed_ref, approximate),
                               tempo_gelu_module._backward_reference(dy, y_ref, packed_ref,
                                                                     approximate),
                               rtol=1e-5, atol=1e-6)


def _norm_inputs(dtype, n=37, zeros=(3, 20)):
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, n, generator=generator).to(dtype).requires_grad_()
    weight = 1 + 0.3 * torch.randn(n, generator=generator)
    weight[list(zeros)] = 0.0  # gamma at zero: the guard keeps these columns exactly
    bias = (0.3 * torch.randn(n, generator=generator)).requires_grad_()
    return x, weight.requires_grad_(), bias


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_matches_eager_with_zeros_in_gamma(dtype):
    """bf16 autocast: y is bf16, so x_hat rebuilt from it carries bf16's rounding (4e-3,
    times up to 1 + the guard's amplification bound 2) into every gradient, fp32 ones
    (dgamma, a sum over 15 rows) included: an absolute tolerance of 5e-2 there."""
    x, weight, bias = _norm_inputs(dtype)
    assert guard_capacity(37) == 2
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        expected = F.layer_norm(x, (37,), weight, bias, 1e-5)
    y = tempo_layer_norm(x, 37, weight, bias, 1e-5, expected.dtype)[0]
    _assert_close(y, expected)
    for grad, expected_grad in zip(_grads(y, (x, weight, bias)),
                                   _grads(expected, (x, weight, bias))):
        _assert_close(grad, expected_grad,
                      TOLERANCES[dtype] if dtype == torch.float32 else (1.6e-2, 5e-2))


@pytest.mark.parametrize("round_before_weight", [False, True])
def test_rms_norm_matches_eager_with_zeros_in_gamma(round_before_weight):
    x, weight, _ = _norm_inputs(torch.float32, zeros=(0, 36))
    expected = F.rms_norm(x, (37,), weight, 1e-6)
    y = tempo_rms_norm(x, 37, weight, 1e-6, round_before_weight, torch.float32)[0]
    _assert_close(y, expected)
    for grad, expected_grad in zip(_grads(y, (x, weight)), _grads(expected, (x, weight))):
        _assert_close(grad, expected_grad)


# x_hat rebuilt from y rounded to bf16 (u = 2**-8; RMSNorm has no beta, so no |beta / gamma|
# amplification): dgamma's terms dy * x_hat are off by u, dx's x_hat * mean(g * x_hat) by
# 2u (x_hat twice); sums of them, so relative to each gradient's largest element
RMS_CAST_BOUND = 2 * 2 ** -8


@pytest.mark.parametrize("form", ["custom_op", "fusible"])
@pytest.mark.parametrize("round_before_weight", [False, True])
def test_rms_norm_cast_matches_eager_under_autocast(form, round_before_weight):
    """``fxopt::tempo_rms_norm_cast`` (and its aten-only form) at an odd shape, with zeros in
    gamma: y in fp32 and its bf16 cast equal eager's fp32 RMSNorm and the cast autocast's
    Linears make; the gradients from both outputs within RMS_CAST_BOUND of eager's, which
    adds the cast's bf16 gradient (converted to fp32) to the fp32 output's."""
    x, weight, _ = _norm_inputs(torch.float32, zeros=(0, 36))
    expected = F.rms_norm(x, (37,), weight, 1e-6)
    if round_before_weight:  # Llama's formula: x_hat rounded to x's dtype, fp32 here
        expected = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    args = (x, 37, weight, 1e-6, round_before_weight, torch.float32, torch.bfloat16)
    if form == "custom_op":
        y, y_kept = tempo_rms_norm_cast(*args)[:2]
    else:
        y, y_kept = fusible.fusible_rms_norm_cast(*args)
    _assert_close(y, expected)
    assert y_kept.dtype == torch.bfloat16 and torch.equal(y_kept, expected.bfloat16())
    generator = torch.Generator().manual_seed(6)
    dy, dy_kept = torch.randn(x.shape, generator=generator), torch.randn(x.shape,
                                                                        generator=generator)
    grads = torch.autograd.grad((y * dy).sum() + (y_kept.float() * dy_kept).sum(), (x, weight))
    want = torch.autograd.grad(
        (expected * dy).sum() + (expected.bfloat16().float() * dy_kept).sum(), (x, weight))
    for got, eager in zip(grads, want):
        assert (got - eager).abs().max() <= RMS_CAST_BOUND * eager.abs().max()


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_too_many_zeros_in_gamma_give_nan_gradients_without_a_host_sync(op):
    """More unsafe columns than the guard holds: x is not recoverable, so dx and dgamma are
    NaN (never silently wrong) and dbeta stays exact; decided on the device, so the step
    calls nothing that waits for the host."""
    from fxopt.analysis.host_sync import HostSyncRecorder

    x, weight, bias = _norm_inputs(torch.float32, zeros=(1, 2, 3))
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    with HostSyncRecorder() as recorder:
        if op == "layer_norm":
            y = tempo_layer_norm(x, 37, weight, bias, 1e-5, torch.float32)[0]
        else:
            y = tempo_rms_norm(x, 37, weight, 1e-6, False, torch.float32)[0]
        (y * dy).sum().backward()
    assert recorder.calls == []
    expected = (F.layer_norm(x, (37,), weight, bias, 1e-5) if op == "layer_norm"
                else F.rms_norm(x, (37,), weight, 1e-6))
    _assert_close(y, expected)  # the forward is exact
    assert x.grad.isnan().all() and weight.grad.isnan().all()
    if op == "layer_norm":
        _assert_close(bias.grad, dy.sum((0, 1)))


def _attention(scores, v, p):
    return F.dropout(scores.softmax(-1), p, training=True) @ v


@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16_autocast"])
def test_attention_matches_eager_given_the_same_mask(p, autocast):
    """Same seed, same mask: the op draws its mask through F.dropout as eager does; the
    gradients (which use the saved 1-bit mask) then equal eager's."""
    generator = torch.Generator().manual_seed(4)
    scores = torch.randn(2, 3, 13, 13, generator=generator).requires_grad_()
    v = torch.randn(2, 3, 13, 5, generator=generator).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        torch.manual_seed(5)
        expected = _attention(scores, v, p)
        torch.manual_seed(5)
        out, s, packed = tempo_softmax_dropout_matmul(scores, v, -1, p, torch.float32,
                                                      torch.float32, expected.dtype)
    _assert_close(out, expected)
    if p:
        torch.manual_seed(5)
        eager_mask = F.dropout(scores.detach().softmax(-1), p, training=True) != 0
        assert torch.equal(unpack_bits(packed, s.shape), eager_mask)
        assert not eager_mask.all()
    else:
        assert packed.numel() == 0
    for grad, expected_grad in zip(_grads(out, (scores, v)), _grads(expected, (scores, v))):
        _assert_close(grad, expected_grad)


def test_every_tempo_forward_op_is_recomputable():
    """A budget's plan may run a tempo op again in the backward (a pure function of its
    inputs): the cast forms were left out of the planner's list, so a chain stopped at
    them and kept their outputs."""
    from fxopt.planner.joint import RECOMPUTABLE_CUSTOM_OPS

    forwards = {f"fxopt::{name}" for name in dir(torch.ops.fxopt)
                if name.startswith("tempo_") and not name.endswith("_backward")}
    assert {"fxopt::tempo_layer_norm_cast", "fxopt::tempo_rms_norm_cast"} <= forwards
    assert forwards <= RECOMPUTABLE_CUSTOM_OPS
