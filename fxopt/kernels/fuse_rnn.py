"""Fused LSTM and GRU cell steps (EcoRNN): one Triton kernel per step forward, one backward.

A cell step is split in two, as EcoRNN does: the projections (``x @ W_ih^T`` and
``h @ W_hh^T``) stay ordinary GEMMs that autograd differentiates, and everything after them
(adding the biases, the gate nonlinearities, the cell and hidden update) is one custom op,
``fxopt::lstm_cell`` or ``fxopt::gru_cell``, whose forward and backward are each one Triton
kernel on a device where Triton runs (`fxopt.kernels.triton_runs_on`), and the pure-torch
reference elsewhere. Both paths save the same tensors for backward.

What is saved, deliberately (the backward needs nothing recomputed through a GEMM):
- LSTM: the *activated* gates ``i, f, g, o`` (one [B, 4H] buffer, in i, f, g, o order),
  the previous cell state and the new one. Not the pre-activations: the derivatives of
  sigmoid and tanh are functions of their outputs. EcoRNN's leaner variant (keep only i and
  f, recover g and o by division) is not used: it divides by gates that can be ~0.
- GRU: ``r, z, n`` and the hidden-side candidate term ``hn = (h @ W_hn^T + b_hn)`` (one
  [B, 4H] buffer), and the previous hidden state.

Weights: the projections read ``W_ih`` and ``W_hh`` in place (``linear`` hands cuBLAS the
transposed operand, no copy), so no re-laid-out weight is cached that an optimizer step
could leave stale; a kernel fusing the hidden GEMM with the gates (which would want a
cached, re-laid-out ``W_hh``) is not built.

The two projections are the op's inputs ``a`` (input side) and ``b`` (hidden side), each
of the gates' shape [B, G*H]; a gate layout other than PyTorch's (i, f, g, o for the LSTM)
is given by ``order``: ``order[k]`` is the chunk of ``a``/``b`` that holds gate ``k``. The
op computes in fp32 and returns the dtype that eager's math would give (the promotion of
its inputs). Gradients of ``a`` and ``b`` are the pre-activation gate gradients (for the
GRU, the n-gate part of ``b``'s is scaled by ``r``); bias gradients are their column sums.

Fusible forms (:func:`fusible_lstm_cell`, :func:`fusible_gru_cell`): the same step as an
autograd Function of the references, which fuse_rnn inserts under a code generator that
fuses pointwise ops (Inductor). AOTAutograd traces through it, and Inductor generates the
forward and the backward as one kernel each, launched from its compiled code: called as an
extern op, each step paid the host a Python dispatch and a Triton launch, which bound the
GPU's LSTMCell loop (tests/passes/fuse_rnn/test_fuse_rnn_inductor.py counts the launches).
They hand backward the op's tensors; which are kept is then the partitioner's choice.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fxopt.kernels import triton_installed, triton_runs_on

__all__ = ["lstm_cell", "gru_cell", "fusible_lstm_cell", "fusible_gru_cell", "LSTM_ORDER",
           "GRU_ORDER"]

LSTM_ORDER = (0, 1, 2, 3)  # PyTorch's chunk order: input, forget, cell candidate, output
GRU_ORDER = (0, 1, 2)      # reset, update, new


# ---------------------------------------------------------------- pure-torch references

def _gate(x: torch.Tensor, order: Sequence[int], k: int, hidden: int) -> torch.Tensor:
    return x[:, order[k] * hidden:(order[k] + 1) * hidden]


def _out_dtype(a: torch.Tensor, b: torch.Tensor, state: torch.Tensor) -> torch.dtype:
    """What eager's gate math returns: the promotion of the projections and the state."""
    return torch.promote_types(torch.promote_types(a.dtype, b.dtype), state.dtype)


