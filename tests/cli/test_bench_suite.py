"""``fxopt bench --smoke`` end to end: progress, JSON, markdown, charts, a failure."""

import json

import pytest

from fxopt.__main__ import main


def test_smoke_run_writes_results_and_a_summary(tmp_path, capsys):
    pytest.importorskip("transformers")
    out = tmp_path / "results"
    code = main(["bench", "--smoke", "--workloads", "gpt2-small", "lstm-lm",
                 "--configs", "eager", "fxopt", "--steps", "1", "--no-progress",
                 "--memory-cap", "2MiB", "--max-batch", "4", "--out", str(out)])
    assert code == 0
    report = capsys.readouterr().out
    assert "smoke run" in report and "| gpt2-small | fxopt |" in report
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["smoke"] and data["meta"]["torch"]
    runs = {(r["workload"], r["config"]): r for r in data["results"]}
    assert set(runs) == {(w, c) for w in ("gpt2-small", "lstm-lm") for c in ("eager", "fxopt")}
    for run in runs.values():
        assert run["status"] == "ok", run["error"]
        assert run["step_ms"] > 0 and run["peak_bytes"] > 0 and 1 <= run["max_batch"] <= 4
    assert (out / "results.md").read_text() == report.split("wrote ")[0].rstrip("\n") + "\n"
    # a chart per workload with matplotlib (optional), none without it
    charts = sorted(p.name for p in out.glob("*.png"))
    assert charts == (["gpt2-small.png", "lstm-lm.png"] if _has_matplotlib() else [])
    assert all((out / name).stat().st_size > 0 for name in charts)


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("argv, message", [
    (["--workloads", "gpt5"], "unknown workload"),
    (["--configs", "fastest"], "unknown configuration"),
    (["--memory-cap", "50%"], "--memory-cap takes bytes"),
    (["--memory-cap", "0"], "fxopt bench: --memory-cap must be positive"),
    (["--steps", "0"], "--steps must be positive"),
])
def test_bad_arguments_exit_2(tmp_path, capsys, argv, message):
    assert main(["bench", "--smoke", "--out", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_list_names_every_workload_and_configuration(capsys):
    from fxopt.bench import WORKLOADS, all_configs

    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in WORKLOADS)
    assert all(config.name in out for config in all_configs())
