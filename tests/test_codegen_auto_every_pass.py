"""Issue 17's composition bar: with tempo, fuse_rnn and ``memory_budget=0.5`` (swap_recompute)
on, ``strict=True`` and fx code generation (the bitwise bar is the fx path's: Inductor's
fused kernels round differently once it recomputes; the default, Inductor, is checked in
bytes with tempo under a fraction by tests/test_codegen_auto_budget.py),
transformers' GPT-2, BERT, Llama and ViT and an ``nn.LSTM`` language model train with no
fallback, loss and every gradient bitwise equal to fxopt's with the same passes and no
budget (the reference: tempo and fuse_rnn change the numerics, the budget's recomputation
must not), whose loss equals eager's to fp32 rounding. Models and the step are
benchmarks/budget_reach.py's, at a tiny size."""


import pytest
import torch
from models import load_benchmark

import fxopt
from fxopt import _compat

pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

reach = load_benchmark("budget_reach")

# fuse_linear_cross_entropy, on by default under a budget, is on in the reference too:
# it changes the numerics (fp32 rounding), the budget's recomputation must not
PASSES = {"tempo": True, "fuse_rnn": True, "fuse_linear_cross_entropy": True,
          "codegen": "fx"}
# the pass that must fire on each model besides swap_recompute
FIRES = {"gpt2": "tempo", "bert": "tempo", "llama": "tempo", "vit": "tempo", "lstm": "fuse_rnn"}


@pytest.mark.parametrize("name", list(FIRES))
def test_every_pass_under_fx_codegen_and_strict(name):
    model, kwargs = reach.build(name, hidden=32, seq=16, batch=2)
    with _compat.dynamo_allow_rnn():
        eager_loss, _, _ = reach.step(model, kwargs, model)
        torch._dynamo.reset()
        unbudgeted = torch.compile(model, backend=fxopt.backend(strict=True, **PASSES))
        reach.step(model, kwargs, unbudgeted)
        ref_loss, ref_grads, _ = reach.step(model, kwargs, unbudgeted)
        torch._dynamo.reset()
        backend = fxopt.backend(strict=True, memory_budget=0.5, **PASSES)
        compiled = torch.compile(model, backend=backend)
        reach.step(model, kwargs, compiled)
        loss, grads, _ = reach.step(model, kwargs, compiled)
    torch.testing.assert_close(ref_loss, eager_loss, rtol=1e-5, atol=1e-6)
    assert torch.equal(loss, ref_loss)
    assert len(grads) == len(ref_grads)
    assert all(torch.equal(a, b) for a, b in zip(grads, ref_grads))
    assert backend.graphs and not [f for g in backend.graphs for f in g.every_fallback()]
    assert {g.codegen.name for g in backend.graphs} == {"fx"}
    assert any(r.fired for g in backend.graphs for r in g.pass_records(FIRES[name]))
    assert any(r.fired for g in backend.graphs for r in g.pass_records("swap_recompute"))
