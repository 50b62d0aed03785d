"""A fraction budget across a graph break: a graph's input that another graph made is an
activation (counted when kept), the loss graph's floor is what it cannot recompute, and a
model whose graphs' floors fit the budget meets it under ``strict`` even where the loss
graph, compiled last, cannot meet the share the first graph left it.

The model is transformers' GPT-2 in small: a body and an LM head, then a logging call
(which breaks Dynamo's graph, as ``PreTrainedModel.loss_function``'s ``warning_once``
does) and the cross-entropy on the upcast logits, which are the second graph's input.
"""

import contextlib
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxopt
from fxopt.analysis import measure_saved_bytes
from fxopt.explain import logging_break
from fxopt.passes.swap_recompute import InfeasibleBudget
from fxopt.planner.joint import recomputable

log = logging.getLogger(__name__)

VOCAB, WIDTH = 512, 32


class HeadThenLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(*[nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))
            for _ in range(4)])
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.body(x))
        log.debug("computing the loss")  # a logging call: Dynamo breaks the graph here
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def _inputs():
    data = torch.Generator().manual_seed(0)
    return (torch.randn(8, 32, WIDTH, generator=data),
            torch.randint(0, VOCAB, (8, 32), generator=data))


def _step(model, fn, x, labels, bf16=False):
    """(loss, gradients, saved bytes) of one step of ``fn``."""
    model.zero_grad(set_to_none=True)
    held = {}

    def forward():
        with torch.autocast("cpu", torch.bfloat16) if bf16 else contextlib.nullcontext():
            held["loss"] = fn(x, labels)
    saved = measure_saved_bytes(forward, exclude=[*model.parameters(), x, labels]).bytes
    held["loss"].backward()
    return held["loss"].detach(), [p.grad.clone() for p in model.parameters()], saved


def _stats(backend):
    return [r.stats for g in backend.graphs for r in g.pass_records("swap_recompute")]


def test_the_loss_graphs_logits_count_and_the_model_meets_its_budget():
    """fp32: the loss graph can recompute its log-softmax from the logits, but keeps them
    (its floor is its plain bytes); the model can still meet 0.5, the body recomputing
    more. Before, the kept logits were not counted: the ledger said 0.31 of eager's while
    the step kept 0.62."""
    model, (x, labels) = HeadThenLoss(), _inputs()
    eager_loss, eager_grads, eager = _step(model, model, x, labels)
    backend = fxopt.backend(codegen="fx", memory_budget=0.5, strict=True)
    compiled = torch.compile(model, backend=backend)
    _step(model, compiled, x, labels)  # compiles both graphs; the body gives room back
    loss, grads, saved = _step(model, compiled, x, labels)  # the body planned again

    body, head = _stats(backend)[-2:]
    logits = 8 * 32 * VOCAB * 4
    assert head["floor_bytes"] >= logits and head["saved_bytes_after"] >= logits
    assert body["model_graphs"] == 2 and body["recompute_nodes"] > 0  # fired, re-planned
    assert saved <= 0.5 * eager, (saved, eager)
    assert saved == body["saved_bytes_after"] + head["saved_bytes_after"]
    assert torch.equal(loss, eager_loss)
    for got, want in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_strict_raises_where_the_graphs_floors_together_miss_the_budget():
    """At 0.25 the loss graph's logits alone are 0.31 of eager's bytes. The error names
    the floor, how much of it the logits are, and the fix (one graph; for transformers,
    fxopt.ignore_transformers_logging()): issue 29 item 4, where GPT-2 with its logging
    break cannot meet 0.3. Before, it named the floor alone."""
    model, (x, labels) = HeadThenLoss(), _inputs()
    compiled = torch.compile(model, backend=fxopt.backend(codegen="fx", memory_budget=0.25,
                                                          strict=True))
    with pytest.raises(Exception) as caught:
        _step(model, compiled, x, labels)
    assert "InfeasibleBudget" in str(caught.value) or isinstance(caught.value,
                                                                 InfeasibleBudget)
    message = str(caught.value)
    logits = 8 * 32 * VOCAB * 4
    assert "the floors of the model's 2 graphs together are" in message
    assert f"{logits} bytes of the floor" in message
    assert "across a graph break" in message and "ignore_transformers_logging()" in message
    assert "model.loss_type = 'ForCausalLM'" in message


