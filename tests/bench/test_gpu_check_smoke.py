"""The GPU check (benchmarks/gpu_check.py) at tiny sizes on the CPU, and the rules that let
a cut-off GPU run still return its rows: a failing configuration is its row's error line
and the next one runs, a configuration past its own limit is stopped, none starts after the
deadline, and the file is rewritten after every row; a resumed run keeps the rows that ran
(from its own day, device and versions only). The session script's dry runs."""

import os
import pathlib
import subprocess
import sys
import time

import pytest
import torch

from fxopt.bench.table import Case, Row, markdown_tables, read_rows, run_cases

REPO = pathlib.Path(__file__).parents[2]
SMOKE = ["eager", "fxopt defaults", "fuse_rnn=True (", "cpu_fraction=0.5", "LM head"]


def _env():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # torch reference
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_tiny_gpu_check_runs_every_section_and_writes_the_table(tmp_path):
    pytest.importorskip("transformers")
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--tiny", "--out-dir",
         str(tmp_path), "--only", *SMOKE], env=_env(), capture_output=True, text=True,
        timeout=240, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    text = (tmp_path / "gpu_check_cpu-tiny.md").read_text()
    for needle in ("torch 2.", "triton ", "transformers ", "fxopt at ", "Command: `",
                   "--tiny", "## GPT-2", "## nn.LSTM LM", "## LSTMCell loop",
                   "## Offloaded optimizer", "## GEMMs", "TFLOP/s", "Progress: ",
                   "device busy "):
        assert needle in text, needle
    rows = [line for line in text.splitlines() if line.startswith("| ")
            and not line.startswith("| configuration")]
    ran = [r for r in rows if "not run" not in r]
    assert len(ran) >= 10, rows
    assert not [r for r in ran if "failed" in r], ran
    # the passes fired where asked, and the compiled losses are eager's (no dropout in
    # the LSTM models: equal to fp tolerance)
    fused = [r for r in ran if "fuse_rnn=True" in r]
    assert len(fused) == 2 and all("fired: fuse_rnn" in r for r in fused)
    assert any("fired: offload_optimizer" in r and "; plan: " in r and "of parameters "
               "update on the host" in r for r in ran)  # the predicted step beside the row's
    # a compared row names the kernel families it ran beyond its reference's
    (unbroken,) = [r for r in ran if r.startswith("| fxopt defaults, logging break ignored |")]
    assert "ops (CPU) against fxopt defaults (auto: Inductor): " in unbroken, unbroken
    for row in fused:
        loss_cell = row.split(" | ")[4]
        assert abs(float(loss_cell.split("(")[1].rstrip(")"))) < 1e-4, row


def test_a_failure_is_a_row_a_slow_case_is_stopped_and_the_deadline_holds():
    writes = []

    def boom(row):
        raise RuntimeError("no kernel\nsecond line")

    def slow(row):
        time.sleep(5)

    def fine(row):
        row.step = "1.0 (1.0-1.0)"

    def waits(row):
        time.sleep(20)

    cases = [Case("a", "boom", boom), Case("a", "slow", slow, limit_s=0.3),
             Case("b", "fine", fine), Case("b", "waits", waits, limit_s=60),
             Case("b", "late", fine)]
    clock = time.monotonic()
    rows = run_cases(cases, deadline_s=4, write=lambda rows: writes.append(
        markdown_tables(rows, {})), min_start_s=0.5, between=lambda: None)
    assert time.monotonic() - clock < 10     # "waits" is stopped at the deadline
    status = {r.name: (r.status, r.notes) for r in rows}
    assert status["boom"] == ("failed", ["RuntimeError: no kernel"])
    assert status["slow"][0] == "failed" and "CaseTimeout" in status["slow"][1][0]
    assert status["fine"][0] == "ok"
    assert status["waits"][0] == "failed" and "CaseTimeout" in status["waits"][1][0]
    assert status["late"] == ("not run", ["deadline (4 s) reached"])
    assert len(writes) == len(cases) + 1        # once at the start, once after each
    assert "| boom | failed: RuntimeError: no kernel |" in writes[1]
    assert "| late | not run |" in writes[1]


def test_rows_keep_the_section_order_given():
    rows = [Row("b", "x", "ok", step="2"), Row("a", "y", "ok", step="1")]
    text = markdown_tables(sorted(rows, key=lambda r: ["a", "b"].index(r.section)),
                           {"a": "## A", "b": "## B"})
    assert text.index("## A") < text.index("## B")


def test_the_session_script_dry_run_plans_three_steps_under_out(tmp_path):
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_session.sh"), "--dry-run"],
                          env={**_env(), "OUT": str(tmp_path)}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "session.txt").read_text()
    for needle in (f"fxopt doctor --device cuda --json {tmp_path}/fxopt_doctor.json",
                   "pytest -m gpu", "--deselect tests/cli/test_doctor.py::test_every_doctor",
                   f"gpu_check.py --deadline-s 250 --out-dir {tmp_path}/benchmarks/results "
                   "--also-to .gpu_session"):
        assert needle in log, log
    limits = [int(part.split()[0]) for part in log.split("(limit ")[1:]]
    assert sum(limits) <= 540  # one device command (600 s) with room to start up


