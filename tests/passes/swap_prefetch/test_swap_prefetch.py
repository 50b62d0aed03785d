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


def test_under_inductor_each_prefetch_and_offload_finish_stays_where_it_was_placed():
    """Inductor's scheduler hoists a call whose inputs are ready: without their ordering
    arguments every prefetch was started and waited for at the backward's first line
    (every swapped tensor back on the device at once), and an offload could finish
    before the compute that hides its copy."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(48, 48), nn.GELU())])
    backend = fxopt.backend(codegen="inductor", memory_budget=0.3, force_swap=True)
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(64, 48)
    with pytest.warns(UserWarning, match="cannot fit"):
        _, (forward, backward) = run_and_get_code(lambda: compiled(x).sum().backward())

    def calls(code):
        body = code[code.index("def call("):].splitlines()
        return [line.strip() for line in body
                if "torch.ops.fxopt.swap_" in line or "extern_kernels.mm" in line
                or "extern_kernels.addmm" in line or line.strip().startswith("cpp_fused")]

    def kernel(line):
        return "swap_" not in line

    forward, backward = calls(forward), calls(backward)
    waits = [i for i, line in enumerate(backward) if "swap_prefetch_wait" in line]
    assert len(waits) >= 2
    # compute runs before the first wait and between the first and the last (two waits
    # for one backward node's inputs may stand together, as in the fx graph)
    assert any(kernel(line) for line in backward[:waits[0]])
    assert any(kernel(line) for line in backward[waits[0]:waits[-1]])
    # each offload's finish comes after some compute issued since its start
    starts = [i for i, line in enumerate(forward) if "swap_offload_start" in line]
    finishes = [i for i, line in enumerate(forward) if "swap_offload_finish" in line]
    assert len(starts) == len(finishes) >= 2
    assert any(any(kernel(line) for line in forward[s:f]) for s, f in zip(starts, finishes))


def test_a_swap_whose_offload_the_partitioner_put_in_the_backward_is_undone():
    """The backward then has the device tensor saved: its readers read it again and the
    four swap ops go (two copies saved, nothing else changes)."""
    import torch.fx as fx

    from fxopt.passes.swap_recompute.apply import undo_backward_offloads

    ops = torch.ops.fxopt
    graph = fx.Graph()
    x, g = graph.placeholder("x"), graph.placeholder("tangents_1")
    token = graph.call_function(ops.swap_offload_start.default, (x,))
    host = graph.call_function(ops.swap_offload_finish.default, (token, x, [g]))
    started = graph.call_function(ops.swap_prefetch_start.default,
                                  (host, torch.device("cpu"), []))
    back = graph.call_function(ops.swap_prefetch_wait.default,
                               (started, host, torch.device("cpu"), [g]))
    graph.output(graph.call_function(torch.ops.aten.mul.Tensor, (back, g)))
    backward = fx.GraphModule(torch.nn.Module(), graph)
    assert undo_backward_offloads(backward) == ["x"]
    assert [n.op for n in backward.graph.nodes] == [
        "placeholder", "placeholder", "call_function", "output"]
    product = next(n for n in backward.graph.nodes if n.op == "call_function")
    assert product.args == (x, g)
    a, b = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(backward(a, b), a * b)
