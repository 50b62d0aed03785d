"""``fxopt plan`` and ``fxopt calibrate``, run in-process."""

import json
from pathlib import Path

import pytest
import torch

from fxopt.__main__ import main
from fxopt.cli.calibrate import calibrate
from fxopt.cli.planner import load_target
from fxopt.compiler import Backend
from fxopt.config import OptionError
from fxopt.planner import Plan, profile_for
from fxopt.planner.hardware import CPU_DEFAULT, cache_path, load_calibrated, save_calibrated
from fxopt.planner.plan import load_plans

TARGET = str(Path(__file__).with_name("plan_targets.py"))


def test_plan_prints_the_frontier_solves_a_budget_and_fits_a_batch(tmp_path, capsys):
    plan_path, png = tmp_path / "plan.json", tmp_path / "frontier.png"
    assert main(["plan", TARGET, "--budget", "1800000", "--points", "4", "--save",
                 str(plan_path), "--png", str(png), "--dynamic", "--fit", "4MiB"]) == 0
    out = capsys.readouterr().out
    assert "keep-all peak" in out and "step ms" in out and "recompute" in out
    assert "budget 1.72 MiB: predicted peak" in out and "OVER BUDGET" not in out
    # the plan as a table: counts per action, predicted peak and step time, the floor
    assert "plan for g0: milp (optimal)" in out
    assert all(f"\n  {action}" in out for action in ("recompute", "swap", "keep"))
    assert "predicted peak" in out and "predicted step" in out
    assert "floor: lowest reachable peak" in out and "added ms" in out
    assert "largest s" in out and "that fits in 4.00 MiB" in out
    plan = Plan.load(plan_path)
    assert plan.feasible and plan.budget_bytes == 1800000 and plan.actions
    assert plan.predictions["peak_bytes"] <= 1800000
    if png.exists():  # matplotlib is optional
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_plan_reports_the_floor_and_plans_a_fraction_of_saved_bytes(tmp_path, capsys):
    plan_path = tmp_path / "plan.json"
    assert main(["plan", TARGET, "--budget", "0.5", "--points", "2", "--save",
                 str(plan_path)]) == 0
    out = capsys.readouterr().out
    assert "floor of a fraction budget" in out and "of plain autograd's saved bytes" in out
    assert "budget 0.5 of activation memory: predicted saved bytes" in out
    assert "OVER BUDGET" not in out
    assert "plan for g0: fraction path" in out and "predicted step" in out
    assert "floor: 0.000 of plain autograd's saved bytes" in out
    # with --save, the frontier is drawn next to the plan when matplotlib is installed
    png = plan_path.with_suffix(".frontier.png")
    assert (f"frontier drawn: {png}" in out and png.read_bytes()[:4] == b"\x89PNG"
            if _has_matplotlib() else "frontier not drawn: " in out)
    plan = Plan.load(plan_path)
    assert plan.feasible and plan.actions and plan.extra["fraction"] == 0.5
    assert plan.predictions["saved_bytes"] <= 0.5 * plan.predictions["plain_saved_bytes"]


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _compiled_step(options):
    """One compiled step of TARGET: swap_recompute's stats and the parameters' gradients."""
    model, (x,) = load_target(TARGET)
    backend = Backend(options)
    torch.compile(model, backend=backend)(x).sum().backward()
    (stats,) = [r.stats for g in backend.graphs for r in g.passes if r.name == "swap_recompute"]
    return stats, [p.grad for p in model.parameters()]


@pytest.mark.parametrize("budget", ["0.5", "1700000"])  # saved bytes; the predicted peak
def test_the_saved_plan_is_the_one_compilation_builds_and_replays(budget, tmp_path, capsys):
    plan_path = tmp_path / "plan.json"
    assert main(["plan", TARGET, "--budget", budget, "--points", "2", "--save",
                 str(plan_path)]) == 0
    saved = Plan.load(plan_path).to_dict()
    assert saved["actions"]
    solved, solved_grads = _compiled_step({"codegen": "fx", "memory_budget": budget})
    replayed, replayed_grads = _compiled_step({"plan": str(plan_path)})
    assert solved.get("plan") and replayed.get("plan")
    # the same plan but for the graph's name (g0 here, Dynamo's there) and the solve's time
    ignored = {"graph", "planning_seconds"}
    assert ({k: v for k, v in solved["plan"].items() if k not in ignored}
            == {k: v for k, v in saved.items() if k not in ignored})
    assert replayed["plan"]["actions"] == saved["actions"] and replayed["plan"]["solver"] == "plan"
    assert replayed["plan"]["predictions"] == saved["predictions"]
    assert all(torch.equal(a, b) for a, b in zip(solved_grads, replayed_grads, strict=True))


