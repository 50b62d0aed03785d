"""Triton kernels of ``fxopt::linear_cross_entropy``: the row reductions and pointwise math
of one vocabulary block of logits; the matmuls around them stay cuBLAS (torch).

- :func:`lse_block` folds one block of logits ``z`` (tokens x block columns) into each
  token's running log-sum-exp state (running max ``m`` and sum ``s`` of ``exp(z - m)``), its
  running sum of logits (label smoothing's term) and its target logit, in place: one
  program per token, looping over the block's columns.
- :func:`dlogits_block` writes the block's logit gradients ``softmax - (1 - eps) onehot -
  eps / V`` times each token's scale, in the output's dtype (the compute dtype the
  gradient matmuls take: one write of 2 bytes an entry under bf16): one program per
  (token, column tile).

Both read ``z`` in its dtype and compute in fp32. The torch references they must equal are
:func:`fxopt.kernels.fuse_linear_cross_entropy.lse_block_reference` and
:func:`~fxopt.kernels.fuse_linear_cross_entropy.dlogits_block_reference`. Imported only where
Triton runs (see ``fxopt.kernels.triton_runs_on``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["BLOCK", "dlogits_block", "lse_block"]

BLOCK = 1024  # columns per loop iteration (lse) or per program (dlogits)


@triton.jit
def _lse_block_kernel(z_ptr, z_stride, labels_ptr, m_ptr, s_ptr, sumz_ptr, target_ptr,
                      cols, v0, SMOOTH: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    z_row = z_ptr + row.to(tl.int64) * z_stride
    label = tl.load(labels_ptr + row) - v0
    m_run = tl.load(m_ptr + row)
    s_run = tl.load(s_ptr + row)
    sum_z = tl.load(sumz_ptr + row)
    target = tl.load(target_ptr + row)
    for start in range(0, cols, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        inside = offsets < cols
        z = tl.load(z_row + offsets, mask=inside, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m_run, tl.max(z, 0))
        s_run = s_run * tl.exp(m_run - m_new) + tl.sum(tl.exp(z - m_new), 0)
        m_run = m_new
        if SMOOTH:
            sum_z += tl.sum(tl.where(inside, z, 0.0), 0)
        target += tl.sum(tl.where(inside & (offsets == label), z, 0.0), 0)
    tl.store(m_ptr + row, m_run)
    tl.store(s_ptr + row, s_run)
    tl.store(sumz_ptr + row, sum_z)
    tl.store(target_ptr + row, target)


@triton.jit
def _dlogits_block_kernel(z_ptr, z_stride, p_ptr, p_stride, labels_ptr, lse_ptr, scale_ptr,
                          cols, v0, smooth_each, hit, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < cols
    z = tl.load(z_ptr + row.to(tl.int64) * z_stride + offsets, mask=inside,
                other=0.0).to(tl.float32)
    p = tl.exp(z - tl.load(lse_ptr + row)) - smooth_each
    p = tl.where(offsets == tl.load(labels_ptr + row) - v0, p - hit, p) * tl.load(scale_ptr + row)
    tl.store(p_ptr + row.to(tl.int64) * p_stride + offsets, p.to(p_ptr.dtype.element_ty),
             mask=inside)


def lse_block(z: torch.Tensor, labels: torch.Tensor, v0: int, m: torch.Tensor,
              s: torch.Tensor, sum_z: torch.Tensor, target: torch.Tensor,
              smooth: bool) -> None:
    """Fold ``z`` (columns ``v0:v0 + z.shape[1]`` of the logits) into the running state."""
    rows, cols = z.shape
    if rows == 0:
        return
    _lse_block_kernel[(rows,)](z, z.stride(0), labels, m, s, sum_z, target, cols, v0,
                               SMOOTH=smooth, BLOCK=min(BLOCK, triton.next_power_of_2(cols)))


def dlogits_block(z: torch.Tensor, out: torch.Tensor, labels: torch.Tensor, v0: int,
                  lse: torch.Tensor, label_smoothing: float, vocab: int,
                  row_scale: torch.Tensor) -> None:
    """Write the logit gradients of block ``z``, times each row's scale, into ``out`` (in
    its dtype: fp32, or the compute dtype the matmuls take; may be ``z``)."""
    rows, cols = z.shape
    if rows == 0:
        return
    block = min(BLOCK, triton.next_power_of_2(cols))
    _dlogits_block_kernel[(rows, triton.cdiv(cols, block))](
        z, z.stride(0), out, out.stride(0), labels, lse, row_scale, cols, v0,
        label_smoothing / vocab,
        1.0 - label_smoothing, BLOCK=block)
