"""``fxopt doctor``: the CPU subset runs here and lists the GPU checks it skipped; on a GPU
(``gpu`` mark) every check runs and passes. The checks are fxopt.doctor's functions."""

import json
from types import SimpleNamespace

import pytest
import torch
from torch._dynamo.exc import InvalidBackend

import fxopt.compiler
import fxopt.optim
import fxopt.testing
from fxopt import doctor
from fxopt.__main__ import main
from fxopt.bench import timing
from fxopt.doctor import (
    CHECKS,
    Check,
    memory_problems,
    offload_problems,
    overlap_problem,
    run_doctor,
)
from fxopt.doctor import memory as doctor_memory
from fxopt.doctor import offload as doctor_offload
from fxopt.doctor import speed as doctor_speed
from fxopt.doctor.criteria import overlap
from fxopt.kernels import triton_runs_on


@pytest.mark.skipif(not triton_runs_on("cpu"),
                    reason="needs Triton's interpreter (TRITON_INTERPRET=1)")
def test_doctor_on_the_cpu_runs_the_kernels_and_lists_what_it_skipped(tmp_path, capsys):
    report = tmp_path / "doctor.json"
    code = main(["doctor", "--device", "cpu", "--only", "kernels", "swap_overlap", "memory",
                 "--json", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "skipped here: swap_overlap, memory" in out
    checks = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
    assert checks["kernels"]["status"] == "ok"
    assert checks["kernels"]["data"]["kernels"] == "Triton"
    assert "pointwise chain bfloat16" in checks["kernels"]["data"]
    assert {checks[n]["status"] for n in ("swap_overlap", "memory")} == {"skipped"}


def test_an_unknown_check_is_named_with_the_choices(capsys):
    assert main(["doctor", "--only", "kernel"]) == 2
    assert "unknown check(s) ['kernel']; choose from" in capsys.readouterr().out


def test_copy_time_covered_by_compute_is_counted_once():
    copies = [(0.0, 10.0), (20.0, 30.0)]
    compute = [(5.0, 12.0), (8.0, 15.0), (25.0, 40.0)]  # two overlapping kernels
    assert overlap(copies, compute) == 5.0 + 5.0


@pytest.mark.gpu
def test_every_doctor_check_passes_on_the_gpu():
    checks = run_doctor("cuda")
    assert [c.name for c in checks] == list(CHECKS)
    failed = [(c.name, c.detail) for c in checks if c.status == "failed"]
    assert failed == []
    assert [c.name for c in checks if c.status == "skipped"] == ["aot_compile"]
    assert torch.cuda.is_available()


# ---------------------------------------------------------------- every check can fail
# Each check's criterion, driven on the CPU with what a GPU would measure stubbed in; the
# GPU figures are ../shared/gpu/h100-2026-11-26.md's.

def _run(name: str) -> Check:
    (check,) = run_doctor("cpu", [name])
    return check


@pytest.fixture
def on_any_device(monkeypatch):
    """The CUDA-only checks run on the CPU with their measurements stubbed."""
    for module in (doctor_memory, doctor_speed):
        monkeypatch.setattr(module, "cuda_only", lambda device: None)


class _FakeComparison:
    def fired(self, name):
        return True


def test_kernels_compares_against_eager_without_tf32_and_names_the_failing_family(
        monkeypatch):
    """Eager's cuDNN RNNs run TF32 by default: the reference runs with TF32 off (restored
    afterwards); an RNN family not close to it fails the check by name."""
    seen = []

    def spy(model, inputs, options, tolerances=None):
        seen.append((torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32))
        if isinstance(getattr(model, "rnn", None), torch.nn.GRU):
            raise AssertionError("output 0: not close (1.3e-4 absolute)")
        return _FakeComparison()

    monkeypatch.setattr(fxopt.testing, "assert_same_as_eager", spy)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    check = _run("kernels")
    assert check.status == "failed" and check.detail.startswith("GRU float32 (fuse_rnn)")
    assert "not close to eager without TF32" in check.detail
    assert check.data["LSTM float32"] == "equal to eager"  # what passed stays in the report
    assert seen and set(seen) == {(False, False)}
    assert torch.backends.cudnn.allow_tf32 is True


def test_host_sync_fails_on_a_step_that_waits_for_the_device(monkeypatch):
    pytest.importorskip("transformers")

    def compile_with_a_sync(model, backend=None):
        def run(**inputs):
            out = model(**inputs)
            out.loss.detach().item()  # reads the loss back: a host sync
            return out
        return run

    monkeypatch.setattr(torch, "compile", compile_with_a_sync)
    check = _run("host_sync")
    assert check.status == "failed" and "host syncs:" in check.detail


def test_aot_compile_fails_on_a_kernel_problem(monkeypatch):
    from fxopt.kernels import aot, triton_installed

    if not triton_installed():
        pytest.skip("needs Triton")
    monkeypatch.setattr(aot, "compile_specs",
                        lambda specs: [aot.KernelReport("lstm", 90, error="PassManager")])
    check = _run("aot_compile")
    assert check.status == "failed" and "does not compile: PassManager" in check.detail


def test_swap_overlap_is_skipped_on_the_cpu_and_fails_below_its_floor():
    check = _run("swap_overlap")
    assert (check.status, check.detail) == (
        "skipped", "no copy stream on the CPU: swaps copy synchronously")
    copies = [(0.0, 10.0), (20.0, 30.0)]
    data, problem = overlap_problem(copies, [(8.0, 12.0)])  # 2 of 20 us: 10%
    assert data["overlapped"] == "10%" and "below the floor of 25%" in problem
    assert overlap_problem(copies, [(0.0, 30.0)]) == (
        {"copies": 2, "copy ms": 0.02, "overlapped": "100%"}, None)
    assert overlap_problem([], [(0.0, 30.0)])[1].startswith("no copies")


H100_MEMORY = {1.0: (832, 993), 0.6: (512, 688), 0.35: (640, 801)}  # MiB measured, predicted


def test_memory_fails_on_the_h100_table(monkeypatch, on_any_device):
    """The first H100 run's figures, which the check called "ok": the lowest budget's peak
    is above 0.6's, and every prediction is 19-34% high."""
    monkeypatch.setattr(doctor_memory, "step_peak", lambda device, fraction: tuple(
        m * 2**20 for m in H100_MEMORY[fraction]))
    check = _run("memory")
    assert check.status == "failed"
    assert "budget 0.35: measured 640 MiB, above budget 0.6's 512 MiB" in check.detail
    assert check.detail.count("more than 10% off") == 3
    assert check.data["budget 0.6"] == {"measured MiB": 512.0, "predicted MiB": 688.0}


def test_memory_problems_accept_a_falling_peak_predicted_within_the_tolerance():
    rows = [(1.0, 1000, 1090), (0.6, 700, 640), (0.35, 700, 700)]
    assert memory_problems(rows) == []
    assert memory_problems([(1.0, 1000, 1110)]) == [
        "budget 1.0: predicted 0 MiB, measured 0 MiB (+11%, more than 10% off)"]


def _offload_with(fault):
    """fxopt.optim.offload, the optimizer it returns then given ``fault``."""
    real = fxopt.optim.offload

    def offload(*args, **kwargs):
        optimizer = real(*args, **kwargs)
        fault(optimizer)
        return optimizer
    return offload


def test_offload_optimizer_passes_on_the_cpu_with_its_plan_in_the_report(monkeypatch):
    """For real on the CPU: the same steps as plain AdamW, dropped optimizers die, and the
    profiler's device peak falls by the host state, the plan's prediction to the byte; the
    report line carries the plan's summary."""
    plans = []
    monkeypatch.setattr(fxopt.optim, "offload", _offload_with(lambda o: plans.append(o.plan)))
    check = _run("offload_optimizer")
    assert check.status == "ok", check.detail
    assert plans and plans[0].summary() in doctor.format_report([check])
    assert check.data["dropped optimizers alive"] == 0
    assert check.data["saving KiB"] == check.data["predicted KiB"] > 0
    assert check.data["host state KiB"] == check.data["predicted KiB"]


def test_offload_optimizer_fails_when_the_offloaded_steps_differ(monkeypatch):
    """Criterion 1: an offloaded optimizer that steps with twice the learning rate."""
    monkeypatch.setattr(fxopt.optim, "offload",
                        _offload_with(lambda o: o.param_groups[0].update(lr=2e-2)))
    monkeypatch.setattr(doctor_offload, "release_rounds", lambda device: (False, []))
    check = _run("offload_optimizer")
    assert check.status == "failed"
    assert check.detail.startswith("parameters differ from plain AdamW's by up to")
    assert "(plan: " in check.detail and "of parameters update on the host" in check.detail


class _Plan:
    """An offload plan's figures: 4 KiB of fp32 state (512 parameters, two moments) placed
    on the host, as the plan predicts."""
    subgroups = [SimpleNamespace(numel=512, placement="cpu"),
                 SimpleNamespace(numel=512, placement="gpu")]
    states_per_param, all_gpu_state_bytes, gpu_state_bytes = 2, 8192, 4096

    def summary(self):
        return "50% of parameters update on the host"


def _sides(saving):
    """offload_side stubbed: equal parameters, the offloaded peak ``saving`` below."""
    return lambda device, offloaded: ([torch.zeros(3)], 10**6 - saving * offloaded, _Plan())


def test_offload_optimizer_fails_when_a_dropped_optimizer_lives_on(monkeypatch):
    """Criterion 2 on the CPU: the bug this check guards, a gradient hook closing over the
    optimizer (a cycle through the autograd engine that gc never collects)."""
    def hook_over(optimizer):
        param = optimizer.param_groups[0]["params"][0]
        param.register_post_accumulate_grad_hook(lambda p, kept=optimizer: None)
    monkeypatch.setattr(fxopt.optim, "offload", _offload_with(hook_over))
    monkeypatch.setattr(doctor_offload, "offload_side", _sides(4096))
    check = _run("offload_optimizer")
    assert check.status == "failed"
    assert check.detail == ("a dropped offloaded optimizer is still referenced: it keeps its "
                            "model and state alive (plan: 50% of parameters update on the "
                            "host)")


def test_offload_optimizer_fails_when_cuda_memory_grows_round_by_round(monkeypatch):
    """Criterion 2 on CUDA (its allocator's count stubbed): the second round ends 100 KiB
    above the first."""
    counts = iter([10**6, 10**6 + 100 * 2**10])
    monkeypatch.setattr(doctor_offload, "_allocated", lambda device: next(counts, None))
    monkeypatch.setattr(doctor_offload, "offload_side", _sides(4096))
    check = _run("offload_optimizer")
    assert check.status == "failed"
    assert check.detail.startswith("dropping it left 100.0 KiB more allocated after round 2 "
                                   "than after round 1 (slack 4 KiB)")
    assert check.data["allocated after each round"] == [10**6, 10**6 + 100 * 2**10]


@pytest.mark.parametrize("saving, problem", [
    (3000, "the device peak fell by 2.9 KiB, below 90% of the 4.0 KiB of state placed on "
           "the host; the device peak fell by 2.9 KiB, the plan predicted 4.0 KiB (more "
           "than 5% off)"),
    (4600, "the device peak fell by 4.5 KiB, the plan predicted 4.0 KiB (more than 5% off)")])
def test_offload_optimizer_fails_when_the_device_keeps_the_host_state(
        monkeypatch, saving, problem):
    """Criterion 3 (measured peaks stubbed): the device peak falls by less than 90% of the
    host state, or by more than 5% off the plan's prediction."""
    monkeypatch.setattr(doctor_offload, "offload_side", _sides(saving))
    monkeypatch.setattr(doctor_offload, "release_rounds", lambda device: (False, []))
    check = _run("offload_optimizer")
    assert check.status == "failed"
    assert check.detail == problem + " (plan: 50% of parameters update on the host)"


def test_offload_problems_accept_the_criteria_met_and_name_a_plan_with_no_host_state():
    measured = {"close": True, "difference": 0.0, "alive": False, "released": [100, 100],
                "saving": 4000, "host state": 4096, "predicted": 4096}
    assert offload_problems(measured) == []
    assert offload_problems({**measured, "released": [100, 100 + 4096]}) == []  # the slack
    assert offload_problems({**measured, "saving": 0, "host state": 0, "predicted": 0}) == [
        "the plan placed no state on the host"]


def test_speed_runs_without_the_entry_point_and_fails_when_fxopt_is_slower(
        monkeypatch, on_any_device):
    """From a source checkout Dynamo's registry has no "fxopt": the check must pass its
    backend as an object. fxopt's defaults 20% slower than Inductor (medians of interleaved
    steps) fail it."""
    pytest.importorskip("transformers")
    backends = []

    def compile_without_the_entry_point(model, backend=None):
        if isinstance(backend, str) and backend != "inductor":
            raise InvalidBackend(name=backend)
        backends.append(backend)
        return model

    monkeypatch.setattr(torch, "compile", compile_without_the_entry_point)
    times = {"eager": [30.0] * 3, "torch.compile": [10.0, 11.0, 9.0], "fxopt": [10.5] * 3}
    monkeypatch.setattr(timing, "interleaved", lambda steps, device, warmup: {
        name: timing.Timing(0.0, [t / 1e3 for t in times[name]]) for name in steps})
    check = _run("speed")
    assert check.status == "ok", check.detail
    assert backends[0] == "inductor" and isinstance(backends[1], fxopt.compiler.Backend)
    times["fxopt"] = [12.0] * 3
    check = _run("speed")
    assert check.status == "failed" and "20% more than Inductor's 10" in check.detail
    assert check.data == {"eager ms/step": 30.0, "torch.compile ms/step": 10.0,
                          "fxopt ms/step": 12.0}


def test_memory_compares_peaks_above_the_parameters_and_inputs_on_both_sides():
    """The planner's ``peak_bytes`` includes the parameters and inputs; the measured peak is
    taken above them. Compared as they were on the H100, the predictions were 19-34% high
    (by exactly that baseline); compared above the baseline on both sides, within the
    check's tolerance (the doctor's model, smaller, on the CPU under Inductor)."""
    measured, predicted = doctor_memory.step_peak(torch.device("cpu"), 1.0, width=64, batch=256)
    assert memory_problems([(1.0, measured, predicted)]) == []


def test_the_command_prints_and_saves_each_check_as_it_ends(tmp_path, capsys, monkeypatch):
    """A first run on a GPU compiles for minutes: a run cut off by a time limit must still
    show, and have saved, every check that ended before it."""
    report = tmp_path / "doctor.json"

    def first(device):
        return {"found": 1}

    def second(device):  # runs after the first has been printed and saved
        assert "first" in capsys.readouterr().out
        saved = json.loads(report.read_text())["checks"]
        assert [(c["name"], c["status"]) for c in saved] == [("first", "ok")]
        raise KeyboardInterrupt  # the time limit

    monkeypatch.setattr(doctor, "CHECKS", {"first": first, "second": second})
    with pytest.raises(KeyboardInterrupt):
        main(["doctor", "--device", "cpu", "--json", str(report)])
    assert [c["name"] for c in json.loads(report.read_text())["checks"]] == ["first"]
