"""codegen="auto", the default: fx code generation on the CPU, Inductor on CUDA (measured in
benchmarks/results/codegen_auto_cpu.md), fx when fuse_elementwise is asked for; explain says
which generator compiled each graph and why; "fx" and "inductor" force one."""

import pytest
import torch
from torch import nn

import fxopt
from fxopt import config
from fxopt.codegen import choose_codegen

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize("options, device, expected", [
    ({}, CPU, "fx"),
    ({}, CUDA, "inductor"),
    ({"fuse_elementwise": True}, CUDA, "fx"),
    ({"inductor_max_autotune": True}, CPU, "inductor"),  # asking for tuning asks for Inductor
    ({"codegen": "inductor"}, CPU, "inductor"),
    ({"codegen": "fx"}, CUDA, "fx"),
])
def test_auto_picks_by_device_and_an_explicit_choice_wins(options, device, expected):
    chosen, reason = choose_codegen(config.resolve(options), device)
    assert chosen == expected
    assert reason.startswith("auto: ") == ("codegen" not in options)


def test_default_is_auto_and_explain_says_what_it_chose_and_why():
    model = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.Linear(8, 3))
    report = fxopt.explain(model, torch.randn(4, 6))
    assert report.options.codegen == "auto"
    graph = report.graphs[0]
    assert graph.options.codegen == "fx" and "backward" in graph.graphs
    assert graph.codegen_reason.startswith("auto: on CPU")
    assert "code generation: fx (auto: on CPU" in str(report)
    assert report.fallbacks == [] and "fallbacks: none" in str(report)

