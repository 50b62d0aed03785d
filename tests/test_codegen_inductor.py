"""codegen="inductor" on models with dropout: Inductor's random-op passes run inside the
fake-mode context Inductor expects, so such graphs compile (issue 17: they used to fall back
to eager with "'NullHandler' object does not support the context manager protocol").

Inductor draws dropout masks from its own seeded generator, so its masks differ from
eager's. Two checks follow from that: with Inductor's own RNG, the backward must use the
forward's mask (checked in closed form); with ``fallback_random`` (Inductor calls eager's
random ops, as the other Inductor tests do) loss and every gradient equal eager's.
"""

import pytest
import torch
import torch.nn.functional as F

import fxopt
from fxopt.testing import assert_same_as_eager

transformers = pytest.importorskip("transformers")

VOCAB = 97
P = 0.25


def _seed_nodes(graph_module):
    return [n for n in graph_module.graph.nodes if "seed" in str(n.target)]


def test_inductor_rng_dropout_compiles_and_backward_uses_the_forward_mask():
    backend = fxopt.backend(codegen="inductor", strict=True)

    def fn(x, w):
        return F.dropout(x * w, p=P, training=True)

    compiled = torch.compile(fn, backend=backend)
    x, w = torch.randn(64, 33), torch.randn(33, requires_grad=True)
    weights = torch.randn(64, 33)
    y = compiled(x, w)
    (y * weights).sum().backward()

    record = backend.graphs[0]
    assert record.fallback is None
    assert record.codegen.name == "inductor"
    assert record.codegen.reason == "set by the codegen option"
    assert _seed_nodes(record.graphs["forward"]), "Inductor's seeded random ops not used"
    kept = y != 0
    assert 0.5 < kept.float().mean() < 0.95  # a real mask, neither all kept nor all dropped
    scale = 1 / (1 - P)
    torch.testing.assert_close(y, kept * x * w * scale)
    # d/dw sum(weights * mask * x * w * scale) = sum over rows of weights * mask * x * scale
    torch.testing.assert_close(w.grad, (weights * kept * x * scale).sum(0))


def _gpt2():
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2,
                                     n_head=4, bos_token_id=0, eos_token_id=0,
                                     resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                                     attn_implementation="eager")
    return transformers.GPT2LMHeadModel(config).train()


@pytest.mark.slow
def test_gpt2_with_dropout_trains_like_eager_under_inductor():
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 11))
    kwargs = {"input_ids": ids, "labels": ids, "use_cache": False}
    # Eager's masks: Inductor calls aten's random ops instead of its own generator.
    with torch._inductor.config.patch(fallback_random=True):
        comparison = assert_same_as_eager(_gpt2(), (), {"codegen": "inductor", "strict": True},
                                          kwargs=kwargs)
    assert [g.fallback for g in comparison.graphs] == [None] * len(comparison.graphs)
    assert all("backward" in g.graphs for g in comparison.graphs)


@pytest.mark.slow
def test_gpt2_with_dropout_compiles_with_inductors_rng():
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 11))
    backend = fxopt.backend(codegen="inductor", strict=True)
    model = torch.compile(_gpt2(), backend=backend)
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert [g.fallback for g in backend.graphs] == [None] * len(backend.graphs)
    assert any(_seed_nodes(g.graphs["forward"]) for g in backend.graphs)
