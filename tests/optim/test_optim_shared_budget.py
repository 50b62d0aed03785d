"""One byte budget for activations and optimizer state (fxopt.optim.shared_budget): the joint
choice against brute force over every action x every placement, and never worse than the
separate choice (activations first, then the optimizer in what is left)."""

import itertools
import random

import pytest

from fxopt.optim.model import RESIDENCIES, ParamInfo, offload_frontier, simulate, split_subgroups
from fxopt.optim.shared_budget import choose_with_optimizer, resident_bytes
from fxopt.planner import (
    ActivationChoice,
    ActivationProblem,
    HardwareProfile,
    SavedActivation,
    StepProblem,
    evaluate,
)
from fxopt.planner.solvers.fraction import SavedBytesProblem

# Rates that make the optimizer's seconds comparable to the activations' (units of ~1 s).
GPU = HardwareProfile(name="toy-gpu", device_type="cuda", flops={"float32": 1.0},
                      memory_bandwidth=40.0, host_device_bandwidth=30.0,
                      cpu_update_params_per_second=12.0)
CPU = HardwareProfile(name="toy-cpu", device_type="cpu", flops={"float32": 1.0},
                      memory_bandwidth=40.0, host_device_bandwidth=None,
                      cpu_update_params_per_second=12.0)


def _instance(rng):
    steps = rng.randint(3, 8)
    live = [rng.randint(60, 160) for _ in range(steps)]
    acts = []
    for i in range(rng.randint(1, 4)):
        choices = []
        for action in rng.sample(["recompute", "swap"], rng.randint(0, 2)):
            start = rng.randint(0, steps - 1)
            choices.append(ActivationChoice(action, (start, rng.randint(start, steps)),
                                            round(rng.uniform(0, 2), 2)))
        acts.append(SavedActivation(f"t{i}", rng.randint(5, 50), tuple(choices)))
    activations = ActivationProblem(tuple(live), tuple(acts), max(live))
    problem = StepProblem(graph="g0", fingerprint=(), activations=activations,
                          saved_bytes=SavedBytesProblem({}, (), (), {}),
                          keep_all_peak_bytes=max(live), baseline_bytes=0,
                          activation_bytes=sum(a.nbytes for a in acts), step_seconds=1.0)
    params = [ParamInfo(key=k, numel=rng.randint(4, 16), itemsize=1,
                        ready_seconds=rng.uniform(0, 0.5)) for k in range(rng.randint(1, 5))]
    subgroups = split_subgroups(params, rng.randint(1, len(params)))
    return problem, subgroups, rng.randint(min(live) - 20, max(live) + 60)


def _brute_force(problem, subgroups, budget, hardware):
    """Least step + optimizer seconds over every action and every placement that fits."""
    acts = problem.activations.activations
    best = None
    for combo in itertools.product(*[["keep", *(c.action for c in a.choices)] for a in acts]):
        decision = evaluate(problem.activations, dict(zip([a.name for a in acts], combo)),
                            "brute")
        for placement in itertools.product(RESIDENCIES, repeat=len(subgroups)):
            opt = simulate(subgroups, placement, hardware)
            resident = opt.gpu_state_bytes + (opt.host_bytes if hardware.device_type == "cpu"
                                              else 0)
            if decision.peak_bytes + resident <= budget:
                total = problem.step_seconds + decision.added_seconds + opt.seconds
                best = total if best is None else min(best, total)
    return best


@pytest.mark.parametrize("hardware", [GPU, CPU], ids=["gpu", "cpu"])
@pytest.mark.parametrize("seed", range(25))
def test_joint_choice_matches_brute_force_and_beats_the_separate_one(seed, hardware):
    problem, subgroups, budget = _instance(random.Random(seed))
    choice, separate = choose_with_optimizer({(): problem}, budget, subgroups, hardware)
    best = _brute_force(problem, subgroups, budget, hardware)
    chosen = choice.chosen
    assert chosen.feasible == (best is not None)
    if best is None:
        return
    assert chosen.seconds == pytest.approx(best, rel=1e-6)
    assert chosen.peak_bytes <= budget
    assert chosen.peak_bytes == (int(chosen.plan.predictions["peak_bytes"])
                                 + resident_bytes(chosen.offload, hardware))
    if separate.feasible:
        assert chosen.seconds <= separate.seconds + 1e-12


def test_the_joint_choice_beats_the_separate_one_where_recompute_buys_device_state():
    """Separately, the activations take the whole budget (nothing recomputed) and the
    optimizer is pushed to the slow host; jointly, one cheap recompute makes room for the
    state on the device."""
    fast_device = HardwareProfile(name="toy", device_type="cuda", flops={"float32": 1.0},
                                  memory_bandwidth=400.0, host_device_bandwidth=30.0,
                                  cpu_update_params_per_second=12.0)
    act = SavedActivation("t0", 40, (ActivationChoice("recompute", (0, 1), 0.1),))
    activations = ActivationProblem((100,), (act,), 100)
    problem = StepProblem(graph="g0", fingerprint=(), activations=activations,
                          saved_bytes=SavedBytesProblem({}, (), (), {}),
                          keep_all_peak_bytes=100, baseline_bytes=0, activation_bytes=40,
                          step_seconds=1.0)
    subgroups = split_subgroups([ParamInfo(key=0, numel=20, itemsize=1)], 1)
    choice, separate = choose_with_optimizer({(): problem}, 110, subgroups, fast_device)
    assert separate.feasible and separate.plan.actions == {}
    assert [s.placement for s in separate.offload.subgroups] == ["cpu"]
    assert choice.chosen.plan.actions == {"t0": "recompute"}
    assert [s.placement for s in choice.chosen.offload.subgroups] == ["gpu"]
    assert choice.chosen.peak_bytes == 60 + 40 <= 110
    assert choice.chosen.seconds < separate.seconds - 1.0


def test_offload_frontier_is_non_dominated_and_reaches_both_ends():
    params = [ParamInfo(key=k, numel=8 + k, itemsize=1) for k in range(6)]
    subgroups = split_subgroups(params, 6)
    frontier = offload_frontier(subgroups, GPU)
    states = [p.gpu_state_bytes for p in frontier]
    times = [p.predicted_seconds for p in frontier]
    assert states == sorted(states) and times == sorted(times, reverse=True)
    assert states[0] == 0 and frontier[-1].predicted_seconds == pytest.approx(
        min(simulate(subgroups, c, GPU).seconds
            for c in itertools.product(RESIDENCIES, repeat=6)))


def test_a_fraction_is_refused():
    problem, subgroups, _ = _instance(random.Random(0))
    with pytest.raises(ValueError, match="byte budget"):
        choose_with_optimizer({(): problem}, 0.5, subgroups, GPU)
