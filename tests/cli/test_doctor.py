"""``fxopt doctor``: the CPU subset runs here and lists the GPU checks it skipped; on a GPU
(``gpu`` mark) every check runs and passes. The checks are fxopt.doctor's functions."""

import json

import pytest
import torch

from fxopt.__main__ import main
from fxopt.doctor import CHECKS, _overlap, run_doctor
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
    assert _overlap(copies, compute) == 5.0 + 5.0


@pytest.mark.gpu
def test_every_doctor_check_passes_on_the_gpu():
    checks = run_doctor("cuda")
    assert [c.name for c in checks] == list(CHECKS)
    failed = [(c.name, c.detail) for c in checks if c.status == "failed"]
    assert failed == []
    assert [c.name for c in checks if c.status == "skipped"] == ["aot_compile"]
    assert torch.cuda.is_available()
