"""The offload plan against the H100 measurement (issue 30, item 3): the rows of
benchmarks/results/offload_optimizer-h100-2026-11-26.md, read from the file.

- The predicted step (the plain step plus the plan's host overhead on the ``H100`` profile)
  is within 20% of the measured one at cpu_fraction 0.5 and 1.0.
- The plan says the host cannot keep up there, even crediting the backward with the whole
  plain step; and a plan whose host share does keep up is predicted within 1.3x.
- The measured peaks differ from plain by the plan's saving plus one constant (the other
  backend's activations), the same at both fractions to within 1% of the state: the state
  placed on the host left the device in full.
- A PREDICTION, not a measurement (no GPU has run staged device updates yet): the file's
  prediction table is what the plan predicts with staging left to it, on the same profile;
  where it stages, the device still saves 90% of the state on the host and the optimizer
  phase is never predicted slower than without staging. The measured rows ran without
  staging, and are compared with plans made with ``staged=False``.
"""

import pathlib
import re

import pytest
import torch

from fxopt.optim import ParamInfo, plan_offload, split_subgroups
from fxopt.optim.model import MAX_SLOWDOWN, MIN_SAVING
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


def _plan(cpu_fraction, ready_seconds=0.0, staged=False, subgroups=8):
    # CUDA AdamW (not fused, not capturable): the step counters stay on the host; the
    # measured rows ran without staged updates
    return plan_offload(split_subgroups(_gpt2_params(ready_seconds), subgroups),
                        KNOWN_GPUS["H100"], cpu_fraction=cpu_fraction, staged=staged,
                        counter_bytes=(0, 4))


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


def _predicted_rows():
    """The prediction table: (subgroups asked, subgroups, cpu_fraction, staged share,
    optimizer phase ms, step ms, device saving MiB, staging buffers MiB)."""
    rows = []
    for line in TABLE.read_text().splitlines():
        match = re.fullmatch(r"\| (\d+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| "
                             r"([\d.]+) \| (\d+) \| ([\d.]+) \|", line.strip())
        if match:
            rows.append((int(match[1]), int(match[2]), *map(float, match.groups()[2:])))
    assert len(rows) >= 4, rows
    return rows


def test_the_staged_prediction_is_the_plans():
    """PREDICTION: the table's rows are the plan's with staging left to it (the step: the
    measured plain step plus the host overhead, gradients assumed ready at the end)."""
    plain_step = _rows()[0.0][0]
    for asked, count, fraction, share, phase, step, saving, buffers in _predicted_rows():
        plan = _plan(fraction, staged=None, subgroups=asked)
        assert len(plan.subgroups) == count
        assert round(plan.staged_share, 2) == share
        assert plan.predicted_seconds * 1e3 == pytest.approx(phase, abs=0.05)
        assert (plain_step + plan.host_overhead_seconds) * 1e3 == pytest.approx(step, abs=0.05)
        assert (plan.all_gpu_state_bytes - plan.gpu_state_bytes) / MIB == pytest.approx(
            saving, abs=0.5)
        assert plan.staging_bytes / MIB == pytest.approx(buffers, abs=0.05)
        host_state = sum(s.numel * 4 * 2 for s in plan.subgroups if s.on_host)
        assert plan.all_gpu_state_bytes - plan.gpu_state_bytes >= MIN_SAVING * host_state
        unstaged = _plan(fraction, subgroups=asked)
        assert plan.predicted_seconds <= unstaged.predicted_seconds
        if share == 0:  # the plan says why it did not stage
            assert "no subgroup is staged" in plan.summary()
        else:
            assert "update on the device through" in plan.summary()