def test_plan_and_compilation_make_the_same_plan_for_a_fraction_on_the_cpu(monkeypatch,
                                                                          capsys):
    """The code generator is resolved from the user's budget, as compilation resolves it:
    a fraction on the CPU is Inductor's budgeted min-cut for both (issue 31: `fxopt plan`
    planned for fx code generation with the default options)."""
    import fxopt.planner.step as step

    made = []
    real_plan_step = step.plan_step
    monkeypatch.setattr(step, "plan_step", lambda *a, **k: made.append(real_plan_step(*a, **k))
                        or made[-1])
    assert main(["plan", TARGET, "--budget", "0.5", "--points", "2"]) == 0
    out = capsys.readouterr().out
    assert "code generation: inductor (auto: under a fraction memory_budget" in out
    assert "budgeted min-cut meets the fraction" in out
    (planned,) = made
    compiled, _ = _compiled_step({"memory_budget": 0.5})
    assert "partition" in compiled["inductor"]  # compilation took Inductor's min-cut too
    ignored = {"graph", "planning_seconds"}
    assert planned.actions and ({k: v for k, v in compiled["plan"].items() if k not in ignored}
                                == {k: v for k, v in planned.to_dict().items()
                                    if k not in ignored})


def test_a_plan_made_for_inductor_replays_under_inductor_and_only_there(tmp_path, capsys):
    """Issue 30 item 4: `fxopt plan --codegen inductor` captures the joint graph Inductor's
    compilation traces (its decompositions), so the saved plan is that graph's: compiling
    with codegen="inductor" replays it, and fx code generation refuses it by name."""
    plan_path = tmp_path / "plan.json"
    assert main(["plan", TARGET, "--budget", "1700000", "--codegen", "inductor", "--points",
                 "2", "--save", str(plan_path)]) == 0
    out = capsys.readouterr().out
    assert "code generation: inductor (set by the codegen option)" in out
    assert "OVER BUDGET" not in out
    saved = Plan.load(plan_path)
    assert saved.actions and saved.extra["codegen"] == "inductor"
    model, (x,) = load_target(TARGET)
    eager_grads = torch.autograd.grad(model(x).sum(), list(model.parameters()))
    replayed, grads = _compiled_step({"codegen": "inductor", "plan": str(plan_path)})
    assert replayed["plan"]["solver"] == "plan" and replayed["plan"]["actions"] == saved.actions
    for got, want in zip(grads, eager_grads, strict=True):  # Inductor's fused sums: fp32
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)  # rounding, 32x64 terms
    try:
        _compiled_step({"codegen": "fx", "plan": str(plan_path)})
    except Exception as error:  # noqa: BLE001 - Dynamo wraps the backend's OptionError
        chain = [error]
        while chain[-1].__cause__ or chain[-1].__context__:
            chain.append(chain[-1].__cause__ or chain[-1].__context__)
        assert any(isinstance(e, OptionError) and "made for inductor code generation" in str(e)
                   for e in chain), chain
    else:
        pytest.fail("a plan made for Inductor replayed under fx code generation")


def test_a_model_with_a_graph_break_saves_one_plan_file_that_replays_each_graph(tmp_path,
                                                                              capsys):
    plan_path, target = tmp_path / "plan.json", f"{TARGET}:graph_break"
    assert main(["plan", target, "--budget", "0.4", "--points", "2", "--save",
                 str(plan_path)]) == 0
    assert "plan saved: " in capsys.readouterr().out
    saved = load_plans(plan_path)
    assert [p.graph for p in saved] == ["g0", "g1"] and all(p.actions for p in saved)

    def step(options):
        model, (x,) = load_target(target)
        backend = Backend(options)
        torch.compile(model, backend=backend)(x).sum().backward()
        stats = [r.stats for g in backend.graphs for r in g.passes
                 if r.name == "swap_recompute"]
        return stats, [p.grad for p in model.parameters()]

    solved, solved_grads = step({"codegen": "fx", "memory_budget": 0.4})
    replayed, replayed_grads = step({"plan": str(plan_path)})
    assert [s["plan"]["actions"] for s in solved] == [p.actions for p in saved]
    assert [s["plan"]["solver"] for s in replayed] == ["plan", "plan"]
    assert [s["plan"]["actions"] for s in replayed] == [p.actions for p in saved]
    # the second graph's share is what the model's budget leaves after the first
    assert solved[1]["share_bytes"] == (int(0.4 * solved[1]["model_plain_saved_bytes"])
                                        - solved[0]["saved_bytes_after"])
    assert all(torch.equal(a, b) for a, b in zip(solved_grads, replayed_grads, strict=True))


def test_joint_splits_a_fraction_by_the_graphs_frontiers(tmp_path, capsys):
    target, totals = f"{TARGET}:graph_break", {}
    for flags in ([], ["--joint"]):
        path = tmp_path / f"plan{len(flags)}.json"
        assert main(["plan", target, "--budget", "0.3", "--points", "2", "--save", str(path),
                     *flags]) == 0
        plans = load_plans(path)
        saved, plain = (sum(p.predictions[k] for p in plans)
                        for k in ("saved_bytes", "plain_saved_bytes"))
        assert saved <= 0.3 * plain
        totals[bool(flags)] = sum(p.predictions["added_seconds"] for p in plans)
    assert "budget split by the frontiers" in capsys.readouterr().out
    assert totals[True] <= totals[False]  # never slower than the one-at-a-time split


