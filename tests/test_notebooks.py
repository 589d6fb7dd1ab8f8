"""Every notebook runs top to bottom in SMOKE mode on a fresh kernel, through `run_notebooks` (as `make workbook`);
its executed copy carries offline fallbacks and a standalone page; the runner's poll workaround returns a reply
at once."""
from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from queue import Empty
from types import SimpleNamespace

import nbformat
import pytest
import torch

from specdec_lib.workbook import offline_views, run_notebooks

NOTEBOOKS = run_notebooks.find_notebooks()


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no notebooks under {run_notebooks.NOTEBOOKS_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_exercise_cells_left_out_on_the_real_pair_are_only_those_after_the_exercises(path):
    """run_notebooks(skip_exercises=True) (the real pair's CI run) drops the solution and answer-check cells: every
    one of them sits after the "## Exercises" heading, and every code cell after the heading but the checkers'
    definitions is one of them."""
    cells = nbformat.read(path, as_version=4).cells
    heading = next(i for i, c in enumerate(cells) if c.cell_type == "markdown" and "## Exercises" in c.source)
    skipped = [i for i, c in enumerate(cells) if run_notebooks.is_exercise_cell(c)]
    assert skipped and min(skipped) > heading, (path.name, skipped, heading)
    assert not run_notebooks.is_exercise_cell(nbformat.v4.new_markdown_cell("# Exercise 1"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_smoke_mode(path, smoke_workbook):
    run = smoke_workbook["runs"][path.name]
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
    # no red boxes: nothing a cell writes to stderr (a FutureWarning from a moved transformers keyword, a log line)
    assert not run.stderr, run.stderr
    # readable outside Jupyter: every plotly figure and every widget view also carries text/html
    outputs = [o for c in code for o in c.outputs if o.get("data")]
    for mime in (offline_views.PLOTLY_MIME, offline_views.WIDGET_VIEW_MIME):
        assert all("text/html" in o.data for o in outputs if mime in o.data), f"{mime} output without text/html"
    # no progress bar (a tqdm widget frozen at 100 %, a "Generating train split" line) in a saved notebook
    bars = [c.source[:60] for c in code for o in c.outputs if re.search(r"\d+(?:\.\d+)?\s?(?:it|examples)/s\]", str(o))]
    assert not bars, f"progress bars captured in the outputs of: {bars}"
    assert run.html is not None and run.html.exists()
    page = run.html.read_text()
    remote = re.findall(r'<script[^>]*\bsrc="((?:https?:)?//[^"]*)"', page)
    assert not remote, f"the standalone page loads scripts from the network: {remote}"
    assert (run.html.parent / offline_views.PLOTLY_JS).exists()


@pytest.mark.full
@pytest.mark.real_pair_workbook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_on_the_real_pair(path, smol_workbook):
    """MODELS = "smol": the same notebook on SmolLM2-135M-Instruct (49k-token vocabulary, chat template, GQA) and
    its exit draft, with no error and nothing on stderr (no warning box, e.g. a missing frozen table). In make
    test-full, and in make test whenever what it reads changed since the last full run (tests/real_pair_stamp.py);
    the methods it runs are checked on the real pair in make test by tests/test_smol.py."""
    run = smol_workbook["runs"][path.name]
    assert run.ok, f"{run.name} failed with MODELS='smol':\n{run.error}"
    nb = nbformat.read(run.output, as_version=4)
    injected = [c for c in nb.cells if run_notebooks.INJECTED_TAG in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "MODELS = 'smol'" in injected[0].source.replace('"', "'")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, [f"{e.ename}: {e.evalue}" for e in errors]
    assert not run.stderr, run.stderr


# where the sliding-window pair takes another path: the refusal a notebook prints before it goes on on the tiny pair
SLIDING_REFUSALS = {"08_flexattention_block_layout.ipynb": "the store holds full-attention layers only",
                    "07_fumble_decoding.ipynb": "'fafo' cannot decode with a gemma3_text target"}


def test_the_sliding_pair_is_two_model_directories_a_user_could_pass(tmp_path):
    """helpers.sliding_pair_dirs: seeded (the same weights twice), float32 on disk, the tiny pair's tokenizer in both
    folders, and load_models((target_dir, draft_dir)) reads a Gemma 3 pair whose sliding window the SMOKE prompts
    cross (what sliding_workbook runs every notebook on)."""
    from helpers import SLIDING_WINDOW, sliding_pair_dirs

    from specdec_lib import bench, load_models

    first, second = sliding_pair_dirs(tmp_path / "a"), sliding_pair_dirs(tmp_path / "b")
    for a, b in zip(first, second):
        assert (Path(a) / "model.safetensors").read_bytes() == (Path(b) / "model.safetensors").read_bytes()
    pair = load_models(first, device="cpu")
    layers = {type(pair.target).__name__, pair.target.config.model_type, next(pair.target.parameters()).dtype}
    assert layers == {"Gemma3ForCausalLM", "gemma3_text", torch.float32}, layers
    for model in (pair.target, pair.draft):
        assert set(model.config.layer_types) == {"sliding_attention", "full_attention"}
        assert model.config.sliding_window == SLIDING_WINDOW
    assert pair.tokenizer.get_vocab() == load_models("tiny", device="cpu").tokenizer.get_vocab()
    shortest = min(pair.encode_prompt(p).shape[1] for p in bench.load_suite("code", limit=2))
    assert shortest > 2 * SLIDING_WINDOW, shortest


@pytest.mark.full
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_on_a_sliding_window_pair(path, sliding_workbook):
    """MODELS = two local directories of a random Gemma 3 pair (sliding_workbook): the same notebook with no error
    cell. Where the pair takes another path (SLIDING_REFUSALS: the FlexAttention store and FAFO have no window) the
    notebook prints the library's refusal and goes on on the shipped tiny pair. Nothing on stderr. In make test-full only (minutes of kernels); the methods on sliding-window families are checked in make test by
    tests/test_family_matrix.py, and the notebooks on the tiny pair by test_notebook_runs_in_smoke_mode."""
    run = sliding_workbook["runs"][path.name]
    assert run.ok, f"{run.name} failed with MODELS={sliding_workbook['models']}:\n{run.error}"
    nb = nbformat.read(run.output, as_version=4)
    injected = [c for c in nb.cells if run_notebooks.INJECTED_TAG in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "gemma3-sliding-target" in injected[0].source
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), "some cells did not run"
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, [f"{e.ename}: {e.evalue}" for e in errors]
    assert not run.stderr, run.stderr
    if path.name in SLIDING_REFUSALS:
        printed = "".join(o.get("text", "") for c in code for o in c.outputs if o.output_type == "stream")
        assert SLIDING_REFUSALS[path.name] in printed and "shipped tiny pair instead" in printed


def test_index_links_every_notebook_and_its_figures(smoke_workbook):
    out = smoke_workbook["out"]
    index = (out / "index.html").read_text()
    for name in smoke_workbook["runs"]:
        stem = name.removesuffix(".ipynb")
        assert f'href="{stem}.html"' in index and f'href="{stem}.ipynb"' in index, stem
        for figure in (out / stem).glob("*.html"):
            assert f'href="{stem}/{figure.name}"' in index, figure
            assert 'src="plotly.min.js"' in figure.read_text(), f"{figure} does not load the folder's plotly.js"
        if any((out / stem).glob("*.html")):
            assert (out / stem / offline_views.PLOTLY_JS).exists(), stem


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


def test_jobs_run_notebooks_side_by_side_in_order(tmp_path):
    """run_all(jobs=2): two kernels at once (each notebook waits for the other's flag file: one after the other,
    the first would time out), results in the notebooks' order, each kernel told it runs headless and given its
    share of the cores."""
    from specdec_lib.workbook import notebook

    folder = tmp_path / "nbs"
    folder.mkdir()
    waits = {"a": "b", "b": "a", "c": None}
    for name, other in waits.items():
        wait = "" if other is None else (
            f"deadline = time.time() + 120\n"
            f"while not os.path.exists(r'{tmp_path / other}.flag') and time.time() < deadline:\n"
            f"    time.sleep(0.1)\n"
            f"assert os.path.exists(r'{tmp_path / other}.flag'), 'ran alone'\n")
        code = (f"import os, time\nopen(r'{tmp_path / name}.flag', 'w').close()\n{wait}"
                f"print(os.environ.get('OMP_NUM_THREADS'), os.environ.get('{notebook.EXECUTED}'))")
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("SMOKE = False",
                                                                       metadata={"tags": ["parameters"]}),
                                             nbformat.v4.new_code_cell(code)])
        nbformat.write(nb, folder / f"{name}.ipynb")
    runs = run_notebooks.run_all(tmp_path / "out", notebooks_dir=folder, timeout=150, jobs=2,
                                 log=lambda *a, **k: None)
    assert [r.name for r in runs] == ["a.ipynb", "b.ipynb", "c.ipynb"]
    assert all(r.ok for r in runs), [r.error for r in runs]
    threads = run_notebooks.kernel_threads(2)["OMP_NUM_THREADS"]
    for run in runs:
        printed = nbformat.read(run.output, as_version=4).cells[-1].outputs[0].text.split()
        assert printed == [threads, "1"], printed
    assert run_notebooks.kernel_threads(1) == {}
    assert (tmp_path / "out" / "index.html").exists()


class _MissedWakeUpChannel:
    """A shell channel with nbclient#312's symptom: a poll sees only replies queued before it started, so one long
    poll misses a reply that arrives during it and returns when its timeout expires."""

    def __init__(self, reply_after_s: float):
        self.ready_at = time.monotonic() + reply_after_s

    async def get_msg(self, timeout=None):
        queued = time.monotonic() >= self.ready_at
        if queued:
            return {"msg_type": "execute_reply"}
        await asyncio.sleep(timeout)
        raise Empty


def test_poll_in_slices_picks_up_a_reply_a_long_poll_misses():
    client = SimpleNamespace(kc=SimpleNamespace(shell_channel=_MissedWakeUpChannel(reply_after_s=0.3)))
    unpatched = client.kc.shell_channel.get_msg
    start = time.monotonic()
    with pytest.raises(Empty):  # the symptom: a 2 s poll misses the reply sent after 0.3 s
        asyncio.run(unpatched(timeout=2.0))
    assert time.monotonic() - start >= 2.0
    client.kc.shell_channel = _MissedWakeUpChannel(reply_after_s=0.3)
    run_notebooks._poll_shell_in_slices(client, slice_s=0.1)
    start = time.monotonic()
    reply = asyncio.run(client.kc.shell_channel.get_msg(timeout=30.0))
    # a missed wake-up waits the whole 30 s; 10 s is slack for a loaded, shared machine
    assert reply["msg_type"] == "execute_reply" and time.monotonic() - start < 10.0
    client.kc.shell_channel = _MissedWakeUpChannel(reply_after_s=60.0)
    run_notebooks._poll_shell_in_slices(client, slice_s=0.1)
    start = time.monotonic()
    with pytest.raises(Empty):  # and it still gives up at the cell timeout
        asyncio.run(client.kc.shell_channel.get_msg(timeout=0.5))
    assert 0.5 <= time.monotonic() - start < 10.0  # the reply comes at 60 s: it gave up at its own timeout


def test_static_fallbacks_draw_plots_and_snapshot_explorers():
    """A plotly output gets a plotly div; an explorer (a box of a slider, a dropdown and an Output holding a
    figure) gets a snapshot naming the controls' values and holding the figure's div."""
    figure = {"data": [{"type": "bar", "x": [1, 2], "y": [3, 4]}], "layout": {}}
    state = {
        "box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_s", "IPY_MODEL_d", "IPY_MODEL_o"]}},
        "s": {"model_name": "IntSliderModel", "state": {"description": "gamma", "value": 4}},
        "d": {"model_name": "DropdownModel", "state": {"description": "prompt", "_options_labels": ["a", "b"],
                                                       "index": 1}},
        "o": {"model_name": "OutputModel", "state": {"outputs": [
            {"output_type": "display_data", "data": {offline_views.PLOTLY_MIME: figure}, "metadata": {}}]}},
    }
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x")])
    nb.cells[0].outputs = [
        nbformat.v4.new_output("display_data", data={offline_views.PLOTLY_MIME: figure}),
        nbformat.v4.new_output("display_data", data={"text/plain": "VBox()", offline_views.WIDGET_VIEW_MIME: {
            "model_id": "box", "version_major": 2, "version_minor": 0}}),
    ]
    nb.metadata["widgets"] = {offline_views.WIDGET_STATE_MIME: {"state": state, "version_major": 2,
                                                               "version_minor": 0}}
    assert offline_views.figure_count(nb) == {"plotly": 1, "plotly_in_widgets": 1, "widgets": 1}
    assert offline_views.add_static_fallbacks(nb) == {"plotly": 2, "widgets": 1}
    plot, snapshot = (o.data["text/html"] for o in nb.cells[0].outputs)
    assert 'class="plotly-graph-div"' in plot and "Plotly.newPlot" in plot
    assert offline_views.SNAPSHOT_CLASS in snapshot and "<b>gamma</b> <code>4</code>" in snapshot
    assert "<b>prompt</b> <code>b</code>" in snapshot and "Plotly.newPlot" in snapshot
    assert offline_views.add_static_fallbacks(nb) == {"plotly": 0, "widgets": 0}, "fallbacks are added once"


