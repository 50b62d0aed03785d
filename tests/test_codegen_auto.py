"""codegen="auto", the default: Inductor on the CPU and on CUDA (fx code generation peaks at
eager's memory: benchmarks/results/default_peak_cpu.md), fx when fuse_elementwise is asked
for; under a fraction memory_budget Inductor (benchmarks/results/budget_frontier_cpu.md)
except where the fx path is kept (tempo, a saved plan, force_swap, a byte budget); explain
says which generator compiled each graph and why; "fx" and "inductor" force one.
tests/test_codegen_auto_budget.py runs the fraction's choice end to end."""

import pytest
import torch
from torch import nn

import fxopt
from fxopt import config
from fxopt.codegen import resolve_codegen

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize("options, device, expected", [
    ({}, CPU, "inductor"),
    ({}, CUDA, "inductor"),
    ({"tempo": True}, CPU, "inductor"),
    ({"fuse_elementwise": True}, CPU, "fx"),
    ({"fuse_elementwise": True}, CUDA, "fx"),
    ({"inductor_max_autotune": True}, CPU, "inductor"),  # asking for tuning asks for Inductor
    ({"codegen": "inductor"}, CPU, "inductor"),
    ({"codegen": "fx"}, CUDA, "fx"),
    ({"memory_budget": 0.5}, CPU, "inductor"),  # Inductor's budgeted min-cut: fewer bytes
    ({"memory_budget": "50%"}, CUDA, "inductor"),
    ({"memory_budget": 0.5, "codegen": "fx"}, CPU, "fx"),
    ({"memory_budget": "6GiB"}, CPU, "fx"),  # a bound on fx's simulated peak
    ({"memory_budget": 0.5, "force_swap": True}, CPU, "fx"),  # the fx path's swap runtime
])
@pytest.mark.default_codegen  # the resolution itself, unpinned
def test_auto_picks_by_device_and_an_explicit_choice_wins(options, device, expected):
    chosen = resolve_codegen(config.resolve(options), device)
    assert chosen.name == expected
    assert chosen.reason.startswith("auto: ") == ("codegen" not in options)


@pytest.mark.default_codegen
def test_default_is_auto_and_explain_says_what_it_chose_and_why():
    model = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3))
    report = fxopt.explain(model, torch.randn(4, 6))
    assert report.options.codegen == "auto"
    graph = report.graphs[0]
    assert graph.options.codegen == "auto"  # the user's options, as given
    assert graph.codegen.name == "inductor" and "backward" in graph.graphs
    assert graph.codegen.reason.startswith("auto: on CPU") and "default_peak_cpu.md" in \
        graph.codegen.reason
    assert "code generation: inductor (auto: on CPU" in str(report)
    assert report.fallbacks == [] and "fallbacks: none" in str(report)


def test_a_fractions_reason_names_the_measurement_and_each_fx_case_says_why(tmp_path):
    reason = resolve_codegen(config.resolve({"memory_budget": 0.3}), CPU).reason
    assert "budgeted min-cut" in reason and "budget_frontier_cpu.md" in reason
    plan = tmp_path / "plan.json"  # replayed as `fxopt plan` made it, for fx code generation
    plan.write_text("{}")
    for options, why in [({"plan": str(plan)}, "saved plan"),
                         ({"force_swap": True}, "force_swap"),
                         ({"tempo": True}, "budget_frontier_tempo_cpu.md"),
                         ({"tempo": "auto"}, "budget_frontier_tempo_cpu.md")]:
        chosen = resolve_codegen(config.resolve({"memory_budget": 0.3, **options}), CPU)
        assert chosen.name == "fx" and why in chosen.reason, (options, chosen.reason)
    chosen = resolve_codegen(config.resolve({"memory_budget": "6GiB"}), CPU)
    assert chosen.name == "fx" and "byte memory_budget" in chosen.reason
