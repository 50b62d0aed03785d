"""``fxopt::linear_cross_entropy_with_grads``: ``cross_entropy(h @ W.T + b, labels)`` and its
gradients in one pass over the tokens, never storing the logits.

The sibling of :mod:`fxopt.kernels.fuse_linear_cross_entropy` (whose helpers it shares):
that op recomputes the logits in its backward, four (tokens x hidden x vocabulary) matmuls
where plain autograd runs three. This one walks the tokens in chunks of rows (Liger-Kernel's
order) and, per chunk, computes the whole rows' logits once, their softmax, the loss, and
the gradients of h, W and b for an incoming gradient of 1: three matmuls. It keeps those
gradients for the backward, which only scales them by the incoming gradient. The price is
what is kept: W's gradient (vocabulary x hidden fp32) and h's (tokens x hidden fp32), that is
``hidden / tokens + hidden / vocabulary`` of the logits' fp32 bytes, against the sibling's
``tokens`` floats. W's gradient is made either way, so the peak differs little; the kept
bytes are what a memory budget counts. The pass chooses (its module doc).

Per chunk of rows ``r0:r1``:

- ``z = h[r0:r1] @ W.T (+ b)`` in the compute dtype (autocast's: the Linear's), then in
  fp32 the row max, ``exp(z - max)`` (exponents clamped at ``EXP_FLOOR``) and its row sum:
  the log-sum-exp, the loss, and the softmax in place of ``z``;
- ``dz = softmax - (1 - eps) onehot - eps / V``, times each token's scale (over the token
  count for ``mean``, zero for ``ignore_index``), rounded to the compute dtype as autocast
  rounds eager's;
- ``dh[r0:r1] = dz @ W`` (complete), ``dW += dz.T @ h[r0:r1]`` and ``db += dz``'s column sums,
  fp32 results of compute-dtype operands (``mm_fp32``, ``add_mm_fp32``: the GEMM adds to
  W's fp32 gradient where it can).

On CUDA the logits' rows have an aligned stride (W's rows padded with zeros: the sibling's
"aligned logits"); the three GEMMs of GPT-2's head ran 6x slower without it.

**Chunk size** (:func:`chunk_rows`): one chunk's temporaries at most 1/16 of the logits' fp32
bytes (on CUDA a chunk's logits in the compute dtype, overwritten in place with their
gradient: an eighth of the tokens under bf16; the torch path also makes an fp32 softmax),
but at least :data:`MIN_CHUNK_ROWS` rows: each chunk reads and writes all of W's fp32
gradient, so narrow chunks make that traffic, not the matmuls, the cost. ``block_bytes`` > 0
bounds a chunk's temporaries instead: on CUDA
:mod:`fxopt.passes.fuse_linear_cross_entropy_chunks` sets it from the step's predicted peak
and the budget (:func:`chunk_count`, :func:`chunk_bytes_for`). On CUDA the softmax and
gradient math runs in the sibling's Triton kernels (a chunk is one block of all the
columns).

The gradients of inputs that need none are not computed: the pass passes which are wanted
(a frozen head is common in fine-tuning), and the op returns an empty tensor in their place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fxopt.kernels import fuse_linear_cross_entropy as single

__all__ = ["CHUNK_FRACTION", "MIN_CHUNK_ROWS", "chunk_bytes_for", "chunk_count", "chunk_rows",
           "kept_bytes", "linear_cross_entropy_with_grads", "softmax_rows_reference"]

CHUNK_FRACTION = 16
MIN_CHUNK_ROWS = 128


def chunk_rows(tokens: int, vocab: int, block_bytes: int = 0, logit_bytes: int = 4) -> int:
    """Token rows per chunk (module doc): the chunk's temporaries, ``logit_bytes`` a logit
    (``fuse_linear_cross_entropy.temporary_bytes``), at most 1/:data:`CHUNK_FRACTION` of
    the logits' fp32 bytes, but at least :data:`MIN_CHUNK_ROWS` rows; ``block_bytes`` > 0
    bounds them instead."""
    bound = block_bytes or 4 * tokens * vocab // CHUNK_FRACTION
    rows = bound // (logit_bytes * max(vocab, 1))
    return max(1, min(tokens, rows if block_bytes else max(rows, MIN_CHUNK_ROWS)))


def chunk_count(tokens: int, vocab: int, block_bytes: int, compute_dtype: torch.dtype,
                device: torch.device) -> int:
    """The chunks of token rows the op walks for ``block_bytes`` (0: the default bound)."""
    return -(-tokens // chunk_rows(tokens, vocab, block_bytes, single.logit_bytes(compute_dtype,
                                                                            device)))


def chunk_bytes_for(chunks: int, tokens: int, vocab: int, compute_dtype: torch.dtype,
                    device: torch.device) -> int:
    """The ``block_bytes`` that cut the tokens into at most ``chunks`` chunks."""
    return -(-tokens // max(chunks, 1)) * vocab * single.logit_bytes(compute_dtype, device)


def kept_bytes(tokens: int, hidden: int, vocab: int, grad_h: bool, grad_weight: bool,
               grad_bias: bool) -> int:
    """What the op keeps for its backward: the wanted gradients, in fp32."""
    return 4 * (grad_h * tokens * hidden + grad_weight * vocab * hidden + grad_bias * vocab)


def softmax_rows_reference(z: torch.Tensor, row_scale: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(each row of ``z``'s softmax times the row's scale, in fp32; each row's log-sum-exp).
    An fp32 ``z`` is overwritten; the scale rides on the normalisation (no pass of its
    own)."""
    p = z.float()
    m = p.amax(1, keepdim=True)
    p.sub_(m).clamp_(min=single.EXP_FLOOR).exp_()
    s = p.sum(1, keepdim=True)
    p.mul_(row_scale.unsqueeze(1) / s)
    return p, (m + s.log()).squeeze(1)


