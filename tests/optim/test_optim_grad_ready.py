"""Gradients copied to the host where the compiled backward produces them (issue 30.3: a
compiled graph hands its gradients to autograd only at its end, so copies started from
autograd's hooks cannot overlap that graph's backward).

- ``fxopt::grad_ready`` runs inside the compiled backward, under fx and under Inductor, in
  the order the gradients are produced, every call before autograd's first hook;
- the offloaded optimizer copies each host-updated gradient at its announcement and the
  hook copies none, with parameters bit-identical to the hook-only path, also where the
  hook must copy after all: gradient accumulation, a parameter used by two graphs (whose
  announcements are no longer copied once its hook has seen their sum); a graph compiled
  after the optimizer is listened to;
- an announcement does not outlive its backward; closing removes the listeners.
"""

import copy

import pytest
import torch
from models import MLP
from torch import nn

import fxopt
from fxopt.optim import grad_ready as announcements
from fxopt.optim import offload
from fxopt.optim.host_grads import GradientCopies
from fxopt.optim.link import gradient_sources

CODEGENS = ["fx", "inductor"]
WIDTH = 13  # MLP's input


class TiedAcrossABreak(nn.Module):
    """``a.weight`` is used by both graphs: its gradient is their two contributions'
    sum."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        x = torch.tanh(self.a(x))
        torch._dynamo.graph_break()
        return self.b(x @ self.a.weight)


def _compiled(model, codegen):
    backend = fxopt.backend(offload_optimizer=True, codegen=codegen, strict=True)
    return backend, torch.compile(model, backend=backend)


def _inputs(step):
    return torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(step))


@pytest.mark.parametrize("codegen", CODEGENS)
def test_the_compiled_backward_announces_each_gradient_before_autograd_sees_any(codegen):
    torch.manual_seed(0)
    model = MLP()
    backend, compiled = _compiled(model, codegen)
    compiled(_inputs(0)).sum().backward()  # compiles
    model.zero_grad(set_to_none=True)
    params = list(model.parameters())
    sources = gradient_sources(backend, compiled, params)
    assert sorted(sources) == list(range(len(params)))
    events = []
    handles = [announcements.listen(sources[i], lambda g, i=i: events.append(("announced", i)))
               for i in sources]
    for i, p in enumerate(params):
        handles.append(p.register_post_accumulate_grad_hook(
            lambda p, i=i: events.append(("accumulated", i))))
    compiled(_inputs(1)).sum().backward()
    for handle in handles:
        handle.remove()
    (record,) = [r for g in backend.graphs for r in g.pass_records("offload_optimizer")]
    ready = sorted(record.stats["gradients"], key=lambda g: g["ready"])
    input_to_param = {src[1]: i for i, (src,) in sources.items()}
    assert events[:len(params)] == [("announced", input_to_param[g["input"]]) for g in ready]
    assert sorted(events[len(params):]) == [("accumulated", i) for i in range(len(params))]


def _count_copies(monkeypatch):
    """Copies started at an announcement, and by autograd's hook or step's refresh."""
    counts = {"announced": 0, "hook": 0}
    start, copy_current = GradientCopies.start, GradientCopies.copy

    def counted_start(self, hp, grad):
        counts["announced"] += 1
        return start(self, hp, grad)

    def counted_copy(self, hp):
        if hp.param.grad is not None:  # then it calls start too
            counts["hook"] += 1
            counts["announced"] -= 1
        return copy_current(self, hp)

    monkeypatch.setattr(GradientCopies, "start", counted_start)
    monkeypatch.setattr(GradientCopies, "copy", counted_copy)
    return counts


def _train(model, optimizer, steps, micro_batches, width, device="cpu"):
    for step in range(steps):
        for micro in range(micro_batches):
            x = torch.randn(4, width, generator=torch.Generator().manual_seed(10 * step + micro))
            model(x.to(device)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _twins(model_class, codegen, device="cpu"):
    """The same model compiled twice: one offloaded with the announcements, one with
    autograd's hooks only (no backend given: no sources)."""
    torch.manual_seed(0)
    model = model_class().to(device)
    twin = copy.deepcopy(model)
    backend, compiled = _compiled(model, codegen)
    _, twin_compiled = _compiled(twin, codegen)
    return model, compiled, backend, twin, twin_compiled


