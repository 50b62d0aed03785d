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
- With a ``softcap`` (Gemma 2's final-logit soft-capping), both read the logits as
  ``softcap * tanh(z / softcap)`` and the gradient is times ``1 - tanh(z / softcap)**2``.

Both read ``z`` in its dtype and compute in fp32. Given a ``span`` (the padded product's
width: the ops' logits are a column prefix of a product whose rows are padded to 16 bytes on
CUDA), they read each row up to it and the dlogits kernel writes the padding's gradient as
zeros: a row then starts and ends on a 16-byte boundary, and the compiler issues 128-bit
loads and stores where an odd vocabulary (GPT-2's 50257 columns) would otherwise cut every
access to one element (``tests/kernels/test_fuse_linear_cross_entropy_kernels.py`` compiles
them for sm_80/sm_90 at that vocabulary). The row strides and the span come divided by
``ALIGN``, the power of two that divides them (up to 16 bytes' worth of elements), so that
the compiler sees multiples of it. The torch references they must equal are
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
def _tanh(x):
    """tanh from one exponential: exact limits (exp overflows to inf: 1; underflows: -1),
    and near 0 an absolute error of fp32's epsilon, which the soft-cap's scale (30 for
    Gemma 2) multiplies into a logit's absolute error of about 4e-6."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _lse_block_kernel(z_ptr, z_stride_aligns, labels_ptr, m_ptr, s_ptr, sumz_ptr, target_ptr,
                      cols, span_aligns, v0, softcap, SMOOTH: tl.constexpr,
                      SOFTCAP: tl.constexpr, ALIGN: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    z_row = z_ptr + row.to(tl.int64) * (z_stride_aligns * ALIGN)
    span = span_aligns * ALIGN
    label = tl.load(labels_ptr + row) - v0
    m_run = tl.load(m_ptr + row)
    s_run = tl.load(s_ptr + row)
    sum_z = tl.load(sumz_ptr + row)
    target = tl.load(target_ptr + row)
    for start in range(0, span, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        inside = offsets < cols
        z = tl.load(z_row + offsets, mask=offsets < span, other=0.0).to(tl.float32)
        if SOFTCAP:
            z = softcap * _tanh(z / softcap)
        z = tl.where(inside, z, float("-inf"))  # the padding's values, whatever they are
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
def _dlogits_block_kernel(z_ptr, z_stride_aligns, p_ptr, p_stride_aligns, labels_ptr, lse_ptr,
                          scale_ptr, cols, span_aligns, v0, smooth_each, hit, softcap,
                          SOFTCAP: tl.constexpr, ALIGN: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    spanned = offsets < span_aligns * ALIGN
    z = tl.load(z_ptr + row * (z_stride_aligns * ALIGN) + offsets, mask=spanned,
                other=0.0).to(tl.float32)
    if SOFTCAP:
        tanh = _tanh(z / softcap)
        z = softcap * tanh
    p = tl.exp(z - tl.load(lse_ptr + row)) - smooth_each
    p = tl.where(offsets == tl.load(labels_ptr + row) - v0, p - hit, p) * tl.load(scale_ptr + row)
    if SOFTCAP:
        p = p * (1.0 - tanh * tanh)  # the soft-cap's slope
    p = tl.where(offsets < cols, p, 0.0)  # the padding's gradient: zero
    tl.store(p_ptr + row * (p_stride_aligns * ALIGN) + offsets, p.to(p_ptr.dtype.element_ty),
             mask=spanned)


def _align(itemsize: int, *counts: int) -> int:
    """The largest power of two that divides every one of ``counts`` (row strides in
    elements, the span), up to 16 bytes' worth of elements: the vector width the compiler
    may then use for a row's loads and stores."""
    align = 16 // itemsize
    while align > 1 and any(c % align for c in counts):
        align //= 2
    return align


def _span(z: torch.Tensor, span: int | None) -> int:
    cols = z.shape[1]
    if span is None:
        return cols
    if span < cols or span > z.stride(0) or z.stride(1) != 1:
        raise ValueError(f"fxopt: a span of {span} columns does not fit rows of {cols} "
                         f"columns at a stride of {z.stride(0)}")
    return span


def lse_block(z: torch.Tensor, labels: torch.Tensor, v0: int, m: torch.Tensor,
              s: torch.Tensor, sum_z: torch.Tensor, target: torch.Tensor,
              smooth: bool, span: int | None = None, softcap: float = 0.0) -> None:
    """Fold ``z`` (columns ``v0:v0 + z.shape[1]`` of the logits, soft-capped where
    ``softcap`` is not 0) into the running state. ``span``: how many columns of each row
    may be read (the padded product's width, whose columns past ``z``'s are padding; None:
    ``z``'s own), so that the rows are read in aligned vectors up to an aligned end."""
    rows, cols = z.shape
    if rows == 0:
        return
    span = _span(z, span)
    align = _align(z.element_size(), z.stride(0), span)
    _lse_block_kernel[(rows,)](z, z.stride(0) // align, labels, m, s, sum_z, target, cols,
                               span // align, v0, float(softcap), SMOOTH=smooth,
                               SOFTCAP=bool(softcap), ALIGN=align,
                               BLOCK=min(BLOCK, triton.next_power_of_2(span)))


def dlogits_block(z: torch.Tensor, out: torch.Tensor, labels: torch.Tensor, v0: int,
                  lse: torch.Tensor, label_smoothing: float, vocab: int,
                  row_scale: torch.Tensor, span: int | None = None, softcap: float = 0.0
                  ) -> None:
    """Write the logit gradients of block ``z``, times each row's scale, into ``out`` (in
    its dtype: fp32, or the compute dtype the matmuls take; may be ``z``). ``span``: as
    :func:`lse_block`'s, and ``out``'s columns past ``z``'s up to it are written with
    zeros (``out``'s rows must have them: its padding too). ``softcap``: as
    :func:`lse_block`'s, the gradient then times the soft-cap's slope."""
    rows, cols = z.shape
    if rows == 0:
        return
    span = _span(z, span)
    if span != cols:
        _span(out, span)
    align = _align(z.element_size(), z.stride(0), out.stride(0), span)
    block = min(BLOCK, triton.next_power_of_2(span))
    _dlogits_block_kernel[(rows, triton.cdiv(span, block))](
        z, z.stride(0) // align, out, out.stride(0) // align, labels, lse, row_scale, cols,
        span // align, v0, label_smoothing / vocab, 1.0 - label_smoothing, float(softcap),
        SOFTCAP=bool(softcap), ALIGN=align, BLOCK=block)
