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
  ``dz = softmax - (1 - eps) onehot - eps / V`` in fp32, then ``dW[v0:v1] = dz.T @ (s h)``
  (complete in one matmul, written once in W's dtype), ``db[v0:v1] = dz.T @ s`` and
  ``dh += dz @ W[v0:v1]`` (accumulated in fp32, times ``s`` at the end), where ``s`` is per
  token the incoming gradient (over the token count for ``mean``; zero for
  ``ignore_index`` tokens): the scale rides on the small operands, not a pass over a
  block. The
  gradient matmuls run in fp32 on operands rounded to the compute dtype, as autocast's
  casts round them. A gradient whose input needs none is not computed.

Why recompute rather than compute the gradients in the forward and keep them (Liger's
choice): the kept gradient of W is vocabulary x hidden in fp32, the size of the parameter's
own gradient; where the tokens are few against the hidden size (a short sequence, a small
batch) it is a large share of what the logits were (hidden / tokens of them), and autograd
would count it as kept for backward. Recomputing costs one more (tokens x hidden x vocab)
matmul and keeps only ``tokens`` floats beside the inputs the Linear kept anyway.

**Block size** (:func:`block_columns`): one block's fp32 logits at most 1/64 of the whole
(the op's temporaries are a block or two: its fp32 logits, overwritten with their
exponentials or gradients, and, from a lower-precision compute dtype, their upcast) and
at most :data:`BLOCK_BYTES_CAP`, but at least :data:`MIN_BLOCK_COLUMNS` columns (matmuls
narrower than that run far below peak); the ``block_bytes`` argument overrides the byte
bound. The pass uses the default.

On CUDA, the per-block reductions and pointwise math run in Triton
(:mod:`fxopt.kernels.fuse_linear_cross_entropy_triton`); elsewhere their torch references below.
Loss and gradients equal ``F.cross_entropy(F.linear(h, W, b), labels, ...)``'s to fp32
rounding (the sums run in another order); under autocast eager rounds the logits'
gradient to the compute dtype before its matmuls and this op does not, so the gradients
differ from eager's by the compute dtype's rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fxopt.kernels import triton_runs_on

__all__ = ["BLOCK_BYTES_CAP", "MIN_BLOCK_COLUMNS", "block_columns", "dlogits_block_reference",
           "linear_cross_entropy", "linear_cross_entropy_backward", "lse_block_reference",
           "reference"]

BLOCK_BYTES_CAP = 32 * 2**20
BLOCK_FRACTION = 64
MIN_BLOCK_COLUMNS = 128
REDUCTIONS = ("mean", "sum")


def block_columns(tokens: int, vocab: int, block_bytes: int = 0) -> int:
    """Columns per vocabulary block (module doc); ``block_bytes`` > 0 bounds one block's
    fp32 logits instead of the default."""
    row_bytes = 4 * max(tokens, 1)
    bound = block_bytes or min(row_bytes * vocab // BLOCK_FRACTION, BLOCK_BYTES_CAP)
    return max(1, min(vocab, max(bound // row_bytes, MIN_BLOCK_COLUMNS)))


def _uses_triton(t: torch.Tensor) -> bool:
    return t.is_cuda and triton_runs_on(t.device)


# ---------------------------------------------------------------- per-block references

def lse_block_reference(z: torch.Tensor, labels: torch.Tensor, v0: int, m: torch.Tensor,
                        s: torch.Tensor, sum_z: torch.Tensor, target: torch.Tensor,
                        smooth: bool) -> None:
    """Fold the block ``z`` (columns ``v0:v0 + z.shape[1]``) into the running state, in
    place: max ``m``, ``s = sum exp(z - m)``, the sum of logits, the target logit. An fp32
    ``z`` is overwritten (with its exponentials: no second block is allocated)."""
    z = z.float()
    cols = z.shape[1]
    local = labels - v0
    inside = (local >= 0) & (local < cols)
    picked = z.gather(1, local.clamp(0, cols - 1).unsqueeze(1)).squeeze(1)
    target.add_(torch.where(inside, picked, 0.0))
    if smooth:
        sum_z.add_(z.sum(1))
    m_new = torch.maximum(m, z.amax(1))
    s.mul_(torch.exp(m - m_new)).add_(z.sub_(m_new.unsqueeze(1)).exp_().sum(1))
    m.copy_(m_new)


def dlogits_block_reference(z: torch.Tensor, out: torch.Tensor, labels: torch.Tensor, v0: int,
                            lse: torch.Tensor, label_smoothing: float, vocab: int) -> None:
    """``out = softmax - (1 - eps) onehot - eps / V`` for block ``z`` (``out`` fp32, may be
    ``z``). Unscaled: the caller folds the per-token scale (zero for ignored tokens) into
    the matmuls' small operands instead of a pass over the block."""
    p = torch.sub(z, lse.unsqueeze(1), out=out).exp_()
    if label_smoothing:
        p.sub_(label_smoothing / vocab)
    cols = z.shape[1]
    local = labels - v0
    inside = ((local >= 0) & (local < cols)).to(p.dtype)
    p.scatter_add_(1, local.clamp(0, cols - 1).unsqueeze(1),
                   (inside * -(1.0 - label_smoothing)).unsqueeze(1))


# ---------------------------------------------------------------- the chunked computation

def _block_logits(h_cd: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  v0: int, v1: int, compute_dtype: torch.dtype) -> torch.Tensor:
    """Columns ``v0:v1`` of the logits, computed as the Linear computes them."""
    b = None if bias is None else bias[v0:v1].to(compute_dtype)
    return F.linear(h_cd, weight[v0:v1].to(compute_dtype), b)


def _forward(h, weight, bias, labels, ignore_index, label_smoothing, reduction,
             compute_dtype, out_dtype, block_bytes):
    tokens, vocab = h.shape[0], weight.shape[0]
    f32 = dict(device=h.device, dtype=torch.float32)
    m = torch.full((tokens,), float("-inf"), **f32)
    s, sum_z, target = (torch.zeros(tokens, **f32) for _ in range(3))
    fold = _triton().lse_block if _uses_triton(h) else lse_block_reference
    h_cd = h.to(compute_dtype)
    step = block_columns(tokens, vocab, block_bytes)
    for v0 in range(0, vocab, step):
        z = _block_logits(h_cd, weight, bias, v0, min(v0 + step, vocab), compute_dtype)
        fold(z, labels, v0, m, s, sum_z, target, bool(label_smoothing))
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


def _backward(grad, h, weight, bias, labels, lse, ignore_index, label_smoothing, reduction,
              compute_dtype, block_bytes, wants):
    tokens, vocab = h.shape[0], weight.shape[0]
    want_h, want_w, want_b = wants
    scale = grad.float().reshape(())
    if reduction == "mean":
        scale = scale / (labels != ignore_index).sum()
    # d loss / d logits = scale_i x (softmax - onehot - ...): scale_i (zero for ignored
    # tokens) goes into h's rows for dW, into db's sum, and onto dh's rows at the end
    row_scale = torch.where(labels != ignore_index, scale, 0.0)
    gradient = _triton().dlogits_block if _uses_triton(h) else dlogits_block_reference
    h_cd = h.to(compute_dtype)
    h_scaled = h_cd.float() * row_scale.unsqueeze(1) if want_w else None
    dh = torch.zeros(tokens, h.shape[1], device=h.device, dtype=torch.float32) if want_h \
        else None
    dw = torch.empty_like(weight) if want_w else None
    db = torch.empty_like(bias) if want_b else None
    step = block_columns(tokens, vocab, block_bytes)
    for v0 in range(0, vocab, step):
        v1 = min(v0 + step, vocab)
        z = _block_logits(h_cd, weight, bias, v0, v1, compute_dtype)
        dz = z if z.dtype == torch.float32 else torch.empty(z.shape, device=z.device,
                                                            dtype=torch.float32)
        gradient(z, dz, labels, v0, lse, label_smoothing, vocab)
        del z
        if want_w:
            torch.mm(dz.t(), h_scaled, out=dw[v0:v1]) if dw.dtype == torch.float32 else \
                dw[v0:v1].copy_(dz.t() @ h_scaled)
        if want_b:
            db[v0:v1] = (dz.t() @ row_scale).to(bias.dtype)
        if want_h:
            dh.addmm_(dz, weight[v0:v1].to(compute_dtype).float())
        del dz
    if want_h:
        dh = (dh * row_scale.unsqueeze(1)).to(h.dtype)
    return [g for g in (dh, dw, db) if g is not None]


def _triton():
    from fxopt.kernels import fuse_linear_cross_entropy_triton

    return fuse_linear_cross_entropy_triton


# ---------------------------------------------------------------- the ops

def _check(h, weight, labels, reduction):
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
                         block_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, per-token log-sum-exp) of ``cross_entropy(linear(h, weight, bias), labels)``,
    the Linear in ``compute_dtype``, the loss in fp32 then ``out_dtype``."""
    _check(h, weight, labels, reduction)
    with torch.autocast(h.device.type, enabled=False):  # the op chooses its own dtypes
        return _forward(h, weight, bias, labels, ignore_index, label_smoothing, reduction,
                        compute_dtype, out_dtype, block_bytes)


@linear_cross_entropy.register_fake
def _(h, weight, bias, labels, ignore_index, label_smoothing, reduction, compute_dtype,
      out_dtype, block_bytes):
    _check(h, weight, labels, reduction)
    return h.new_empty((), dtype=out_dtype), h.new_empty((h.shape[0],), dtype=torch.float32)


@torch.library.custom_op("fxopt::linear_cross_entropy_backward", mutates_args=())
def linear_cross_entropy_backward(
        grad: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
        labels: torch.Tensor, lse: torch.Tensor, ignore_index: int, label_smoothing: float,
        reduction: str, compute_dtype: torch.dtype, block_bytes: int, grad_h: bool,
        grad_weight: bool, grad_bias: bool) -> list[torch.Tensor]:
    """The gradients of h, weight and bias that ``grad_*`` ask for, in that order."""
    with torch.autocast(h.device.type, enabled=False):
        return _backward(grad, h, weight, bias, labels, lse, ignore_index, label_smoothing,
                         reduction, compute_dtype, block_bytes,
                         (grad_h, grad_weight, grad_bias and bias is not None))


@linear_cross_entropy_backward.register_fake
def _(grad, h, weight, bias, labels, lse, ignore_index, label_smoothing, reduction,
      compute_dtype, block_bytes, grad_h, grad_weight, grad_bias):
    wanted = ((grad_h, h), (grad_weight, weight), (grad_bias and bias is not None, bias))
    return [t.new_empty(t.shape) for want, t in wanted if want]


def _setup_context(ctx, inputs, output):
    h, weight, bias, labels, ignore_index, smoothing, reduction, compute_dtype, _, block = inputs
    ctx.save_for_backward(h, weight, bias, labels, output[1])
    ctx.arguments = (ignore_index, smoothing, reduction, compute_dtype, block)


def _autograd_backward(ctx, grad, _grad_lse):
    h, weight, bias, labels, lse = ctx.saved_tensors
    want_h, want_w, want_b = ctx.needs_input_grad[:3]
    want_b = want_b and bias is not None
    found = iter(linear_cross_entropy_backward(grad, h, weight, bias, labels, lse,
                                               *ctx.arguments, want_h, want_w, want_b))
    grads = [next(found) if want else None for want in (want_h, want_w, want_b)]
    return (*grads, *([None] * 7))


linear_cross_entropy.register_autograd(_autograd_backward, setup_context=_setup_context)


def reference(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              labels: torch.Tensor, ignore_index: int = -100, label_smoothing: float = 0.0,
              reduction: str = "mean", compute_dtype: torch.dtype | None = None
              ) -> torch.Tensor:
    """What the op computes, as eager torch computes it (the logits stored): for tests."""
    compute_dtype = compute_dtype or h.dtype
    logits = F.linear(h.to(compute_dtype), weight.to(compute_dtype),
                      None if bias is None else bias.to(compute_dtype))
    return F.cross_entropy(logits.float(), labels, ignore_index=ignore_index,
                           label_smoothing=label_smoothing, reduction=reduction)
