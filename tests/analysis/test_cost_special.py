"""What a roofline misses on a CPU, priced: special functions and random draws counted per
node (``NodeCost.transcendental`` / ``random``), a per-node overhead, and their rates
measured by ``fxopt calibrate``."""

import dataclasses

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxopt.analysis import node_cost
from fxopt.cli.calibrate import calibrate
from fxopt.planner.hardware import CPU_DEFAULT


def _costs(fn, *args):
    gm = make_fx(fn)(*args)
    return {n.target: node_cost(n) for n in gm.graph.nodes if n.op == "call_function"}


def test_special_functions_and_random_draws_are_counted():
    aten = torch.ops.aten
    x = torch.randn(3, 5)
    costs = _costs(lambda x: torch.nn.functional.gelu(x) * x + torch.exp(x), x)
    assert costs[aten.gelu.default].transcendental == 15
    assert costs[aten.exp.default].transcendental == 15
    assert costs[aten.mul.Tensor].transcendental == 0
    softmax = _costs(lambda x: torch.softmax(x, -1), x)[aten._softmax.default]
    assert softmax.transcendental == 15
    dropout = _costs(lambda x: torch.ops.aten.native_dropout(x, 0.1, True), x)
    assert dropout[aten.native_dropout.default].random == 15
    assert dropout[aten.native_dropout.default].transcendental == 0


def test_node_seconds_add_the_overhead_to_the_slowest_of_roofline_and_special_work():
    profile = dataclasses.replace(CPU_DEFAULT, flops={"float32": 1e9}, memory_bandwidth=1e9,
                                  node_overhead_seconds=1e-6, transcendental_per_second=1e8,
                                  random_per_second=1e7)
    # 1000 elements read and written (8000 bytes: 8 us) against 1000 special ones (10 us)
    assert profile.node_seconds(1000, 8000, transcendental=1000) == pytest.approx(11e-6)
    # random draws (100 us) outweigh the bytes
    assert profile.node_seconds(0, 8000, random=1000) == pytest.approx(101e-6)
    # without special work: the roofline and the overhead
    assert profile.node_seconds(0, 8000) == pytest.approx(9e-6)
    unpriced = dataclasses.replace(profile, transcendental_per_second=None)
    assert unpriced.node_seconds(0, 8000, transcendental=1000) == pytest.approx(9e-6)


def test_calibrate_measures_the_cpu_rates_with_the_threads_asked_for():
    before = torch.get_num_threads()
    profile = calibrate("cpu", size=64, copy_mib=1, adam_params=1 << 10, repeats=1, threads=1)
    assert torch.get_num_threads() == before  # restored
    assert "1 threads" in profile.notes
    assert 0 < profile.node_overhead_seconds < 1e-3
    assert profile.transcendental_per_second > 0 and profile.random_per_second > 0
    with pytest.raises(ValueError, match="threads must be >= 1"):
        calibrate("cpu", threads=0)
