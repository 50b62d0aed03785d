"""fuse_linear_cross_entropy: every spelling it covers fires and trains like eager (loss and
every gradient); what it declines is declined with its reason; the logits are not kept.

Small heads (hidden 16, vocabulary 97 or 131, odd token counts) under fx code generation,
one under Inductor; transformers' GPT-2 (behind its logging graph break) and Llama.
"""

import pytest
import torch
import torch.nn.functional as F
from models import BF16Autocast
from models import LMHead as Head
from torch import nn

from fxopt.analysis import measure_saved_bytes
from fxopt.testing import assert_same_as_eager

PASS = "fuse_linear_cross_entropy"
ON = {PASS: True, "codegen": "fx"}
V, H = 131, 16


def _verdicts(comparison):
    return [r.verdicts for r in comparison.passes if r.name == PASS]


def _flat_ce(**kw):
    return lambda m, h, y: F.cross_entropy(m.head(h).view(-1, _vocab(m)), y.view(-1), **kw)


def _vocab(m):
    return m.head.weight.shape[0]


def _matmul_ce(m, h, y):  # h @ W.T, hand-written bias, nn.CrossEntropyLoss
    logits = h @ m.head.weight.T + m.head.bias
    return nn.CrossEntropyLoss(ignore_index=5)(logits.flatten(0, 1), y.flatten())


def _old_shift(m, h, y):  # transformers 4.x ForCausalLMLoss: shift the logits
    logits = m.head(h).float()
    shift_logits, shift_labels = logits[..., :-1, :].contiguous(), y[..., 1:].contiguous()
    return F.cross_entropy(shift_logits.view(-1, _vocab(m)), shift_labels.view(-1),
                           reduction="sum")


def _new_shift(m, h, y):  # transformers 5.x: pad the labels with ignore_index and shift them
    logits = m.head(h).float().view(-1, _vocab(m))
    labels = F.pad(y, (0, 1), value=-100)[..., 1:].contiguous().view(-1)
    return F.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=0.05)


def _transpose_matmul(m, h, y):
    logits = torch.matmul(h, m.head.weight.transpose(0, 1))
    return F.cross_entropy(logits.reshape(-1, _vocab(m)), y.reshape(-1), reduction="sum",
                           label_smoothing=0.1)


def _added_bias(m, h, y):  # BART: the buffer added after the head, moved to the logits' device
    logits = m.head(h) + m.final_logits_bias.to(h.device)
    return F.cross_entropy(logits.view(-1, _vocab(m)), y.view(-1))


def _scaled_around_bias(m, h, y):  # numbers on both sides of the added bias, one a divisor
    logits = (2.0 * m.head(h) + m.final_logits_bias) / 3.0
    return F.cross_entropy(logits.float().view(-1, _vocab(m)), y.view(-1))


def _labels(batch=3, seq=7, ignored=True, vocab=V):
    labels = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
    if ignored:
        labels[:, ::4] = -100
    return labels


