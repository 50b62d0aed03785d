"""Tempo's aten-only forms (``fxopt.kernels.tempo.fusible``, what the pass inserts under
``codegen="inductor"``), run eagerly: the same mask layout as the custom ops', GELU's
gradient equal to the CPU reference's, the norms' rebuilt x_hat equal to theirs, and their
zero-gamma guard decided on the device."""

import pytest
import torch
import torch.nn.functional as F

from fxopt.analysis.host_sync import HostSyncRecorder
from fxopt.kernels.tempo import fusible, norm
from fxopt.kernels.tempo import gelu as tempo_gelu_module
from fxopt.kernels.tempo.bitmask import pack_bits


@pytest.mark.parametrize("numel", [1, 8, 13, 67])
def test_fusible_packing_has_the_custom_ops_layout(numel):
    mask = torch.rand(numel, generator=torch.Generator().manual_seed(numel)) > 0.5
    packed = fusible.pack_bits_fusible(mask)
    assert torch.equal(packed, pack_bits(mask))
    assert torch.equal(fusible.unpack_bits_fusible(packed, mask.shape), mask)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_fusible_gelu_gradient_equals_the_reference(approximate):
    x = (torch.linspace(-9, 9, 997) + 0.01).view(-1, 1).requires_grad_()
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
    form = fusible.fusible_form(torch.ops.fxopt.tempo_gelu.default, (x, approximate))
    (y,) = form(x, approximate)
    y.backward(dy)
    # the CPU reference, not the op: under TRITON_INTERPRET=1 the op runs its Triton kernel
    expected_y, packed = tempo_gelu_module._forward_reference(x.detach(), approximate)
    expected = tempo_gelu_module._backward_reference(dy, expected_y, packed, approximate)
    torch.testing.assert_close(y, expected_y, rtol=0, atol=0)
    # The same table and interpolation, but value + slope * position is rounded twice
    # where the reference's addcmul rounds once: the derivatives (at most 1.13) may differ
    # by an ulp at 1.13 (2.4e-7), times |dy| (below 5 here): under 2e-6.
    assert dy.abs().max() < 5
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=2e-6)


@pytest.mark.parametrize("code_generator", ["cpp", "triton"])
def test_fusible_norm_xhat_equals_the_custom_ops(code_generator):
    """Both forms (the one-hot sum Inductor's C++ runs, the slot gather its Triton runs)."""
    from torch._inductor import config as inductor_config

    generator = torch.Generator().manual_seed(2)
    y = torch.randn(5, 37, generator=generator)
    weight, bias = torch.randn(37, generator=generator), torch.randn(37, generator=generator)
    weight[3] = 0.0
    guard = torch.tensor([3, 20])
    guard_xhat = torch.randn(5, 2, generator=generator)
    expected = norm._xhat_from_output(y, weight, bias, guard_xhat, guard)
    with inductor_config.patch(cpu_backend=code_generator):
        actual = fusible._xhat_from_output(y, weight, bias, guard_xhat, guard)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_fusible_norm_with_too_many_zeros_in_gamma_gives_nan_without_a_host_sync(op):
    """The custom ops' contract (tests/kernels/tempo/test_tempo_ops.py) in the aten-only
    form: three zero columns where the guard holds two, so dx and dgamma are NaN, dbeta
    exact, decided on the device (nothing waits for the host)."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, 37, generator=generator).requires_grad_()
    weight = 1 + 0.3 * torch.randn(37, generator=generator)
    weight[[1, 2, 3]] = 0.0
    weight.requires_grad_()
    bias = (0.3 * torch.randn(37, generator=generator)).requires_grad_()
    dy = torch.randn(x.shape, generator=generator)
    assert norm.guard_capacity(37) == 2
    with HostSyncRecorder() as recorder:
        if op == "layer_norm":
            (y,) = fusible.fusible_layer_norm(x, 37, weight, bias, 1e-5, torch.float32)
        else:
            (y,) = fusible.fusible_rms_norm(x, 37, weight, 1e-6, False, torch.float32)
        (y * dy).sum().backward()
    assert recorder.calls == []
    expected = (F.layer_norm(x, (37,), weight, bias, 1e-5) if op == "layer_norm"
                else F.rms_norm(x, (37,), weight, 1e-6))
    torch.testing.assert_close(y, expected)  # the forward is exact
    assert x.grad.isnan().all() and weight.grad.isnan().all()
    if op == "layer_norm":
        torch.testing.assert_close(bias.grad, dy.sum((0, 1)))
