"""bench.compare and viz.compare (notebook 12): spread over repeats, per-category speedups, the efficiency bound,
Spec-Bench's question.jsonl layout, the README's table generated from the saved results, and the figures'
data."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specdec_lib import generate, viz
from specdec_lib.bench import compare, harness

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def runs(tiny_pair):
    """A real (small) benchmark on the shipped pair: two categories, two repeats. The draft sizes are fixed: an
    "auto" budget times this machine, and on a loaded one may decode plainly all through 12 tokens (no rows to
    price), where these tests read the rows a draft spends."""
    prompts = [{"id": "a", "prompt": "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n", "category": "code"},
               {"id": "b", "prompt": "import os\nimport sys\n", "category": "imports"}]
    return harness.run_bench(tiny_pair, prompts, ["hf", "prompt_lookup", "draft_model"], max_new_tokens=12,
                             repeats=2, warmup=0, progress=False,
                             config={"draft_model": {"gamma": 4}, "prompt_lookup": {"num_tokens": 10}})


def test_spread_and_categories_are_speedups_over_hf_of_the_same_group(runs):
    spread = compare.spread(runs).set_index("method")
    assert (spread.loc["hf"] == 1.0).all()
    assert (spread.speedup_min <= spread.speedup_median).all() and (spread.speedup_median <= spread.speedup_max).all()
    # by hand: repeat 0 of draft_model against repeat 0 of hf
    r0 = runs[runs.repeat == 0].groupby("method")[["new_tokens", "wall_seconds"]].sum()
    by_hand = (r0.new_tokens / r0.wall_seconds)["draft_model"] / (r0.new_tokens / r0.wall_seconds)["hf"]
    per_repeat = [by_hand, None]
    assert spread.loc["draft_model", "speedup_min"] <= per_repeat[0] <= spread.loc["draft_model", "speedup_max"]
    table = compare.by_category(runs)
    assert list(table.columns) == ["code", "imports"] and list(table.index) == ["hf", "prompt_lookup", "draft_model"]
    assert np.allclose(table.loc["hf"], 1.0)
    code = runs[runs.category == "code"].groupby("method")[["new_tokens", "wall_seconds"]].sum()
    speed = code.new_tokens / code.wall_seconds
    assert np.isclose(table.loc["prompt_lookup", "code"], speed["prompt_lookup"] / speed["hf"])


def test_efficiency_is_speedup_over_the_bound_from_the_cost_curve(runs):
    costs = pd.DataFrame(dict(rows=[1, 4, 16], median_ms=[10.0, 12.0, 30.0]))  # a curve, as forward_cost gives
    table = compare.efficiency(runs, costs).set_index("method")
    assert set(table.index) == {"prompt_lookup", "draft_model"}  # hf is the reference, not a row
    dm = runs[runs.method == "draft_model"]
    mat = dm.new_tokens.sum() / dm.target_forwards.sum()
    rows = np.average(dm.rows_per_step, weights=dm.target_forwards)
    assert rows > 1 and np.isclose(table.loc["draft_model", "rows_per_step"], rows)
    assert np.isclose(table.loc["draft_model", "bound"], mat * 10.0 / np.interp(rows, [1, 4, 16], [10, 12, 30]))
    assert np.allclose(table.efficiency, table.speedup / table.bound)
    fig = viz.efficiency_figure(table.reset_index())
    assert list(fig.data[0].y) == list(table.bound) and fig.data[1].text[0].endswith("%")


def test_efficiency_against_the_loops_plain_decoding_shares_the_bounds_baseline(runs):
    """baseline="autoregressive": the speedup is over the loop's plain decoding (no row of its own), and with
    decode=True speeds and MAT are read after the prompt's forward, as summarize's decode_tokens_per_s."""
    costs = pd.DataFrame(dict(rows=[1, 4, 16], median_ms=[10.0, 12.0, 30.0]))
    plain = runs[runs.method == "draft_model"].assign(method="autoregressive", rows_per_step=1.0)
    with_plain = pd.concat([runs, plain], ignore_index=True)
    with pytest.raises(ValueError, match="autoregressive"):
        compare.efficiency(runs, costs, baseline="autoregressive")
    table = compare.efficiency(with_plain, costs, baseline="autoregressive", decode=True).set_index("method")
    assert set(table.index) == {"prompt_lookup", "draft_model"}  # neither hf nor the baseline is a row
    assert np.isclose(table.loc["draft_model", "speedup"], 1.0)  # the same runs as its baseline's
    pl = with_plain[with_plain.method == "prompt_lookup"]
    decode_speed = lambda g: (g.new_tokens - g.prefill_tokens).sum() / (g.wall_seconds - g.prefill_seconds).sum()
    assert np.isclose(table.loc["prompt_lookup", "speedup"], decode_speed(pl) / decode_speed(plain))
    mat = (pl.new_tokens - pl.prefill_tokens).sum() / (pl.target_forwards - 1).sum()
    rows = np.average(pl.rows_per_step, weights=pl.target_forwards)
    assert np.isclose(table.loc["prompt_lookup", "bound"], mat * 10.0 / np.interp(rows, [1, 4, 16], [10, 12, 30]))
    fig = viz.efficiency_figure(table.reset_index(), baseline="autoregressive")
    assert fig.layout.yaxis.title.text == "x autoregressive"


def test_spec_bench_question_jsonl_loads_first_turns_and_categories(tmp_path):
    path = tmp_path / "question.jsonl"
    rows = [{"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Now in French."]},
            {"question_id": 82, "category": "math", "turns": ["What is 2 + 2?"]}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    suite = harness.load_suite(str(path))
    assert suite == [{"id": "81", "prompt": "Write a haiku.", "category": "writing"},
                     {"id": "82", "prompt": "What is 2 + 2?", "category": "math"}]
    assert {p["category"] for p in harness.load_suite("code", limit=3)} == {"code"}


def test_readme_benchmark_table_is_generated_from_the_saved_results():
    """The tiny pair's table on the results page is `python -m specdec_lib.bench.compare --readme docs/results.md
    code editing`'s output for the JSON under data/results/: edit the data (rerun the bench), not the table."""
    results = compare.load_results(ROOT / "data" / "results" / f"bench_{s}_cpu.json" for s in ("code", "editing"))
    table = compare.markdown_table(results)
    readme = (ROOT / compare.RESULTS_PAGE).read_text()
    block = readme.split(compare.START, 1)[1].split(compare.END, 1)[0].strip()
    assert block == table
    for suite, data in results.items():  # the table's numbers are the summary's
        hf = next(r for r in data["summary"] if r["method"] == "hf")
        assert f"{hf['tokens_per_s']:.0f}" in table.splitlines()[4]


def test_readme_real_pair_table_is_generated_from_the_saved_results():
    """The real pair's block: `python -m specdec_lib.bench.compare --readme docs/results.md humaneval editing --tag
    cpu_smol --block smol` (written by `make bench-smol`)."""
    results = compare.load_results(ROOT / "data" / "results" / f"bench_{s}_cpu_smol.json"
                                   for s in ("humaneval", "editing"))
    table = compare.markdown_table(results, "cpu_smol", "smol")
    start, end = compare.markers("smol")
    readme = (ROOT / compare.RESULTS_PAGE).read_text()
    assert readme.split(start, 1)[1].split(end, 1)[0].strip() == table
    assert "--tag cpu_smol --block smol" in table.splitlines()[0]
    assert all(data["meta"]["models"] == "smol" for data in results.values())


def test_readme_never_slower_table_is_generated_from_the_saved_results():
    """The "never slower" block: `python -m specdec_lib.bench.compare --never --readme docs/results.md` (written by
    `make bench-never`), every saved setting present, every method lossless in each."""
    table, metas = compare.load_never(ROOT / "data" / "results")
    assert set(metas) == set(compare.NEVER_FILES)
    start, end = compare.markers("never")
    readme = (ROOT / compare.RESULTS_PAGE).read_text()
    assert readme.split(start, 1)[1].split(end, 1)[0].strip() == compare.never_markdown(table, metas)
    assert (table.all_match_hf != False).all()  # noqa: E712


def test_readme_headline_table_is_generated_from_the_saved_results():
    """The README's one table: `python -m specdec_lib.bench.compare --headline --readme README.md`, each column one
    saved run (compare.HEADLINE) named with its date or lease; a GPU run's tokens that left hf's path are marked."""
    start, end = compare.markers("headline")
    readme = (ROOT / "README.md").read_text()
    table = compare.headline_table(ROOT / "data" / "results")
    assert readme.split(start, 1)[1].split(end, 1)[0].strip() == table
    header, rule, *rows = table.split("\n\n")[0].splitlines()
    assert [c.strip() for c in header.strip("|").split("|")][1:] == [name for name, _ in compare.HEADLINE]
    assert [r.split("|")[1].strip() for r in rows] == list(compare.HEADLINE_METHODS)
    smol = json.loads((ROOT / "data" / "results" / compare.HEADLINE[1][1]).read_text())
    fafo = next(r for r in smol["summary"] if r["method"] == "fafo")
    assert f"{fafo['speedup']:.2f} ({fafo['mat']:.2f})" == rows[compare.HEADLINE_METHODS.index("fafo")].split("|")[3].strip()


def test_write_readme_table_replaces_only_the_block(tmp_path):
    results = compare.load_results(ROOT / "data" / "results" / f"bench_{s}_cpu.json" for s in ("code",))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{compare.START}\nold table\n{compare.END}\noutro\n")
    text = compare.write_readme_table(readme, results)
    assert text.startswith("intro\n") and text.endswith("\noutro\n") and "old table" not in text
    assert compare.markdown_table(results) in text
    readme.write_text("no markers")
    with pytest.raises(ValueError, match="bench-table"):
        compare.write_readme_table(readme, results)


def test_radar_and_cost_per_token_figures_carry_the_data(tiny_pair, runs):
    table = compare.by_category(runs)
    bars = viz.radar_figure(table)  # two categories: no polygon, one bar group per method
    assert [t.name for t in bars.data] == ["code", "imports"] and list(bars.data[1].y) == list(table["imports"])
    table = table.assign(third=table["code"] * 2)
    fig = viz.radar_figure(table)
    assert [t.name for t in fig.data] == list(table.index)
    assert list(fig.data[1].r) == list(table.iloc[1]) + [table.iloc[1, 0]]  # closed polygon
    ids = tiny_pair.encode("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n")
    results = {"prompt_lookup": generate("prompt_lookup", tiny_pair.target, ids, 16),
               "hf": generate("hf", tiny_pair.target, ids, 16)}  # hf records no steps: left out
    fig = viz.cost_per_token_figure(results)
    steps = results["prompt_lookup"].stats["steps"]
    verify = sum(s["verify_ms"] for s in steps) / sum(s["emitted"] for s in steps)
    assert [t.name for t in fig.data] == ["draft", "verify", "update"] and list(fig.data[1].y) == ["prompt_lookup"]
    assert np.isclose(fig.data[1].x[0], verify)
    assert np.isclose(viz.compare.per_token_costs(results["prompt_lookup"])["verify"], verify)
    box = viz.why_explorer(results)
    assert box.state["label"] == "prompt_lookup" and len(box.state["figures"][0].data[0].y) == len(steps)
    with pytest.raises(ValueError, match="step records"):
        viz.why_explorer({"hf": results["hf"]})


def test_never_slower_is_each_method_over_autoregressive_of_its_own_setting(tmp_path):
    def summary(loop, others):
        rows = [dict(method="hf", tokens_per_s=50.0, decode_tokens_per_s=55.0, mat=1.0),
                dict(method="autoregressive", tokens_per_s=loop, decode_tokens_per_s=loop + 10, mat=1.0)]
        return pd.DataFrame(rows + [dict(method=m, tokens_per_s=t, decode_tokens_per_s=t + 10, mat=2.0,
                                         plain_share=0.25) for m, t in others.items()])

    table = compare.never_slower({"tiny": summary(100.0, {"lookahead": 95.0, "fafo": 150.0}),
                                  "smol": summary(20.0, {"lookahead": 30.0})})
    assert list(table.setting) == ["tiny", "tiny", "tiny", "smol", "smol"] and "hf" not in set(table.method)
    ratio = table.set_index(["setting", "method"]).vs_autoregressive
    assert ratio["tiny", "autoregressive"] == 1.0 and ratio["tiny", "lookahead"] == 0.95
    assert ratio["smol", "lookahead"] == 1.5  # over its own setting's autoregressive, not another's
    decode = table.set_index(["setting", "method"]).decode_vs_autoregressive
    assert decode["tiny", "fafo"] == pytest.approx(160 / 110)
    with pytest.raises(ValueError, match="autoregressive"):
        compare.never_slower({"x": summary(1.0, {}).query("method != 'autoregressive'")})
    fig = viz.never_slower_figure(table)
    assert [trace.name for trace in fig.data] == ["tiny", "smol"]
    assert list(fig.data[0].x) == ["lookahead", "fafo"] and list(fig.data[1].y) == [1.5, None]  # fafo not run there
    # a saved run reads back as it was written: the harness's JSON and bench.long_context's CSV
    (tmp_path / "bench_code_cpu_x.json").write_text(json.dumps(dict(
        meta=dict(suite="code", machine=dict(device="cpu")), summary=summary(10.0, {}).to_dict("records"))))
    summary(10.0, {}).assign(device="CPU test", timestamp="20261126-215455").to_csv(tmp_path / "long_context_x.csv",
                                                                                  index=False)
    loaded, meta = compare.load_summary(tmp_path / "bench_code_cpu_x.json")
    assert meta["suite"] == "code" and list(loaded.method) == ["hf", "autoregressive"]
    loaded, meta = compare.load_summary(tmp_path / "long_context_x.csv")
    assert meta["device"] == "CPU test" and loaded.tokens_per_s.tolist() == [50.0, 10.0]
    assert compare.when(meta) == "2026-11-26 21:54" and compare.when({}) == "not recorded"
    assert compare.never_markdown(table, {"tiny": meta}).endswith("Measured: tiny 2026-11-26 21:54; smol not recorded.")