# on CUDA the copies run on the copy stream, ordered after the gradient's kernels
WHERE = [("fx", "cpu"), ("inductor", "cpu"),
         pytest.param("inductor", "cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize(("codegen", "device"), WHERE)
@pytest.mark.parametrize("micro_batches", [1, 2])
def test_host_gradients_are_copied_at_their_announcement_and_train_bit_identically(
        codegen, device, micro_batches, monkeypatch):
    model, compiled, backend, twin, twin_compiled = _twins(MLP, codegen, device)
    for m in (compiled, twin_compiled):  # compile, so the pass has recorded the graph
        m(_inputs(0).to(device)).sum().backward()
    model.zero_grad(set_to_none=True)
    twin.zero_grad(set_to_none=True)
    announced = offload(torch.optim.AdamW(model.parameters(), lr=1e-2), backend,
                        model=compiled, cpu_fraction=1.0, subgroups=2)
    hooked = offload(torch.optim.AdamW(twin.parameters(), lr=1e-2), twin, cpu_fraction=1.0,
                     subgroups=2)
    counts = _count_copies(monkeypatch)
    _train(compiled, announced, 3, micro_batches, WIDTH, device)
    n = len(list(model.parameters()))
    # the first micro-batch's gradients at their announcement; a later one's sum, which
    # autograd adds into the existing .grad after the graph, by the hook
    assert counts == {"announced": 3 * n, "hook": 3 * n * (micro_batches - 1)}
    _train(twin_compiled, hooked, 3, micro_batches, WIDTH, device)
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), name
    assert all(hp.announced is None for hp in announced._host.values())  # forgotten


def test_a_parameter_used_by_two_graphs_is_copied_by_its_hook_after_the_first_step(
        monkeypatch):
    model, compiled, backend, twin, twin_compiled = _twins(TiedAcrossABreak, "fx")
    for m in (compiled, twin_compiled):
        m(torch.randn(4, 6)).sum().backward()
    assert len(backend.graphs) == 2
    model.zero_grad(set_to_none=True)
    twin.zero_grad(set_to_none=True)
    params = list(model.parameters())
    assert len(gradient_sources(backend, compiled, params)[0]) == 2  # a.weight: both graphs
    announced = offload(torch.optim.Adam(model.parameters(), lr=1e-2), backend,
                        model=compiled, cpu_fraction=1.0, subgroups=2)
    hooked = offload(torch.optim.Adam(twin.parameters(), lr=1e-2), twin, cpu_fraction=1.0,
                     subgroups=2)
    counts = _count_copies(monkeypatch)
    _train(compiled, announced, 2, 1, 6)
    # a.weight: autograd adds the two graphs' contributions before it accumulates (after
    # both backwards), so the first step's two announced copies are wasted and its hook
    # copies the sum; from then on its announcements are not copied, only its hook's sum
    assert counts == {"announced": 2 * (len(params) - 1) + 2, "hook": 2}
    assert not announced._host[0].copy_announced
    _train(twin_compiled, hooked, 2, 1, 6)
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), name


def _compiled_and_offloaded():
    """MLP compiled under fx (one step run) and an SGD offloaded from its backend."""
    torch.manual_seed(0)
    model = MLP()
    backend, compiled = _compiled(model, "fx")
    compiled(_inputs(0)).sum().backward()
    model.zero_grad(set_to_none=True)
    optimizer = offload(torch.optim.SGD(model.parameters(), lr=0.1), backend, model=compiled,
                        cpu_fraction=1.0, subgroups=2)
    return model, backend, compiled, optimizer


def test_an_announcement_does_not_outlive_its_backward_and_close_stops_listening():
    model, backend, compiled, optimizer = _compiled_and_offloaded()
    # torch.autograd.grad accumulates nothing: no hook checks the announcements, and
    # the end of the backward forgets them (a later tensor may reuse their addresses)
    torch.autograd.grad(compiled(_inputs(1)).sum(), list(model.parameters()))
    assert all(hp.announced is None for hp in optimizer._host.values())
    assert all(p.grad is None for p in model.parameters())
    sources = [s for srcs in gradient_sources(backend, compiled,
                                              list(model.parameters())).values() for s in srcs]
    assert all(s in announcements._listeners for s in sources)
    # called outside a backward pass (no hook will check it): copied, not remembered
    index, ((graph, position),) = next(iter(gradient_sources(
        backend, compiled, list(model.parameters())).items()))
    announcements.GRAD_READY(torch.zeros_like(list(model.parameters())[index]), graph,
                             position)
    assert all(hp.announced is None for hp in optimizer._host.values())
    optimizer.close()
    assert not any(s in announcements._listeners for s in sources)


def test_a_graph_compiled_after_the_optimizer_is_listened_to(monkeypatch):
    """A new batch size after offload(): Dynamo compiles another graph, whose first
    grad_ready call lets the optimizer find and listen to its announcements."""
    model, backend, compiled, optimizer = _compiled_and_offloaded()
    counts = _count_copies(monkeypatch)
    compiled(torch.randn(6, WIDTH)).sum().backward()
    assert len(backend.graphs) == 2
    assert counts == {"announced": len(list(model.parameters())), "hook": 0}
    optimizer.step()
    optimizer.close()
