"""Colab readiness: every notebook's badge and setup cell follow pyproject's one Repository URL, and the tool that
rewrites them changes exactly those two places (checked on a copy)."""
from __future__ import annotations

import shutil

import nbformat

from specdec_lib.workbook import colab


def test_every_notebook_points_at_the_repository_url(capsys):
    status = colab.main(["--check"])
    assert status == 0, capsys.readouterr().err  # fix: python -m specdec_lib.workbook.colab


def test_setup_cell_installs_the_clone_and_enables_widgets():
    _, setup = colab.expected_cells("notebooks/00_x.ipynb", colab.repository_url())
    assert f'REPO = "{colab.repository_url()}"' in setup
    assert "pip install -q -e /content/specdec-workbook" in setup and "enable_custom_widget_manager()" in setup
    assert 'if "google.colab" in sys.modules:' in setup  # a local run skips it


def test_changing_the_url_rewrites_badge_and_setup_only(tmp_path):
    source = sorted(colab.NOTEBOOKS_DIR.glob("0*.ipynb"))[0]
    path = tmp_path / source.name
    shutil.copy(source, path)
    before = nbformat.read(path, as_version=4)
    fork = "https://github.com/someone/fork-of-workbook"
    assert colab.check(path, fork) == ["badge", "setup cell"]
    assert colab.apply(path, fork, branch="dev") is True
    assert colab.check(path, fork, branch="dev") == [] and colab.apply(path, fork, branch="dev") is False
    after = nbformat.read(path, as_version=4)
    badge = f"https://colab.research.google.com/github/someone/fork-of-workbook/blob/dev/notebooks/{source.name}"
    assert badge in after.cells[0].source and "specdec-workbook/specdec-workbook" not in after.cells[0].source
    changed = [i for i, (a, b) in enumerate(zip(before.cells, after.cells)) if a.source != b.source]
    assert len(after.cells) == len(before.cells) and len(changed) == 2, changed


def test_url_lives_in_pyproject(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    shutil.copy(colab.PYPROJECT, pyproject)
    colab.set_repository_url("https://github.com/a/b", pyproject)
    assert colab.repository_url(pyproject) == "https://github.com/a/b"
