"""The project's own files install everything: pyproject and environment.yml agree; notebooks are clean."""
from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_environment_yml_matches_pyproject():
    env = (ROOT / "environment.yml").read_text()
    project = _pyproject()["project"]
    extras = project["optional-dependencies"]
    specs = project["dependencies"] + extras["dev"] + extras["lab"] + extras["browser"]
    for spec in specs:
        assert re.search(rf"^\s*- {re.escape(spec)}\s*$", env, re.M), f"{spec} missing from environment.yml"
    assert "-e .[dev,lab,browser]" in env


def test_makefile_pins_torch_and_ci_calls_make_test():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^TORCH_SPEC \?= torch==2\.13\.0$", makefile, re.M)
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make workbook" in readme


def test_notebooks_are_committed_without_outputs():
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks, "no notebooks found"
    for path in notebooks:
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, path.name
        sources = "".join("".join(c["source"]) for c in nb["cells"])
        assert "sys.path" not in sources, f"{path.name} edits sys.path"
        assert any("parameters" in c.get("metadata", {}).get("tags", []) for c in nb["cells"]), path.name
        assert "SMOKE" in sources and "colab.research.google.com" in sources, path.name
