"""``python -m fxopt.kernels.tempo.fit_gelu`` writes its table outside the installed
package unless ``--update-package`` asks for the package's own table."""

import pytest

from fxopt.kernels.tempo import fit_gelu


@pytest.fixture
def quick_fit(monkeypatch, tmp_path):
    """The fit and its error report are stubbed (seconds of erf evaluations; what is
    tested is where the table goes), and the package's table is a copy, so that nothing
    here can touch the real one."""
    monkeypatch.setattr(fit_gelu, "fit_branch", lambda form, right: {"stub": right})
    monkeypatch.setattr(fit_gelu, "max_error", lambda form, fit, bf16: 0.0)
    package_copy = tmp_path / "package" / "gelu_coefficients.py"
    package_copy.parent.mkdir()
    package_copy.write_text(fit_gelu.PACKAGE_TABLE.read_text())
    monkeypatch.setattr(fit_gelu, "PACKAGE_TABLE", package_copy)
    monkeypatch.chdir(tmp_path)
    return package_copy


def test_default_writes_to_the_working_directory_not_the_package(quick_fit, tmp_path, capsys):
    untouched = quick_fit.read_text()
    fit_gelu.main([])
    written = (tmp_path / "gelu_coefficients.py").read_text()
    assert "FITS = {'none'" in written and "'stub': True" in written
    assert quick_fit.read_text() == untouched
    assert "--update-package would replace that one" in capsys.readouterr().out


def test_update_package_rewrites_the_packages_table(quick_fit, capsys):
    fit_gelu.main(["--update-package"])
    assert "'stub': True" in quick_fit.read_text()
    assert f"wrote {quick_fit}; it differs" in capsys.readouterr().out
