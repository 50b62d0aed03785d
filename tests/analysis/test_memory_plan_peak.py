"""One memory model: the peak a plan predicts is the compiled step's simulation, the one
explain reports, and it is within 5% of the peak measured by the memory profiler on the
real compiled step (transformers' GPT-2, BERT and Llama at the suite's smoke size, dropout
0.1, one graph: the loss is computed in the compiled module).

Measured when written at 2 layers x 64 (batch 2 x 32; the tests run the smoke size,
2 layers x 32): with fx code generation the
prediction equals the measurement to 0.01% at fraction budgets 0.7 and 0.5 and at a byte
budget. With ``codegen="inductor"`` and no budget, the Inductor-aware simulation
(:func:`fxopt.analysis.memory.inductor_buffers`) is within 0.1% on GPT-2 and BERT, where
the node-by-node simulation is 13% and 8% over.
"""

import functools
import warnings

import pytest
import torch
from models import load_benchmark

from fxopt.analysis import estimate_step_memory
from fxopt.compiler import Backend
from fxopt.profile import profile_memory

pytest.importorskip("transformers")

# the models of benchmarks/planner_accuracy.py (its loss in the module: one graph), at the
# benchmark suite's smoke size
accuracy = load_benchmark("planner_accuracy")

TOLERANCE = 0.05  # issue 16: predicted peak within 5% of measured


def tiny(kind: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    size = accuracy.SIZES["smoke"]
    torch.manual_seed(0)
    ids = torch.randint(0, size["vocab"], (size["batch"], size["seq"]))
    return accuracy.build(kind, "smoke").train(), {"input_ids": ids}


def compiled_step(kind: str, options: dict) -> tuple[int, object]:
    """The measured peak of one compiled training step, and fxopt's record of its graph."""
    model, inputs = tiny(kind)
    backend = Backend(options)
    compiled = torch.compile(model, backend=backend)
    measured = profile_memory(compiled, inputs, steps=1, loss_fn=lambda loss: loss).peak_bytes
    torch._dynamo.reset()
    (record,) = backend.graphs
    return measured, record


@pytest.mark.parametrize("kind", ["gpt2", "bert", "llama"])
@pytest.mark.parametrize("budget", [0.5, "bytes"])
def test_plan_peak_is_explains_and_within_5_percent_of_measured(kind, budget):
    if budget == "bytes":  # a byte budget 10% under the keep-all step's peak
        _, plain = compiled_step(kind, {"codegen": "fx"})
        budget = int(0.9 * plain.memory["fxopt"].peak_bytes)
    measured, record = compiled_step(kind, {"codegen": "fx", "memory_budget": budget})
    (swap_recompute,) = record.pass_records("swap_recompute")
    assert swap_recompute.fired
    predicted = swap_recompute.stats["plan"]["predictions"]["peak_bytes"]
    assert predicted == record.memory["fxopt"].peak_bytes  # explain's final prediction
    assert predicted == pytest.approx(measured, rel=TOLERANCE)
    if isinstance(budget, int) and swap_recompute.stats["feasible"]:
        assert measured <= budget


def test_inductor_prediction_within_5_percent_of_measured():
    measured, record = compiled_step("bert", {"codegen": "inductor"})
    fw, bw = record.graphs["forward"], record.graphs["backward"]
    predicted = record.memory["fxopt"].peak_bytes
    assert predicted == estimate_step_memory(fw, bw, codegen="inductor").peak_bytes
    assert predicted == pytest.approx(measured, rel=TOLERANCE)
    # node by node (every intermediate stored) the same graphs are predicted too high
    assert estimate_step_memory(fw, bw).peak_bytes > (1 + TOLERANCE) * measured


@functools.cache
def inductor_keep_all_peak(kind: str) -> int:
    """The predicted peak of ``kind``'s compiled step under Inductor with everything kept."""
    return compiled_step(kind, {"codegen": "inductor"})[1].memory["fxopt"].peak_bytes


@pytest.mark.parametrize("fraction", [0.9, 0.8])
def test_a_byte_budget_under_inductor_is_met_when_its_plan_says_it_fits(fraction):
    """Issue 30 item 4: a byte budget's plan under Inductor (recompute tags min-cut
    honours). Inductor orders its fused kernels itself, so its measured peak can exceed the
    simulation of the graph's order; the plan keeps ``Codegen.peak_margin`` of its bound for
    that (without it, GPT-2 at 0.8 of its keep-all peak measured above the budget its plan
    said it fitted: benchmarks/results/inductor_budgets_cpu.md)."""
    budget = int(fraction * inductor_keep_all_peak("gpt2"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        measured, record = compiled_step("gpt2", {"codegen": "inductor",
                                                  "memory_budget": budget})
    (swap_recompute,) = record.pass_records("swap_recompute")
    assert swap_recompute.fired
    predicted = record.memory["fxopt"].peak_bytes
    assert predicted == pytest.approx(measured, rel=0.10)
    # a plan that says it fits is measured within the budget; one that does not says so to
    # the user (0.8 of the keep-all peak is below what the margin lets the plan reach)
    cannot_fit = [w for w in caught if "cannot fit" in str(w.message)]
    assert swap_recompute.stats["feasible"] == (fraction == 0.9)
    if swap_recompute.stats["feasible"]:
        assert measured <= budget and not cannot_fit
    else:
        assert cannot_fit


def test_inductor_buffers_fuses_pointwise_chains_and_reuses_dying_inputs():
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxopt.analysis.memory import inductor_buffers

    def step(x, w):
        y = torch.mm(x, w)           # extern kernel: stored
        e = torch.exp(y)             # read by a matmul: stored, in place of y (dies here)
        r = torch.relu(torch.mm(e, w))
        return (r * 2).sum()         # relu and mul computed inside the sum's kernel

    gm = make_fx(step)(torch.randn(8, 8), torch.randn(8, 8))
    by_target = {n.target: n for n in gm.graph.nodes if n.op == "call_function"}
    aten = torch.ops.aten
    fused, reuses = inductor_buffers(gm)
    assert {n.target for n in fused} == {aten.relu.default, aten.mul.Tensor}
    mm_first = next(n for n in gm.graph.nodes if n.target is aten.mm.default)
    assert reuses == {by_target[aten.exp.default]: mm_first}
