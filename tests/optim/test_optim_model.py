"""fxopt.optim.model: the offload performance model and plan, table-driven on plain data,
with the choice checked against brute force on tiny cases."""

import dataclasses
import itertools
import json
import random

import pytest

from fxopt.optim import OffloadPlan, ParamInfo, plan_offload, simulate, split_subgroups
from fxopt.optim.model import EXHAUSTIVE_LIMIT, MIN_SAVING, PLACEMENTS
from fxopt.planner.hardware import CPU_DEFAULT, KNOWN_GPUS

H100 = KNOWN_GPUS["H100"]
MB = 10**6


def _groups(*numels, itemsize=2, ready=0.0):
    infos = [ParamInfo(key=i, numel=n, itemsize=itemsize, ready_seconds=ready)
             for i, n in enumerate(numels)]
    return split_subgroups(infos, max(1, len(infos)))


# (case, subgroup numels, options, expected placements)
CASES = [
    ("empty", (), {}, ()),
    ("all fits: no budget", (MB, MB, MB), {}, ("gpu", "gpu", "gpu")),
    ("all fits: budget of exactly all state", (MB, MB), {"gpu_state_budget_bytes": 8 * MB},
     ("gpu", "gpu")),
    ("nothing fits", (MB, MB, MB), {"gpu_state_budget_bytes": 0}, ("cpu", "cpu", "cpu")),
    ("one fits: the largest, it saves the most CPU time", (MB, 3 * MB, MB),
     {"gpu_state_budget_bytes": 12 * MB}, ("cpu", "gpu", "cpu")),
    ("forced cpu_fraction 0", (MB, MB), {"cpu_fraction": 0.0}, ("gpu", "gpu")),
    ("forced cpu_fraction 1", (MB, MB), {"cpu_fraction": 1.0}, ("cpu", "cpu")),
    ("forced cpu_fraction is a share of parameters", (MB, MB, 2 * MB), {"cpu_fraction": 0.5},
     ("cpu", "cpu", "gpu")),
    ("forced cpu_fraction 1 under a zero budget", (MB,),
     {"cpu_fraction": 1, "gpu_state_budget_bytes": 0}, ("cpu",)),
]


@pytest.mark.parametrize("case, numels, options, expected", CASES, ids=[c[0] for c in CASES])
def test_plan_table(case, numels, options, expected):
    plan = plan_offload(_groups(*numels), H100, **options)
    assert tuple(s.placement for s in plan.subgroups) == expected
    budget = options.get("gpu_state_budget_bytes")
    assert budget is None or plan.gpu_state_bytes <= budget
    assert plan.predicted_seconds >= 0 and (numels or plan.predicted_seconds == 0)
    assert plan.all_gpu_seconds <= plan.predicted_seconds <= plan.all_cpu_seconds + 1e-12


def test_ties_offload_the_earliest_ready_subgroups_first():
    # On a CPU device both kinds share the cores: every placement with two CPU subgroups
    # of four equal ones takes the same time; the earliest-ready two go to the CPU.
    plan = plan_offload(_groups(1000, 1000, 1000, 1000), CPU_DEFAULT, cpu_fraction=0.5)
    assert [s.placement for s in plan.subgroups] == ["cpu", "cpu", "gpu", "gpu"]
    assert plan.cpu_share == 0.5


def test_interleaving_hides_host_updates_behind_device_updates():
    # A slow device update (low memory bandwidth) against a fast host: splitting beats both
    # all-device and all-host, which is Deep Optimizer States' point.
    hardware = dataclasses.replace(H100, memory_bandwidth=20e9, cpu_update_params_per_second=4e9,
                                   host_device_bandwidth=200e9)
    plan = plan_offload(_groups(*[MB] * 6), hardware)
    assert {"cpu", "gpu"} == {s.placement for s in plan.subgroups}
    assert plan.predicted_seconds < min(plan.all_gpu_seconds, plan.all_cpu_seconds)


def test_gradient_copies_overlap_the_backward():
    early, late = _groups(MB, ready=1.0), _groups(MB, ready=0.0)
    t_early = simulate(early, ["cpu"], H100, contention=1.0).seconds
    t_late = simulate(late, ["cpu"], H100, contention=1.0).seconds
    copy = MB * 2 / H100.host_device_bandwidth
    assert t_late == pytest.approx(t_early + copy)


