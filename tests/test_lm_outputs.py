"""fxopt.drop_logits: a transformers language model (causal, or sequence-to-sequence as T5)
compiled as users compile it returns no logits from a step that computes its loss, so the
graph never makes them and fuse_linear_cross_entropy replaces the head whole; everything
else is as before."""

import pytest
import torch
import transformers

import fxopt
from fxopt.testing import assert_same_as_eager

V = 131
FUSED = {"fuse_linear_cross_entropy": True, "codegen": "fx"}
BROKEN_FORWARD = "Dynamo breaks the graph inside its forward"


def _gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=V, n_positions=32, n_embd=32, n_layer=1,
                                     n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # the loss it falls back to, without the logging break
    return model


def _ids(batch=2, seq=9):
    return torch.randint(0, V, (batch, seq), generator=torch.Generator().manual_seed(3))


def _pass_kinds(comparison):
    return [kind for r in comparison.passes if r.name == "fuse_linear_cross_entropy"
            for kind in r.verdicts.matched]


def test_a_compiled_step_makes_no_logits_and_the_fused_loss_takes_the_whole_head():
    ids = _ids()
    kept = assert_same_as_eager(_gpt2(), (ids,), FUSED, kwargs={"labels": ids})
    dropped = assert_same_as_eager(fxopt.drop_logits(_gpt2()), (ids,), FUSED,
                                   kwargs={"labels": ids})
    assert dropped.eager_output.logits is None and kept.eager_output.logits is not None
    assert _pass_kinds(kept) == ["linear, logits recomputed in the backward "
                                 "(its logits still made for the graph's output; their "
                                 "gradient only for a caller that uses them)"]
    assert _pass_kinds(dropped) == ["linear, logits recomputed in the backward"]
    outputs = [n for n in dropped.graphs[0].graphs["dynamo"].graph.nodes if n.op == "output"]
    values = [a.meta.get("example_value") for a in outputs[0].args[0]]  # Dynamo's fakes
    shapes = [tuple(v.shape) for v in values if isinstance(v, torch.Tensor)]
    assert (2, 9, V) not in shapes and shapes  # the loss (and the cache) only
    peaks = [c.graphs[0].memory["fxopt"].peak_bytes for c in (kept, dropped)]
    assert peaks[1] < peaks[0]


def test_a_sequence_to_sequence_model_drops_its_logits_too():
    """T5 ties its head to the embedding, scales the decoder's output by d_model ** -0.5
    before it, and takes its own CrossEntropyLoss(ignore_index=-100) over the flattened
    logits; its output is a Seq2SeqLMOutput, which drop_logits rebuilds without them."""
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                   num_heads=4, dropout_rate=0.0, decoder_start_token_id=0)
    ids, labels = _ids(), _ids(seq=7)
    labels[0, -2:] = -100  # padding the loss ignores
    dropped = assert_same_as_eager(
        fxopt.drop_logits(transformers.T5ForConditionalGeneration(config)), (ids,), FUSED,
        kwargs={"labels": labels})
    assert dropped.eager_output.logits is None
    assert dropped.eager_output.encoder_last_hidden_state is not None
    if len(dropped.graphs) == 1:
        assert _pass_kinds(dropped) == ["linear, logits recomputed in the backward"]
    else:  # torch 2.11 and 2.12's Dynamo breaks T5's forward at copy.deepcopy(config)
        report = fxopt.explain(fxopt.drop_logits(transformers.T5ForConditionalGeneration(
            config)), ids, labels=labels, options=FUSED)
        assert any(BROKEN_FORWARD in note for note in report.notes)


class BrokenLM(torch.nn.Module):
    """A language model whose forward Dynamo breaks before its head."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(V, 16)
        self.head = torch.nn.Linear(16, V, bias=False)

    def forward(self, ids, labels):
        hidden = self.embedding(ids)
        torch._dynamo.graph_break()
        logits = self.head(hidden)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return transformers.modeling_outputs.CausalLMOutput(loss=loss, logits=logits)


def test_explain_says_a_graph_break_in_the_forward_keeps_the_logits_drop_logits_drops():
    ids = _ids()
    report = fxopt.explain(fxopt.drop_logits(BrokenLM()), ids, labels=ids, options=FUSED)
    assert report.graph_breaks
    assert any(BROKEN_FORWARD in note for note in report.notes)
    assert not any("fxopt.drop_logits(model) removes them" in note for note in report.notes)


def test_calls_without_a_loss_and_tuple_outputs():
    model = fxopt.drop_logits(_gpt2()).eval()
    ids = _ids()
    with torch.no_grad():
        assert model(ids).logits.shape == (2, 9, V)  # no labels: no loss, logits kept
        loss, logits, *rest = model(ids, labels=ids, return_dict=False)
    assert loss.dim() == 0 and logits is None and rest


def test_a_second_call_changes_nothing_and_other_arguments_are_refused():
    model = _gpt2()
    forward = fxopt.drop_logits(model).forward
    assert fxopt.drop_logits(model).forward is forward
    assert forward.__wrapped__.__self__ is model  # the model's own forward, kept
    with pytest.raises(TypeError, match="expected an nn.Module, got function"):
        fxopt.drop_logits(_ids)


def test_explain_names_drop_logits_where_the_fused_loss_leaves_the_logits_made():
    ids = _ids()
    words = "fxopt.drop_logits(model) removes them"
    kept = fxopt.explain(_gpt2(), ids, labels=ids, options=FUSED)
    dropped = fxopt.explain(fxopt.drop_logits(_gpt2()), ids, labels=ids, options=FUSED)
    assert any(words in note for note in kept.notes)
    assert not any(words in note for note in dropped.notes)
