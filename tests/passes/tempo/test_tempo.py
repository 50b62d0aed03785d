"""The tempo pass: each kind of site is rewritten (and the pass says so), outputs and every
gradient equal eager on small models and on tiny transformers BERT and GPT-2 in training
(dropout 0.1), sites that would not save memory are left alone with a reason, and the
bytes autograd keeps for backward during a compiled BERT forward are measured to drop."""

import pytest
import torch
import torch.nn.functional as F
from models import BF16Autocast, Block
from torch import nn

import fxopt
from fxopt.analysis import measure_saved_bytes
from fxopt.passes import torch_calls
from fxopt.passes.tempo import sites
from fxopt.passes.torch_calls import symbolic_float
from fxopt.testing import TEMPO_TOLERANCES, TOLERANCES, assert_same_as_eager

try:
    import transformers
except ImportError:  # only the tests of transformers' own modules and models skip
    transformers = None
needs_transformers = pytest.mark.skipif(transformers is None, reason="needs transformers")

TEMPO = {"tempo": True, "strict": True}


def _tempo_stats(comparison):
    (record,) = [r for r in comparison.passes if r.name == "tempo" and r.fired]
    return {"rewritten": record.verdicts.counts(), "skipped": record.verdicts.reasons(),
            "bytes_removed": {k: m.bytes for k, m in record.verdicts.matched.items()},
            **record.stats}


class Sandwich(nn.Module):
    """Linear -> ``middle`` -> Linear: the second Linear keeps the middle's output."""

    def __init__(self, middle, dim=37):
        super().__init__()
        self.fc1, self.middle, self.fc2 = nn.Linear(13, dim), middle, nn.Linear(dim, 11)

    def forward(self, x):
        return self.fc2(self.middle(self.fc1(x)))


def _llama_rms_norm(dim):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    return LlamaRMSNorm(dim)


def _gemma_rms_norm(dim):
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    return GemmaRMSNorm(dim)


def _olmo2_rms_norm(dim):
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    return Olmo2RMSNorm(dim)


def _t5_layer_norm(dim):
    from transformers.models.t5.modeling_t5 import T5LayerNorm

    return T5LayerNorm(dim)


def _cohere_layer_norm(dim):
    from transformers.models.cohere.modeling_cohere import CohereLayerNorm

    return CohereLayerNorm(dim)


class _OneCenteringLayerNorm(nn.Module):
    """A LayerNorm by hand that centers once and has no weight."""

    def __init__(self, _dim):
        super().__init__()

    def forward(self, x):
        centered = x - x.mean(-1, keepdim=True)
        return centered * torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + 1e-5)


def _new_gelu(_dim):
    from transformers.activations import NewGELUActivation

    return NewGELUActivation()


class _FunctionalLayerNorm(nn.LayerNorm):
    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


@pytest.mark.parametrize("middle, kind", [
    pytest.param(lambda d: nn.GELU(), "gelu", id="gelu"),
    pytest.param(lambda d: nn.GELU(approximate="tanh"), "gelu", id="gelu_tanh"),
    pytest.param(_new_gelu, "gelu", id="gpt2_gelu_formula", marks=needs_transformers),
    pytest.param(nn.LayerNorm, "layer_norm", id="layer_norm"),
    pytest.param(_FunctionalLayerNorm, "layer_norm", id="f_layer_norm"),
    pytest.param(nn.RMSNorm, "rms_norm", id="rms_norm"),
    pytest.param(_llama_rms_norm, "rms_norm", id="llama_rms_norm", marks=needs_transformers),
    # both end in a cast to the input's dtype (a no-op here) after the weight
    pytest.param(_gemma_rms_norm, "rms_norm", id="gemma_rms_norm", marks=needs_transformers),
    pytest.param(_olmo2_rms_norm, "rms_norm", id="olmo2_rms_norm", marks=needs_transformers),
    # normalizes x itself, its fp32 cast (a no-op here) only squared
    pytest.param(_t5_layer_norm, "rms_norm", id="t5_layer_norm", marks=needs_transformers),
    # by hand: the centering written twice, the weight cast to fp32, a no-op cast back
    pytest.param(_cohere_layer_norm, "layer_norm", id="cohere_layer_norm",
                 marks=needs_transformers),
    pytest.param(_OneCenteringLayerNorm, "layer_norm", id="one_centering_layer_norm"),
])
def test_each_site_kind_is_rewritten_and_matches_eager(middle, kind):
    torch.manual_seed(0)
    model = Sandwich(middle(37))
    for p in model.middle.parameters():  # gamma containing zeros
        with torch.no_grad():
            p[3] = 0.0
    comparison = assert_same_as_eager(model, (torch.randn(3, 5, 13),), TEMPO,
                                      tolerances=TEMPO_TOLERANCES)
    assert comparison.fired("tempo")
    stats = _tempo_stats(comparison)
    assert stats["rewritten"] == {kind: 1} and stats["bytes_removed"][kind] > 0


