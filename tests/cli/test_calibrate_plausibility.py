"""``fxopt calibrate`` does not cache a profile whose rates are far off the device's
documented default (``--quick`` on a busy machine once measured 50x too low) unless
``--force`` says so, and says which rate and by how much."""

import dataclasses

from fxopt.__main__ import main
from fxopt.cli import calibrate as calibration
from fxopt.cli.calibrate import implausible
from fxopt.planner.hardware import CPU_DEFAULT, cache_path, load_calibrated


def measured(flops_float32):
    return dataclasses.replace(CPU_DEFAULT, flops={**CPU_DEFAULT.flops,
                                                   "float32": flops_float32},
                               source="calibrated")


def test_implausible_names_each_rate_far_off_the_default():
    assert implausible(measured(57e9), CPU_DEFAULT) == []
    (problem,) = implausible(measured(1e9), CPU_DEFAULT)
    assert problem == ("matmul float32: measured 0.001 TFLOP/s, 60x below the default "
                       "0.06 TFLOP/s for cpu")
    assert "above" in implausible(measured(1e13), CPU_DEFAULT)[0]


def test_a_profile_50x_off_is_not_saved_without_force(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(calibration, "calibrate", lambda device, **sizes: measured(1.2e9))
    assert main(["calibrate", "--device", "cpu", "--quick"]) == 1
    err = capsys.readouterr().err
    assert "implausible: matmul float32: measured 0.0012 TFLOP/s, 50x below" in err
    assert "NOT saved" in err and "--force" in err
    assert load_calibrated("cpu") is None
    assert main(["calibrate", "--device", "cpu", "--quick", "--force"]) == 0
    assert "implausible" in capsys.readouterr().err  # still said, once forced
    assert load_calibrated("cpu").flops["float32"] == 1.2e9 and cache_path("cpu").is_file()


def test_a_plausible_profile_is_saved(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(calibration, "calibrate", lambda device, **sizes: measured(57e9))
    assert main(["calibrate", "--device", "cpu"]) == 0
    assert capsys.readouterr().err == ""
    assert load_calibrated("cpu").flops["float32"] == 57e9