def _biased(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.float() if bias is None else x.float() + bias.float()


def lstm_forward_reference(a, b, c, bias_a, bias_b, order):
    """(h, c_new, gates): the reference of the forward kernel, in fp32 math."""
    hidden = c.shape[-1]
    # the projections first: in fp32, Inductor then folds the sum into the recurrent GEMM
    # (addmm, the hoisted projection's step its C operand), so the step's generated kernel
    # reads no step-dependent offset and one kernel serves every step (one compile, not one
    # per step: tests/passes/fuse_rnn/test_fuse_rnn_inductor.py)
    pre = _biased(b.float() + a.float(), bias_a)
    pre = pre if bias_b is None else pre + bias_b.float()
    i, f, g, o = (_gate(pre, order, k, hidden) for k in range(4))
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    c_new = f * c.float() + i * g
    h = o * c_new.tanh()
    out = _out_dtype(a, b, c)
    return h.to(out), c_new.to(out), torch.cat([i, f, g, o], dim=1).to(out)


def lstm_backward_reference(dh, dc, gates, c, c_new, order):
    """(d_pre in the op's gate layout, dc_prev): the reference of the backward kernel."""
    hidden = c.shape[-1]
    i, f, g, o = (gates[:, k * hidden:(k + 1) * hidden].float() for k in range(4))
    tc = c_new.float().tanh()
    dh, dc = dh.float(), dc.float()
    dc_total = dc + dh * o * (1 - tc * tc)
    d_pre = [dc_total * g * i * (1 - i), dc_total * c.float() * f * (1 - f),
             dc_total * i * (1 - g * g), dh * tc * o * (1 - o)]
    placed = [None] * 4
    for k in range(4):
        placed[order[k]] = d_pre[k]
    return torch.cat(placed, dim=1), dc_total * f


def gru_forward_reference(a, b, h, bias_a, bias_b, order):
    """(h_new, saved): saved is [r, z, n, hn] with hn the hidden-side candidate term."""
    hidden = h.shape[-1]
    pa, pb = _biased(a, bias_a), _biased(b, bias_b)
    r = (_gate(pa, order, 0, hidden) + _gate(pb, order, 0, hidden)).sigmoid()
    z = (_gate(pa, order, 1, hidden) + _gate(pb, order, 1, hidden)).sigmoid()
    hn = _gate(pb, order, 2, hidden)
    n = (_gate(pa, order, 2, hidden) + r * hn).tanh()
    h_new = (1 - z) * n + z * h.float()
    out = _out_dtype(a, b, h)
    return h_new.to(out), torch.cat([r, z, n, hn], dim=1).to(out)


def gru_backward_reference(dh, saved, h, order):
    """(d_pre_a, d_pre_b, dh_prev) in the op's gate layout."""
    hidden = h.shape[-1]
    r, z, n, hn = (saved[:, k * hidden:(k + 1) * hidden].float() for k in range(4))
    dh = dh.float()
    dn = dh * (1 - z) * (1 - n * n)
    dz = dh * (h.float() - n) * z * (1 - z)
    dr = dn * hn * r * (1 - r)
    da, db = [None] * 3, [None] * 3
    for k, (ga, gb) in enumerate(((dr, dr), (dz, dz), (dn, dn * r))):
        da[order[k]], db[order[k]] = ga, gb
    return torch.cat(da, dim=1), torch.cat(db, dim=1), dh * z


# ---------------------------------------------------------------- Triton kernels

if triton_installed():
    import triton
    import triton.language as tl

    @triton.jit
    def _sigmoid(x):
        return 1.0 / (1.0 + tl.exp(-x))

    @triton.jit
    def _tanh(x):
        t = tl.exp(-2.0 * tl.abs(x))  # never overflows: |x| large gives t -> 0
        y = (1.0 - t) / (1.0 + t)
        return tl.where(x < 0, -y, y)

    @triton.jit
    def _load_gate(a_ptr, b_ptr, bias_a_ptr, bias_b_ptr, row, col, mask, stride_a, stride_b,
                   chunk, H: tl.constexpr, HAS_BIAS_A: tl.constexpr,
                   HAS_BIAS_B: tl.constexpr):
        """One gate's two pre-activation terms (input side, hidden side), fp32."""
        off = chunk * H + col
        pa = tl.load(a_ptr + row * stride_a + off, mask=mask, other=0.0).to(tl.float32)
        pb = tl.load(b_ptr + row * stride_b + off, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS_A:
            pa += tl.load(bias_a_ptr + off, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS_B:
            pb += tl.load(bias_b_ptr + off, mask=mask, other=0.0).to(tl.float32)
        return pa, pb

    @triton.jit
    def _lstm_forward_kernel(a_ptr, b_ptr, c_ptr, bias_a_ptr, bias_b_ptr, h_out, c_out,
                             gates_out, n, stride_a, stride_b, stride_c,
                             H: tl.constexpr, O0: tl.constexpr, O1: tl.constexpr,
                             O2: tl.constexpr, O3: tl.constexpr, HAS_BIAS_A: tl.constexpr,
                             HAS_BIAS_B: tl.constexpr, BLOCK: tl.constexpr):
        # one program per BLOCK (batch, hidden) elements; each reads its 4 gates' columns
        idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = idx < n
        row, col = idx // H, idx % H
        ia, ib = _load_gate(a_ptr, b_ptr, bias_a_ptr, bias_b_ptr, row, col, mask, stride_a,
                            stride_b, O0, H, HAS_BIAS_A, HAS_BIAS_B)
        fa, fb = _load_gate(a_ptr, b_ptr, bias_a_ptr, bias_b_ptr, row, col, mask, stride_a,
                            stride_b, O1, H, HAS_BIAS_A, HAS_BIAS_B)
        ga, gb = _load_gate(a_ptr, b_ptr, bias_a_ptr, bias_b_ptr, row, col, mask, stride_a,
                            stride_b, O2, H, HAS_BIAS_A, HAS_BIAS_B)
        oa, ob = _load_gate(a_ptr, b_ptr, bias_a_ptr, bias_b_ptr, row, col, mask, stride_a,
                            stride_b, O3, H, HAS_BIAS_A, HAS_BIAS_B)
        i, f, g, o = _sigmoid(ia + ib), _sigmoid(fa + fb), _tanh(ga + gb), _sigmoid(oa + ob)
        c = tl.load(c_ptr + row * stride_c + col, mask=mask, other=0.0).to(tl.float32)
        c_new = f * c + i * g
        h = o * _tanh(c_new)
        dtype = h_out.dtype.element_ty
        tl.store(h_out + idx, h.to(dtype), mask=mask)
        tl.store(c_out + idx, c_new.to(dtype), mask=mask)
        base = gates_out + row * 4 * H + col
        tl.store(base, i.to(dtype), mask=mask)
        tl.store(base + H, f.to(dtype), mask=mask)
        tl.store(base + 2 * H, g.to(dtype), mask=mask)
        tl.store(base + 3 * H, o.to(dtype), mask=mask)

    @triton.jit
    def _lstm_backward_kernel(dh_ptr, dc_ptr, gates_ptr, c_ptr, c_new_ptr, d_pre_out,
                              dc_prev_out, n, stride_c, H: tl.constexpr, O0: tl.constexpr,
                              O1: tl.constexpr, O2: tl.constexpr, O3: tl.constexpr,
                              BLOCK: tl.constexpr):
        idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = idx < n
        row, col = idx // H, idx % H
        base = gates_ptr + row * 4 * H + col
        i = tl.load(base, mask=mask, other=0.0).to(tl.float32)
        f = tl.load(base + H, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(base + 2 * H, mask=mask, other=0.0).to(tl.float32)
        o = tl.load(base + 3 * H, mask=mask, other=0.0).to(tl.float32)
        c = tl.load(c_ptr + row * stride_c + col, mask=mask, other=0.0).to(tl.float32)
        tc = _tanh(tl.load(c_new_ptr + idx, mask=mask, other=0.0).to(tl.float32))
        dh = tl.load(dh_ptr + idx, mask=mask, other=0.0).to(tl.float32)
        dc = tl.load(dc_ptr + idx, mask=mask, other=0.0).to(tl.float32) + dh * o * (1 - tc * tc)
        out = d_pre_out + row * 4 * H + col
        dtype = d_pre_out.dtype.element_ty
        tl.store(out + O0 * H, (dc * g * i * (1 - i)).to(dtype), mask=mask)
        tl.store(out + O1 * H, (dc * c * f * (1 - f)).to(dtype), mask=mask)
        tl.store(out + O2 * H, (dc * i * (1 - g * g)).to(dtype), mask=mask)
        tl.store(out + O3 * H, (dh * tc * o * (1 - o)).to(dtype), mask=mask)
        tl.store(dc_prev_out + idx, (dc * f).to(dc_prev_out.dtype.element_ty), mask=mask)

    @triton.jit
    def _gru_forward_kernel(a_ptr, b_ptr, h_ptr, bias_a_ptr, bias_b_ptr, h_out, saved_out,
                            n, stride_a, stride_b, stride_h, H: tl.constexpr,
                            O0: tl.constexpr, O1: tl.constexpr, O2: tl.constexpr,
                            HAS_BIAS_A: tl.constexpr, HAS_BIAS_B: tl.constexpr,
                            BLOCK: tl.constexpr):
        idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = idx < n
        row, col = idx // H, idx % H
        ra, rb = _load_gate(a_ptr, b_ptr, bias_a_ptr, bias_b_ptr, row, col, mask, stride_a,
                            stride_b, O0, H, HAS_BIAS_A, HAS_BIAS_B)
        za, zb = _load_gate(a_ptr, b_ptr, bias_a_ptr, bias_b_ptr, row, col, mask, stride_a,
                            stride_b, O1, H, HAS_BIAS_A, HAS_BIAS_B)
        na, hn = _load_gate(a_ptr, b_ptr, bias_a_ptr, bias_b_ptr, row, col, mask, stride_a,
                            stride_b, O2, H, HAS_BIAS_A, HAS_BIAS_B)
        r, z = _sigmoid(ra + rb), _sigmoid(za + zb)
        n_gate = _tanh(na + r * hn)
        h = tl.load(h_ptr + row * stride_h + col, mask=mask, other=0.0).to(tl.float32)
        dtype = h_out.dtype.element_ty
        tl.store(h_out + idx, ((1 - z) * n_gate + z * h).to(dtype), mask=mask)
        base = saved_out + row * 4 * H + col
        tl.store(base, r.to(dtype), mask=mask)
        tl.store(base + H, z.to(dtype), mask=mask)
        tl.store(base + 2 * H, n_gate.to(dtype), mask=mask)
        tl.store(base + 3 * H, hn.to(dtype), mask=mask)

    @triton.jit
    def _gru_backward_kernel(dh_ptr, saved_ptr, h_ptr, da_out, db_out, dh_prev_out, n,
                             stride_h, H: tl.constexpr, O0: tl.constexpr, O1: tl.constexpr,
                             O2: tl.constexpr, BLOCK: tl.constexpr):
        idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = idx < n
        row, col = idx // H, idx % H
        base = saved_ptr + row * 4 * H + col
        r = tl.load(base, mask=mask, other=0.0).to(tl.float32)
        z = tl.load(base + H, mask=mask, other=0.0).to(tl.float32)
        n_gate = tl.load(base + 2 * H, mask=mask, other=0.0).to(tl.float32)
        hn = tl.load(base + 3 * H, mask=mask, other=0.0).to(tl.float32)
        h = tl.load(h_ptr + row * stride_h + col, mask=mask, other=0.0).to(tl.float32)
        dh = tl.load(dh_ptr + idx, mask=mask, other=0.0).to(tl.float32)
        dn = dh * (1 - z) * (1 - n_gate * n_gate)
        dz = dh * (h - n_gate) * z * (1 - z)
        dr = dn * hn * r * (1 - r)
        dtype = da_out.dtype.element_ty
        out_a, out_b = da_out + row * 3 * H + col, db_out + row * 3 * H + col
        tl.store(out_a + O0 * H, dr.to(dtype), mask=mask)
        tl.store(out_b + O0 * H, dr.to(dtype), mask=mask)
        tl.store(out_a + O1 * H, dz.to(dtype), mask=mask)
        tl.store(out_b + O1 * H, dz.to(dtype), mask=mask)
        tl.store(out_a + O2 * H, dn.to(dtype), mask=mask)
        tl.store(out_b + O2 * H, (dn * r).to(dtype), mask=mask)
        tl.store(dh_prev_out + idx, (dh * z).to(dh_prev_out.dtype.element_ty), mask=mask)


_BLOCK = 1024  # 8 elements per thread at 4 warps: 128-bit accesses for bf16 and fp16


def _grid(n: int) -> tuple[int]:
    return ((n + _BLOCK - 1) // _BLOCK,)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` with unit column stride (rows may be strided, e.g. a time step of a batch-first
    projection), so a kernel addresses it with one row stride."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _use_triton(*tensors: torch.Tensor) -> bool:
    return triton_runs_on(tensors[0].device)


def _into(results: tuple, out: tuple | None) -> tuple:
    """``results`` copied into ``out`` (the caller's buffers) where it gives them."""
    if out is None:
        return results
    for buffer, value in zip(out, results):
        buffer.copy_(value)
    return out


def lstm_forward(a, b, c, bias_a, bias_b, order, out=None):
    """The forward step: Triton where it runs, else the reference (same outputs); ``out``:
    contiguous (h, c_new, gates) buffers to write instead of new ones (a sequence's step)."""
    if not _use_triton(a):
        return _into(lstm_forward_reference(a, b, c, bias_a, bias_b, order), out)
    a, b, c = _rows(a), _rows(b), _rows(c)
    batch, hidden = c.shape
    dtype = _out_dtype(a, b, c)
    h, c_new, gates = out or (torch.empty(batch, hidden, dtype=dtype, device=a.device),
                              torch.empty(batch, hidden, dtype=dtype, device=a.device),
                              torch.empty(batch, 4 * hidden, dtype=dtype, device=a.device))
    n = batch * hidden
    _lstm_forward_kernel[_grid(n)](
        a, b, c, a if bias_a is None else bias_a, a if bias_b is None else bias_b, h, c_new,
        gates, n, a.stride(0), b.stride(0), c.stride(0), H=hidden, O0=order[0], O1=order[1],
        O2=order[2], O3=order[3], HAS_BIAS_A=bias_a is not None,
        HAS_BIAS_B=bias_b is not None, BLOCK=_BLOCK)
    return h, c_new, gates


def lstm_backward(dh, dc, gates, c, c_new, order, out=None):
    """The backward step; ``out``: contiguous (d_pre, dc_prev) buffers to write (their
    dtype is what is stored; fp32 when new)."""
    if not _use_triton(gates):
        return _into(lstm_backward_reference(dh, dc, gates, c, c_new, order), out)
    dh, dc, c = dh.contiguous(), dc.contiguous(), _rows(c)
    batch, hidden = c.shape
    d_pre, dc_prev = out or (
        torch.empty(batch, 4 * hidden, dtype=torch.float32, device=gates.device),
        torch.empty(batch, hidden, dtype=torch.float32, device=gates.device))
    n = batch * hidden
    _lstm_backward_kernel[_grid(n)](
        dh, dc, gates, c, c_new, d_pre, dc_prev, n, c.stride(0), H=hidden, O0=order[0],
        O1=order[1], O2=order[2], O3=order[3], BLOCK=_BLOCK)
    return d_pre, dc_prev


def gru_forward(a, b, h, bias_a, bias_b, order, out=None):
    """As :func:`lstm_forward`; ``out``: (h_new, saved) buffers."""
    if not _use_triton(a):
        return _into(gru_forward_reference(a, b, h, bias_a, bias_b, order), out)
    a, b, h = _rows(a), _rows(b), _rows(h)
    batch, hidden = h.shape
    dtype = _out_dtype(a, b, h)
    h_new, saved = out or (torch.empty(batch, hidden, dtype=dtype, device=a.device),
                           torch.empty(batch, 4 * hidden, dtype=dtype, device=a.device))
    n = batch * hidden
    _gru_forward_kernel[_grid(n)](
        a, b, h, a if bias_a is None else bias_a, a if bias_b is None else bias_b, h_new,
        saved, n, a.stride(0), b.stride(0), h.stride(0), H=hidden, O0=order[0],
        O1=order[1], O2=order[2], HAS_BIAS_A=bias_a is not None,
        HAS_BIAS_B=bias_b is not None, BLOCK=_BLOCK)
    return h_new, saved


def gru_backward(dh, saved, h, order, out=None):
    """As :func:`lstm_backward`; ``out``: (da, db, dh_prev) buffers."""
    if not _use_triton(saved):
        return _into(gru_backward_reference(dh, saved, h, order), out)
    dh, h = dh.contiguous(), _rows(h)
    batch, hidden = h.shape
    da, db, dh_prev = out or (
        torch.empty(batch, 3 * hidden, dtype=torch.float32, device=saved.device),
        torch.empty(batch, 3 * hidden, dtype=torch.float32, device=saved.device),
        torch.empty(batch, hidden, dtype=torch.float32, device=saved.device))
    n = batch * hidden
    _gru_backward_kernel[_grid(n)](
        dh, saved, h, da, db, dh_prev, n, h.stride(0), H=hidden, O0=order[0], O1=order[1],
        O2=order[2], BLOCK=_BLOCK)
    return da, db, dh_prev


# ---------------------------------------------------------------- the custom ops

def _grad_or_zeros(grad: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like) if grad is None else grad


def _bias_dtypes(*biases: torch.Tensor | None) -> tuple[torch.dtype | None, ...]:
    """What backward needs to know of the biases (kept instead of the tensors themselves)."""
    return tuple(None if b is None else b.dtype for b in biases)


def _bias_grad(d_pre: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor | None:
    return None if dtype is None else d_pre.sum(0).to(dtype)


@torch.library.custom_op("fxopt::lstm_cell", mutates_args=())
def lstm_cell(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, bias_a: torch.Tensor | None,
              bias_b: torch.Tensor | None, order: list[int]
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One LSTM step after its projections: (h, c_new, gates saved for backward)."""
    return lstm_forward(a, b, c, bias_a, bias_b, order)


@lstm_cell.register_fake
def _(a, b, c, bias_a, bias_b, order):
    out = _out_dtype(a, b, c)
    h = c.new_empty(c.shape, dtype=out)
    return h, c.new_empty(c.shape, dtype=out), a.new_empty((c.shape[0], 4 * c.shape[1]),
                                                            dtype=out)


@torch.library.custom_op("fxopt::lstm_cell_backward", mutates_args=())
def lstm_cell_backward(dh: torch.Tensor, dc: torch.Tensor, gates: torch.Tensor,
                       c: torch.Tensor, c_new: torch.Tensor, order: list[int]
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of the gate pre-activations (the op's layout) and of the previous cell state,
    both fp32."""
    return lstm_backward(dh, dc, gates, c, c_new, order)


@lstm_cell_backward.register_fake
def _(dh, dc, gates, c, c_new, order):
    return (gates.new_empty(gates.shape, dtype=torch.float32),
            c.new_empty(c.shape, dtype=torch.float32))


def _lstm_setup_context(ctx, inputs, output):
    a, b, c, bias_a, bias_b, order = inputs
    h, c_new, gates = output
    ctx.save_for_backward(gates, c, c_new)
    ctx.order, ctx.dtypes = order, (a.dtype, b.dtype, c.dtype)
    ctx.bias_dtypes = _bias_dtypes(bias_a, bias_b)


def _lstm_backward(ctx, dh, dc, _dgates, step=lstm_cell_backward):
    """The op's gradients from ``step`` (the backward op, or in the fusible form its
    reference), cast back to the inputs' dtypes, with the biases' column sums."""
    gates, c, c_new = ctx.saved_tensors
    d_pre, dc_prev = step(_grad_or_zeros(dh, c_new), _grad_or_zeros(dc, c_new), gates, c,
                          c_new, ctx.order)
    a_dtype, b_dtype, c_dtype = ctx.dtypes
    bias_a, bias_b = ctx.bias_dtypes
    return (d_pre.to(a_dtype), d_pre.to(b_dtype), dc_prev.to(c_dtype),
            _bias_grad(d_pre, bias_a), _bias_grad(d_pre, bias_b), None)


lstm_cell.register_autograd(_lstm_backward, setup_context=_lstm_setup_context)


@torch.library.custom_op("fxopt::gru_cell", mutates_args=())
def gru_cell(a: torch.Tensor, b: torch.Tensor, h: torch.Tensor, bias_a: torch.Tensor | None,
             bias_b: torch.Tensor | None, order: list[int]
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """One GRU step after its projections: (h_new, [r, z, n, hn] saved for backward)."""
    return gru_forward(a, b, h, bias_a, bias_b, order)


@gru_cell.register_fake
def _(a, b, h, bias_a, bias_b, order):
    out = _out_dtype(a, b, h)
    return h.new_empty(h.shape, dtype=out), h.new_empty((h.shape[0], 4 * h.shape[1]),
                                                        dtype=out)


@torch.library.custom_op("fxopt::gru_cell_backward", mutates_args=())
def gru_cell_backward(dh: torch.Tensor, saved: torch.Tensor, h: torch.Tensor,
                      order: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of the input-side and hidden-side pre-activations and of the previous
    hidden state (through the gate algebra only), all fp32."""
    return gru_backward(dh, saved, h, order)


@gru_cell_backward.register_fake
def _(dh, saved, h, order):
    shape = (h.shape[0], 3 * h.shape[1])
    return (saved.new_empty(shape, dtype=torch.float32),
            saved.new_empty(shape, dtype=torch.float32),
            h.new_empty(h.shape, dtype=torch.float32))


def _gru_setup_context(ctx, inputs, output):
    a, b, h, bias_a, bias_b, order = inputs
    ctx.save_for_backward(output[1], h)
    ctx.order, ctx.dtypes = order, (a.dtype, b.dtype, h.dtype)
    ctx.bias_dtypes = _bias_dtypes(bias_a, bias_b)


def _gru_backward(ctx, dh, _dsaved, step=gru_cell_backward):
    """As :func:`_lstm_backward`, for the GRU."""
    saved, h = ctx.saved_tensors
    da, db, dh_prev = step(_grad_or_zeros(dh, h), saved, h, ctx.order)
    a_dtype, b_dtype, h_dtype = ctx.dtypes
    bias_a, bias_b = ctx.bias_dtypes
    return (da.to(a_dtype), db.to(b_dtype), dh_prev.to(h_dtype), _bias_grad(da, bias_a),
            _bias_grad(db, bias_b), None)


gru_cell.register_autograd(_gru_backward, setup_context=_gru_setup_context)


# ---------------------------------------------------------------- fusible forms

def _fusible(name, forward_reference, setup_context, backward, backward_reference):
    """An autograd Function computing a cell op by its references, as torch ops AOTAutograd
    traces through: it saves what the op saves (``setup_context``), its last output (the
    tensors saved for backward) is not differentiable, and ``backward`` is the op's own
    with the reference as its step."""
    def forward(ctx, *inputs):
        output = forward_reference(*inputs)
        setup_context(ctx, inputs, output)
        ctx.mark_non_differentiable(output[-1])
        return output

    def backward_by_reference(ctx, *grads):
        return backward(ctx, *grads, step=backward_reference)

    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward), "backward": staticmethod(backward_by_reference)})


_FusibleLstmCell = _fusible("_FusibleLstmCell", lstm_forward_reference, _lstm_setup_context,
                            _lstm_backward, lstm_backward_reference)
_FusibleGruCell = _fusible("_FusibleGruCell", gru_forward_reference, _gru_setup_context,
                           _gru_backward, gru_backward_reference)


def fusible_lstm_cell(a, b, c, bias_a, bias_b, order):
    """``fxopt::lstm_cell``'s outputs, computed by torch ops a code generator fuses."""
    return _FusibleLstmCell.apply(a, b, c, bias_a, bias_b, order)


def fusible_gru_cell(a, b, h, bias_a, bias_b, order):
    """``fxopt::gru_cell``'s outputs, computed by torch ops a code generator fuses."""
    return _FusibleGruCell.apply(a, b, h, bias_a, bias_b, order)
