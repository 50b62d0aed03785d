"""Models that checkpoint their own blocks (``torch.utils.checkpoint``, as transformers'
``gradient_checkpointing_enable`` does) compile with fxopt as with plain torch.compile.

A random op inside a checkpointed block (SDPA with dropout, dropout itself) is replayed in
the backward from the forward's RNG state: the partitioner wraps it in
``run_and_save_rng_state`` / ``run_with_rng_state``. Those nodes carried no fake value
after Inductor's partition, so every graph's cost report failed with a logged traceback.
The block's attention has dropout: torch 2.11-2.13 wrap SDPA without it too, torch 2.14
only with it. The tests compile with Inductor (the default code generator, which the suite
pins to fx on the CPU), calling eager's random ops (``fallback_random``) so that the masks
compare with eager's.
"""

import logging
import operator

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import fxopt
from fxopt import _compat
from fxopt.analysis import measure_saved_bytes, node_cost

INDUCTOR = {"codegen": "inductor"}


class Attention(nn.Module):
    def __init__(self, width: int = 24, heads: int = 3) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=0.25 if self.training else 0.0)
        return x + self.proj(y.transpose(1, 2).reshape(b, t, d))


class CheckpointedModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Attention() for _ in range(2))
        self.head = nn.Linear(24, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(x).square().mean()


def _rng_wrappers(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function"
            and _compat.rng_wrapped_call(n) is not None]


def test_checkpointed_attention_is_costed_and_equal_to_eager(caplog):
    torch.manual_seed(0)
    model, x = CheckpointedModel(), torch.randn(2, 7, 24)
    with caplog.at_level(logging.WARNING, logger="fxopt"), \
            torch._inductor.config.patch(fallback_random=True):
        report = fxopt.explain(model, x, options=INDUCTOR)
        _equal_to_eager_and_plain(model, x)
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("fxopt")]
    graph = report.graphs[0]
    forward, backward = graph.graphs["forward"], graph.graphs["backward"]
    assert _rng_wrappers(forward) and _rng_wrappers(backward)  # the case this test is for
    assert graph.cost["forward"] is not None and graph.cost["backward"] is not None
    for node in _rng_wrappers(backward):  # the replayed attention writes and draws as SDPA
        op, _, _, value = _compat.rng_wrapped_call(node)
        cost = node_cost(node)
        assert cost.bytes_written >= value[0].numel() * 4 and cost.random > 0, op


def _equal_to_eager_and_plain(model: nn.Module, x: torch.Tensor) -> None:
    """fxopt's gradients equal eager's (the same seed: the same masks), and it keeps the
    bytes plain torch.compile keeps."""
    compiled = torch.compile(model, backend="fxopt", options=INDUCTOR)
    grads = []
    for run in (model, compiled):
        model.zero_grad()
        torch.manual_seed(1)
        run(x).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for eager_grad, fxopt_grad in zip(*grads):
        torch.testing.assert_close(fxopt_grad, eager_grad)
    torch._dynamo.reset()
    params = list(model.parameters())
    plain = torch.compile(model)
    compiled(x), plain(x)  # compiled outside the measuring hooks
    assert measure_saved_bytes(lambda: compiled(x), exclude=params).bytes == \
        measure_saved_bytes(lambda: plain(x), exclude=params).bytes


def test_an_rng_wrapper_costs_the_op_it_runs():
    """A replayed matmul is a matmul: its FLOPs, not a zero-cost 'other' node."""
    a, b = torch.randn(6, 5), torch.randn(5, 3)
    graph = torch.fx.Graph()
    pa, pb = graph.placeholder("a"), graph.placeholder("b")
    saved = graph.call_function(torch.ops.higher_order.run_and_save_rng_state,
                                (torch.ops.aten.mm.default, pa, pb))
    state = graph.call_function(operator.getitem, (saved, 0))
    replayed = graph.call_function(torch.ops.higher_order.run_with_rng_state,
                                   (state, torch.ops.aten.mm.default, pa, pb))
    graph.output(replayed)
    pa.meta["val"], pb.meta["val"] = a, b
    saved.meta["val"] = (torch.get_rng_state(), a @ b)
    state.meta["val"] = torch.get_rng_state()
    replayed.meta["val"] = a @ b
    for node in (saved, replayed):
        cost = node_cost(node)
        assert (cost.kind, cost.flops) == ("matmul", 2 * 6 * 5 * 3), node.name