def _brute_force(subgroups, hardware, budget, fraction):
    """The least predicted time over all 3**n placements within the constraints: the
    budget, the forced share of state on the host, and (staging left to the plan) a device
    saving of at least MIN_SAVING of the state placed on the host."""
    placements = list(itertools.product(PLACEMENTS, repeat=len(subgroups)))
    total = sum(s.numel for s in subgroups)
    if fraction is not None:  # only the shares of parameters on the host closest to it

        def distance(placement):
            host = sum(s.numel for s, w in zip(subgroups, placement) if w != "gpu")
            return abs(host / total - fraction)

        closest = min(map(distance, placements))
        placements = [p for p in placements if distance(p) <= closest + 1e-12]
    all_gpu = simulate(subgroups, ["gpu"] * len(subgroups), hardware).gpu_state_bytes
    best = None
    for placement in placements:
        prediction = simulate(subgroups, placement, hardware)
        if budget is not None and prediction.gpu_state_bytes > budget:
            continue
        unstaged = ["cpu" if w == "staged" else w for w in placement]
        on_host = all_gpu - simulate(subgroups, unstaged, hardware).gpu_state_bytes
        if all_gpu - prediction.gpu_state_bytes < MIN_SAVING * on_host:
            continue
        if best is None or prediction.seconds < best:
            best = prediction.seconds
    return best


