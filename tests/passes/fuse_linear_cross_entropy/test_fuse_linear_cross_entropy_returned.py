"""Logits the fused loss leaves for the graph's output get their gradient from the caller
alone (fxopt/passes/fuse_linear_cross_entropy_returned.py): the backward has no gradient
input of the logits' size, a caller that back-propagates the loss only makes no logits-sized
tensor in the backward, and one that also back-propagates through the logits gets eager's
gradients (of h, W, b and a tail's bias), with the tails models put between the head and
the returned logits (a scale, a bias, a soft-cap). Small heads (hidden 16, vocabulary 131,
3 x 7 tokens).
"""

import pytest
import torch
import torch.nn.functional as F
from models import BF16Autocast, LMHead
from torch.utils._python_dispatch import TorchDispatchMode

import fxopt
from fxopt.passes.fuse_linear_cross_entropy_returned import LogitsGrad
from fxopt.testing import assert_same_as_eager

PASS = "fuse_linear_cross_entropy"
V, H = 131, 16
RETURNED = ("(its logits still made for the graph's output; their gradient only for a "
            "caller that uses them)")


def _returning(logits):
    """A loss for LMHead that returns the loss and the logits ``logits(m, h)`` makes, as
    transformers' models do."""
    def loss(m, h, labels):
        out = logits(m, h)
        return F.cross_entropy(out.float().view(-1, m.head.out_features), labels.view(-1)), out
    return loss


def _head(logits, **kwargs):
    return LMHead(_returning(logits), **kwargs)


HEADS = {
    "linear with a bias": (lambda m, h: m.head(h), {"bias": True}),
    "h @ W.T, tied": (lambda m, h: h @ m.embed.weight.T, {"tied": True}),
    "matmul with W.transpose": (lambda m, h: torch.matmul(h, m.head.weight.transpose(0, 1)),
                                {}),
    # tails between the head and the returned logits, as the loss reads them
    "scaled (Cohere)": (lambda m, h: m.head(h) * 0.0625, {}),
    "divided, bias (Granite)": (lambda m, h: m.head(h) / 3.0, {"bias": True}),
    "added bias buffer, moved (BART)": (
        lambda m, h: m.head(h) + m.final_logits_bias.to(h.device), {"logits_bias": True}),
    "scaled around a trained bias": (lambda m, h: (2.0 * m.head(h) + m.final_logits_bias) / 3.0,
                                     {"logits_bias": "trained"}),
    "soft-capped (Gemma 2)": (lambda m, h: torch.tanh(m.head(h) / 0.5) * 0.5, {}),
}


def _linear_head():
    logits, kwargs = HEADS["linear with a bias"]
    return _head(logits, **kwargs)


def _tokens():
    return (torch.randint(0, V, (3, 7), generator=torch.Generator().manual_seed(2)),
            torch.randint(0, V, (3, 7), generator=torch.Generator().manual_seed(3)))


def _logits_tangents(graphs):
    """The backward graphs' gradient inputs of the logits' (3, 7, V) shape."""
    return [p for graph in graphs
            for p in graph.graphs["backward"].graph.find_nodes(op="placeholder")
            if "tangent" in p.name and tuple(p.meta["val"].shape) == (3, 7, V)]


@pytest.mark.parametrize("codegen", ["fx", "inductor"])
@pytest.mark.parametrize("head", HEADS)
def test_returned_logits_have_no_gradient_input_and_train_like_eager(head, codegen):
    """assert_same_as_eager back-propagates a weighted sum of both outputs, so the logits'
    own gradient runs through LogitsGrad's backward to h, W and b."""
    logits, kwargs = HEADS[head]
    torch.manual_seed(0)
    comparison = assert_same_as_eager(_head(logits, **kwargs), _tokens(),
                                      {PASS: True, "codegen": codegen})
    assert comparison.fired(PASS)
    (matched,) = [kind for r in comparison.passes if r.name == PASS
                  for kind in r.verdicts.matched]
    assert matched.endswith(RETURNED)
    assert not _logits_tangents(comparison.graphs)
    assert comparison.compiled_output[1].grad_fn.name() == "LogitsGradBackward"


class _Allocations(TorchDispatchMode):
    """The shapes of the tensors the ops run under it return."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self.shapes.append(tuple(out.shape))
        return out


def _loss_only_step(options, autocast=False):
    """One step of ``model(tokens, labels)[0].backward()`` (the logits dropped first), compiled
    and eager: the shapes the compiled backward's ops made, the compiled graphs' record, and
    the parameters' gradients on each side."""
    torch.manual_seed(0)
    model, eager = _linear_head(), _linear_head()
    eager.load_state_dict(model.state_dict())
    if autocast:
        model, eager = BF16Autocast(model), BF16Autocast(eager)
    backend = fxopt.backend(**options)
    loss, logits = torch.compile(model, backend=backend)(*_tokens())
    assert logits.requires_grad
    del logits
    with _Allocations() as allocations:
        loss.backward()
    eager(*_tokens())[0].backward()
    grads = [(name, p.grad, e.grad) for (name, p), e in zip(model.named_parameters(),
                                                             eager.parameters())]
    return allocations.shapes, backend.graphs, grads


