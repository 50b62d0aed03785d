"""``fxopt::linear_cross_entropy`` against eager ``cross_entropy(linear(h, W, b))`` with the
logits stored, and its Triton kernels against their torch references.

Odd shapes (7 tokens x 131 vocabulary, 33 x 1000), blocks narrower than the vocabulary (so
the running log-sum-exp and the per-block gradients are exercised across blocks), a bias,
label smoothing, ignored tokens, both reductions. The kernels run under
``TRITON_INTERPRET=1`` on the CPU, and compile ahead of time for sm_80 and sm_90.
"""

import pytest
import torch
import torch.nn.functional as F

from fxopt.kernels import fuse_linear_cross_entropy as lce
from fxopt.kernels import fuse_linear_cross_entropy_with_grads as with_grads
from fxopt.kernels import triton_installed, triton_runs_on

SHAPES = [(7, 5, 131), (33, 16, 1000)]
GRADIENT_ROUNDOFF = 32  # fp32 eps of a gradient's largest entry (see the test using it)


def _inputs(tokens, hidden, vocab, bias, seed=0):
    generator = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=generator, requires_grad=True)
    weight = torch.randn(vocab, hidden, generator=generator, requires_grad=True)
    b = torch.randn(vocab, generator=generator, requires_grad=True) if bias else None
    labels = torch.randint(0, vocab, (tokens,), generator=generator)
    labels[::3] = -100
    return h, weight, b, labels


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_loss_and_gradients_equal_eager_across_blocks(shape, bias, smoothing, reduction):
    h, weight, b, labels = _inputs(*shape, bias)
    block_bytes = 4 * shape[0] * 37  # 37 columns a block: blocks that do not divide V
    assert lce.block_columns(shape[0], shape[2], block_bytes) < shape[2]
    loss, lse = lce.linear_cross_entropy(h, weight, b, labels, -100, smoothing, reduction,
                                         torch.float32, torch.float32, block_bytes)
    expected = lce.reference(h, weight, b, labels, -100, smoothing, reduction)
    inputs = [t for t in (h, weight, b) if t is not None]
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, torch.logsumexp(h @ weight.T + (0 if b is None else b), 1))
    exact = [t.detach().double().requires_grad_() for t in inputs]
    truth = torch.autograd.grad(3.0 * F.cross_entropy(
        F.linear(*exact), labels, ignore_index=-100, label_smoothing=smoothing,
        reduction=reduction), exact)
    for got, eager, want in zip(torch.autograd.grad(3.0 * loss, inputs),
                                torch.autograd.grad(3.0 * expected, inputs), truth):
        # fp32 rounding, normwise: each entry is a sum over the vocabulary (dh) or the
        # tokens (dW) of products whose softmax factor carries the logits' rounding, so its
        # error scales with the gradient's largest entry, not its own (an entry that
        # cancels to 0.02 beside entries of 14). Off fp64, eager's fp32 on an AVX2 CPU is
        # up to 18 eps of the largest entry here, the kernels up to 9 (an entrywise 1e-4
        # failed eager's on that CPU)
        bound = GRADIENT_ROUNDOFF * torch.finfo(torch.float32).eps * want.abs().max()
        for fp32 in (got, eager):
            torch.testing.assert_close(fp32.double(), want, rtol=0, atol=bound.item())


def _op_body(h, weight, labels):
    """(loss, [dh, dW]) of the op's forward and backward bodies (aten calls, no custom op)."""
    loss, lse = lce._forward(h.detach(), weight.detach(), None, labels, -100, 0.0, "mean",
                             torch.float32, torch.float32, 4 * 33 * 37, 0.0)
    return loss, lce._backward(torch.ones(()), h.detach(), weight.detach(), None, labels,
                               lse, -100, 0.0, "mean", torch.float32, 4 * 33 * 37,
                               (True, True, False), 0.0)


