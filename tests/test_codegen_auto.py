"""codegen="auto", the default: Inductor on the CPU and on CUDA (fx code generation peaks at
eager's memory: benchmarks/results/default_peak_cpu.md), with or without a budget or a
saved plan or force_swap (whose copies Inductor's code waits for as fx's does), fx when
fuse_elementwise is asked for; explain says which generator compiled each graph and why,
naming the results file; "fx" and "inductor" force one.
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
    ({"memory_budget": "6GiB"}, CPU, "inductor"),  # its plan as recompute tags min-cut honours
    ({"memory_budget": 0.5, "tempo": True}, CPU, "inductor"),  # one generator for both
    ({"memory_budget": 0.5, "tempo": "auto"}, CPU, "inductor"),
    ({"memory_budget": 0.5, "force_swap": True}, CPU, "inductor"),
    ({"memory_budget": 0.5, "force_swap": True}, CUDA, "inductor"),
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


@pytest.mark.default_codegen
def test_each_reason_names_its_measurement(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    for options, why in [({"memory_budget": 0.3}, "budget_frontier_cpu.md"),
                         ({"memory_budget": 0.3, "tempo": True}, "inductor_budgets_cpu.md"),
                         ({"memory_budget": 0.3, "tempo": "auto"}, "inductor_budgets_cpu.md"),
                         ({"memory_budget": "6GiB"}, "inductor_budgets_cpu.md"),
                         ({"plan": str(plan)}, "fxopt plan"),
                         ({}, "default_peak_cpu.md")]:
        chosen = resolve_codegen(config.resolve(options), CPU)
        assert chosen.name == "inductor" and why in chosen.reason, (options, chosen.reason)
    chosen = resolve_codegen(config.resolve({"memory_budget": 0.3, "force_swap": True}), CPU)
    assert chosen.name == "inductor" and "budget_frontier_cpu.md" in chosen.reason
    chosen = resolve_codegen(config.resolve({"memory_budget": 0.3, "force_swap": True}), CUDA)
    assert chosen.name == "inductor" and "gpu_h100_2026-11-26.md" in chosen.reason