@pytest.mark.parametrize("middle, kind", [
    pytest.param(nn.LayerNorm, "layer_norm", id="layer_norm"),
    pytest.param(_FunctionalLayerNorm, "layer_norm", id="f_layer_norm"),
    pytest.param(nn.RMSNorm, "rms_norm", id="rms_norm"),
    pytest.param(_llama_rms_norm, "rms_norm", id="llama_rms_norm", marks=needs_transformers),
    pytest.param(_cohere_layer_norm, "layer_norm", id="cohere_layer_norm",
                 marks=needs_transformers),
])
def test_a_norm_whose_eps_changed_between_calls_is_rewritten(middle, kind, monkeypatch):
    """A forward compiled again with another ``eps`` (a second model of the same class, a
    sweep in one process) gets it as a symbolic float read from a graph input: torch's
    ``specialize_float=False``. The norm is still rewritten, with that value; before, the
    formulas were skipped without a word and ``F.rms_norm`` failed the pass. (Under fx
    code generation the op, whose ``eps`` is a float, specializes it: Dynamo restarts the
    compile with the constant, also rewritten, and only that compile is recorded.)"""
    seen = []  # the premise: tempo met a symbolic eps (in the compile Dynamo restarted)

    def spy(value):
        seen.append(symbolic_float(value))
        return seen[-1]
    for module in (sites, torch_calls):  # the norm matchers, the formulas' scalar_operand
        monkeypatch.setattr(module, "symbolic_float", spy)
    torch.manual_seed(0)
    for eps in (1e-5, 1e-3):
        model = Sandwich(middle(37))
        norm = model.middle
        setattr(norm, "variance_epsilon" if hasattr(norm, "variance_epsilon") else "eps", eps)
        comparison = assert_same_as_eager(model, (torch.randn(3, 5, 13),), TEMPO,
                                          tolerances=TEMPO_TOLERANCES)
        tempo = [r for r in comparison.passes if r.name == "tempo"]
        assert tempo and all(r.verdicts.counts() == {kind: 1} for r in tempo)
    assert any(seen)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_transformer_block_matches_eager(dropout):
    """The block's GELU feeds a dropout (whose output fc2 keeps), so it is left alone."""
    torch.manual_seed(0)
    comparison = assert_same_as_eager(Block(dim=32, dropout=dropout).train(),
                                      (torch.randn(2, 9, 32),), TEMPO, steps=2,
                                      tolerances=TEMPO_TOLERANCES)
    stats = _tempo_stats(comparison)
    assert stats["rewritten"] == {"layer_norm": 2, "attention": 1}
    assert stats["skipped"] == {"gelu: output not kept by a neighbour (no saving)": 1}


def test_transformer_block_under_bf16_autocast_matches_eager():
    """The attention site is rewritten under autocast; output, input gradient and every
    parameter's gradient equal eager's. Those gradients are fp32 tensors holding bf16
    values: under bf16 autocast each parameter's gradient is a bf16 matmul result cast up
    (and the norms' come from bf16 upstream gradients), so compiled and eager may round one
    bf16 ulp apart (up to 2**-7 relative; 0.031 at |g| in [4, 8), measured here, and as
    much without tempo). They are compared at bf16's tolerance for that reason."""
    torch.manual_seed(0)
    comparison = assert_same_as_eager(
        BF16Autocast(Block(dim=32, dropout=0.1).train()),
        (torch.randn(2, 9, 32, requires_grad=True),), TEMPO,
        tolerances={torch.float32: TOLERANCES[torch.bfloat16]})
    assert _tempo_stats(comparison)["rewritten"]["attention"] == 1


def test_sites_that_would_not_save_memory_are_left_alone():
    """GELU feeding a sum: no neighbour keeps its output, so saving it would not free x."""
    def fn(x):
        return F.gelu(x).sum(-1) + F.layer_norm(x, (37,)).amax(-1)

    comparison = assert_same_as_eager(fn, (torch.randn(4, 37, requires_grad=True),), TEMPO)
    assert not comparison.fired("tempo")
    (record,) = [r for r in comparison.passes if r.name == "tempo"]
    assert record.verdicts.reasons() == {
        "gelu: output not kept by a neighbour (no saving)": 1,
        "layer_norm: output not kept by a neighbour (no saving)": 1}