def test_a_confident_softmax_takes_no_exponent_below_fp32s_normal_range(monkeypatch):
    """Logits spread over hundreds (a confident model): most softmax entries are below
    fp32's smallest normal number, and ATen's CPU ``exp_`` of such an exponent is 100-250x
    slower per element (the Llama step's slowdown, issue 29 item 3). The references clamp
    exponents at EXP_FLOOR first: no exponential the op takes is subnormal, and loss and
    gradients still equal eager's (the clamp moves entries below 1.6e-38 to 1.6e-38).
    Before the clamp, exponents reached below -1000 here."""
    from torch.utils._python_dispatch import TorchDispatchMode

    h, weight, _, labels = _inputs(33, 16, 1000, False)
    with torch.no_grad():
        weight.mul_(40.0)
    exponents = []

    class Exponents(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.exp_.default, torch.ops.aten.exp.default):
                exponents.append(float(args[0].min()))
            return func(*args, **(kwargs or {}))

    with Exponents():  # the op's body, so the dispatch mode sees its aten calls
        loss, grads = _op_body(h, weight, labels)
    assert exponents and min(exponents) >= lce.EXP_FLOOR
    assert torch.finfo(torch.float32).tiny <= torch.tensor(lce.EXP_FLOOR).exp()
    # unclamped: each softmax entry moves by less than exp(-87) ~ 1.6e-38, each gradient
    # entry (a sum of at most 1000 of them times |W|, |h| < 1e3) by less than 1e-30
    monkeypatch.setattr(lce, "EXP_FLOOR", float("-inf"))
    unclamped_loss, unclamped = _op_body(h, weight, labels)
    assert torch.equal(loss, unclamped_loss)
    for a, b in zip(grads, unclamped, strict=True):
        assert float((a - b).abs().max()) < 1e-30
    expected = lce.reference(h, weight, None, labels)
    torch.testing.assert_close(loss, expected.detach(), rtol=1e-5, atol=1e-5)
    # fp32 rounding of sums of products 40x the other test's: relative to the largest
    for got, want in zip(grads, torch.autograd.grad(expected, (h, weight))):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("form", ["recompute", "with_grads"])
def test_softcapped_logits_equal_eagers_across_pieces(form):
    """Gemma 2's final-logit soft-capping, ``cap * tanh(logits / cap)``, folded into both
    forms: loss and gradients equal eager's with the capped logits stored, at a cap the
    logits reach (|z| up to about 15 against a cap of 5, so tanh saturates), across
    vocabulary blocks or token chunks, with a bias, label smoothing and ignored tokens."""
    _assert_softcapped_form_equals_eager(form, *_inputs(33, 16, 1000, True), columns=37,
                                         rows=3)


def _assert_softcapped_form_equals_eager(form, h, weight, b, labels, columns, rows):
    """``form`` at a cap of 5 with W scaled 3x (so the cap saturates), cut in blocks of
    ``columns`` vocabulary columns or chunks of ``rows`` tokens, against eager with the
    fp32 capped logits stored."""
    tokens, vocab = h.shape[0], weight.shape[0]
    with torch.no_grad():
        weight.mul_(3.0)
    if form == "recompute":
        loss = lce.linear_cross_entropy(h, weight, b, labels, -100, 0.1, "mean",
                                        torch.float32, torch.float32, 4 * tokens * columns,
                                        5.0)[0]
    else:
        loss = _with_grads(h, weight, b, labels, 0.1, "mean", torch.float32,
                           4 * vocab * rows, softcap=5.0)[0]
    expected = lce.reference(h, weight, b, labels, -100, 0.1, "mean", softcap=5.0)
    assert float((expected - lce.reference(h, weight, b, labels, -100, 0.1, "mean")).abs()) \
        > 1.0  # the cap changes the loss: it is applied, not ignored
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    # sums over the vocabulary in another order: fp32 rounding relative to the largest entry
    for got, want in zip(torch.autograd.grad(loss, (h, weight, b)),
                         torch.autograd.grad(expected, (h, weight, b))):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))


def test_gradients_only_where_wanted():
    h, weight, b, labels = _inputs(7, 5, 131, True)
    weight.requires_grad_(False)
    loss, _ = lce.linear_cross_entropy(h, weight, b, labels, -100, 0.0, "sum", torch.float32,
                                       torch.float32, 0)
    dh, db = torch.autograd.grad(loss, (h, b))
    expected = lce.reference(h, weight, b, labels, reduction="sum")
    want_dh, want_db = torch.autograd.grad(expected, (h, b))
    torch.testing.assert_close(dh, want_dh)
    torch.testing.assert_close(db, want_db)
    grads = lce.linear_cross_entropy_backward(torch.tensor(1.0), h, weight, b, labels,
                                              torch.zeros(7), -100, 0.0, "sum",
                                              torch.float32, 0, False, False, True)
    assert [g.shape for g in grads] == [b.shape]


