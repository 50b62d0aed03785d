"""fxopt bench: the smoke run's covering set of pairs, CPU timings on one thread with
their spread, and time ratios marked unreliable when a step time is."""

import pytest
import torch

from fxopt.bench import WORKLOADS, Config, Settings, all_configs, get_workloads, measure
from fxopt.bench.measure import RELIABLE_SPREAD, RELIABLE_STEPS, Measurement, timing_spread
from fxopt.bench.report import markdown
from fxopt.bench.runner import all_pairs, smoke_pairs


def test_smoke_pairs_cover_every_configuration_and_workload_with_fewer_runs():
    workloads, configs = get_workloads(None, smoke=True), all_configs()
    pairs = smoke_pairs(workloads, configs)
    assert {c.name for _, c in pairs} == {c.name for c in configs}
    assert {w.name for w, _ in pairs} == {w.name for w in workloads}
    assert {c.name for w, c in pairs if w is not workloads[0]} == {"eager", "fxopt"}
    # Inductor (a C++ build per model on the CPU) runs on one workload only
    assert sum(c.name.startswith("inductor") for _, c in pairs) <= 2
    assert len(pairs) == len(configs) + 2 * (len(workloads) - 1)
    assert len(pairs) < len(all_pairs(workloads, configs)) / 2


def test_cpu_steps_run_on_one_thread_and_report_their_spread():
    threads_seen = []

    def probe(model, workload):
        model.register_forward_hook(lambda *_: threads_seen.append(torch.get_num_threads()))
        return model

    before = torch.get_num_threads()
    result = measure(WORKLOADS["lstm-lm"], Config("probe", "baseline", probe),
                     Settings(smoke=True, device=torch.device("cpu"), warmup=1, steps=3))
    assert result.status == "ok", result.error
    assert threads_seen and set(threads_seen) == {1}
    assert torch.get_num_threads() == before
    assert result.step_spread is not None and result.step_spread >= 0
    assert not result.timing_reliable  # 3 steps: fewer than RELIABLE_STEPS


def test_a_step_time_is_reliable_from_enough_steps_of_a_small_spread():
    steady = [1.0] * RELIABLE_STEPS
    assert timing_spread(steady) == (0.0, True)
    assert timing_spread(steady[1:]) == (0.0, False)  # one step too few
    spread = 1.5 * RELIABLE_SPREAD  # one step that much slower than the rest
    assert timing_spread(steady[1:] + [1.0 + spread]) == (pytest.approx(spread), False)
    assert timing_spread([0.0] * RELIABLE_STEPS) == (None, False)


def run(config, kind, step_ms, reliable):
    return Measurement("w", config, kind, "ok", 2, step_ms=step_ms, step_spread=0.01,
                       timing_reliable=reliable, peak_bytes=100, throughput=1.0)


def test_time_ratios_from_an_unreliable_step_time_are_marked():
    meta = {"device": "cpu", "torch": "x", "date": "d", "command": "c"}
    steady = markdown([run("eager", "baseline", 10.0, True),
                       run("fxopt", "fxopt", 5.0, True)], meta)
    assert "| w | fxopt | 0.50 | 1.00 | 0.50 (eager) |" in steady
    noisy = markdown([run("eager", "baseline", 10.0, False),
                      run("fxopt", "fxopt", 5.0, True)], meta)
    assert "| w | fxopt | 0.50* | 1.00 | 0.50* (eager) |" in noisy
    assert "unreliable time ratio" in noisy
    assert "| eager | ok | 2 | 10.0* | 1% |" in noisy


def test_interleaved_timing_takes_one_step_of_each_per_round_in_rotated_order():
    """First calls and warm-up of each candidate, then one step of each per round, the
    order rotated every round, so a load that comes and goes falls on all of them alike."""
    from fxopt.bench import timing

    order = []
    steps = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
    timings = timing.interleaved(steps, "cpu", warmup=1, rounds=3)
    assert order == ["a", "b", "c"] * 2 + ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert [len(t.times_s) for t in timings.values()] == [3, 3, 3]
