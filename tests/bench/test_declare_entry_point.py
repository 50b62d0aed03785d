"""benchmarks/declare_entry_point.py: the GPU machine runs the checkout uninstalled, where
``backend="fxopt"`` raised ``InvalidBackend``; the metadata it writes declares the entry
point an install would (read from pyproject.toml), and it writes nothing where fxopt is
installed. (Checked end to end on 2026-11-29 with fxopt's install hidden from a torch 2.12
environment: ``tests/passes/fuse_linear_cross_entropy_chunks`` failed on the bare checkout
and passed after ``gpu_session.sh --dry-run`` declared it.)"""

import importlib.metadata

import pytest
from models import load_benchmark

declare = load_benchmark("declare_entry_point")


def _fxopt_points(folder):
    (dist,) = [d for d in importlib.metadata.distributions(path=[str(folder)])
               if d.metadata["Name"] == "fxopt"]
    return {(ep.group, ep.name, ep.value) for ep in dist.entry_points}


def test_the_written_metadata_declares_what_the_install_declares(tmp_path):
    (installed,) = importlib.metadata.entry_points(group="torch_dynamo_backends",
                                                   name="fxopt")
    info = declare.write_metadata(tmp_path)
    assert info.name == f"fxopt-{importlib.metadata.version('fxopt')}.dist-info"
    assert ("torch_dynamo_backends", "fxopt", installed.value) in _fxopt_points(tmp_path)
    # every group the install declares but its command-line scripts (which only an
    # installer puts on PATH)
    assert _fxopt_points(tmp_path) == {
        (ep.group, ep.name, ep.value)
        for ep in importlib.metadata.distribution("fxopt").entry_points
        if ep.group != "console_scripts"}


def test_a_second_write_replaces_the_first(tmp_path):
    (tmp_path / "fxopt-0.0.1.dist-info").mkdir()
    declare.write_metadata(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [
        f"fxopt-{importlib.metadata.version('fxopt')}.dist-info"]


def test_a_pyproject_without_the_entry_point_is_refused(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "fxopt"\nversion = "0.1.0"\n')
    with pytest.raises(ValueError, match="no torch_dynamo_backends entry point named fxopt"):
        declare.write_metadata(tmp_path / "site", pyproject)


def test_nothing_is_written_where_fxopt_is_installed(tmp_path, capsys):
    assert declare.declared()
    assert declare.main([str(tmp_path / "site")]) == 0
    assert capsys.readouterr().out == "" and not (tmp_path / "site").exists()


def test_an_uninstalled_checkout_gets_the_folder_to_put_on_its_path(tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.setattr(declare, "declared", lambda: False)
    assert declare.main([str(tmp_path / "site")]) == 0
    assert capsys.readouterr().out == f"{tmp_path / 'site'}\n"
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    names = {ep.value for ep in importlib.metadata.entry_points(
        group="torch_dynamo_backends", name="fxopt")}
    assert names == {"fxopt.compiler:fxopt_backend"}
