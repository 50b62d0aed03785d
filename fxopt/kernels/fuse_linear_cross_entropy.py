"""``fxopt::linear_cross_entropy``: ``cross_entropy(h @ W.T + b, labels)`` that never stores
the logits.

A causal LM's head and loss set its peak: plain autograd keeps the (tokens x vocabulary)
fp32 log-probabilities for backward, and the backward makes a gradient of the same size.
This op walks the vocabulary in blocks of columns instead (the design of Apple's Cut
Cross-Entropy; Liger-Kernel's fused linear cross-entropy chunks over tokens):

- **forward**: per block, the block's logits ``h @ W[v0:v1].T (+ b[v0:v1])`` in the compute
  dtype (autocast's: the Linear's), upcast to fp32 and folded into each token's running
  log-sum-exp, its target logit and (label smoothing) its sum of logits; then the loss.
  It keeps the per-token log-sum-exp (``tokens`` fp32) and its inputs.
- **backward** (``fxopt::linear_cross_entropy_backward``): per block, the logits again,
  ``dz = softmax - (1 - eps) onehot - eps / V`` in fp32, times each token's scale ``s``
  (the incoming gradient, over the token count for ``mean``, zero for ``ignore_index``
  tokens) and rounded to the compute dtype, as autocast's cast backward rounds eager's;
  then ``dW[v0:v1] = dz.T @ h`` (complete in one matmul), ``db[v0:v1]`` its column sums
  and ``dh += dz @ W[v0:v1]``, the matmuls on compute-dtype operands with fp32 results
  (:func:`mm_fp32`: tensor cores on CUDA). A gradient whose input needs none is not
  computed.

**Soft-capped logits** (``softcap`` not 0; Gemma 2's ``final_logit_softcapping``): each
block's logits become ``softcap * tanh(z / softcap)`` in fp32 before they are folded or
differentiated, and the gradient is times the cap's slope ``1 - tanh(z / softcap)**2``: the
cap costs one tanh per logit each way and keeps nothing more. Eager applies the cap in the
logits' dtype (three bf16 roundings under autocast), the op in fp32.

This form runs four (tokens x hidden x vocabulary) matmuls where plain autograd runs three,
and keeps only ``tokens`` floats beside the inputs the Linear kept anyway. Its sibling
:mod:`fxopt.kernels.fuse_linear_cross_entropy_with_grads` computes the gradients in the
forward (three matmuls) and keeps them instead: W's gradient, hidden / tokens of the
logits' bytes. The pass picks between them (its module doc).

**Block size** (:func:`block_columns`): one block's temporaries at most 1/64 of the logits'
fp32 bytes (:func:`temporary_bytes`: on CUDA its logits in the compute dtype, overwritten
in place by the Triton kernels with their gradient; the torch path adds an fp32 copy where
the compute dtype is narrower), but at least :data:`MIN_BLOCK_COLUMNS` columns (matmuls
narrower than that run far below peak); the ``block_bytes`` argument overrides the byte
bound. The bound is relative only: each block adds to h's fp32 gradient, so on a GPU an
absolute cap (32 MiB before) multiplied that traffic at large heads (126 blocks for Llama
3's at 8192 tokens, a predicted 12.6 ms on an H100; 32 blocks now). On CUDA
:mod:`fxopt.passes.fuse_linear_cross_entropy_chunks` sets ``block_bytes`` from the step's
predicted peak and the budget (:func:`block_count`, :func:`block_bytes_for`).

**Aligned logits** (:func:`row_alignment`, :func:`padded_rows`): on CUDA every matmul that
reads or writes logits gets a row stride that is a multiple of 16 bytes, W's rows padded with
zeros where the vocabulary (or a block) is not such a multiple, the logits a view of the
padded product. cuBLAS runs an odd row stride (GPT-2's 50257) on pre-Hopper align1
kernels: the head's three GEMMs took 15.6 ms eagerly on an H200 against 2.6 ms at 50264
(benchmarks/results/gpu_check_h200_2026-11-27.md, the GEMM rows). The padded rows' logits
are never read.

On CUDA, the per-block reductions and pointwise math run in Triton
(:mod:`fxopt.kernels.fuse_linear_cross_entropy_triton`); elsewhere their torch references below.
Loss and gradients equal ``F.cross_entropy(F.linear(h, W, b), labels, ...)``'s to fp32
rounding (the sums run in another order); under autocast, to the compute dtype's rounding (the
logits' gradient is rounded as eager rounds it, but not from the same fp32 values).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from fxopt import _compat
from fxopt.kernels import triton_runs_on

__all__ = ["EXP_FLOOR", "MIN_BLOCK_COLUMNS", "add_mm_fp32", "block_bytes_for", "block_columns",
           "block_count", "check_arguments", "dlogits_block_reference", "fused_fp32_accumulate",
           "linear_cross_entropy", "linear_cross_entropy_backward", "logit_bytes",
           "lse_block_reference", "mm_fp32", "padded_kernels", "padded_rows", "reference",
           "refuse_double_backward", "row_alignment", "softcap_tanh", "softcapped_",
           "subtract_targets_", "temporary_bytes", "times_softcap_slope_", "token_scales",
           "triton_kernels", "uses_triton", "uses_triton_on"]

BLOCK_FRACTION = 64
MIN_BLOCK_COLUMNS = 128
REDUCTIONS = ("mean", "sum")
log = logging.getLogger(__name__)
# The torch references clamp exponents here before ``exp_``: exp(-87) is fp32's smallest
# normal number or above (FLT_MIN = exp(-87.34)), so no exponential is subnormal. On the
# CPU ATen's ``exp_`` of an input whose result is subnormal or underflows takes a slow path,
# many times the normal cost per element (measured in
# benchmarks/results/fuse_linear_cross_entropy_step_cpu.md), and a confident model's softmax
# is mostly such entries. Harmless: an entry whose true
# value is below exp(-87) ~ 1.6e-38 becomes 1.6e-38, off by less than that, beside a
# per-token sum of at least 1 (forward) or a softmax row summing to 1 (backward).
EXP_FLOOR = -87.0


def block_columns(tokens: int, vocab: int, block_bytes: int = 0, logit_bytes: int = 4) -> int:
    """Columns per vocabulary block (module doc): the block's temporaries, ``logit_bytes`` a
    logit, at most 1/:data:`BLOCK_FRACTION` of the logits' fp32 bytes; ``block_bytes`` > 0
    bounds them instead."""
    rows = max(tokens, 1)
    bound = block_bytes or 4 * rows * vocab // BLOCK_FRACTION
    return max(1, min(vocab, max(bound // (logit_bytes * rows), MIN_BLOCK_COLUMNS)))


def temporary_bytes(itemsize: int, triton: bool) -> int:
    """A block's (or chunk's) temporaries per logit: its logits in the compute dtype,
    overwritten in place by the Triton kernels; the torch path adds an fp32 copy where the
    compute dtype is narrower."""
    return itemsize if triton or itemsize == 4 else itemsize + 4


def logit_bytes(compute_dtype: torch.dtype, device: torch.device) -> int:
    """:func:`temporary_bytes` of the ops' path on ``device`` (Triton on CUDA)."""
    return temporary_bytes(compute_dtype.itemsize, uses_triton_on(device))