def _chunk_gradient(z, labels, row_scale, smoothing, vocab, compute_dtype, softcap):
    """(the logits' gradient, scaled per token and in the compute dtype; the per-token
    loss) of one chunk's whole-row logits ``z`` (soft-capped where ``softcap`` is not 0:
    the sibling's ``softcap_tanh``, and the gradient times its slope)."""
    rows = z.shape[0]
    if single.uses_triton(z):
        fold, gradient = single.padded_kernels()  # z: a prefix of its padded product
        f32 = dict(device=z.device, dtype=torch.float32)
        m = torch.full((rows,), float("-inf"), **f32)
        s, sum_z, target = (torch.zeros(rows, **f32) for _ in range(3))
        fold(z, labels, 0, m, s, sum_z, target, bool(smoothing), softcap=softcap)
        lse = m + torch.log(s)
        gradient(z, z, labels, 0, lse, smoothing, vocab, row_scale, softcap=softcap)
        dz = z  # overwritten with its scaled gradient, in the compute dtype
    else:
        capped, tanh = single.softcap_tanh(z, softcap) if softcap else (z, None)
        target = capped.gather(1, labels.clamp(0, vocab - 1).unsqueeze(1)).squeeze(1).float()
        sum_z = capped.float().sum(1) if smoothing else None
        dz, lse = softmax_rows_reference(capped, row_scale)
        single.subtract_targets_(dz, labels, 0, smoothing, vocab, row_scale)
        if tanh is not None:
            single.times_softcap_slope_(dz, tanh)
        # back into z where it is a padded view (CUDA without Triton): its aligned stride
        dz = dz.to(compute_dtype) if z.is_contiguous() else z.copy_(dz)
    per_token = (1.0 - smoothing) * (lse - target)
    if smoothing:
        per_token = per_token + smoothing * (lse - sum_z / vocab)
    return dz, per_token