def test_a_caller_reading_the_loss_only_makes_no_logits_in_the_backward():
    """The step transformers' users write (``model(ids, labels=ids).loss.backward()``): the
    gradients equal eager's, and no op of the backward makes a logits-sized tensor (before
    the split, autograd filled the logits' gradient input with zeros and the backward
    multiplied them by W and h)."""
    shapes, graphs, grads = _loss_only_step({PASS: True, "codegen": "fx"})
    assert (3, 7, V) not in shapes and (21, V) not in shapes
    assert shapes  # the mode saw the backward's ops
    for name, compiled, expected in grads:
        torch.testing.assert_close(compiled, expected, msg=name)
    assert graphs[0].pass_records(PASS)[0].fired


def test_many_tokens_in_the_gradients_in_the_forward_form():
    """4 x 32 tokens, hidden 8, vocabulary 1000 (test_fuse_linear_cross_entropy.py's
    MANY_TOKENS): the op computes the gradients in the forward, as at a real batch (GPT-2's
    4 x 512 in benchmarks/results/drop_logits_cpu.md), and the returned logits are split
    the same way."""
    torch.manual_seed(0)
    model = _head(lambda m, h: m.head(h), bias=True, vocab=1000, hidden=8)
    tokens = torch.randint(0, 1000, (4, 32), generator=torch.Generator().manual_seed(2))
    labels = torch.randint(0, 1000, (4, 32), generator=torch.Generator().manual_seed(3))
    comparison = assert_same_as_eager(model, (tokens, labels), {PASS: True, "codegen": "fx"})
    (matched,) = [kind for r in comparison.passes if r.name == PASS
                  for kind in r.verdicts.matched]
    assert matched == f"linear, gradients in the forward {RETURNED}"
    assert not [p for p in comparison.graphs[0].graphs["backward"].graph.find_nodes(
        op="placeholder") if tuple(p.meta["val"].shape) == (4, 32, 1000)]


def test_under_a_budget_and_autocast():
    """bf16 autocast, ``memory_budget=0.5``: the fused loss computes the logits in bf16 and
    the loss in fp32 from them, as eager does, but its gradient of h and W reaches them
    unrounded where eager rounds the logits' gradient to bf16 (2**-9 of each): bf16's
    tolerance on fp32 gradients (test_fuse_linear_cross_entropy.py's autocast test)."""
    _, graphs, grads = _loss_only_step({"memory_budget": 0.5}, autocast=True)
    for name, compiled, expected in grads:
        torch.testing.assert_close(compiled, expected, rtol=1.6e-2, atol=1e-2, msg=name)
    assert graphs[0].pass_records(PASS)[0].fired
    assert not _logits_tangents(graphs)


def test_logits_grad_is_the_linear_backward():
    """LogitsGrad against autograd's own Linear, for a gradient in each layout: h (2, 5, 16),
    W vocabulary-major and hidden-major, a bias of BART's (1, V) shape."""
    h = torch.randn(2, 5, H, requires_grad=True)
    w = torch.randn(V, H, requires_grad=True)
    b = torch.randn(1, V, requires_grad=True)
    grad = torch.randn(2, 5, V)
    expected = torch.autograd.grad(F.linear(h, w, b.view(-1)), (h, w, b), grad)
    attached = LogitsGrad.apply(F.linear(h, w, b.view(-1)).detach(), h, w, b, None, True)
    for got, want in zip(torch.autograd.grad(attached, (h, w, b), grad), expected):
        torch.testing.assert_close(got, want)
    right = w.detach().t().contiguous().requires_grad_()
    attached = LogitsGrad.apply((h @ right).detach(), h, right, None, None, False)
    got_h, got_right = torch.autograd.grad(attached, (h, right), grad)
    torch.testing.assert_close(got_h, expected[0])
    torch.testing.assert_close(got_right, expected[1].t())


def test_logits_grad_under_autocast_is_eagers():
    """Under bf16 autocast eager's Linear casts h and W to bf16, its GEMMs run in bf16 and
    the casts' backward returns fp32 gradients: LogitsGrad runs the same ops, so the
    gradients are equal bit for bit."""
    h = torch.randn(2, 5, H, requires_grad=True)
    w = torch.randn(V, H, requires_grad=True)
    grad = torch.randn(2, 5, V).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = F.linear(h, w)
    expected = torch.autograd.grad(logits, (h, w), grad)
    attached = LogitsGrad.apply(logits.detach(), h, w, None, None, True)
    for got, want in zip(torch.autograd.grad(attached, (h, w), grad), expected):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_logits_grad_through_a_tail_is_autograds():
    """``(0.5 * tanh((h @ W.T + b) * 0.25 + c) * 4)``, the tail's steps given to LogitsGrad,
    against autograd through the same ops: the tanh's slope from the returned logits, the
    trained tail bias c reduced to its (1, V) shape."""
    h = torch.randn(2, 5, H, requires_grad=True)
    w = torch.randn(V, H, requires_grad=True)
    b = torch.randn(V, requires_grad=True)
    c = torch.randn(1, V, requires_grad=True)

    def tail(z):
        return torch.tanh(z * 0.25 + c) * 0.5 * 4.0

    grad = torch.randn(2, 5, V)
    returned = tail(F.linear(h, w, b))
    expected = torch.autograd.grad(returned, (h, w, b, c), grad)
    steps = (("mul", 0.25), ("bias",), ("tanh",), ("mul", 0.5), ("mul", 4.0))
    attached = LogitsGrad.apply(returned.detach(), h, w, b, c, True, steps, torch.float32)
    for got, want in zip(torch.autograd.grad(attached, (h, w, b, c), grad), expected):
        torch.testing.assert_close(got, want)