def row_alignment(device: torch.device, itemsize: int) -> int:
    """Elements per 16 bytes on CUDA, where cuBLAS's fast kernels want row strides of that
    multiple (module doc); 1 elsewhere (the CPU's BLAS is indifferent, and padding would
    only copy)."""
    return 16 // itemsize if device.type == "cuda" else 1


def padded_rows(weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
                align: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``weight`` (and ``bias``) in ``dtype`` with zero rows appended up to a multiple of
    ``align`` rows: the product with them has logits rows of an aligned stride, the real
    ones its first ``weight.shape[0]`` columns. No copy beyond the cast where the rows are
    already a multiple."""
    rows = weight.shape[0]
    padded = -(-rows // align) * align
    if padded == rows:
        return weight.to(dtype), None if bias is None else bias.to(dtype)
    w = weight.new_zeros((padded, weight.shape[1]), dtype=dtype)
    w[:rows] = weight
    b = None
    if bias is not None:
        b = bias.new_zeros((padded,), dtype=dtype)
        b[:rows] = bias
    return w, b


def uses_triton(t: torch.Tensor) -> bool:
    """Whether the per-block math runs in Triton (:mod:`.fuse_linear_cross_entropy_triton`)."""
    return uses_triton_on(t.device)


def uses_triton_on(device: torch.device) -> bool:
    """:func:`uses_triton` for the tensors of ``device``."""
    return device.type == "cuda" and triton_runs_on(device)


# ---------------------------------------------------------------- per-block references

def softcapped_(z: torch.Tensor, softcap: float) -> torch.Tensor:
    """``softcap * tanh(z / softcap)`` in place (Gemma 2's final-logit soft-capping) for an
    fp32 ``z``; ``z`` as it is where ``softcap`` is 0 (none)."""
    return z.div_(softcap).tanh_().mul_(softcap) if softcap else z


def softcap_tanh(z: torch.Tensor, softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(``softcap * tanh(z / softcap)``, ``tanh(z / softcap)``) in fp32, tensors of their own
    whatever ``z``'s dtype: the capped logits, and what the gradient's slope is taken from
    (:func:`times_softcap_slope_`)."""
    tanh = z.float().div(softcap).tanh_()
    return tanh * softcap, tanh


def times_softcap_slope_(grad: torch.Tensor, tanh: torch.Tensor) -> None:
    """``grad *= 1 - tanh**2`` in place, the soft-cap's slope (``tanh`` is consumed)."""
    grad.mul_(tanh.square_().neg_().add_(1.0))


def lse_block_reference(z: torch.Tensor, labels: torch.Tensor, v0: int, m: torch.Tensor,
                        s: torch.Tensor, sum_z: torch.Tensor, target: torch.Tensor,
                        smooth: bool, softcap: float = 0.0) -> None:
    """Fold the block ``z`` (columns ``v0:v0 + z.shape[1]``), soft-capped where ``softcap``
    is not 0 (:func:`softcapped_`), into the running state, in place: max ``m``,
    ``s = sum exp(z - m)``, the sum of logits, the target logit. An fp32 ``z`` is
    overwritten (with its exponentials: no second block is allocated)."""
    z = softcapped_(z.float(), softcap)
    cols = z.shape[1]
    local = labels - v0
    inside = (local >= 0) & (local < cols)
    picked = z.gather(1, local.clamp(0, cols - 1).unsqueeze(1)).squeeze(1)
    target.add_(torch.where(inside, picked, 0.0))
    if smooth:
        sum_z.add_(z.sum(1))
    m_new = torch.maximum(m, z.amax(1))
    s.mul_((m - m_new).clamp_(min=EXP_FLOOR).exp_()).add_(
        z.sub_(m_new.unsqueeze(1)).clamp_(min=EXP_FLOOR).exp_().sum(1))
    m.copy_(m_new)


def dlogits_block_reference(z: torch.Tensor, out: torch.Tensor, labels: torch.Tensor, v0: int,
                            lse: torch.Tensor, label_smoothing: float, vocab: int,
                            row_scale: torch.Tensor, softcap: float = 0.0) -> None:
    """``out = (softmax - (1 - eps) onehot - eps / V) x row_scale`` for block ``z``, in
    ``out``'s dtype (``out`` may be ``z``; computed in fp32). Soft-capped logits
    (``softcap``): the softmax of ``softcap * tanh(z / softcap)``, and the gradient times
    that function's slope, ``1 - tanh(z / softcap)**2``."""
    if softcap:
        capped, tanh = softcap_tanh(z, softcap)
        p = capped.sub_(lse.unsqueeze(1)).clamp_(min=EXP_FLOOR).exp_()
    else:
        buffer = out if out.dtype == torch.float32 else None
        p = torch.sub(z, lse.unsqueeze(1), out=buffer).float().clamp_(min=EXP_FLOOR).exp_()
    subtract_targets_(p, labels, v0, label_smoothing, vocab)
    p.mul_(row_scale.unsqueeze(1))
    if softcap:
        times_softcap_slope_(p, tanh)
    if p is not out:
        out.copy_(p)


def subtract_targets_(p: torch.Tensor, labels: torch.Tensor, v0: int, label_smoothing: float,
                      vocab: int, row_scale: torch.Tensor | None = None) -> None:
    """``p -= (1 - eps) onehot + eps / V`` in place, for the block of columns ``v0:v0 +
    p.shape[1]`` of the softmax ``p`` (fp32); with ``row_scale``, each row's two terms times
    its scale (``p`` already scaled): the cross-entropy's targets, shared by the references
    of both forms."""
    if label_smoothing:
        p.sub_(label_smoothing / vocab if row_scale is None else
               (row_scale * (label_smoothing / vocab)).unsqueeze(1))
    cols = p.shape[1]
    local = labels - v0
    inside = ((local >= 0) & (local < cols)).to(p.dtype)
    hit = inside * -(1.0 - label_smoothing)
    p.scatter_add_(1, local.clamp(0, cols - 1).unsqueeze(1),
                   (hit if row_scale is None else hit * row_scale).unsqueeze(1))


# ---------------------------------------------------------------- the chunked computation

def _block_logits(h_cd: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  v0: int, v1: int, compute_dtype: torch.dtype) -> torch.Tensor:
    """Columns ``v0:v1`` of the logits, computed as the Linear computes them, with a row
    stride of :func:`row_alignment` (a view of the padded product, whose columns past
    ``v1 - v0`` are padding: :func:`padded_kernels`)."""
    w, b = padded_rows(weight[v0:v1], None if bias is None else bias[v0:v1], compute_dtype,
                       row_alignment(h_cd.device, compute_dtype.itemsize))
    return F.linear(h_cd, w, b)[:, :v1 - v0]


def padded_kernels() -> tuple[Callable[..., None], Callable[..., None]]:
    """The Triton block kernels (``lse_block``, ``dlogits_block``) for logits that are a
    column prefix of their padded product (the ops' blocks and chunks): each row is read,
    and its gradient written, up to the product's width, so in aligned vectors (the
    padding's gradient is written as zeros)."""
    kernels = triton_kernels()

    def fold(z: torch.Tensor, *state: Any, softcap: float = 0.0) -> None:
        kernels.lse_block(z, *state, span=z.stride(0), softcap=softcap)

    def gradient(z: torch.Tensor, out: torch.Tensor, *args: Any, softcap: float = 0.0
                 ) -> None:
        kernels.dlogits_block(z, out, *args, span=z.stride(0), softcap=softcap)

    return fold, gradient


def _block_step(tokens: int, vocab: int, block_bytes: int, compute_dtype: torch.dtype,
                device: torch.device) -> int:
    """:func:`block_columns` for the op's dtype and device, a multiple of the row
    alignment: only the last block is padded."""
    step = block_columns(tokens, vocab, block_bytes, logit_bytes(compute_dtype, device))
    align = row_alignment(device, compute_dtype.itemsize)
    return min(vocab, -(-step // align) * align)


def block_count(tokens: int, vocab: int, block_bytes: int, compute_dtype: torch.dtype,
                device: torch.device) -> int:
    """The vocabulary blocks both ops walk for ``block_bytes`` (0: the default bound)."""
    return -(-vocab // _block_step(tokens, vocab, block_bytes, compute_dtype, device))


def block_bytes_for(blocks: int, tokens: int, vocab: int, compute_dtype: torch.dtype,
                    device: torch.device) -> int:
    """The ``block_bytes`` that cut the vocabulary into at most ``blocks`` blocks (fewer
    where :data:`MIN_BLOCK_COLUMNS` or the alignment widens them)."""
    columns = -(-vocab // max(blocks, 1))
    return columns * max(tokens, 1) * logit_bytes(compute_dtype, device)


def _forward(h, weight, bias, labels, ignore_index, label_smoothing, reduction,
             compute_dtype, out_dtype, block_bytes, softcap):
    tokens, vocab = h.shape[0], weight.shape[0]
    f32 = dict(device=h.device, dtype=torch.float32)
    m = torch.full((tokens,), float("-inf"), **f32)
    s, sum_z, target = (torch.zeros(tokens, **f32) for _ in range(3))
    fold = padded_kernels()[0] if uses_triton(h) else lse_block_reference
    h_cd = h.to(compute_dtype)
    step = _block_step(tokens, vocab, block_bytes, compute_dtype, h.device)
    for v0 in range(0, vocab, step):
        z = _block_logits(h_cd, weight, bias, v0, min(v0 + step, vocab), compute_dtype)
        fold(z, labels, v0, m, s, sum_z, target, bool(label_smoothing), softcap=softcap)
        del z
    lse = m + torch.log(s)
    per_token = (1.0 - label_smoothing) * (lse - target)
    if label_smoothing:
        per_token = per_token + label_smoothing * (lse - sum_z / vocab)
    valid = labels != ignore_index
    loss = torch.where(valid, per_token, 0.0).sum()
    if reduction == "mean":
        loss = loss / valid.sum()
    return loss.to(out_dtype), lse


def mm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of compute-dtype operands, accumulated and returned in fp32. Half operands
    run on CUDA as a tensor-core GEMM with an fp32 output (``out_dtype``, torch >= 2.8; an
    fp32 GEMM there is many times slower); elsewhere as an fp32 GEMM of the upcast operands,
    the same products (a half value is exact in fp32)."""
    if a.dtype == torch.float32:
        return a @ b
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()


def add_mm_fp32(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``out + a @ b`` for the fp32 accumulator ``out`` (:func:`mm_fp32`'s precision): in
    place where the GEMM can add to it (fp32 operands; half operands on CUDA where
    :func:`fused_fp32_accumulate` holds, as a new tensor), else the product then an add (a
    second pass over the accumulator). Callers keep the result."""
    if a.dtype == torch.float32:
        return out.addmm_(a, b)
    if not a.is_cuda:
        return out.addmm_(a.float(), b.float())
    if fused_fp32_accumulate(a.device):
        return torch.addmm(out, a, b, out_dtype=torch.float32)
    return out.add_(mm_fp32(a, b))


@functools.cache
def fused_fp32_accumulate(device: torch.device) -> bool:
    """Whether ``torch.addmm(fp32, half, half, out_dtype=torch.float32)`` runs here (torch's
    CUDA GEMMs take an fp32 ``self`` with half operands from pytorch/pytorch#167931, late
    2025): probed once per device on a small case and checked against the two-pass form."""
    try:
        with _compat.modes_suspended():  # the pass asks while Dynamo's fake mode traces
            a = torch.ones(16, 16, device=device, dtype=torch.bfloat16)
            acc = torch.full((16, 16), 0.5, device=device)
            return bool((torch.addmm(acc, a, a, out_dtype=torch.float32) == 16.5).all())
    except (RuntimeError, TypeError) as unsupported:
        log.debug("fxopt: addmm with out_dtype and an fp32 accumulator unsupported on %s "
                  "(%s): accumulating in two passes", device, unsupported)
        return False


def token_scales(labels: torch.Tensor, ignore_index: int, reduction: str,
                 grad: torch.Tensor | float = 1.0) -> torch.Tensor:
    """Per token, d loss / d (its cross-entropy): ``grad`` (over the counted tokens for
    ``mean``), zero for ``ignore_index`` tokens."""
    valid = labels != ignore_index
    scale = torch.as_tensor(grad, dtype=torch.float32, device=labels.device).reshape(())
    if reduction == "mean":
        scale = scale / valid.sum()
    return torch.where(valid, scale, 0.0)


def _backward(grad, h, weight, bias, labels, lse, ignore_index, label_smoothing, reduction,
              compute_dtype, block_bytes, wants, softcap):
    tokens, vocab = h.shape[0], weight.shape[0]
    want_h, want_w, want_b = wants
    row_scale = token_scales(labels, ignore_index, reduction, grad.float())
    gradient = padded_kernels()[1] if uses_triton(h) else dlogits_block_reference
    h_cd = h.to(compute_dtype)
    dh = torch.zeros(tokens, h.shape[1], device=h.device, dtype=torch.float32) if want_h \
        else None
    dw = torch.empty_like(weight) if want_w else None
    db = torch.empty_like(bias) if want_b else None
    step = _block_step(tokens, vocab, block_bytes, compute_dtype, h.device)
    for v0 in range(0, vocab, step):
        v1 = min(v0 + step, vocab)
        z = _block_logits(h_cd, weight, bias, v0, v1, compute_dtype)
        dz = z  # overwritten with its gradient, in the compute dtype the matmuls take
        gradient(z, dz, labels, v0, lse, label_smoothing, vocab, row_scale, softcap=softcap)
        del z
        if want_w:
            dw[v0:v1] = mm_fp32(dz.t(), h_cd)
        if want_b:
            db[v0:v1] = dz.float().sum(0)
        if want_h:
            dh = add_mm_fp32(dh, dz, weight[v0:v1].to(compute_dtype))
        del dz
    if want_h:
        dh = dh.to(h.dtype)
    return [g for g in (dh, dw, db) if g is not None]


def triton_kernels():
    """The Triton kernels' module, imported only where they run."""
    from fxopt.kernels import fuse_linear_cross_entropy_triton

    return fuse_linear_cross_entropy_triton


# ---------------------------------------------------------------- the ops

def check_arguments(h, weight, labels, reduction):
    """Raise a ValueError naming what is wrong with the ops' arguments."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"fxopt::linear_cross_entropy: reduction {reduction!r} is not one of "
                         f"{REDUCTIONS}")
    if h.dim() != 2 or weight.dim() != 2 or labels.dim() != 1 or h.shape[0] != labels.shape[0] \
            or h.shape[1] != weight.shape[1]:
        raise ValueError(f"fxopt::linear_cross_entropy: expected h (N, H), weight (V, H), "
                         f"labels (N,); got {tuple(h.shape)}, {tuple(weight.shape)}, "
                         f"{tuple(labels.shape)}")


@torch.library.custom_op("fxopt::linear_cross_entropy", mutates_args=())
def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         labels: torch.Tensor, ignore_index: int, label_smoothing: float,
                         reduction: str, compute_dtype: torch.dtype, out_dtype: torch.dtype,
                         block_bytes: int, softcap: float = 0.0
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, per-token log-sum-exp) of ``cross_entropy(linear(h, weight, bias), labels)``,
    the Linear in ``compute_dtype``, the loss in fp32 then ``out_dtype``; with ``softcap``
    (not 0), of the soft-capped logits ``softcap * tanh(logits / softcap)`` (Gemma 2's),
    computed in fp32."""
    check_arguments(h, weight, labels, reduction)
    with torch.autocast(h.device.type, enabled=False):  # the op chooses its own dtypes
        return _forward(h, weight, bias, labels, ignore_index, label_smoothing, reduction,
                        compute_dtype, out_dtype, block_bytes, softcap)


@linear_cross_entropy.register_fake
def _(h, weight, bias, labels, ignore_index, label_smoothing, reduction, compute_dtype,
      out_dtype, block_bytes, softcap=0.0):
    check_arguments(h, weight, labels, reduction)
    return h.new_empty((), dtype=out_dtype), h.new_empty((h.shape[0],), dtype=torch.float32)


@torch.library.custom_op("fxopt::linear_cross_entropy_backward", mutates_args=())
def linear_cross_entropy_backward(
        grad: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
        labels: torch.Tensor, lse: torch.Tensor, ignore_index: int, label_smoothing: float,
        reduction: str, compute_dtype: torch.dtype, block_bytes: int, grad_h: bool,
        grad_weight: bool, grad_bias: bool, softcap: float = 0.0) -> list[torch.Tensor]:
    """The gradients of h, weight and bias that ``grad_*`` ask for, in that order."""
    with torch.autocast(h.device.type, enabled=False):
        return _backward(grad, h, weight, bias, labels, lse, ignore_index, label_smoothing,
                         reduction, compute_dtype, block_bytes,
                         (grad_h, grad_weight, grad_bias and bias is not None), softcap)


@linear_cross_entropy_backward.register_fake
def _(grad, h, weight, bias, labels, lse, ignore_index, label_smoothing, reduction,
      compute_dtype, block_bytes, grad_h, grad_weight, grad_bias, softcap=0.0):
    wanted = ((grad_h, h), (grad_weight, weight), (grad_bias and bias is not None, bias))
    return [t.new_empty(t.shape) for want, t in wanted if want]


def _setup_context(ctx, inputs, output):
    h, weight, bias, labels, ignore_index, smoothing, reduction, compute_dtype, _, block, \
        softcap = inputs
    ctx.save_for_backward(h, weight, bias, labels, output[1])
    ctx.arguments = (ignore_index, smoothing, reduction, compute_dtype, block)
    ctx.softcap = softcap


def refuse_double_backward(op: str) -> None:
    """Raise where the backward is being differentiated (``create_graph=True``: autograd runs
    a backward with grad mode on only then): the ops' backwards are not differentiable, and
    a Hessian-vector product through them would silently miss terms."""
    if torch.is_grad_enabled():
        raise RuntimeError(f"fxopt::{op}: a backward with create_graph=True (a second "
                           "derivative) is not supported; compile with "
                           "fuse_linear_cross_entropy=False for this loss")


def _autograd_backward(ctx, grad, _grad_lse):
    refuse_double_backward("linear_cross_entropy")
    h, weight, bias, labels, lse = ctx.saved_tensors
    want_h, want_w, want_b = ctx.needs_input_grad[:3]
    want_b = want_b and bias is not None
    found = iter(linear_cross_entropy_backward(grad, h, weight, bias, labels, lse,
                                               *ctx.arguments, want_h, want_w, want_b,
                                               ctx.softcap))
    grads = [next(found) if want else None for want in (want_h, want_w, want_b)]
    return (*grads, *([None] * 8))


linear_cross_entropy.register_autograd(_autograd_backward, setup_context=_setup_context)


def reference(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              labels: torch.Tensor, ignore_index: int = -100, label_smoothing: float = 0.0,
              reduction: str = "mean", compute_dtype: torch.dtype | None = None,
              softcap: float = 0.0) -> torch.Tensor:
    """What the op computes, as eager torch computes it (the logits stored; soft-capped as
    Gemma 2 does it, in the logits' dtype): for tests."""
    compute_dtype = compute_dtype or h.dtype
    logits = F.linear(h.to(compute_dtype), weight.to(compute_dtype),
                      None if bias is None else bias.to(compute_dtype))
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return F.cross_entropy(logits.float(), labels, ignore_index=ignore_index,
                           label_smoothing=label_smoothing, reduction=reduction)
