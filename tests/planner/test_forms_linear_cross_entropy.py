"""fxopt.planner.forms.linear_cross_entropy_work: the two forms' counts, exactly."""

import pytest

from fxopt.planner import forms

N, H, V = 100, 10, 1000
GEMM = 2 * N * H * V


def test_recompute_runs_four_matmuls_and_accumulates_hs_gradient_per_block():
    work = forms.linear_cross_entropy_work("recompute", N, H, V, 5, 4)
    assert work.gemm_flops == {"float32": 4 * GEMM}
    # logits written and read twice, the gradient read and written once, fp32; dh read and
    # written in place by each of the 5 blocks' fp32 GEMMs
    assert work.bytes == 2 * 2 * 4 * N * V + 2 * 4 * N * V + 5 * N * H * 8
    assert work.launches == {"compiled": 40}


def test_with_grads_runs_three_and_accumulates_ws_gradient_per_chunk():
    work = forms.linear_cross_entropy_work("with_grads", N, H, V, 3, 2)
    assert work.gemm_flops == {"bfloat16": 3 * GEMM}  # 1000 x 2 bytes: rows 16-byte aligned
    # a half GEMM's fp32 output is written, then added: 16 bytes an entry of W's gradient
    assert work.bytes == 2 * 2 * N * V + 2 * 2 * N * V + 3 * V * H * 16


def test_wanted_gradients_and_alignment():
    frozen = forms.linear_cross_entropy_work("with_grads", N, H, V, 3, 4, grad_weight=False)
    assert frozen.gemm_flops == {"float32": 2 * GEMM}
    assert frozen.bytes == 2 * 4 * N * V + 2 * 4 * N * V  # nothing accumulated
    no_backward = forms.linear_cross_entropy_work("recompute", N, H, V, 5, 4, grad_h=False,
                                                  grad_weight=False)
    assert no_backward.gemm_flops == {"float32": GEMM}
    odd = forms.linear_cross_entropy_work("recompute", N, H, 50257, 5, 2)
    assert list(odd.gemm_flops) == ["bfloat16_unaligned"]
    with pytest.raises(ValueError, match="form 'chunked'"):
        forms.linear_cross_entropy_work("chunked", N, H, V, 5, 4)