VARIANTS = {
    "linear mean": (_flat_ce(), {}),
    "ignore_index 5, smoothing, sum": (_flat_ce(ignore_index=5, label_smoothing=0.2,
                                                reduction="sum"), {}),
    "matmul W.T + bias": (_matmul_ce, {"bias": True}),
    "transformers 4 shift, upcast": (_old_shift, {}),
    "transformers 5 shift, smoothing": (_new_shift, {}),
    "transpose matmul": (_transpose_matmul, {}),
    "bias": (_flat_ce(), {"bias": True}),
    "tied embeddings": (_flat_ce(), {"tied": True}),
    # folded into the op's h and bias: (h @ W.T + b) * s == (h * s) @ W.T + b * s
    "scaled (Cohere's logit_scale)": (lambda m, h, y: F.cross_entropy(
        (m.head(h) * 0.0625).float().view(-1, _vocab(m)), y.view(-1)), {}),
    "divided, bias (Granite's logits_scaling)": (lambda m, h, y: F.cross_entropy(
        (m.head(h) / 3.0).view(-1, _vocab(m)), y.view(-1)), {"bias": True}),
    "added bias (BART's final_logits_bias)": (_added_bias, {"logits_bias": True}),
    "scaled around an added bias": (_scaled_around_bias, {"logits_bias": True}),
    # the op applies cap * tanh(z / cap) to each block: Gemma 2's final-logit soft-capping
    # (which its logits here, of order 0.1, barely bend), and a cap of 0.2 that saturates
    # them, the numbers around the tanh folded (0.2 * tanh(2.5 z) == 0.2 tanh(z' / 0.2))
    "soft-capped (Gemma 2's final_logit_softcapping)": (lambda m, h, y: F.cross_entropy(
        (torch.tanh(m.head(h) / 30.0) * 30.0).float().view(-1, _vocab(m)), y.view(-1)), {}),
    "soft-capped to saturation, bias, smoothing": (lambda m, h, y: F.cross_entropy(
        (0.2 * torch.tanh(m.head(h) * 2.5)).view(-1, _vocab(m)), y.view(-1),
        label_smoothing=0.1), {"bias": True}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_fires_and_trains_like_eager(variant):
    loss, kwargs = VARIANTS[variant]
    torch.manual_seed(0)
    model = Head(loss, **kwargs)
    tokens = torch.randint(0, V, (3, 7), generator=torch.Generator().manual_seed(2))
    labels = _labels()
    if variant in ("ignore_index 5, smoothing, sum", "matmul W.T + bias"):
        labels[labels == 5] = 6
        labels[labels == -100] = 5  # ignored tokens where ignore_index=5
    comparison = assert_same_as_eager(model, (tokens, labels), ON)
    assert comparison.fired(PASS), _verdicts(comparison)
    assert _verdicts(comparison)[0].count == 1


# 4 x 32 tokens, hidden 8, vocabulary 1000: the gradients of h and W are 8/128 + 8/1000 of
# the logits' bytes, under the pass's 1/8; the variants above (21 tokens, hidden 16) are over
MANY_TOKENS = dict(vocab=1000, hidden=8)
IN_FORWARD = "gradients in the forward"


def _many_tokens(variant, frozen_head=False):
    loss, kwargs = VARIANTS[variant]
    torch.manual_seed(0)
    model = Head(loss, **kwargs, **MANY_TOKENS)
    model.head.weight.requires_grad_(not frozen_head)
    tokens = torch.randint(0, 1000, (4, 32), generator=torch.Generator().manual_seed(2))
    labels = _labels(4, 32, vocab=1000)
    if variant in ("ignore_index 5, smoothing, sum", "matmul W.T + bias"):
        labels[labels == 5] = 6
        labels[labels == -100] = 5
    return model, (tokens, labels)


@pytest.mark.parametrize("variant,frozen_head", [
    ("linear mean", False), ("ignore_index 5, smoothing, sum", False),
    ("matmul W.T + bias", False), ("transformers 5 shift, smoothing", False),
    ("tied embeddings", False), ("scaled around an added bias", False),
    ("soft-capped to saturation, bias, smoothing", False),
    ("linear mean", True),  # fine-tuning with the head frozen: no W gradient made
])
def test_many_tokens_take_the_gradients_in_the_forward_and_train_like_eager(variant,
                                                                            frozen_head):
    model, args = _many_tokens(variant, frozen_head)
    comparison = assert_same_as_eager(model, args, ON)
    (form,) = _verdicts(comparison)[0].counts()
    assert form.endswith(IN_FORWARD), form


def _chosen(tokens, h_grad, w_grad, grad_mode=True):
    """The op and gradient flags the pass puts in place of ``cross_entropy(linear(h, W))``
    for these example values (hidden 8, vocabulary 1000)."""
    from fxopt.passes.fuse_linear_cross_entropy import fuse_linear_cross_entropies

    gm = torch.fx.symbolic_trace(lambda h, w, y: F.cross_entropy(F.linear(h, w), y))
    values = (torch.randn(tokens, 8, requires_grad=h_grad),
              torch.randn(1000, 8, requires_grad=w_grad), torch.zeros(tokens).long())
    for node, value in zip(gm.graph.find_nodes(op="placeholder"), values):
        node.meta["example_value"] = value
    with torch.set_grad_enabled(grad_mode):
        for node in [n for n in gm.graph.nodes if n.op == "call_function"]:
            node.meta["example_value"] = node.target(
                *[a.meta["example_value"] for a in node.args])
    fuse_linear_cross_entropies(gm)
    (op,) = [n for n in gm.graph.nodes if n.op == "call_function" and
             str(n.target).startswith("fxopt.linear_cross_entropy")]
    with_grads = op.target is torch.ops.fxopt.linear_cross_entropy_with_grads.default
    return op.target.name().removeprefix("fxopt::"), op.args[10:] if with_grads else None


@pytest.mark.parametrize("tokens,h_grad,w_grad,grad_mode,expected", [
    (128, True, True, True, ("linear_cross_entropy_with_grads", (True, True, False))),
    # a frozen head (fine-tuning): no vocabulary-wide matmul for W's gradient
    (128, True, False, True, ("linear_cross_entropy_with_grads", (True, False, False))),
    # no backward (evaluation under no_grad): one matmul, nothing kept
    (128, True, True, False, ("linear_cross_entropy", None)),
    # few tokens: W's gradient would be 8/16 of the logits' bytes
    (16, True, True, True, ("linear_cross_entropy", None)),
])
def test_the_form_follows_the_gradients_wanted_and_their_share_of_the_logits(
        tokens, h_grad, w_grad, grad_mode, expected):
    assert _chosen(tokens, h_grad, w_grad, grad_mode) == expected


def test_autocast_linear_in_bf16_loss_in_fp32():
    """Under bf16 autocast the head runs in bf16 and the loss in fp32, as eager's. The loss
    equals eager's to fp32 rounding (both upcast the same bf16 logits); the gradients differ
    by bf16's rounding: both round the logits' gradient to bf16 before the head's matmuls,
    from fp32 values computed in another order, so an entry may round to a neighbouring
    bf16 value. Hence bf16's tolerance on fp32 gradients (rtol 1.6e-2, atol 1e-2 against
    gradients of order 0.1)."""
    torch.manual_seed(0)
    model = BF16Autocast(Head(_new_shift))
    tokens = torch.randint(0, V, (3, 7), generator=torch.Generator().manual_seed(2))
    comparison = assert_same_as_eager(model, (tokens, _labels()), ON,
                                      tolerances={torch.float32: (1.6e-2, 1e-2)})
    assert comparison.fired(PASS)
    assert comparison.compiled_output.dtype == torch.float32


def test_autocast_soft_capped_logits():
    """Soft-capping under bf16 autocast: eager caps the bf16 logits in bf16 (a rounding
    after the scale, the tanh and the cap: 3 x 2**-9 of each capped logit, at most 0.2
    here), the op in fp32 from the same bf16 logits. Each capped logit moves by at most
    3e-3, a token's cross-entropy by at most twice that; the gradients by bf16's rounding
    as above, plus eager's slope 1 - tanh**2 taken from its bf16 tanh (2 x 2**-8 of it).
    Within bf16's tolerance on fp32 values, as the test above."""
    torch.manual_seed(0)
    loss, kwargs = VARIANTS["soft-capped to saturation, bias, smoothing"]
    model = BF16Autocast(Head(loss, **kwargs))
    tokens = torch.randint(0, V, (3, 7), generator=torch.Generator().manual_seed(2))
    comparison = assert_same_as_eager(model, (tokens, _labels()), ON,
                                      tolerances={torch.float32: (1.6e-2, 1e-2)})
    assert comparison.fired(PASS)


def test_inductor_code_generation():
    torch.manual_seed(0)
    model = Head(_new_shift, bias=True)
    tokens = torch.randint(0, V, (3, 7), generator=torch.Generator().manual_seed(2))
    comparison = assert_same_as_eager(model, (tokens, _labels()),
                                      {PASS: True, "codegen": "inductor"})
    assert comparison.fired(PASS)


def test_logits_used_elsewhere_stay_for_that_user():
    def loss_and_scores(m, h, y):
        logits = m.head(h)
        return F.cross_entropy(logits.view(-1, V), y.view(-1)), logits.softmax(-1)

    torch.manual_seed(0)
    comparison = assert_same_as_eager(Head(loss_and_scores), (torch.randint(0, V, (3, 7)),
                                                              _labels()), ON)
    assert comparison.fired(PASS)
    assert _verdicts(comparison)[0].counts() == {
        "linear, logits recomputed in the backward (its logits still made for another user)":
        1}


DECLINED = {
    "class weights": lambda m, h, y: F.cross_entropy(m.head(h).view(-1, V), y.view(-1),
                                                     weight=torch.ones(V)),
    "reduction='none'": lambda m, h, y: F.cross_entropy(m.head(h).view(-1, V), y.view(-1),
                                                        reduction="none").sum(),
    "through two tanh": lambda m, h, y: F.cross_entropy(
        torch.tanh(torch.tanh(m.head(h))).view(-1, V), y.view(-1)),
    "a bias added to the logits after their tanh": lambda m, h, y: F.cross_entropy(
        (torch.tanh(m.head(h)) + m.final_logits_bias).view(-1, V), y.view(-1)),
    "logits come from call_function sigmoid": lambda m, h, y: F.cross_entropy(
        torch.sigmoid(m.head(h)).view(-1, V), y.view(-1)),
    "a bias added to the logits of a Linear with its own bias": lambda m, h, y: (
        F.cross_entropy((m.head(h) + m.final_logits_bias).view(-1, V), y.view(-1))),
    "cast to torch.bfloat16": lambda m, h, y: F.cross_entropy(
        m.head(h).view(-1, V).bfloat16(), y.view(-1)),
    "not (tokens, vocabulary)": lambda m, h, y: F.cross_entropy(
        m.head(h).transpose(1, 2), y),
}


@pytest.mark.parametrize("reason", list(DECLINED))
def test_declined_with_reason(reason):
    torch.manual_seed(0)
    labels = _labels(ignored=False)
    two_biases = reason.startswith("a bias added")
    model = Head(DECLINED[reason], bias=two_biases, logits_bias=two_biases)
    comparison = assert_same_as_eager(model, (torch.randint(0, V, (3, 7)), labels), ON,
                                      tolerances={torch.bfloat16: (2e-2, 2e-2)})
    assert not comparison.fired(PASS)
    (declined,) = _verdicts(comparison)[0].reasons()
    assert reason in declined


class ScaledHead(Head):
    """Cohere's LM head: the logits times the model's ``logit_scale``."""

    def __init__(self, logit_scale):
        super().__init__(lambda m, h, y: F.cross_entropy(
            (m.head(h) * m.logit_scale).view(-1, V), y.view(-1)))
        self.logit_scale = logit_scale


def test_a_logit_scale_that_changed_between_calls_is_declined_with_its_reason():
    """A second model of the same class with another scale: Dynamo passes the number as a
    symbolic float (torch's ``specialize_float=False``), which the op cannot fold into h;
    the loss is declined with that reason (it said "logits come from mul", as if the
    head were not found)."""
    torch.manual_seed(0)
    inputs = (torch.randint(0, V, (3, 7)), _labels(ignored=False))
    assert assert_same_as_eager(ScaledHead(0.0625), inputs, ON).fired(PASS)
    comparison = assert_same_as_eager(ScaledHead(0.125), inputs, ON)
    assert not comparison.fired(PASS)
    assert [v.reasons() for v in _verdicts(comparison)] == [{
        "logits scaled by a number that changes between calls (a symbolic float; the op "
        "folds only constants)": 1}]


def test_fp64_declined():
    torch.manual_seed(0)
    comparison = assert_same_as_eager(Head(_flat_ce()).double(),
                                      (torch.randint(0, V, (3, 7)), _labels()), ON)
    assert not comparison.fired(PASS)
    assert "fp64" in next(iter(_verdicts(comparison)[0].reasons()))


def test_on_under_memory_budget_and_off_by_default():
    from fxopt import config, passes
    from fxopt.passes.base import GraphKind, PassContext, Stage

    spec = passes.get_pass(PASS)
    for options, on in (({}, False), ({"memory_budget": 0.5}, True),
                        ({"memory_budget": 0.5, PASS: False}, False), ({PASS: True}, True)):
        ctx = PassContext(config.resolve(options), Stage.PRE_AUTOGRAD, GraphKind.DYNAMO, "g0",
                          torch.device("cpu"))
        assert spec.decide(ctx)[0] is on, options


def test_the_loss_keeps_no_logits():
    """The loss part alone at GPT-2's vocabulary: plain autograd keeps the (tokens x vocab)
    fp32 log-probabilities; the op keeps h (kept by the Linear anyway), the labels and one
    float per token."""
    vocab, hidden, tokens = 50257, 32, 64
    weight = nn.Parameter(torch.randn(vocab, hidden) * 0.02)
    h = torch.randn(tokens, hidden, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,))

    def loss(h, labels):
        return F.cross_entropy(F.linear(h, weight), labels)

    kept = {}
    for name, options in (("plain", {PASS: False, "codegen": "fx"}), ("fused", ON)):
        import fxopt
        torch._dynamo.reset()
        compiled = torch.compile(loss, backend=fxopt.backend(**options))
        kept[name] = measure_saved_bytes(lambda fn=compiled: fn(h, labels),
                                         exclude=[weight, h, labels]).bytes
    assert kept["plain"] >= tokens * vocab * 4
    assert kept["fused"] <= tokens * 4 * 2  # lse (and nothing of vocabulary size)


transformers = pytest.importorskip("transformers")


def _gpt2():
    config = transformers.GPT2Config(vocab_size=V, n_positions=32, n_embd=32, n_layer=1,
                                     n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def _llama():
    config = transformers.LlamaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2,
                                      intermediate_size=64, tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(config)


class _LossOnly(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, labels):
        return self.model(ids, labels=labels).loss


@pytest.mark.parametrize("build", [_gpt2, _llama])
def test_transformers_causal_lm_loss(build):
    """GPT-2 (tied embeddings) behind ignore_transformers_logging, whose graph would
    otherwise break between the head and the loss; Llama with tied embeddings."""
    from fxopt.graph_breaks import ignore_transformers_logging

    torch.manual_seed(0)
    model = _LossOnly(build())
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(3))
    with ignore_transformers_logging():
        comparison = assert_same_as_eager(model, (ids, ids), ON)
    assert len(comparison.graphs) == 1
    assert comparison.fired(PASS)


def test_gpt2_logging_break_splits_head_and_loss_without_the_helper():
    """What ignore_transformers_logging is for: without it GPT-2's graph breaks at
    transformers' warning_once between the head and the loss, and the pass sees no Linear
    behind the loss."""
    torch.manual_seed(0)
    ids = torch.randint(0, V, (2, 9))
    comparison = assert_same_as_eager(_LossOnly(_gpt2()), (ids, ids), ON)
    assert len(comparison.graphs) == 2
    assert not comparison.fired(PASS)


def test_the_helper_finds_transformers_logging_before_transformers_is_imported():
    """A script that builds its model inside the helper imports transformers there: the
    helper imports transformers' logging module itself (else it ignored nothing, and
    GPT-2's head and loss stayed two graphs). In a fresh interpreter; fails without it."""
    import subprocess
    import sys

    check = ("import logging, fxopt\n"
             "assert not hasattr(logging.Logger, 'warning_once'), 'imported before'\n"
             "from fxopt.graph_breaks import transformers_logging_functions\n"
             "assert len(transformers_logging_functions()) == 3\n")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
