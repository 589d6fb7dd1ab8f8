"""Every notebook runs top to bottom in SMOKE mode on a fresh kernel, through `run_notebooks` (as `make workbook`)."""
from __future__ import annotations

import nbformat
import pytest

from specdec_lib.tools import run_notebooks

NOTEBOOKS = run_notebooks.find_notebooks()


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no notebooks under {run_notebooks.NOTEBOOKS_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_smoke_mode(path, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))  # tables built on demand stay in the test's folder
    run = run_notebooks.run_notebook(path, tmp_path, smoke=True, timeout=300)
    assert run.ok, f"{run.name} failed:\n{run.error}"
    nb = nbformat.read(run.output, as_version=4)
    injected = [c for c in nb.cells if run_notebooks.INJECTED_TAG in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "SMOKE = True" in injected[0].source
    tags = [c.metadata.get("tags", []) for c in nb.cells]
    assert "parameters" in tags[nb.cells.index(injected[0]) - 1], "injected cell must follow the parameters cell"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), "some cells did not run"
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, [f"{e.ename}: {e.evalue}" for e in errors]


def test_injection_replaces_a_previous_injection():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"),
                                         nbformat.v4.new_code_cell("SMOKE = False", metadata={"tags": ["parameters"]}),
                                         nbformat.v4.new_code_cell("print(SMOKE)")])
    run_notebooks.inject_parameters(nb, {"SMOKE": True})
    run_notebooks.inject_parameters(nb, {"SMOKE": True, "FIGURES_DIR": "out/x"})
    assert [c.source.splitlines()[-1] for c in nb.cells] == ["x = 1", "SMOKE = False", "FIGURES_DIR = 'out/x'",
                                                            "print(SMOKE)"]


def test_a_failing_cell_fails_the_run(tmp_path, capsys):
    folder = tmp_path / "nbs"
    folder.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("SMOKE = False", metadata={"tags": ["parameters"]}),
                                         nbformat.v4.new_code_cell("raise ValueError('boom')")])
    nbformat.write(nb, folder / "broken.ipynb")
    status = run_notebooks.main(["--notebooks", str(folder), "--out", str(tmp_path / "out"), "--smoke"])
    assert status == 1
    err = capsys.readouterr().err
    assert "broken.ipynb" in err and "boom" in err
    assert (tmp_path / "out" / "broken.ipynb").exists()
