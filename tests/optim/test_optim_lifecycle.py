"""An offloaded optimizer is freed when dropped, with the model it trains: no hook, thread
or registry keeps either alive (issue 28, item 4: on main the parameters' gradient hooks
closed over the optimizer, a cycle through C++ that gc never collects, so every offloaded
AdamW built in a loop kept its model's device memory). Its worker thread stops when it is
dropped, closed or its ``with`` block ends; a closed optimizer refuses to be used."""

import gc
import threading
import weakref

import pytest
import torch
from models import MLP

import fxopt
from fxopt.devices import indexed
from fxopt.optim import offload
from fxopt.optim.worker import THREAD_PREFIX, HostWorker

FRACTIONS = (0.0, 0.5, 1.0)


def _workers():
    return {t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)}


def _train(compiled, optimizer, steps=2):
    for _ in range(steps):
        optimizer.zero_grad()
        compiled(torch.randn(3, 13)).sum().backward()
        optimizer.step()


def _build_train_drop(codegen, cpu_fraction):
    """Weak references to everything a dropped training setup should free, and the backend
    (kept: its records, the plan among them, must not hold the model)."""
    torch.manual_seed(0)
    model = MLP()
    backend = fxopt.backend(offload_optimizer=True, codegen=codegen)
    compiled = torch.compile(model, backend=backend)
    compiled(torch.randn(3, 13)).sum().backward()  # compiles; the pass records the order
    optimizer = offload(torch.optim.AdamW(model.parameters()), backend, model=compiled,
                        cpu_fraction=cpu_fraction, subgroups=2)
    assert (optimizer.plan.cpu_share > 0) == (cpu_fraction > 0)  # the placement asked for
    _train(compiled, optimizer)
    refs = [weakref.ref(o) for o in (model, optimizer, *model.parameters(),
                                     *optimizer.state_tensors("cpu"),
                                     *optimizer.state_tensors("gpu"))]
    return refs, backend


@pytest.mark.parametrize("cpu_fraction", FRACTIONS)
@pytest.mark.parametrize("codegen", ["fx", "inductor"])  # Inductor: a 2-layer MLP, seconds
def test_a_dropped_optimizer_frees_the_model_and_its_state(codegen, cpu_fraction):
    refs, backend = _build_train_drop(codegen, cpu_fraction)
    torch._dynamo.reset()
    gc.collect()
    assert backend.graphs  # still holding its compiled graphs' records
    alive = [r() for r in refs if r() is not None]
    assert not alive, (f"{len(alive)} of {len(refs)} objects outlived the model and the "
                       f"optimizer: {[type(o).__name__ for o in alive]}")


def test_dropping_only_the_optimizer_detaches_it_from_the_model():
    """The model lives on (a sweep keeps it, a restart reuses it): the dropped optimizer
    leaves no hook on its parameters and stops its thread, and a new one trains it."""
    torch.manual_seed(0)
    model = MLP()
    before = _workers()
    optimizer = offload(torch.optim.AdamW(model.parameters()), model, cpu_fraction=1.0)
    _train(model, optimizer)
    started = _workers() - before
    assert len(started) == 1  # the host updates ran on the worker thread
    ref = weakref.ref(optimizer)
    del optimizer
    gc.collect()
    assert ref() is None
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())
    for thread in started:
        thread.join(timeout=10)
        assert not thread.is_alive()
    again = offload(torch.optim.AdamW(model.parameters()), model, cpu_fraction=0.5)
    _train(model, again)


def test_close_and_the_with_block_stop_the_worker_and_free_the_state():
    torch.manual_seed(0)
    model = MLP()
    before = _workers()
    with offload(torch.optim.AdamW(model.parameters()), model, cpu_fraction=1.0) as opt:
        _train(model, opt)
        started = _workers() - before
        masters = [weakref.ref(t) for t in opt.state_tensors("cpu")]
        assert started and masters and not opt.closed
    assert opt.closed
    assert not any(t.is_alive() for t in started)  # close() joins the thread
    gc.collect()
    assert all(r() is None for r in masters)  # freed while `opt` is still referenced
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())
    opt.close()  # idempotent
    for use in (opt.step, opt.state_dict, lambda: opt.load_state_dict({}),
                lambda: opt.state_tensors("cpu"), opt.__enter__):
        with pytest.raises(RuntimeError, match="closed offloaded optimizer"):
            use()


@pytest.mark.parametrize("staged", [True, 0.5])
def test_staging_buffers_and_staged_state_go_with_a_dropped_or_closed_optimizer(staged):
    """The staged path's buffers, its host state and its internal optimizers hold neither
    the wrapper nor the model: dropping frees them all; close() frees them at once."""
    torch.manual_seed(0)
    model = MLP()
    optimizer = offload(torch.optim.AdamW(model.parameters()), model, cpu_fraction=1.0,
                        staged=staged, subgroups=4)
    _train(model, optimizer)
    assert "staged" in optimizer.placements()
    state = [weakref.ref(t) for t in (*optimizer.state_tensors("gpu"),
                                     *optimizer.state_tensors("cpu"))]
    refs = [weakref.ref(optimizer), weakref.ref(model), *state]
    del optimizer, model
    gc.collect()
    assert all(r() is None for r in refs)

    model = MLP()
    with offload(torch.optim.AdamW(model.parameters()), model, cpu_fraction=1.0,
                 staged=staged, subgroups=4) as opt:
        _train(model, opt)
        buffers = [weakref.ref(t) for t in opt.state_tensors("gpu")]
        assert buffers
    gc.collect()
    assert all(r() is None for r in buffers)  # freed while `opt` is still referenced
    with pytest.raises(RuntimeError, match="closed offloaded optimizer"):
        opt.step()


def test_a_closed_optimizer_no_longer_copies_gradients():
    torch.manual_seed(0)
    model = MLP()
    optimizer = offload(torch.optim.Adam(model.parameters()), model, cpu_fraction=1.0)
    optimizer.close()
    model(torch.randn(3, 13)).sum().backward()  # no hook left to run
    assert all(p.grad is not None for p in model.parameters())


def test_the_worker_stops_from_any_thread_and_refuses_work_after():
    worker = HostWorker()
    assert worker.submit(threading.current_thread).result().name.startswith(worker.name + "_")
    worker.submit(worker.stop).result(timeout=10)  # from its own thread: no self-join
    with pytest.raises(RuntimeError, match="stopped"):
        worker.submit(print)
    worker.stop()  # idempotent


@pytest.mark.gpu
def test_offloaded_optimizers_built_in_a_loop_return_their_device_memory():
    """The H100 measurement of issue 28: each dropped offloaded AdamW kept 630-790 MiB.
    Every round of a loop ends where the first ended (the first also leaves what lives
    for the process: cuBLAS workspaces)."""
    device = indexed("cuda")
    after = []
    for cpu_fraction in (0.5, 1.0, 0.5, 1.0):
        model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).to(device)
        optimizer = offload(torch.optim.AdamW(model.parameters()), model,
                            cpu_fraction=cpu_fraction)
        for _ in range(2):
            optimizer.zero_grad()
            model(torch.randn(16, 1024, device=device)).sum().backward()
            optimizer.step()
        torch.cuda.synchronize(device)
        del model, optimizer
        gc.collect()
        after.append(torch.cuda.memory_allocated(device))
    assert after == [after[0]] * len(after), after
