"""Per-node costs: kinds and formulas on captured graphs, totals against FlopCounterMode."""

import operator

import pytest
import torch
import torch.nn.functional as F
from analysis_helpers import MLP, MODELS, ConvNet, capture
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils.flop_counter import FlopCounterMode

from fxopt.analysis import KINDS, NodeCost, graph_cost, node_cost

aten = torch.ops.aten
F32 = 4


def _node(gm, target):
    return next(n for n in gm.graph.nodes if n.target == target)


def test_kinds_and_formulas_on_an_mlp_forward():
    m, k, n, out = 2048, 256, 1024, 256
    cap = capture(MLP(k, n, out), torch.randn(m, k))
    fw = cap.fw
    # (target, kind, flops, bytes_read, bytes_written)
    table = [
        # Linear: addmm(bias, x, w.t()) = 2*M*N*K FLOPs; reads bias, x and w.
        (aten.addmm.default, "matmul", 2 * m * n * k, (n + m * k + n * k) * F32, m * n * F32),
        (aten.relu.default, "pointwise", m * n, m * n * F32, m * n * F32),
        (aten.t.default, "view", 0, 0, 0),
    ]
    for target, kind, flops, read, written in table:
        cost = node_cost(_node(fw, target))
        assert (cost.kind, cost.flops, cost.bytes_read, cost.bytes_written) == (
            kind, flops, read, written), target
    for node in fw.graph.nodes:
        if node.op in ("placeholder", "output"):
            assert node_cost(node) == NodeCost("other", 0, 0, 0)


def test_reduction_and_views_in_the_backward():
    m, k, n = 2048, 256, 1024
    cap = capture(MLP(k, n, k), torch.randn(m, k))
    bias_grad = node_cost(_node(cap.bw, aten.sum.dim_IntList))   # sum over the batch
    assert bias_grad.kind == "reduction"
    assert bias_grad.flops == m * k
    assert bias_grad.bytes_written == k * F32
    for node in cap.bw.graph.nodes:
        if node.target in (aten.view.default, aten.t.default):
            assert node_cost(node).bytes == 0 and node_cost(node).kind == "view"


def test_conv_flops_come_from_the_registry():
    x = torch.randn(16, 3, 64, 64)
    cap = capture(ConvNet(16), x)
    conv = node_cost(_node(cap.fw, aten.convolution.default))
    with FlopCounterMode(display=False) as counter:
        F.conv2d(x, torch.randn(16, 3, 3, 3), torch.randn(16), padding=1)
    assert conv.kind == "conv"
    assert conv.flops == counter.get_total_flops() == 2 * 16 * 64 * 64 * 16 * 3 * 3 * 3
    assert conv.bytes_written == 16 * 16 * 64 * 64 * F32


def test_unsafe_view_is_a_view():
    def fn(a, b):
        return torch.ops.aten._unsafe_view.default(torch.bmm(a, b), [4, 64, 32])

    gm = make_fx(fn, tracing_mode="fake")(torch.empty(4, 64, 16), torch.empty(4, 16, 32))
    cost = node_cost(_node(gm, aten._unsafe_view.default))
    assert cost.kind == "view" and cost.bytes == 0
    bmm = node_cost(_node(gm, aten.bmm.default))
    assert bmm.kind == "matmul" and bmm.flops == 2 * 4 * 64 * 32 * 16


def test_attention_kind_uses_the_registry_formula():
    b, h, s, d = 2, 4, 64, 16

    def fn(q, k, v):
        return aten._scaled_dot_product_efficient_attention.default(q, k, v, None, False)[0]

    gm = make_fx(fn, tracing_mode="fake")(*[torch.empty(b, h, s, d) for _ in range(3)])
    cost = node_cost(_node(gm, aten._scaled_dot_product_efficient_attention.default))
    assert cost.kind == "attention"
    assert cost.flops == 2 * (2 * b * h * s * s * d)  # q @ k^T and attn @ v


@pytest.mark.parametrize("name", sorted(MODELS))
def test_step_flops_match_flop_counter_mode(name):
    make_model, make_input = MODELS[name]
    model, x = make_model(), make_input()
    cap = capture(model, x)
    costs = [graph_cost(cap.fw), graph_cost(cap.bw)]
    predicted = sum(c.flops for g in costs for c in g.nodes.values()
                    if c.kind in ("matmul", "conv", "attention"))
    with FlopCounterMode(display=False) as counter:
        out = model(x)
        out.backward(torch.ones_like(out))
    assert predicted == counter.get_total_flops()
    for g in costs:
        assert g.flops == sum(c.flops for c in g.nodes.values())
        assert g.bytes == sum(c.bytes for c in g.nodes.values())
        assert set(g.by_kind()) <= set(KINDS)


def test_dynamic_graph_costs_use_hints_and_add_no_guards():
    make_model, make_input = MODELS["transformer_block"]
    model, x = make_model(), make_input()
    static = graph_cost(capture(model, x).fw)
    cap = capture(model, x, dynamic=True)
    sym = next(n.meta["val"] for n in cap.fw.graph.nodes
               if isinstance(n.meta.get("val"), torch.SymInt))
    guards = len(sym.node.shape_env.guards)
    dynamic = graph_cost(cap.fw)
    assert len(sym.node.shape_env.guards) == guards
    assert dynamic.by_kind()["matmul"] == static.by_kind()["matmul"]
    assert (dynamic.flops, dynamic.bytes_written) == (static.flops, static.bytes_written)


def test_missing_fake_value_raises():
    gm = make_fx(torch.relu, tracing_mode="fake")(torch.empty(8))
    node = _node(gm, aten.relu.default)
    del node.meta["val"]
    with pytest.raises(ValueError, match="ensure_fake_values"):
        node_cost(node)


def test_the_elements_of_a_split_live_in_its_input():
    """``chunk`` and ``unbind`` trace to ``getitem`` of a list view: each element is a view
    of the product it splits; a multi-output op's new tensors are their own storage."""
    from fxopt.analysis.cost import storage_root

    def fn(x, w):
        gate, up = (x @ w).chunk(2, dim=-1)
        first, _ = up.unbind(0)
        mean = torch.var_mean(x, dim=-1)[1]
        return gate.sin() * first + mean.unsqueeze(-1)

    gm = make_fx(fn, tracing_mode="fake")(torch.empty(2, 3, 4), torch.empty(4, 6))
    product = _node(gm, aten.bmm.default) if any(
        n.target is aten.bmm.default for n in gm.graph.nodes) else _node(gm, aten.mm.default)
    elements = [n for n in gm.graph.nodes if n.target is operator.getitem]
    var_mean = _node(gm, aten.var_mean.correction)
    roots = {n.name: storage_root(n).name for n in elements}
    assert {storage_root(n) for n in elements if n.args[0] is not var_mean} == {
        storage_root(product)}, roots
    assert all(storage_root(n) is n for n in elements if n.args[0] is var_mean), roots