@pytest.mark.parametrize("argv, error", [
    (["plan", f"{TARGET}:not_a_pair"], "must return (model, example_inputs)"),
    (["plan", f"{TARGET}:nope"], "has no function 'nope'"),
    (["plan", "missing_file.py"], "no such script"),
    (["plan", TARGET, "--save", "p.json"], "--save needs --budget"),
    (["plan", TARGET, "--budget", "1MiB", "--joint"], "--joint splits a fraction"),
    (["plan", TARGET, "--fit", "1GiB"], "needs --dynamic"),
    (["plan", TARGET, "--budget", "6 gigs"], "fxopt plan: cannot read --budget '6 gigs'"),
    (["plan", TARGET, "--budget", "0.0000001KB"], "rounds to 0 bytes"),
])
def test_plan_refuses_bad_input_with_a_message(argv, error, capsys):
    assert main(argv) == 2
    assert error in capsys.readouterr().err


def test_calibrate_measures_caches_and_profile_for_uses_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert load_calibrated("cpu") is None and profile_for("cpu") == CPU_DEFAULT
    # --force: what --quick measures depends on the machine's load; the plausibility
    # check has its own test (tests/planner/test_calibrate_plausibility.py)
    assert main(["calibrate", "--device", "cpu", "--quick", "--force"]) == 0
    out = capsys.readouterr().out
    assert "TFLOP/s" in out and "Mparams/s" in out and str(cache_path("cpu")) in out
    profile = profile_for("cpu")
    assert profile.source == "calibrated" and profile.flops["float32"] > 0
    assert profile.memory_bandwidth > 0 and profile.host_device_bandwidth is None
    assert profile_for("cpu", calibrated=False) == CPU_DEFAULT
    cache_path("cpu").write_text(json.dumps({"bogus": 1}))
    assert profile_for("cpu") == CPU_DEFAULT  # an unreadable cache is ignored (logged)


def test_calibrate_no_save_prints_the_rates_and_caches_nothing(tmp_path, monkeypatch,
                                                                capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert main(["calibrate", "--device", "cpu", "--quick", "--no-save"]) == 0
    out = capsys.readouterr().out
    assert "Mparams/s" in out and "not saved (--no-save)" in out
    assert not cache_path("cpu").exists() and profile_for("cpu") == CPU_DEFAULT


def test_calibrate_refuses_cuda_without_cuda(tmp_path, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available")
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        calibrate("cuda")


@pytest.mark.gpu
def test_calibrate_on_the_gpu_measures_host_copies(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    profile = calibrate("cuda", size=1024, copy_mib=64, adam_params=1 << 18)
    assert profile.host_device_bandwidth > 1e9 and profile.flops["bfloat16"] > 1e12
    save_calibrated(profile, "cuda")
    assert profile_for("cuda") == profile


def test_plan_prints_the_joint_plan_of_tempo_activations_and_optimizer(capsys):
    """Block (dim 64) under 2.1 MiB: the activations alone fit, but not with the optimizer
    state beside them; the shared-budget plan recomputes to make room, and takes tempo's sites
    only where they pay."""
    assert main(["plan", TARGET, "--budget", "2.1MiB", "--points", "2", "--tempo", "auto",
                 "--optimizer-subgroups", "4"]) == 0
    out = capsys.readouterr().out
    joint = out[out.index("g0 shared-budget plan"):]
    assert joint.startswith("g0 shared-budget plan: meets the budget")
    assert "tempo sites taken: " in joint and "tensors: recompute " in joint
    assert "optimizer subgroups: " in joint and " on host, " in joint
    assert "predicted peak " in joint and "(step " in joint and "+ optimizer " in joint
    rows = [line.split() for line in joint.splitlines()[6:]]
    assert len(rows) == 8 and {r[0] for r in rows} == {"-", "attention", "layer_norm",
                                                       "attention,layer_norm"}
    assert [r[1] for r in rows if r[0] == "-"][0] == "no"  # the separate choice misses


@pytest.mark.parametrize("argv, message", [
    (["--budget", "0.5", "--optimizer-subgroups", "2"], "byte --budget"),
    (["--tempo", "auto"], "give --budget"),
])
def test_plan_refuses_joint_options_without_their_budget(argv, message, capsys):
    assert main(["plan", TARGET, "--points", "2", *argv]) == 2
    assert message in capsys.readouterr().err


def test_plan_max_batch_counts_the_plans_savings(capsys):
    assert main(["plan", TARGET, "--budget", "6MiB", "--points", "2", "--max-batch"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("largest ") and "savings" in x)
    fits = line.split("swapped): ")[1].split(" (")[0]
    kept = line.rsplit(": ", 1)[1]
    assert int(fits) > int(kept) > 0
