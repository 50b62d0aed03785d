"""Tempo's memory-lean attention core: ``fxopt::tempo_softmax_dropout_matmul`` computes
``dropout(softmax(scores)) @ v`` and saves the softmax output S, the bit-packed dropout mask
and v for backward, not the dropout output.

Eager autograd keeps S (softmax's output), the dropout mask (1 byte per element) and the
dropout output P (matmul's input): three [.., T, T] tensors. This op keeps S and 1 bit per
element; the backward recomputes P from S and the mask for dv = P^T dout, applies the mask
to dP = dout v^T, and runs the softmax backward from S.

The mask comes from ``F.dropout`` itself, so the op draws exactly the random numbers eager
draws (on the CPU and on CUDA); the bits saved are ``P != 0``. Where S is 0 a kept and a
dropped element are indistinguishable, and need not be: the softmax backward multiplies
by S, and P is 0 there either way, so every gradient is the one of eager given its mask.
With p == 0 (or not training) there is no mask and none is saved.

Every output is contiguous, as the fake implementations say (AOTAutograd plans views of
the gradients from the fakes' strides). Dtypes: the replaced code's are passed explicitly
(softmax's, the probabilities' after an optional cast, the matmul's), because a custom op
is opaque to autocast.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from fxopt._compat import softmax_backward
from fxopt.kernels.tempo.bitmask import pack_bits, packed_size, unpack_bits

__all__ = ["attention_backward", "attention_forward", "tempo_softmax_dropout_matmul"]


def attention_forward(scores: torch.Tensor, v: torch.Tensor, dim: int, p: float,
                      softmax_dtype: torch.dtype, probs_dtype: torch.dtype,
                      out_dtype: torch.dtype,
                      pack: Callable[[torch.Tensor], torch.Tensor]
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dropout(softmax(scores, dim)) @ v, S, the mask ``probs != 0`` packed by ``pack``)."""
    s = torch.softmax(scores, dim, dtype=softmax_dtype)
    probs = s.to(probs_dtype)
    if p > 0:
        probs = F.dropout(probs, p, training=True)
        packed = pack(probs != 0)
    else:
        packed = scores.new_empty((0,), dtype=torch.uint8)
    return torch.matmul(probs.to(out_dtype), v.to(out_dtype)), s, packed


def attention_backward(dout: torch.Tensor, s: torch.Tensor, mask: torch.Tensor | None,
                       v: torch.Tensor, dim: int, p: float, probs_dtype: torch.dtype,
                       scores_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(dscores, dv) from S, the dropout mask (bool, None when p == 0) and v."""
    probs = s.to(probs_dtype)
    if p > 0:  # eager's dropout on the CPU multiplies by noise = mask / (1 - p): the same
        noise = mask.to(probs.dtype) / (1.0 - p)
        probs = probs * noise
    dv = torch.matmul(probs.to(dout.dtype).transpose(-2, -1), dout).to(v.dtype)
    dprobs = torch.matmul(dout, v.to(dout.dtype).transpose(-2, -1)).to(probs_dtype)
    if p > 0:
        dprobs = dprobs * noise
    dscores = softmax_backward(dprobs.to(s.dtype), s, dim, s.dtype)
    return dscores.to(scores_dtype), dv


@torch.library.custom_op("fxopt::tempo_softmax_dropout_matmul", mutates_args=(),
                         tags=(torch.Tag.nondeterministic_seeded,))
def tempo_softmax_dropout_matmul(scores: torch.Tensor, v: torch.Tensor, dim: int, p: float,
                                 softmax_dtype: torch.dtype, probs_dtype: torch.dtype,
                                 out_dtype: torch.dtype
                                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dropout(softmax(scores, dim)) @ v, S, packed mask); p == 0 means no dropout."""
    out, s, packed = attention_forward(scores, v, dim, p, softmax_dtype, probs_dtype,
                                       out_dtype, pack_bits)
    return out.contiguous(), s.contiguous(), packed


@tempo_softmax_dropout_matmul.register_fake
def _(scores, v, dim, p, softmax_dtype, probs_dtype, out_dtype):
    out_shape = (*scores.shape[:-1], v.shape[-1])
    return (scores.new_empty(out_shape, dtype=out_dtype),
            scores.new_empty(scores.shape, dtype=softmax_dtype),
            scores.new_empty((packed_size(scores.numel()) if p > 0 else 0,),
                             dtype=torch.uint8))


@torch.library.custom_op("fxopt::tempo_softmax_dropout_matmul_backward", mutates_args=())
def tempo_softmax_dropout_matmul_backward(
        dout: torch.Tensor, s: torch.Tensor, packed: torch.Tensor, v: torch.Tensor, dim: int,
        p: float, probs_dtype: torch.dtype, scores_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dscores, dv) of :func:`tempo_softmax_dropout_matmul` from S, the mask and v."""
    mask = unpack_bits(packed, s.shape) if p > 0 else None
    dscores, dv = attention_backward(dout, s, mask, v, dim, p, probs_dtype, scores_dtype)
    return dscores.contiguous(), dv.contiguous()


@tempo_softmax_dropout_matmul_backward.register_fake
def _(dout, s, packed, v, dim, p, probs_dtype, scores_dtype):
    return s.new_empty(s.shape, dtype=scores_dtype), v.new_empty(v.shape)


def _setup(ctx, inputs, output) -> None:
    scores, v, dim, p, _, probs_dtype, _ = inputs
    ctx.args = (dim, p, probs_dtype, scores.dtype)
    ctx.save_for_backward(output[1], output[2], v)


def _backward(ctx, dout, *_unused):
    s, packed, v = ctx.saved_tensors
    dscores, dv = tempo_softmax_dropout_matmul_backward(dout, s, packed, v, *ctx.args)
    return dscores, dv, None, None, None, None, None


tempo_softmax_dropout_matmul.register_autograd(_backward, setup_context=_setup)