def test_a_collapsed_solution_stays_collapsed_on_the_page(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("# the solution\nx = 987654321", metadata={"jupyter": {"source_hidden": True}}),
                nbformat.v4.new_code_cell("y = 1")]
    page = offline_views.export_html(nb, tmp_path / "page.html").read_text()
    assert page.count('<details class="specdec-collapsed">') == 1 and "the solution (click to open)</summary>" in page
    assert page.index("specdec-collapsed") < page.index(">987654321<")
    # its outputs collapsed too (outputs_hidden): the answer it prints stays behind a click
    answer = nbformat.v4.new_code_cell("# the answer\nprint(424242)",
                                       metadata={"jupyter": {"source_hidden": True, "outputs_hidden": True}},
                                       outputs=[nbformat.v4.new_output("stream", name="stdout", text="424242\n")])
    nb.cells = [answer, nbformat.v4.new_code_cell("y = 1")]
    page = offline_views.export_html(nb, tmp_path / "page2.html").read_text()
    assert page.count('<details class="specdec-collapsed-output">') == 1
    assert page.index("specdec-collapsed-output") < page.rindex("424242")  # the printed one comes last


@pytest.mark.parametrize("name", ["02_draft_trees_and_tree_masks.ipynb",  # make test: one notebook takes the tolerance
                                  pytest.param("08_flexattention_block_layout.ipynb", marks=pytest.mark.full)])
def test_an_exactness_notebook_runs_in_bfloat16(name, tmp_path, monkeypatch):
    """A GPU's dtype: in bfloat16 the same logits computed two ways differ by ~0.1, so these notebooks' checks
    (a tree row against the sequential forward, compaction, the store's verify row) used to fail at 1e-3; they now
    take `notebook.logit_tolerance`, still far below what a wrong mask costs (~3). Run on this CPU in bfloat16."""
    from specdec_lib.workbook import notebook

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    runs = run_notebooks.run_all(tmp_path, smoke=True, pattern=name, timeout=300, log=lambda *a, **k: None,
                                 params={"MODELS": "tiny", "DTYPE": "bfloat16"}, skip_exercises=True)
    assert len(runs) == 1 and runs[0].ok, runs[0].error
    import torch

    assert notebook.exact(torch.float32) and not notebook.exact(torch.bfloat16)
    assert notebook.logit_tolerance(torch.float64) == 1e-3 < notebook.logit_tolerance(torch.float16)