@pytest.mark.parametrize("seed", range(12))
def test_choice_is_the_brute_force_optimum(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 6)
    infos = [ParamInfo(key=i, numel=rng.randint(1, 50) * 10**5, itemsize=rng.choice((2, 4)),
                       ready_seconds=rng.random() * 1e-3) for i in range(n)]
    subgroups = split_subgroups(infos, n)
    hardware = dataclasses.replace(H100, memory_bandwidth=rng.choice((20e9, 2e12)))
    total = simulate(subgroups, ["gpu"] * len(subgroups), hardware).gpu_state_bytes
    budget = rng.choice((None, 0, total // 3, total))
    fraction = rng.choice((None, None, 0.3, 0.5))
    expected = _brute_force(subgroups, hardware, budget, fraction)
    if expected is None:  # the forced share does not fit the budget
        with pytest.raises(ValueError, match="raise the budget"):
            plan_offload(subgroups, hardware, gpu_state_budget_bytes=budget,
                         cpu_fraction=fraction)
        return
    plan = plan_offload(subgroups, hardware, gpu_state_budget_bytes=budget,
                        cpu_fraction=fraction)
    assert plan.predicted_seconds == pytest.approx(expected, rel=1e-9)


def test_many_subgroups_use_interleavings_and_respect_the_budget():
    n = EXHAUSTIVE_LIMIT + 4
    subgroups = _groups(*[MB] * n)
    all_state = simulate(subgroups, ["gpu"] * n, H100).gpu_state_bytes
    plan = plan_offload(subgroups, H100, gpu_state_budget_bytes=all_state // 2)
    assert len(plan.subgroups) == n and plan.gpu_state_bytes <= all_state // 2
    every_other = simulate(subgroups, ["gpu", "cpu"] * (n // 2), H100)
    assert plan.predicted_seconds <= every_other.seconds + 1e-12


def test_split_is_contiguous_and_size_balanced():
    infos = [ParamInfo(key=i, numel=n) for i, n in enumerate([5, 5, 5, 5, 10, 10, 40])]
    groups = split_subgroups(infos, 3)
    assert [g.params for g in groups] == [(0, 1, 2, 3, 4), (5,), (6,)]
    assert split_subgroups(infos, 100)[-1].params == (6,) and len(split_subgroups(infos, 100)) == 7
    mixed = split_subgroups([ParamInfo(0, 10, 4), ParamInfo(1, 10, 2)], 1)
    assert [g.itemsize for g in mixed] == [4, 2]  # a subgroup is copied and cast as one
    assert split_subgroups([], 4) == []


def test_plan_round_trips_through_json():
    plan = plan_offload(_groups(MB, 2 * MB, MB, ready=1e-3), H100,
                        gpu_state_budget_bytes=6 * MB, counter_bytes=(0, 4))
    data = json.loads(json.dumps(plan.to_dict()))
    assert OffloadPlan.from_dict(data) == plan
    assert data["cpu_share"] == plan.cpu_share
    assert plan.counter_bytes == (0, 4) and plan.backward_seconds == 1e-3


def test_bytes_per_placement():
    """Device: the state in the parameter's dtype and its counters; host: fp32 master,
    its gradient, fp32 state, a staging buffer in the parameter's dtype, counters."""
    groups = _groups(MB, 3 * MB, itemsize=2)
    p = simulate(groups, ["gpu", "cpu"], H100, states_per_param=2, counter_bytes=(8, 4))
    assert p.gpu_state_bytes == MB * 2 * 2 + 8
    assert p.host_bytes == 3 * MB * (4 * (2 + 2) + 2) + 4


def test_on_a_cpu_device_a_budget_never_moves_state_to_the_host():
    """There the host is the device's memory: a host subgroup costs more than it frees."""
    groups = _groups(MB, MB)
    state = simulate(groups, ["gpu", "gpu"], CPU_DEFAULT).gpu_state_bytes
    assert set(plan_offload(groups, CPU_DEFAULT, gpu_state_budget_bytes=state)
               .placement_of().values()) == {"gpu"}
    with pytest.raises(ValueError, match="on a CPU device the host is the device's memory"):
        plan_offload(groups, CPU_DEFAULT, gpu_state_budget_bytes=state // 2)
    forced = plan_offload(groups, CPU_DEFAULT, cpu_fraction=1.0)  # forced: testing the path
    assert forced.gpu_state_bytes + forced.host_bytes > state


def test_keeping_up_is_the_host_overhead_against_the_backward():
    slow = plan_offload(_groups(MB, MB, ready=1e-6), H100, cpu_fraction=1.0)
    assert slow.host_overhead_seconds > 0.3 * 1e-6 and slow.keeps_up() is False
    assert "cannot keep up" in slow.summary()
    fast = plan_offload(_groups(MB, MB, ready=1.0), H100, cpu_fraction=1.0)
    assert fast.keeps_up() is True and "keeps up" in fast.summary()
    unknown = plan_offload(_groups(MB, MB), H100, cpu_fraction=1.0)
    assert unknown.keeps_up() is None and "unknown" in unknown.summary()
    assert plan_offload(_groups(MB, MB), H100, cpu_fraction=0.0).keeps_up() is True


@pytest.mark.parametrize("options, message", [
    ({"gpu_state_budget_bytes": -1}, "gpu_state_budget_bytes"),
    ({"gpu_state_budget_bytes": 1.5}, "gpu_state_budget_bytes"),
    ({"cpu_fraction": 1.5}, "cpu_fraction"),
    ({"cpu_fraction": True}, "cpu_fraction"),
    ({"states_per_param": -2}, "states_per_param"),
    ({"contention": 0.5}, "contention"),
    ({"counter_bytes": (4,)}, "counter_bytes"),
    ({"counter_bytes": (-1, 4)}, "counter_bytes"),
    ({"cpu_fraction": 0.0, "gpu_state_budget_bytes": 10}, "raise the budget"),
])
def test_bad_arguments_raise_clearly(options, message):
    with pytest.raises(ValueError, match=message):
        plan_offload(_groups(MB, MB), H100, **options)


def test_bad_simulation_and_split_arguments():
    with pytest.raises(ValueError, match="placements for"):
        simulate(_groups(MB), ["cpu", "gpu"], H100)
    with pytest.raises(ValueError, match="unknown placement 'disk'"):
        simulate(_groups(MB), ["disk"], H100)
    with pytest.raises(ValueError, match="subgroup count"):
        split_subgroups([ParamInfo(0, 1)], 0)


# ---------------------------------------------------------------- staged device updates

def _link_bound(**changes):
    """An H100 whose device updates take no time: staged subgroups are copy-bound."""
    return dataclasses.replace(H100, memory_bandwidth=1e30, **changes)


@pytest.mark.parametrize("count", [1, 2, 5])
def test_staged_copies_are_double_buffered(count):
    """In and back overlap: m equal staged subgroups of b bytes take (m + 1) copies of b, not
    2m (one buffer would serialise them); a single one takes its copy in and its copy back."""
    hardware = _link_bound()
    groups = _groups(*[MB] * count, itemsize=4)
    p = simulate(groups, ["staged"] * count, hardware, contention=1.0)
    copy = MB * 4 * 2 / H100.host_device_bandwidth  # two fp32 moments
    assert p.seconds == pytest.approx((count + 1) * copy)
    # the buffers: two (one for a single subgroup), each the largest staged state
    assert p.staging_bytes == p.gpu_state_bytes == min(2, count) * MB * 4 * 2
    assert p.host_bytes == count * MB * 4 * 2


def test_staged_bytes_count_the_counters_where_they_live():
    """A staged subgroup's device counters are staged with its state (fused Adam); torch's
    host-side counters (unfused CUDA Adam) stay on the host."""
    groups = _groups(MB, 3 * MB, itemsize=2)  # one parameter each
    fused = simulate(groups, ["staged", "staged"], H100, counter_bytes=(4, 4))
    assert fused.staging_bytes == 2 * (3 * MB * 2 * 2 + 4)
    assert fused.host_bytes == 4 * MB * 2 * 2 + 2 * 4
    unfused = simulate(groups, ["staged", "gpu"], H100, counter_bytes=(0, 4))
    assert unfused.gpu_state_bytes == 3 * MB * 2 * 2 + MB * 2 * 2  # resident + one buffer
    assert unfused.host_bytes == MB * 2 * 2 + 4


def test_the_plan_splits_host_state_between_host_and_staged_updates():
    """Deep Optimizer States' interleave: with all state on the host, updating some
    subgroups on the host and staging the others to the device beats doing either alone."""
    groups = _groups(*[MB] * 40, itemsize=4)
    plan = plan_offload(groups, H100, cpu_fraction=1.0)
    kinds = [s.placement for s in plan.subgroups]
    assert {"cpu", "staged"} == set(kinds)
    alone = [simulate(groups, [k] * 40, H100).seconds for k in ("cpu", "staged")]
    assert plan.predicted_seconds < min(alone)
    assert plan.staging_bytes == 2 * MB * 4 * 2 and plan.gpu_state_bytes == plan.staging_bytes
    assert "update on the device through" in plan.staging_note
    assert f"{sum(k == 'staged' for k in kinds) / 40:.0%} on the device" in plan.summary()


def test_left_to_choose_the_plan_stages_only_what_saves_90_percent():
    """Two buffers of eight equal subgroups are 25% of the state: no staging, and the plan
    says why; with forty they are 5%: staging, and the device saves >= 90% of the state
    placed on the host. Forced, it stages whatever it costs."""
    few = plan_offload(_groups(*[MB] * 8, itemsize=4), H100, cpu_fraction=1.0)
    assert {s.placement for s in few.subgroups} == {"cpu"}
    assert "would cost more than 10% of the state placed on the host" in few.summary()
    many = plan_offload(_groups(*[MB] * 40, itemsize=4), H100, cpu_fraction=1.0)
    moved = sum(MB * 4 * 2 for s in many.subgroups if s.on_host)
    assert many.staged_share > 0
    assert many.all_gpu_state_bytes - many.gpu_state_bytes >= MIN_SAVING * moved
    forced = plan_offload(_groups(*[MB] * 8, itemsize=4), H100, cpu_fraction=1.0, staged=True)
    assert {s.placement for s in forced.subgroups} == {"staged"}
    assert forced.staging_note.endswith("forced (staged=True)")


def test_staging_needs_a_device_of_its_own_unless_forced():
    groups = _groups(*[MB] * 40, itemsize=4)
    assert plan_offload(groups, CPU_DEFAULT, cpu_fraction=1.0).staged_share == 0
    assert "on a CPU device" in plan_offload(groups, CPU_DEFAULT, cpu_fraction=1.0).summary()
    assert plan_offload(groups, H100, cpu_fraction=1.0, staged=False).staged_share == 0
    half = plan_offload(_groups(*[MB] * 4), CPU_DEFAULT, cpu_fraction=1.0, staged=0.5)
    assert [s.placement for s in half.subgroups].count("staged") == 2  # the latest-ready


def test_staging_buffers_count_in_the_budget():
    groups = _groups(*[MB] * 40, itemsize=4)
    all_state = simulate(groups, ["gpu"] * 40, H100).gpu_state_bytes
    plan = plan_offload(groups, H100, gpu_state_budget_bytes=all_state // 4)
    assert plan.staging_bytes > 0 and plan.gpu_state_bytes <= all_state // 4
    with pytest.raises(ValueError, match="staged=True keeps the GPU optimizer state"):
        plan_offload(groups, H100, cpu_fraction=1.0, staged=True, gpu_state_budget_bytes=0)


def test_plans_that_stage_round_trip_through_json():
    plan = plan_offload(_groups(*[MB] * 40, ready=1e-3), H100, cpu_fraction=1.0)
    assert plan.staging_bytes > 0
    assert OffloadPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


@pytest.mark.parametrize("staged", [-0.5, 1.5, "yes"])
def test_bad_staged_options_raise_clearly(staged):
    with pytest.raises(ValueError, match="staged must be"):
        plan_offload(_groups(MB, MB), H100, staged=staged)