def test_rows_read_back_as_they_were_written_and_not_run_ones_are_left_out():
    titles = {"a": "## A", "b": "## B"}
    rows = [Row("a", "x", "ok", step="2.0 (1.9-2.1)", peak="12", compile="3.1",
                loss_text="4.1000 (+1.0e-03)", notes=["fired: tempo", "budget 9 MiB"]),
            Row("a", "y", "failed", notes=["RuntimeError: no kernel"]),
            Row("b", "z", "ok", step="1.0 (1.0-1.0)", peak="-", compile="0.0", loss_text="-"),
            Row("b", "late", notes=["deadline (4 s) reached"])]
    text = markdown_tables(rows, titles)
    again = read_rows("# header\n\nDate: x\n" + text, titles)
    assert [(r.section, r.name, r.status) for r in again] == [
        ("a", "x", "ok"), ("a", "y", "failed"), ("b", "z", "ok")]
    assert markdown_tables(again + rows[3:], titles) == text


def _tiny(tmp_path, *args):
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--tiny", "--out-dir",
         str(tmp_path), *args], env=_env(), capture_output=True, text=True, timeout=240,
        cwd=REPO)


def test_a_resumed_check_keeps_what_ran_and_runs_the_rest(tmp_path):
    """The first run also writes its file where the session's next command resumes from
    (``--also-to``)."""
    first = _tiny(tmp_path, "--only", "AdamW on the device", "--also-to",
                  str(tmp_path / "kept"))
    assert first.returncode == 0, first.stderr[-3000:]
    path = tmp_path / "gpu_check_cpu-tiny.md"
    assert (tmp_path / "kept" / path.name).read_text() == path.read_text()
    (reference,) = [line for line in path.read_text().splitlines()
                    if line.startswith("| AdamW on the device |")]
    second = _tiny(tmp_path, "--resume", "--only", "AdamW on the device", "cpu_fraction=0.5")
    assert second.returncode == 0, second.stderr[-3000:]
    text = path.read_text()
    assert reference in text.splitlines() and "Resumed: 1 configurations kept" in text
    (offloaded,) = [line for line in text.splitlines()
                    if line.startswith("| offloaded, cpu_fraction=0.5 |")]
    assert " (+" in offloaded or " (-" in offloaded  # its loss against the kept reference's
    # a file of another day (or device, or versions) is not resumed
    path.write_text(text.replace("Date: ", "Date: 1999-01-01 00:00 UTC. was ", 1))
    third = _tiny(tmp_path, "--resume", "--only", "AdamW on the device")
    assert third.returncode != 0 and "is from another day" in third.stderr


@pytest.mark.parametrize("seconds", [None, 240])
def test_the_continue_dry_run_plans_calibrate_then_the_resumed_check(tmp_path, seconds):
    """The second command measures the machine's rates (printed, not cached: the check
    plans with the documented profile) and gives the check what is left of its time."""
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_session.sh"), "--dry-run",
                           "--continue", *([str(seconds)] if seconds else [])],
                          env={**_env(), "OUT": str(tmp_path)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "session.txt").read_text()
    steps = [line for line in log.splitlines() if line.startswith("== ") and "(limit" in line]
    assert len(steps) == 2
    assert steps[0] == ("== calibrate (limit 45 s): python -m fxopt calibrate --device cuda "
                        "--no-save")
    limit = (seconds or 530) - 45
    assert steps[1].startswith(f"== gpu_check (limit {limit} s)")
    assert f"--deadline-s {limit - 30} --resume" in steps[1]
    assert "--also-to .gpu_session" in steps[1]  # where a later --continue resumes from


def test_a_continue_too_short_for_calibrate_and_the_check_is_refused(tmp_path):
    done = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_session.sh"), "--dry-run",
                           "--continue", "100"], env={**_env(), "OUT": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "need at least 105 s" in done.stderr



def _gpu_check():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return gpu_check


def test_kernels_are_set_against_another_rows_by_family():
    check = _gpu_check()
    ours = check.kernel_families([("triton_poi_fused_gelu_3", 0, 30), ("triton_poi_fused_gelu_9",
                                  40, 70), ("nvjet_gemm|tn", 70, 170), ("topk_kernel", 170, 175)])
    theirs = check.kernel_families([("triton_poi_fused_gelu_1", 0, 10), ("nvjet_gemm|tn", 10, 110),
                                    ("triton_red_fused_norm_2", 110, 150)])
    assert ours == {"triton_poi_fused_gelu": (2, 60.0), "nvjet_gemm/tn": (1, 100.0),
                    "topk_kernel": (1, 5.0)}
    text = check.kernel_difference(ours, theirs, "fxopt defaults", torch.device("cuda"),
                                   shown=2)
    assert text == ("kernels against fxopt defaults: 4 (3), 0.17 ms (0.15); most added: "
                    "triton_poi_fused_gelu +0.05 ms (2 against 1); topk_kernel +0.01 ms "
                    "(1 against 0); most saved: triton_red_fused_norm -0.04 ms (0 against 1)")


def test_device_busy_time_counts_overlapping_kernels_once():
    busy_us = _gpu_check().busy_us
    # two streams overlapping over 5-12, a gap 15-20, one nested kernel
    assert busy_us([(0, 10), (5, 12), (20, 30), (22, 25)]) == 12 + 10
    assert busy_us([]) == 0
