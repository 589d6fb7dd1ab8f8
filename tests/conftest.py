"""Shared fixtures: the shipped tiny pair (float32 and a float64 copy), the executed workbooks, the project's cache
in a temp folder. Shared helper functions (random models, prompts) are in helpers.py."""
from __future__ import annotations

import os

import pytest
import torch

# the workbooks' notebooks run two at a time where there are two cores: their SMOKE cells use one thread each, so
# side by side they take about half the time (CI's 90 minutes)
NOTEBOOK_JOBS = min(2, os.cpu_count() or 1)


@pytest.fixture(scope="module")
def one_thread():
    """Many tiny forwards: on a small shared CPU, thread hand-offs cost more than the arithmetic."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_pair():
    from specdec_lib import load_models

    return load_models("tiny", device="cpu")


@pytest.fixture(scope="session")
def tiny_pair64(tiny_pair):
    import copy

    target = copy.deepcopy(tiny_pair.target).to(torch.float64)
    draft = copy.deepcopy(tiny_pair.draft).to(torch.float64)
    return target, draft, tiny_pair.tokenizer


@pytest.fixture(scope="session")
def smoke_workbook(tmp_path_factory):
    """Every notebook executed once in SMOKE mode as `make workbook` does (executed .ipynb, standalone pages,
    figures, index.html): {"out": folder, "runs": {notebook name: NotebookRun}}. The notebook tests and the
    browser test both read it, so no notebook runs twice."""
    from specdec_lib.tools import run_notebooks

    out = tmp_path_factory.mktemp("workbook")
    jupyter_data = tmp_path_factory.mktemp("jupyter_data")  # the notebooks' trust signatures, not the user's
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_CACHE", str(out / "cache"))  # tables built on demand stay in the test's folder
        mp.setenv("JUPYTER_DATA_DIR", str(jupyter_data))
        runs = run_notebooks.run_all(out, smoke=True, timeout=300, log=lambda *a, **k: None, jobs=NOTEBOOK_JOBS)
    return {"out": out, "runs": {run.name: run for run in runs}, "jupyter_data": jupyter_data}


@pytest.fixture(scope="session")
def smol_workbook(tmp_path_factory):
    """Every notebook executed once in SMOKE mode with MODELS = "smol" (the real pair: SmolLM2-135M-Instruct and
    its exit draft), as a user would run them with that one parameter changed; the exercises' solution cells run
    on the tiny pair (smoke_workbook) and are left out here (each is minutes of the real pair's time in CI)."""
    from specdec_lib.smol import ensure_smol_dir
    from specdec_lib.tools import run_notebooks

    out = tmp_path_factory.mktemp("workbook_smol")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_CACHE", str(out / "cache"))
        mp.setenv("JUPYTER_DATA_DIR", str(tmp_path_factory.mktemp("jupyter_data_smol")))
        ensure_smol_dir(progress=False)  # dequantised once here, not by two kernels at once
        runs = run_notebooks.run_all(out, smoke=True, timeout=600, log=lambda *a, **k: None,
                                     params={"MODELS": "smol"}, skip_exercises=True, jobs=NOTEBOOK_JOBS)
    return {"out": out, "runs": {run.name: run for run in runs}}


@pytest.fixture(scope="session", autouse=True)
def _project_cache_in_a_temp_folder(tmp_path_factory):
    """Cost curves and frozen tables the tests measure or build go to a folder of this test session, not to the
    user's ~/.cache/specdec_lib (a curve timed on a loaded machine would otherwise steer their auto budgets)."""
    import os

    if "SPECDEC_CACHE" in os.environ:  # the caller chose one
        yield
        return
    from specdec_lib.smol import models_root

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_MODELS", str(models_root()))  # models made here (smol's dequantised GGUF) are shared
        mp.setenv("SPECDEC_CACHE", str(tmp_path_factory.mktemp("specdec_cache")))
        yield