class GeluThenCast(nn.Module):
    """GELU followed by ``cast``; a cast that returns its input (to the dtype the value
    has) leaves the next Linear keeping GELU's output, a real one does not."""

    def __init__(self, cast):
        super().__init__()
        self.cast = cast

    def forward(self, x):
        return self.cast(F.gelu(x))


@pytest.mark.parametrize("cast, rewritten", [
    (lambda y: y.to(torch.float32), True),
    (lambda y: y.float().view(-1, 37).view(3, 5, 37), True),
    (lambda y: y.double().float(), False),
    (lambda y: y.to(torch.float32, copy=True), False),
], ids=["no_op_to", "no_op_float_and_views", "round_trip", "copy"])
def test_only_casts_that_return_their_input_reach_the_neighbour(cast, rewritten):
    torch.manual_seed(0)
    comparison = assert_same_as_eager(Sandwich(GeluThenCast(cast)), (torch.randn(3, 5, 13),),
                                      TEMPO, tolerances=TEMPO_TOLERANCES)
    assert comparison.fired("tempo") is rewritten
    if not rewritten:
        (record,) = [r for r in comparison.passes if r.name == "tempo"]
        assert record.verdicts.reasons() == {
            "gelu: output not kept by a neighbour (no saving)": 1}


def test_rewrite_limit_bisects_sites():
    torch.manual_seed(0)
    comparison = assert_same_as_eager(Block(dim=32).train(), (torch.randn(2, 9, 32),),
                                      {**TEMPO, "rewrite_limit": {"tempo": 1}},
                                      tolerances=TEMPO_TOLERANCES)
    stats = _tempo_stats(comparison)
    assert sum(stats["rewritten"].values()) == 1 and stats["rewrites_refused_by_limit"] == 2


VOCAB = 97


def _bert():
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=32, attn_implementation="eager")
    return transformers.BertForMaskedLM(config).train()


def _gpt2():
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=1,
                                     n_head=4, bos_token_id=0, eos_token_id=0,
                                     attn_implementation="eager")
    return transformers.GPT2LMHeadModel(config).train()


@pytest.mark.slow
@needs_transformers
@pytest.mark.parametrize("build, extra, expected", [
    (_bert, {}, {"attention": 1, "layer_norm": 3, "gelu": 1}),
    (_gpt2, {"use_cache": False}, {"attention": 1, "layer_norm": 3, "gelu": 1}),
], ids=["bert", "gpt2"])
def test_transformers_train_like_eager(build, extra, expected):
    """Every eager-attention, GELU and LayerNorm site whose output a neighbour keeps is
    rewritten (BERT's embedding LayerNorm and head GELU feed a dropout and a LayerNorm)."""
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 11))
    comparison = assert_same_as_eager(build(), (), TEMPO, kwargs={"input_ids": ids,
                                                                  "labels": ids, **extra})
    assert _tempo_stats(comparison)["rewritten"] == expected


def _saved_bytes(model, options, kwargs):
    backend = fxopt.backend(**options)
    compiled = torch.compile(model, backend=backend)
    compiled(**kwargs).loss.backward()  # compile forward and backward first
    caller_owned = [*model.parameters(), *model.buffers(), *kwargs.values()]
    return (measure_saved_bytes(lambda: compiled(**kwargs), exclude=caller_owned),
            backend.graphs)


@pytest.mark.slow
@needs_transformers
def test_bert_keeps_fewer_bytes_for_backward():
    """Measured with saved-tensor hooks around the compiled forward: tempo removes what it
    predicts (within the bytes of a few small tensors), here about 30%."""
    torch.manual_seed(0)
    model = _bert()
    kwargs = {"input_ids": torch.randint(0, VOCAB, (2, 11))}
    kwargs["labels"] = kwargs["input_ids"]
    baseline, _ = _saved_bytes(model, {}, kwargs)
    lean, graphs = _saved_bytes(model, TEMPO, kwargs)
    predicted = sum(sum(m.bytes for m in r.verdicts.matched.values())
                    for g in graphs for r in g.passes if r.name == "tempo" and r.fired)
    assert lean.bytes < 0.75 * baseline.bytes
    assert abs((baseline.bytes - lean.bytes) - predicted) <= 0.01 * predicted
