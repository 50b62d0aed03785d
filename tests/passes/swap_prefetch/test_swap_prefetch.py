"""swap_prefetch: after the partitioner's reordering, each swapped activation's prefetch
starts ahead of its wait, where swap_recompute planned it."""

import pytest
import torch
from torch import nn

import fxopt


def test_prefetch_is_issued_ahead_of_its_wait():
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(64, 64), nn.GELU())])
    backend = fxopt.backend(memory_budget=0.3, force_swap=True)
    compiled = torch.compile(model, backend=backend)
    with pytest.warns(UserWarning, match="cannot fit"):
        compiled(torch.randn(32, 64)).sum().backward()
    (placement,) = backend.graphs[0].pass_records("swap_prefetch")
    assert placement.fired and placement.verdicts.count >= 1
    backward = backend.graphs[0].graphs["backward"]
    order = {n: i for i, n in enumerate(backward.graph.nodes)}
    waits = [n for n in backward.graph.nodes
             if n.target is torch.ops.fxopt.swap_prefetch_wait.default]
    assert waits and all(order[w.args[0]] <= order[w] - 1 for w in waits)
    assert any(order[w.args[0]] < order[w] - 1 for w in waits)
