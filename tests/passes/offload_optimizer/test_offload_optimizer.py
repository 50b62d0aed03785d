"""The offload_optimizer pass: it fires on the backward graph, adding only a
``fxopt::grad_ready`` call after each gradient's producer (outputs and gradients equal
eager), records every gradient in ready order with its size, plans, shows the plan in
explain and the debug dump, and the runtime reads it to train a compiled model (a tiny
Llama too) with the same trajectory as the plain optimizer."""

import copy
import json

import pytest
import torch
from models import MLP, ConvNet
from test_compiler import WithGraphBreak

import fxopt
from fxopt.optim import OffloadPlan, offload
from fxopt.optim.grad_ready import GRAD_READY
from fxopt.optim.link import gradient_order, match_graph_inputs
from fxopt.testing import assert_same_as_eager

OFFLOAD = {"offload_optimizer": True, "strict": True}


def _record(graphs):
    (record,) = [r for g in graphs for r in g.pass_records("offload_optimizer")]
    return record


def test_fires_announces_each_gradient_after_its_producer_and_records_every_gradient():
    model = ConvNet()
    comparison = assert_same_as_eager(model, (torch.randn(2, 3, 12, 12),), OFFLOAD)
    record = _record(comparison.graphs)
    assert record.status == "changed" and record.fired
    gradients = record.stats["gradients"]
    # one fxopt::grad_ready(grad, graph id, input) right after each gradient's producer
    assert record.stats["announced"] == len(gradients)
    assert record.nodes_after == record.nodes_before + len(gradients)
    backward = comparison.graphs[0].graphs["backward"].graph
    calls = [n for n in backward.nodes if n.target is GRAD_READY]
    assert sorted((n.args[0].name, n.args[2]) for n in calls) == sorted(
        (g["node"], g["input"]) for g in gradients)
    assert {n.args[1] for n in calls} == {record.stats["graph_id"]}
    assert all(n.prev is n.args[0] or n.prev.target is GRAD_READY for n in calls)
    assert sorted(g["numel"] for g in gradients) == sorted(p.numel() for p in model.parameters())
    assert [g["ready"] for g in gradients] == list(range(len(gradients)))
    positions = [g["position"] for g in gradients]
    assert positions == sorted(positions)
    # ready_seconds: the backward's predicted time left, shrinking in ready order
    remaining = [g["ready_seconds"] for g in gradients]
    assert remaining == sorted(remaining, reverse=True) and remaining[-1] >= 0
    plan = OffloadPlan.from_dict(record.stats["plan"])
    assert sorted(k for s in plan.subgroups for k in s.params) == sorted(
        g["input"] for g in gradients)
    # the backward's length (a lower bound: the first subgroup's last gradient's time
    # left) is what the host's overhead is held against; all on the device, the host has
    # nothing to keep up with
    assert 0 < plan.backward_seconds <= max(remaining)
    assert record.stats["host_keeps_up"] is True and plan.keeps_up() is True


def test_explain_and_the_debug_dump_show_the_plan(tmp_path):
    report = fxopt.explain(MLP(), torch.randn(4, 13),
                           options={**OFFLOAD, "debug_dir": str(tmp_path)})
    (record,) = [r for r in report.passes if r.name == "offload_optimizer"]
    text = str(report)
    assert "plan={" in text and "predicted_ms=" in text and "gradients=[" in text
    json.dumps(record.stats)
    dumped = list(tmp_path.rglob("*offload_optimizer.plan.json"))
    assert len(dumped) == 1
    assert "predicted_seconds" in json.loads(dumped[0].read_text())


def test_off_by_default():
    comparison = assert_same_as_eager(MLP(), (torch.randn(4, 13),), {"strict": True})
    assert _record(comparison.graphs).status == "skipped"


def _train_compiled(model, optimizer, steps, make_input):
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = model(make_input(step)).float().pow(2).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses


def _check_runtime_on(model, make_input, steps=3):
    eager = copy.deepcopy(model)
    backend = fxopt.backend(**OFFLOAD)
    compiled = torch.compile(model, backend=backend)
    compiled(make_input(0)).float().sum().backward()  # compile, record the gradient order
    model.zero_grad()
    params = list(model.parameters())
    order = gradient_order(backend, compiled, params)
    assert sorted(i for i, _ in order) == list(range(len(params)))
    # every parameter is matched to its graph input by name, none left to the fallback
    names = [n.name for n in backend.graphs[0].graphs["dynamo"].graph.find_nodes(
        op="placeholder")]
    assert {id(p) for p in match_graph_inputs(names, model).values()} == {id(p) for p in params}
    recorded = {g["input"] for g in _record(backend.graphs).stats["gradients"]}
    assert set(match_graph_inputs(names, model)) <= recorded

    optimizer = offload(torch.optim.AdamW(model.parameters(), lr=1e-3), backend,
                        model=compiled, cpu_fraction=0.5, subgroups=4)
    assert set(optimizer.placements()) == {"cpu", "gpu"}
    plain = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    got = _train_compiled(compiled, optimizer, steps, make_input)
    expected = _train_compiled(eager, plain, steps, make_input)
    assert got == pytest.approx(expected, rel=1e-4)
    for (name, a), b in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_runtime_follows_the_recorded_order_on_a_compiled_mlp():
    torch.manual_seed(0)
    _check_runtime_on(MLP(), lambda step: torch.randn(4, 13, generator=torch.Generator()
                                                       .manual_seed(step)))


def test_runtime_on_a_compiled_tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(config).eval()  # no dropout; still trains

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.llama = llama

        def forward(self, ids):
            return self.llama(input_ids=ids).logits

    _check_runtime_on(Logits(), lambda step: torch.randint(
        0, 64, (2, 9), generator=torch.Generator().manual_seed(step)))


def test_graph_breaks_record_each_graph_and_order_last_graph_first():
    model = WithGraphBreak()
    backend = fxopt.backend(**OFFLOAD)
    compiled = torch.compile(model, backend=backend)
    compiled(torch.randn(2, 11)).sum().backward()
    assert len(backend.graphs) == 2
    fired = [r for g in backend.graphs for r in g.pass_records("offload_optimizer")
             if r.fired]
    assert len(fired) == 2
    params = list(model.parameters())
    order = [i for i, _ in gradient_order(backend, compiled, params)]
    assert sorted(order) == list(range(len(params)))
    assert order[0] > order[-1]  # the second graph's parameters get their gradients first


def test_a_gradient_that_views_a_graph_input_is_not_announced():
    """y + w, flattened: w's gradient is a view of the incoming gradient (the backward's
    tangent), ready when the backward starts; a declared mutation of it would make
    Inductor copy it back into the input."""

    class PassThrough(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 5))
            self.lin = torch.nn.Linear(5, 5)

        def forward(self, x):
            return self.lin(x).reshape(15) + self.w.reshape(15)

    comparison = assert_same_as_eager(PassThrough(), (torch.randn(3, 5),), OFFLOAD)
    record = _record(comparison.graphs)
    backward = comparison.graphs[0].graphs["backward"].graph
    announced = {n.args[2] for n in backward.nodes if n.target is GRAD_READY}
    recorded = {g["input"] for g in record.stats["gradients"]}
    assert record.stats["announced"] == len(announced) == len(recorded) - 1
