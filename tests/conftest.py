"""Shared fixtures: the shipped tiny pair (float32 and a float64 copy), the executed workbooks, the project's cache
in a temp folder shared by every worker. Shared helper functions (random models, prompts) are in helpers.py.

Two tiers (README "Tests"): `make test` runs every test not marked `full`; `make test-full` runs them all. Tests run
on pytest-xdist workers with one torch thread each; tests that start Jupyter kernels (KERNEL_MODULES) share one
worker (`pytest_xdist_make_scheduler` below: the workbooks are session fixtures, built once).
Costs are estimated, never timed (SPECDEC_COSTS=estimate, mechanisms/budget/cost_curve.py), except in tests marked
`measures_costs` and in the workbooks' kernels, which run as a user's would."""
from __future__ import annotations

import os

import pytest
import torch

from specdec_lib.mechanisms.budget.cost_curve import ESTIMATE_ENV

KERNEL_MODULES = {"test_notebooks.py", "test_browser.py", "test_gpu_report.py"}  # they start Jupyter kernels
ONE_MODEL_MODULES = {"test_gemma_real.py"}  # their tests share one large model (a module fixture): one worker
KERNEL_TIMEOUT_S = 3600  # the first test to read a workbook builds it (every notebook, one after the other)


def in_worker() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


# the workbooks' notebooks run two at a time where two cores are free for them (their SMOKE cells use one thread);
# on an xdist worker the other worker holds the other core, so one at a time
NOTEBOOK_JOBS = 1 if in_worker() else min(2, os.cpu_count() or 1)


def pytest_configure(config):
    config.addinivalue_line("markers", "full: only in `make test-full` (a faster test in `make test` catches the "
                                       "same class of bug; the test says which)")
    config.addinivalue_line("markers", "real_pair_workbook: the real pair's SMOKE workbook (make test runs it when "
                                       "what it depends on changed since the last full run: tests/real_pair_stamp.py)")
    config.addinivalue_line("markers", "measures_costs: times this machine (SPECDEC_COSTS unset for the test)")
    os.environ[ESTIMATE_ENV] = "estimate"  # set before any fixture: every cost in the tests is estimated
    if in_worker():  # two workers on two cores: one thread each, or OpenMP oversubscribes them (10x slower)
        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"  # and their subprocesses


def pytest_collection_modifyitems(config, items):
    for item in items:
        if {"smoke_workbook", "smol_workbook", "sliding_workbook"} & set(item.fixturenames):
            item.add_marker(pytest.mark.timeout(KERNEL_TIMEOUT_S))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Tests one by one to whichever worker is free, but every test of KERNEL_MODULES to one worker (the tiny
    workbook is a session fixture: built once, on that worker), each of ONE_MODEL_MODULES to one worker (its model
    loaded once), the real pair's workbook tests to one worker too (where a free one can build it beside the tiny
    workbook). xdist's own `--dist loadgroup` would do this with an xdist_group mark, but under pytest 9 its group
    never reaches the scheduler (it renames `item._nodeid`, which pytest 9 no longer reads)."""
    from pathlib import PurePosixPath

    from xdist.scheduler import LoadScopeScheduling

    class KernelsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if "::test_notebook_runs_on_the_real_pair[" in nodeid:
                return "real pair's workbook"  # the one reader of smol_workbook: beside the tiny workbook
            path = nodeid.split("::", 1)[0]
            if PurePosixPath(path).name in ONE_MODEL_MODULES:
                return path  # loaded once, not once per worker
            return "kernels" if PurePosixPath(path).name in KERNEL_MODULES else nodeid

    return KernelsTogether(config, log)


@pytest.fixture(autouse=True)
def _costs_timed_only_where_measured(request, monkeypatch):
    if request.node.get_closest_marker("measures_costs"):
        monkeypatch.delenv(ESTIMATE_ENV, raising=False)


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
    from specdec_lib.workbook import run_notebooks

    out = tmp_path_factory.mktemp("workbook")
    jupyter_data = tmp_path_factory.mktemp("jupyter_data")  # the notebooks' trust signatures, not the user's
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(ESTIMATE_ENV, raising=False)  # the kernels time their costs, as a user's do
        mp.setenv("JUPYTER_DATA_DIR", str(jupyter_data))
        runs = run_notebooks.run_all(out, smoke=True, timeout=300, log=lambda *a, **k: None, jobs=NOTEBOOK_JOBS)
    return {"out": out, "runs": {run.name: run for run in runs}, "jupyter_data": jupyter_data}


@pytest.fixture(scope="session")
def smol_workbook(tmp_path_factory):
    """Every notebook executed once in SMOKE mode with MODELS = "smol" (the real pair: SmolLM2-135M-Instruct and
    its exit draft), as a user would run them with that one parameter changed; the exercises' solution cells run
    on the tiny pair (smoke_workbook) and are left out here (each is minutes of the real pair's time in CI)."""
    from specdec_lib.models.smol import ensure_smol_dir
    from specdec_lib.workbook import run_notebooks

    out = tmp_path_factory.mktemp("workbook_smol")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(ESTIMATE_ENV, raising=False)
        mp.setenv("JUPYTER_DATA_DIR", str(tmp_path_factory.mktemp("jupyter_data_smol")))
        ensure_smol_dir(progress=False)  # dequantised once here, not by two kernels at once
        runs = run_notebooks.run_all(out, smoke=True, timeout=600, log=lambda *a, **k: None,
                                     params={"MODELS": "smol"}, skip_exercises=True, jobs=NOTEBOOK_JOBS)
    return {"out": out, "runs": {run.name: run for run in runs}}


@pytest.fixture(scope="session")
def sliding_workbook(tmp_path_factory):
    """Every notebook executed once in SMOKE mode with MODELS = (target_dir, draft_dir), two local directories of a
    random Gemma 3 pair (sliding-window and full attention layers; helpers.sliding_pair_dirs), as a user would pass
    their own pair: {"out": folder, "models": the two directories, "runs": {notebook name: NotebookRun}}."""
    from helpers import sliding_pair_dirs

    from specdec_lib.workbook import run_notebooks

    models = sliding_pair_dirs(tmp_path_factory.mktemp("sliding_pair"))
    out = tmp_path_factory.mktemp("workbook_sliding")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(ESTIMATE_ENV, raising=False)
        mp.setenv("JUPYTER_DATA_DIR", str(tmp_path_factory.mktemp("jupyter_data_sliding")))
        runs = run_notebooks.run_all(out, smoke=True, timeout=600, log=lambda *a, **k: None,
                                     params={"MODELS": models}, jobs=NOTEBOOK_JOBS)
    return {"out": out, "models": models, "runs": {run.name: run for run in runs}}


@pytest.fixture(scope="session", autouse=True)
def _project_cache_in_a_temp_folder(tmp_path_factory):
    """Cost curves and frozen tables the tests measure or build go to a folder of this test session, not to the
    user's ~/.cache/specdec_lib (a curve timed on a loaded machine would otherwise steer their auto budgets)."""

    if "SPECDEC_CACHE" in os.environ:  # the caller chose one
        yield
        return
    from specdec_lib.models.smol import models_root

    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if in_worker() else base) / "specdec_cache"  # one folder for every worker of this run
    cache.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_MODELS", str(models_root()))  # models made here (smol's dequantised GGUF) are shared
        mp.setenv("SPECDEC_CACHE", str(cache))  # curves and frozen tables are written atomically: workers share
        yield
