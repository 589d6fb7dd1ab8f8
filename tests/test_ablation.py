"""The ablation harness and its figures/explorer (notebook 06), on the shipped tiny pair with tiny sizes."""
from __future__ import annotations

import pytest

from specdec_lib import viz
from specdec_lib.bench import ablation

from helpers import all_match_hf
from specdec_lib.tables import ensure_frozen_table, frozen_table_path

RUN = dict(max_new_tokens=12, repeats=1, limit=1, progress=False)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_label():
    assert ablation.label() == "cacheback"
    assert ablation.label("cacheback", tdl=16, crt=4) == "cacheback@tdl=16+crt=4"
    assert ablation.label("prompt_lookup", num_tokens=5) == "prompt_lookup@num_tokens=5"


def test_run_variants_rows_settings_and_object_settings(tiny_pair):
    table = ablation.run_variants(tiny_pair, "code", {"small": dict(tdl=8, crt=2), "table object":
                                                      dict(frozen=frozen_table_path(1, 3))}, **RUN)
    assert list(table.variant) == ["small", "table object", "hf"]
    # an object setting is never filed under the bare method name (every variant would inherit it)
    assert list(table.label) == ["cacheback@tdl=8+crt=2", "cacheback@table_object", "hf"]
    assert all_match_hf(table, key="variant") and (table.mat >= 1).all()
    assert table.loc[0, "tdl"] == 8 and table.loc[0, "crt"] == 2
    assert table.loc[2, "speedup"] == 1.0
    with pytest.raises(ValueError, match="same settings"):
        ablation.run_variants(tiny_pair, "code", {"a": dict(tdl=8), "b": dict(tdl=8)}, **RUN)


def test_table1_and_sweep(tiny_pair):
    t1 = ablation.table1(tiny_pair, "editing", **RUN)
    assert list(t1.variant) == ["dual", "no frozen", "only frozen", "hf"] and all_match_hf(t1, key="variant")
    assert t1.loc[1, "frozen"] is False or t1.loc[1, "frozen"] == False  # noqa: E712
    fig = viz.table1_figure(t1)
    assert list(fig.data[0].x) == ["dual", "no frozen", "only frozen"]
    assert list(fig.data[1].y) == list(t1.mat[:3])
    sw = ablation.sweep(tiny_pair, "code", "tdl", [8, 24], base=dict(crt=2), **RUN)
    assert list(sw.variant) == ["tdl=8", "tdl=24", "hf"] and list(sw.tdl[:2]) == [8, 24]
    fig = viz.sweep_figure(sw, "tdl")
    assert list(fig.data[0].x) == ["8", "24"] and list(fig.data[1].y) == list(sw.mat[:2])


def test_ll_fl_grid_with_tables_built_on_demand(tiny_pair, tmp_path, monkeypatch):
    from specdec_lib import tables as frozen_tables

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    texts = ["for i in range(10):\n    total += i\n" * 20, "def f(x):\n    return x + 1\n" * 10]
    built = {}

    def frozen_for(ll, fl):
        built[ll, fl] = ensure_frozen_table(tiny_pair.tokenizer, ll, fl, texts=texts, corpus_tag="tiny-test",
                                            progress=False)
        return built[ll, fl]

    progress = []
    grid = ablation.ll_fl_grid(tiny_pair, "code", (1, 2), (2, 3), frozen_for=frozen_for,
                               callback=lambda done, total: progress.append((done, total)), **RUN)
    assert sorted(zip(grid.ll, grid.fl)) == [(1, 2), (1, 3), (2, 2), (2, 3)] and all_match_hf(grid, key="variant")
    assert all(p.parent == tmp_path / "tables" for p in built.values())
    assert progress[-1][0] == progress[-1][1] and [d for d, _ in progress] == sorted(d for d, _ in progress)
    assert not frozen_tables._FROZEN  # dropped after each LL
    fig = viz.heatmap_figure(grid, "speedup")
    cell = grid[(grid.ll == 2) & (grid.fl == 3)].speedup.iloc[0]
    assert list(fig.data[0].x) == ["2", "3"] and list(fig.data[0].y) == ["1", "2"]
    assert fig.data[0].z[1][1] == pytest.approx(cell)


def test_steps_and_draft_time_figures(tiny_pair):
    from specdec_lib import generate

    result = generate("cacheback", tiny_pair.target, tiny_pair.encode("import os\nimport sys\n"), 16, tdl=16, crt=4)
    fig = viz.steps_figure(result)
    assert list(fig.data[0].y) == [s["tree_size"] for s in result.stats["steps"]]
    assert list(fig.data[1].y) == result.accept_lengths
    fig = viz.draft_time_figure({"run": result, "values": [1.0, 2.0]})
    assert list(fig.data[0].y) == [s["draft_us"] for s in result.stats["steps"]] and list(fig.data[1].y) == [1.0, 2.0]


def test_explorer_runs_sweeps_and_reports_errors(tiny_pair):
    box = viz.ablation_explorer(tiny_pair, prompts=1, max_new_tokens=8)
    c = box.controls
    assert c["num_tokens"].disabled and not c["tdl"].disabled
    c["tdl"].value, c["crt"].value = 16, 4
    box.run()
    table = box.state["table"]
    assert box.state["error"] is None and list(table.variant) == ["cacheback", "hf"] and all_match_hf(table, key="variant")
    c["sweep"].value, c["values"].value = "tdl", "8, 24"
    box.run()
    assert list(box.state["table"].variant) == ["tdl=8", "tdl=24", "hf"]
    assert list(box.state["figure"].data[0].x) == ["8", "24"]
    c["sweep"].value = "tables"
    box.run()
    assert list(box.state["table"].variant) == ["dual", "no frozen", "only frozen", "hf"]
    c["sweep"].value, c["values"].value = "crt", "20"  # crt > tdl - 2: a clear error, shown, no table
    box.run()
    assert box.state["table"] is None and "crt" in box.state["error"]
    c["method"].value = "prompt_lookup"
    assert not c["num_tokens"].disabled and c["tdl"].disabled and c["sweep"].value == "(none)"
    box.run()
    assert list(box.state["table"].variant) == ["prompt_lookup", "hf"]