@pytest.mark.slow
def test_under_inductor_and_bf16_the_upcast_logits_are_recomputed():
    """Inductor's decompositions write ``logits.float()`` as ``prims.convert_element_type``;
    a chain that stopped there kept the fp32 copy (the loss graph's floor was 1.0, and
    strict raised). Now the bf16 logits are kept and the rest recomputed: floor 0.5."""
    model, (x, labels) = HeadThenLoss(), _inputs()
    *_, eager = _step(model, model, x, labels, bf16=True)
    backend = fxopt.backend(codegen="inductor", memory_budget=0.5, strict=True)
    compiled = torch.compile(model, backend=backend)
    _step(model, compiled, x, labels, bf16=True)
    *_, saved = _step(model, compiled, x, labels, bf16=True)
    head = _stats(backend)[-1]
    assert head["floor_fraction"] == pytest.approx(0.5, abs=0.01)
    assert head["inductor"]["saved_bytes_after"] >= 8 * 32 * VOCAB * 2  # the bf16 logits
    assert saved <= 0.5 * eager * 1.05, (saved, eager)
    assert saved == sum(s["inductor"]["saved_bytes_after"] for s in _stats(backend)[-2:])


def test_explain_names_the_logging_break_and_the_setting_that_removes_it():
    report = fxopt.explain(HeadThenLoss(), *_inputs(),
                           options={"codegen": "fx", "memory_budget": 0.5})
    assert len(report.graphs) == 2
    note = next(n for n in report.notes if "logging call" in n)
    assert "Logger.debug" in note and "ignore_logging_functions" in note
    assert "ignore_transformers_logging" in note


def test_logging_break_reads_dynamos_reasons():
    reason = ("logging.Logger method not supported for non-export cases\n  Developer debug "
              "context: method: <Logger transformers.modeling_utils (WARNING)>.warning_once, "
              "args: [ConstantVariable(str: 'loss_type=None')], kwargs: {}")
    assert logging_break(reason) == "Logger.warning_once"
    assert logging_break("Logger not supported for non-export cases") \
        == "Logger"
    assert logging_break("Tensor.item() call") is None


def test_a_decomposed_upcast_is_recomputable():
    graph = torch.fx.Graph()
    logits = graph.placeholder("logits")
    upcast = graph.call_function(torch.ops.prims.convert_element_type.default,
                                 (logits, torch.float32))
    assert recomputable(upcast)


@pytest.mark.slow
def test_under_inductor_the_body_is_planned_again_and_the_loss_graph_falls_back():
    """fp32 under Inductor: the body, compiled first, is recompiled within a smaller share
    at its next call; the loss graph's min-cut keeps 4 bytes over its share (its floor,
    the logits) at every budget, and fxopt's plan under the default partitioner meets it."""
    model, (x, labels) = HeadThenLoss(), _inputs()
    *_, eager = _step(model, model, x, labels)
    backend = fxopt.backend(codegen="inductor", memory_budget=0.5, strict=True)
    compiled = torch.compile(model, backend=backend)
    _step(model, compiled, x, labels)
    *_, saved = _step(model, compiled, x, labels)
    body, head = _stats(backend)[-2:]
    assert body["share_bytes"] < 0.5 * body["plain_saved_bytes"]  # planned again, with less
    assert head["inductor"]["partition"] == "fxopt plan, default partitioner"
    assert saved <= 0.5 * eager
    assert saved == body["inductor"]["saved_bytes_after"] + head["inductor"]["saved_bytes_after"]


@pytest.mark.parametrize("codegen", ["fx", pytest.param("inductor", marks=pytest.mark.slow)])
def test_under_dynamic_shapes_the_body_is_planned_again_on_its_symbolic_sizes(codegen):
    """``dynamic=True``: the body planned again at its next call traces Dynamo's fake
    values, its batch size still a symbol, and then serves every batch size; on the call's
    inputs the size symbol became an int and the recompile failed (strict raised a
    PassFailure in the second training step)."""
    model = HeadThenLoss()
    backend = fxopt.backend(codegen=codegen, memory_budget=0.5, strict=True)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    for step, batch in enumerate((8, 5, 11)):
        data = torch.Generator().manual_seed(batch)
        x = torch.randn(batch, 32, WIDTH, generator=data)
        labels = torch.randint(0, VOCAB, (batch, 32), generator=data)
        eager_loss, eager_grads, eager = _step(model, model, x, labels)
        loss, grads, saved = _step(model, compiled, x, labels)
        torch.testing.assert_close(loss, eager_loss)
        for got, want in zip(grads, eager_grads, strict=True):
            torch.testing.assert_close(got, want)
        if step:  # the budget holds from the step after the loss graph's compile
            assert saved <= 0.5 * eager, (batch, saved, eager)
    assert len(backend.graphs) == 2  # one compile per graph: no size was specialized
    body = _stats(backend)[0]
    assert body["share_bytes"] < 0.5 * body["plain_saved_bytes"]  # planned again, with less