def _forward(h, weight, bias, labels, ignore_index, smoothing, reduction, compute_dtype,
             out_dtype, block_bytes, wants, softcap):
    tokens, hidden, vocab = h.shape[0], h.shape[1], weight.shape[0]
    want_h, want_w, want_b = wants
    f32 = dict(device=h.device, dtype=torch.float32)
    row_scale = single.token_scales(labels, ignore_index, reduction)
    h_cd = h.to(compute_dtype)
    # W's rows padded to an aligned logits stride on CUDA (the sibling's module doc); the
    # chunks' logits are views of the padded products, W itself its first rows
    w_padded, b_padded = single.padded_rows(
        weight, bias, compute_dtype, single.row_alignment(h.device, compute_dtype.itemsize))
    w_cd = w_padded[:vocab]
    per_token = torch.empty(tokens, **f32)
    # a gradient not asked for: an empty fp32 tensor of its own (as the fake's; outputs of
    # a custom op may not alias each other)
    dh = torch.empty(tokens, hidden, **f32) if want_h else torch.empty(0, **f32)
    dw = torch.zeros(vocab, hidden, **f32) if want_w else torch.empty(0, **f32)
    db = torch.zeros(vocab, **f32) if want_b else torch.empty(0, **f32)
    step = chunk_rows(tokens, vocab, block_bytes, single.logit_bytes(compute_dtype, h.device))
    for r0 in range(0, tokens, step):
        r1 = min(r0 + step, tokens)
        z = F.linear(h_cd[r0:r1], w_padded, b_padded)[:, :vocab]
        dz, per_token[r0:r1] = _chunk_gradient(z, labels[r0:r1], row_scale[r0:r1], smoothing,
                                               vocab, compute_dtype, softcap)
        del z
        if want_w:
            dw = single.add_mm_fp32(dw, dz.t(), h_cd[r0:r1])
        if want_b:
            db.add_(dz.float().sum(0))
        if want_h:
            dh[r0:r1] = single.mm_fp32(dz, w_cd)
        del dz
    valid = labels != ignore_index
    loss = torch.where(valid, per_token, 0.0).sum()
    if reduction == "mean":
        loss = loss / valid.sum()
    return loss.to(out_dtype), dh, dw, db


@torch.library.custom_op("fxopt::linear_cross_entropy_with_grads", mutates_args=())
def linear_cross_entropy_with_grads(
        h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
        ignore_index: int, label_smoothing: float, reduction: str, compute_dtype: torch.dtype,
        out_dtype: torch.dtype, block_bytes: int, grad_h: bool, grad_weight: bool,
        grad_bias: bool, softcap: float = 0.0
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, dh, dW, db): ``cross_entropy(linear(h, weight, bias), labels)`` (the Linear in
    ``compute_dtype``, the loss in fp32 then ``out_dtype``; soft-capped logits where
    ``softcap`` is not 0, as the sibling's) and its gradients for an incoming gradient of
    1, in fp32; an empty tensor for each gradient not asked for."""
    single.check_arguments(h, weight, labels, reduction)
    with torch.autocast(h.device.type, enabled=False):  # the op chooses its own dtypes
        return _forward(h, weight, bias, labels, ignore_index, label_smoothing, reduction,
                        compute_dtype, out_dtype, block_bytes,
                        (grad_h, grad_weight, grad_bias and bias is not None), softcap)


@linear_cross_entropy_with_grads.register_fake
def _(h, weight, bias, labels, ignore_index, label_smoothing, reduction, compute_dtype,
      out_dtype, block_bytes, grad_h, grad_weight, grad_bias, softcap=0.0):
    single.check_arguments(h, weight, labels, reduction)
    f32 = dict(dtype=torch.float32)
    wanted = ((grad_h, h), (grad_weight, weight), (grad_bias and bias is not None, bias))
    return (h.new_empty((), dtype=out_dtype),
            *(t.new_empty(t.shape, **f32) if want else h.new_empty(0, **f32)
              for want, t in wanted))


def _setup_context(ctx, inputs, output):
    h, weight, bias = inputs[:3]
    ctx.save_for_backward(*output[1:])
    ctx.dtypes = (h.dtype, weight.dtype, None if bias is None else bias.dtype)
    ctx.mark_non_differentiable(*output[1:])


def _autograd_backward(ctx, grad, *_unused):
    single.refuse_double_backward("linear_cross_entropy_with_grads")
    scale = grad.float()
    grads = []
    for name, kept, wanted, dtype in zip(("h", "weight", "bias"), ctx.saved_tensors,
                                         ctx.needs_input_grad[:3], ctx.dtypes):
        if wanted and kept.numel() == 0 and dtype is not None:
            raise RuntimeError(
                f"fxopt::linear_cross_entropy_with_grads: the gradient of {name} is wanted "
                "but was not computed in the forward (its grad_* argument was False); "
                "recompile, or pass fuse_linear_cross_entropy=False")
        grads.append((kept * scale).to(dtype) if wanted and kept.numel() else None)
    return (*grads, *([None] * 11))


linear_cross_entropy_with_grads.register_autograd(_autograd_backward,
                                                  setup_context=_setup_context)