def test_block_columns_bound_a_block_to_a_64th_of_the_logits():
    assert lce.block_columns(512, 50257) == 512 * 50257 * 4 // 64 // (512 * 4)
    # relative only: Llama 3's head at 8192 tokens, bf16 in place on CUDA (2 bytes a logit)
    assert lce.block_columns(8192, 128256, logit_bytes=lce.temporary_bytes(2, True)) == \
        128256 // 32
    assert lce.block_columns(4, 5000) == lce.MIN_BLOCK_COLUMNS  # not narrower than this
    assert lce.block_columns(4, 100) == 100


def test_bad_arguments_raise():
    h, weight, _, labels = _inputs(7, 5, 131, False)
    with pytest.raises(ValueError, match="reduction 'none'"):
        lce.linear_cross_entropy(h, weight, None, labels, -100, 0.0, "none", torch.float32,
                                 torch.float32, 0)
    with pytest.raises(ValueError, match="expected h"):
        lce.linear_cross_entropy(h, weight.T, None, labels, -100, 0.0, "mean", torch.float32,
                                 torch.float32, 0)


# ------------------------------------------------------- the with-grads form (chunks of rows)

def _with_grads(h, weight, b, labels, smoothing, reduction, compute_dtype, block_bytes,
                wants=(True, True, True), softcap=0.0):
    return with_grads.linear_cross_entropy_with_grads(
        h, weight, b, labels, -100, smoothing, reduction, compute_dtype, torch.float32,
        block_bytes, *wants, softcap)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_with_grads_loss_and_gradients_equal_eager_across_chunks(shape, bias, smoothing,
                                                                  reduction):
    h, weight, b, labels = _inputs(*shape, bias)
    block_bytes = 4 * shape[2] * 3  # 3 rows a chunk: chunks that do not divide the tokens
    assert with_grads.chunk_rows(shape[0], shape[2], block_bytes) == 3
    loss = _with_grads(h, weight, b, labels, smoothing, reduction, torch.float32,
                       block_bytes)[0]
    expected = lce.reference(h, weight, b, labels, -100, smoothing, reduction)
    inputs = [t for t in (h, weight, b) if t is not None]
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    # dh sums V products whose signs cancel (softmax, less the one-hot and eps / V): fp32
    # rounding of that sum in another order, relative to the largest entry, not to each
    for got, want in zip(torch.autograd.grad(3.0 * loss, inputs),
                         torch.autograd.grad(3.0 * expected, inputs)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("form", ["recompute", "with_grads"])
def test_bf16_gradients_within_bf16_rounding_of_eagers(form):
    """Both forms round the logits' gradient (times each token's scale) to bf16 before the
    head's matmuls, as eager's autocast backward does, and accumulate in fp32; eager's
    rounds the gradient of its own fp32 log-softmax, this op's comes from exponentials summed
    in another order. Each entry of dz may therefore round to a neighbouring bf16 value:
    2**-8 relative, so the gradients differ by up to 2**-8 of the largest gradient entry
    (atol) and bf16's rtol."""
    _assert_bf16_form_equals_eager(form, *_inputs(33, 16, 1000, True), pieces=3)


def _assert_bf16_form_equals_eager(form, h, weight, b, labels, pieces):
    """``form`` in bf16 against eager with the logits stored, cut in about ``pieces``
    vocabulary blocks or token chunks, within the bound the CPU test derives."""
    tokens, vocab = h.shape[0], weight.shape[0]
    if form == "recompute":
        loss = lce.linear_cross_entropy(h, weight, b, labels, -100, 0.1, "mean",
                                        torch.bfloat16, torch.float32,
                                        4 * tokens * (vocab // pieces))[0]
    else:
        loss = _with_grads(h, weight, b, labels, 0.1, "mean", torch.bfloat16,
                           6 * vocab * (tokens // pieces))[0]
    expected = lce.reference(h, weight, b, labels, -100, 0.1, "mean", torch.bfloat16)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    for got, want in zip(torch.autograd.grad(loss, (h, weight, b)),
                         torch.autograd.grad(expected, (h, weight, b))):
        assert got.dtype == want.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1.6e-2,
                                   atol=2**-8 * want.abs().max().item())


def test_with_grads_computes_only_the_gradients_asked_for():
    h, weight, b, labels = _inputs(7, 5, 131, True)
    loss, dh, dw, db = _with_grads(h, weight, b, labels, 0.0, "sum", torch.float32, 0,
                                   wants=(True, False, True))
    assert dw.numel() == 0 and dh.shape == h.shape and db.shape == b.shape
    # every output fp32, as the fake implementation says, whatever h's dtype; and two
    # gradients not asked for (a frozen head without a bias) two tensors, not one aliased
    for bias, wants in ((b.detach(), (True, False, True)), (None, (True, False, False))):
        checks = torch.library.opcheck(with_grads.linear_cross_entropy_with_grads, (
            h.detach().bfloat16(), weight.detach(), bias, labels, -100, 0.0, "sum",
            torch.float32, torch.float32, 0, *wants),
            test_utils=("test_schema", "test_faketensor"))
        assert set(checks.values()) == {"SUCCESS"}, checks
    expected = lce.reference(h, weight, b, labels, reduction="sum")
    for got, want in zip((dh, db), torch.autograd.grad(expected, (h, b))):
        torch.testing.assert_close(got, want)
    with pytest.raises(RuntimeError, match="gradient of weight"):
        torch.autograd.grad(loss, weight)


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["recompute", "with_grads"])
def test_both_forms_on_cuda_in_bf16_match_eager(form):
    """The CUDA path: Triton's per-block math and the matmuls on bf16 operands with fp32
    results (``mm_fp32``'s ``out_dtype`` GEMMs); bound as the CPU bf16 test's."""
    cuda = [t.detach().cuda().requires_grad_(t.requires_grad)
            for t in _inputs(333, 64, 5003, True)]
    _assert_bf16_form_equals_eager(form, *cuda, pieces=4)


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["recompute", "with_grads"])
def test_softcapped_forms_on_cuda_match_eager(form):
    """The soft-capped Triton kernels on a GPU (fp32 logits, so eager caps them in fp32
    too): as the CPU test of both forms, across pieces, at a saturating cap."""
    cuda = [t.detach().cuda().requires_grad_(t.requires_grad) if t.is_floating_point()
            else t.cuda() for t in _inputs(333, 64, 5003, True)]
    _assert_softcapped_form_equals_eager(form, *cuda, columns=1000, rows=100)


@pytest.mark.parametrize("form", ["recompute", "with_grads"])
def test_a_second_derivative_is_refused_not_silently_wrong(form):
    h, weight, b, labels = _inputs(7, 5, 131, False)
    loss = lce.linear_cross_entropy(h, weight, b, labels, -100, 0.0, "mean", torch.float32,
                                    torch.float32, 0)[0] if form == "recompute" else \
        _with_grads(h, weight, b, labels, 0.0, "mean", torch.float32, 0)[0]
    with pytest.raises(RuntimeError, match="create_graph=True"):
        torch.autograd.grad(loss, h, create_graph=True)


def test_accumulating_in_fp32_where_the_gemm_cannot_add_to_it():
    """The CPU's GEMMs take no out_dtype: the probe says so, and bf16 operands accumulate
    into the fp32 sum exactly as fp32 operands of the same values do."""
    assert not lce.fused_fp32_accumulate(torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(9, 7, generator=generator).bfloat16() for _ in range(2))
    out = lce.add_mm_fp32(torch.ones(9, 9), a, b.t())
    torch.testing.assert_close(out, 1 + a.float() @ b.float().t(), rtol=0, atol=0)


def test_chunk_rows_bound_a_chunk_to_a_16th_of_the_tokens_but_not_below_the_minimum():
    assert with_grads.chunk_rows(8192, 50257) == 8192 // 16
    assert with_grads.chunk_rows(1024, 32000) == with_grads.MIN_CHUNK_ROWS
    assert with_grads.chunk_rows(100, 32000) == 100
    # on CUDA a bf16 chunk's temporaries are its logits, 2 bytes each: twice the rows
    assert with_grads.chunk_rows(8192, 50257, logit_bytes=lce.temporary_bytes(
        2, triton=True)) == 8192 // 8
    assert lce.temporary_bytes(2, triton=False) == 6
    assert with_grads.kept_bytes(8192, 768, 50257, True, True, False) == \
        4 * (8192 + 50257) * 768


# ------------------------------------------------------------------ the Triton kernels

@pytest.mark.skipif(not triton_runs_on("cpu"),
                    reason="Triton kernels run on the CPU only with TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("smoothing, softcap", [(0.0, 0.0), (0.1, 0.0), (0.1, 2.5)])
def test_triton_kernels_equal_references_at_odd_shapes(dtype, smoothing, softcap):
    from fxopt.kernels import fuse_linear_cross_entropy_triton as kernels

    generator = torch.Generator().manual_seed(1)
    tokens, vocab, v0 = 7, 131, 40
    logits = (3 * torch.randn(tokens, vocab + 9, generator=generator)).to(dtype)[:, :vocab]
    labels = torch.randint(0, 200, (tokens,), generator=generator)
    labels[2] = -100
    states = []
    for fold in (kernels.lse_block, lce.lse_block_reference):
        state = [torch.full((tokens,), 1.5), torch.full((tokens,), 2.0), torch.ones(tokens),
                 torch.zeros(tokens)]
        fold(logits.clone(), labels, v0, *state, bool(smoothing), softcap=softcap)
        states.append(state)
    # the kernel's tanh (from one exponential) is within 2 eps of torch's, so a capped logit
    # within 2 eps x softcap: the running sum of a row's logits (label smoothing's) within
    # that times the row's columns
    atol = max(1e-6, vocab * 2 * torch.finfo(torch.float32).eps * softcap)
    for got, want in zip(*states):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=atol)
    lse = torch.randn(tokens, generator=generator) + 5
    scale = torch.rand(tokens, generator=generator) * 3
    scale[2] = 0.0
    outs = [torch.empty(tokens, vocab, dtype=dtype), torch.empty(tokens, vocab)]
    kernels.dlogits_block(logits, outs[0], labels, v0, lse, smoothing, 1000, scale,
                          softcap=softcap)
    lce.dlogits_block_reference(logits, outs[1], labels, v0, lse, smoothing, 1000, scale,
                                softcap)
    # a bf16 output: Triton's interpreter truncates fp32 to bf16 (a GPU rounds to nearest),
    # so under one bf16 ulp of the fp32 value, at most 2**-7 of it
    torch.testing.assert_close(outs[0].float(), outs[1], rtol=1e-6 if dtype == torch.float32
                               else 2**-7, atol=1e-7)
    in_place = logits.clone()
    kernels.dlogits_block(in_place, in_place, labels, v0, lse, smoothing, 1000, scale,
                          softcap=softcap)
    torch.testing.assert_close(in_place, outs[0], rtol=0, atol=0)
    hits = ((labels >= v0) & (labels < v0 + vocab)).sum()
    assert hits >= 2  # target columns inside the block are tested


@pytest.mark.skipif(not triton_runs_on("cpu"),
                    reason="Triton kernels run on the CPU only with TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_with_grads_through_the_triton_kernels_equals_its_torch_path(monkeypatch, dtype):
    """The with-grads form's CUDA branch (a chunk of whole rows through lse_block and
    dlogits_block), run by the interpreter on CPU tensors, against its torch branch."""
    h, weight, b, labels = _inputs(7, 5, 131, True)
    results = []
    for triton in (False, True):
        monkeypatch.setattr(lce, "uses_triton", lambda t, on=triton: on)
        results.append(_with_grads(h, weight, b, labels, 0.1, "mean", dtype, 4 * 131 * 3))
    (loss, *grads), (want_loss, *want_grads) = results
    torch.testing.assert_close(loss, want_loss, rtol=1e-6, atol=1e-6)
    # bf16: the interpreter truncates the logits' gradient to bf16 where torch rounds it to
    # nearest, one bf16 ulp apart at most (2**-7 of an entry): so the gradients, to 2**-7 of
    # the largest
    bound = 1e-6 if dtype == torch.float32 else 2**-7
    for got, want in zip(grads, want_grads):
        torch.testing.assert_close(got, want, rtol=bound, atol=bound * float(want.abs().max()))


@pytest.mark.skipif(not triton_installed(), reason="needs Triton")
def test_at_gpt2s_vocabulary_the_kernels_compile_to_128_bit_accesses_without_spills():
    """The calls as GPT-2's head makes them on CUDA: 50257 columns (odd), rows padded to 16
    bytes (50264 bf16 or 50260 fp32 elements), the span the padded width. Specialized as
    the JIT specializes those calls: aligned pointers, and no integer divisible by 16, so
    only ALIGN (8 bf16 or 4 fp32 elements) tells the compiler the rows are aligned. Without
    the span (the columns themselves, odd) every load and store was one element: 8 x 16-bit
    loads for one 128-bit load (checked before the span existed)."""
    from fxopt.kernels import aot

    specs = [s for name in ("bf16", "fp32") for s in aot.linear_cross_entropy_specs(name, 50257)]
    reports = aot.compile_specs(specs, archs=(80, 90))
    print("\n" + aot.format_table(reports))
    assert len(reports) == 8
    assert [p for r in reports for p in aot.problems(r)] == []
    # the logits in 128-bit loads (at most 4 scalar 32-bit ones: the row's label, state and
    # scale; without the span: 12 in fp32, 8 x 16-bit in bf16), their gradients in 128-bit
    # stores only
    for r in reports:
        assert 128 in r.loads and 16 not in r.loads and r.loads.get(32, 0) <= 4, r
    assert all(set(r.stores) == {128} for r in reports if "dlogits" in r.label), reports


@pytest.mark.skipif(not triton_installed(), reason="needs Triton")
def test_the_softcapped_kernels_compile_as_the_plain_ones_at_gemma_2s_vocabulary():
    """Gemma 2's head (256000 columns, bf16, final logits soft-capped): the soft-cap's tanh
    (one exponential) adds no spill and no scalar access."""
    from fxopt.kernels import aot

    reports = aot.compile_specs(aot.linear_cross_entropy_specs("bf16", 256000, softcap=True),
                                archs=(80, 90))
    print("\n" + aot.format_table(reports))
    assert len(reports) == 4 and all("softcap" in r.label for r in reports)
    assert [p for r in reports for p in aot.problems(r)] == []
    for r in reports:
        assert 128 in r.loads and 16 not in r.loads and r.loads.get(32, 0) <= 4, r
    assert all(set(r.stores) == {128} for r in reports if "dlogits" in r.label), reports


@pytest.mark.skipif(not triton_runs_on("cpu"),
                    reason="Triton kernels run on the CPU only with TRITON_INTERPRET=1")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_span_reads_the_padding_to_no_effect_and_zeroes_its_gradient(dtype):
    """Logits as a prefix of their padded product (131 of 136 columns), the padding full of
    NaN and infinities: with the span, the state and the real columns' gradients equal the
    references', and the padding's gradient is zero (the GEMMs that read it see zeros)."""
    from fxopt.kernels import fuse_linear_cross_entropy_triton as kernels

    generator = torch.Generator().manual_seed(2)
    tokens, cols, padded, v0 = 5, 131, 136, 20
    product = (3 * torch.randn(tokens, padded, generator=generator)).to(dtype)
    product[:, cols:] = torch.tensor([float("nan"), float("inf"), -float("inf"), 7.0, 0.0],
                                     dtype=dtype)
    z = product[:, :cols]
    labels = torch.randint(0, 160, (tokens,), generator=generator)
    states = []
    for fold, span in ((kernels.lse_block, padded), (lce.lse_block_reference, None)):
        state = [torch.full((tokens,), 1.5), torch.full((tokens,), 2.0), torch.ones(tokens),
                 torch.zeros(tokens)]
        fold(z.clone() if span is None else z, labels, v0, *state, True,
             **({} if span is None else {"span": span}))
        states.append(state)
    for got, want in zip(*states):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    lse, scale = torch.randn(tokens, generator=generator) + 5, torch.rand(tokens) * 3
    want = torch.empty(tokens, cols)
    lce.dlogits_block_reference(z, want, labels, v0, lse, 0.1, 1000, scale)
    kernels.dlogits_block(z, z, labels, v0, lse, 0.1, 1000, scale, span=padded)
    # bf16: the interpreter truncates fp32 to bf16 (a GPU rounds to nearest): one ulp
    torch.testing.assert_close(z.float(), want, rtol=1e-6 if dtype == torch.float32
                               else 2**-7, atol=1e-7)
    assert (product[:, cols:] == 0).all()
    with pytest.raises(ValueError, match="does not fit"):
        kernels.lse_block(z, labels, v0, *states[0], True, span=padded + 1)


class _GemmOperands(torch.utils._python_dispatch.TorchDispatchMode):
    """The 2-D tensors every matmul reads or writes (aten's mm and addmm, which F.linear
    and the @ of 2-D tensors reach)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm):
            self.seen += [t for t in (*args, out) if isinstance(t, torch.Tensor) and t.dim() == 2]
        return out


_TRITON_ON_CPU = pytest.mark.skipif(
    not triton_runs_on("cpu"), reason="Triton kernels run on the CPU only with TRITON_INTERPRET=1")


@pytest.mark.parametrize("kernels", ["torch", pytest.param("triton", marks=_TRITON_ON_CPU)])
@pytest.mark.parametrize("form", ["recompute", "with_grads"])
@pytest.mark.parametrize("bias", [False, True])
def test_with_cudas_alignment_every_gemm_sees_aligned_row_strides(monkeypatch, form, bias,
                                                                   kernels):
    """cuBLAS runs a row stride that is no multiple of 16 bytes (GPT-2's 50257 logits) on
    align1 kernels, 6x slower on an H200 (benchmarks/results/gpu_check_h200_2026-11-27.md).
    With CUDA's alignment forced here, both forms pad W's rows: every matmul operand and
    result has a unit stride and a row stride of 4 fp32 elements' multiple, over an odd
    vocabulary in odd blocks and chunks, and the loss and gradients stay eager's; with the
    Triton kernels too (the interpreter), which read and write the padded rows whole."""
    monkeypatch.setattr(lce, "row_alignment", lambda device, itemsize: 16 // itemsize)
    monkeypatch.setattr(lce, "uses_triton", lambda t, on=kernels == "triton": on)
    tokens, hidden, vocab = 23, 16, 131
    h, weight, b, labels = _inputs(tokens, hidden, vocab, bias)
    inputs = [t for t in (h, weight, b) if t is not None]
    detached = [None if t is None else t.detach() for t in (h, weight, b)]
    f32 = torch.float32
    with _GemmOperands() as gemms:  # the ops' bodies: a mode sees a custom op as one call
        if form == "recompute":  # 37 columns a block, rounded up to 40: the last one padded
            loss, lse = lce._forward(*detached, labels, -100, 0.1, "mean", f32, f32,
                                     4 * tokens * 37, 0.0)
            grads = lce._backward(torch.ones(()), *detached, labels, lse, -100, 0.1, "mean",
                                  f32, 4 * tokens * 37, (True, True, bias), 0.0)
        else:  # 5 rows a chunk
            loss, *grads = with_grads._forward(*detached, labels, -100, 0.1, "mean", f32, f32,
                                               4 * vocab * 5, (True, True, bias), 0.0)
            grads = grads[:len(inputs)]
    assert len(gemms.seen) >= 3 * 3
    misaligned = [tuple(t.stride()) for t in gemms.seen
                  if min(t.stride()) != 1 or max(t.stride()) % 4]
    assert misaligned == []
    expected = lce.reference(h, weight, b, labels, -100, 0.1, "mean")
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    # dh sums V products whose signs cancel: fp32 rounding relative to the largest entry
    for got, want in zip(grads, torch.autograd.grad(expected, inputs)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))


def test_the_alignment_is_16_bytes_on_cuda_and_none_elsewhere():
    assert lce.row_alignment(torch.device("cuda", 0), 2) == 8
    assert lce.row_alignment(torch.device("cuda", 0), 4) == 4
    assert lce.row_alignment(torch.device("cpu"), 2) == 1
    w, b = lce.padded_rows(torch.ones(5, 3), torch.ones(5), torch.bfloat16, 8)
    assert w.shape == (8, 3) and w.dtype == torch.bfloat16 and b.shape == (8,)
    assert w[:5].eq(1).all() and w[5:].eq(0).all() and b[5:].eq(0).all()
    same, _ = lce.padded_rows(torch.ones(8, 3), None, torch.float32, 8)
    assert same.shape == (8, 3)
