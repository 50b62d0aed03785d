"""The offload plan against the H100 measurement (issue 30, item 3): the rows of
benchmarks/results/offload_optimizer-h100-2026-11-26.md, read from the file.

- The predicted step (the plain step plus the plan's host overhead on the ``H100`` profile)
  is within 20% of the measured one at cpu_fraction 0.5 and 1.0.
- The plan says the host cannot keep up there, even crediting the backward with the whole
  plain step; and a plan whose host share does keep up is predicted within 1.3x.
- The measured peaks differ from plain by the plan's saving plus one constant (the other
  backend's activations), the same at both fractions to within 1% of the state: the state
  placed on the host left the device in full.
"""

import pathlib
import re

import pytest
import torch

from fxopt.optim import ParamInfo, plan_offload, split_subgroups
from fxopt.optim.model import MAX_SLOWDOWN
from fxopt.planner.hardware import KNOWN_GPUS

TABLE = (pathlib.Path(__file__).parents[2] / "benchmarks" / "results"
         / "offload_optimizer-h100-2026-11-26.md")
MIB = 2**20


def _rows():
    rows = {}
    for line in TABLE.read_text().splitlines():
        match = re.fullmatch(r"\| (AdamW on the device|offloaded) \| ([\d.]+) \| ([\d.]+) \| "
                             r"(\d+) \|", line.strip())
        if match:
            rows[float(match[2])] = (float(match[3]) * 1e-3, int(match[4]) * MIB)
    assert set(rows) == {0.0, 0.5, 1.0}, rows
    return rows


def _gpt2_params(ready_seconds=0.0):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=6, n_embd=768, n_head=12, n_positions=1024)
    with torch.device("meta"):
        params = list(transformers.GPT2LMHeadModel(config).parameters())
    assert sum(p.numel() for p in params) == 81_912_576  # the table's model
    return [ParamInfo(i, p.numel(), 4, ready_seconds)  # fp32 parameters under autocast
            for i, p in reversed(list(enumerate(params)))]


def _plan(cpu_fraction, ready_seconds=0.0):
    # CUDA AdamW (not fused, not capturable): the step counters stay on the host
    return plan_offload(split_subgroups(_gpt2_params(ready_seconds), 8), KNOWN_GPUS["H100"],
                        cpu_fraction=cpu_fraction, counter_bytes=(0, 4))


@pytest.mark.parametrize("cpu_fraction", [0.5, 1.0])
def test_predicted_step_is_within_20_percent_of_the_h100(cpu_fraction):
    rows = _rows()
    plain_step, measured_step = rows[0.0][0], rows[cpu_fraction][0]
    predicted = plain_step + _plan(cpu_fraction).host_overhead_seconds
    assert predicted == pytest.approx(measured_step, rel=0.2)


@pytest.mark.parametrize("cpu_fraction", [0.5, 1.0])
def test_the_plan_says_the_host_cannot_keep_up_on_this_model(cpu_fraction):
    plain_step = _rows()[0.0][0]
    plan = _plan(cpu_fraction, ready_seconds=plain_step)  # the backward <= the whole step
    assert plan.keeps_up() is False
    assert "cannot keep up" in plan.summary()
    # where the plan says it keeps up, the step is predicted within the target
    assert _plan(0.0, ready_seconds=plain_step).keeps_up() is True
    small = plan_offload(split_subgroups(_gpt2_params(10 * plain_step), 64),
                         KNOWN_GPUS["H100"], cpu_fraction=1 / 64, counter_bytes=(0, 4))
    assert small.cpu_share > 0 and small.keeps_up() is True
    assert plain_step + small.host_overhead_seconds <= MAX_SLOWDOWN * 10 * plain_step


def test_the_state_placed_on_the_host_left_the_device_in_full():
    rows = _rows()
    plain_peak = rows[0.0][1]
    offsets = []
    for cpu_fraction in (0.5, 1.0):
        plan = _plan(cpu_fraction)
        saving = plan.all_gpu_state_bytes - plan.gpu_state_bytes
        host_state = sum(s.numel * 4 * 2 for s in plan.subgroups if s.placement == "cpu")
        assert saving == host_state  # all of it is predicted to leave
        offsets.append(rows[cpu_fraction][1] - (plain_peak - saving))
    # One constant (the backend's activations), not a share of the state: state left
    # behind would show as a gap of that share of the 625 MiB (half stuck: ~156 MiB); the
    # bound is 1% of the state (the peaks are rounded to MiB and vary by a few MiB).
    assert abs(offsets[0] - offsets[1]) <= 0.01 * plan.all_gpu_state_bytes
