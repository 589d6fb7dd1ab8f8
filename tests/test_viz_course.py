"""The course's classic views, each built from real data and its data checked: one draft-and-verify step token by
token (bench.acceptance.chain_step, viz.chain_step_figure), Lookahead's window (methods.lookahead.window_steps,
viz.lookahead_window_figure), the speedup model against a real benchmark (costs.speedup_against_model), where a
tree starts to pay (costs.tree_break_even: the break-even R known by construction of its inputs) and the speedup
toy whose slider works without a kernel (viz.speedup_slider_figure)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from specdec_lib import bench, generate
from specdec_lib.bench import acceptance, costs
from specdec_lib.methods.lookahead import window_steps
from specdec_lib.viz import acceptance as viz_acceptance, costs as viz_costs, fumble
from specdec_lib.viz.common import token_text

from helpers import SHIPPED_PROMPTS

pytestmark = pytest.mark.usefixtures("one_thread")


def _roles(trace) -> dict:
    """{(x, row): (role, text)} of a cell_grid heatmap's filled cells."""
    out = {}
    for i, row in enumerate(trace.y):
        for j, x in enumerate(trace.x):
            if trace.customdata[i][j]:
                out[x, row] = (trace.customdata[i][j], trace.text[i][j])
    return out


@pytest.fixture(scope="module")
def prompt(tiny_pair):
    return tiny_pair.tokenizer(SHIPPED_PROMPTS[0], return_tensors="pt").input_ids  # (1, P)


# 1. one draft-and-verify step, token by token
def test_chain_step_and_its_figure_follow_every_real_step(tiny_pair64, prompt):
    target, draft, tokenizer = tiny_pair64
    result = generate("draft_model", target, prompt, 24, draft=draft, gamma=3, debug=True)
    steps = result.stats["steps"]
    kinds = set()
    for i, record in enumerate(steps):
        step = acceptance.chain_step(result, i, prompt, target=target)
        k, g = record["accepted"], record["tree_size"]
        assert step.accepted == k and step.drafted == record["drafted"] and len(step.target) == g + 1
        assert step.target[:k] == step.drafted[:k] and step.target[k] == step.next_token  # the walk's reading
        if k < g:
            assert step.target[k] != step.drafted[k]  # the first disagreement
        done = sum(s["emitted"] for s in steps[:i])
        assert step.emitted == result.new_tokens[done:done + record["emitted"]]
        assert step.context[-1] == record["root"] and step.full == record["full"]
        fig = viz_acceptance.chain_step_figure(step, tokenizer.decode, context=4)
        cells = _roles(fig.data[0])
        drafted_roles = [cells[p, "drafted"][0] for p in range(1, g + 1)]
        assert drafted_roles.count("accepted") == k  # the accepted cells are the result's accepted count
        assert drafted_roles.count("rejected") == (k < g) and drafted_roles[k + 1:] == ["after the rejection"] * \
            max(0, g - k - 1)
        own = cells[k + 1, "target"][0]
        assert own == ("bonus" if k == g else "correction")
        kinds.add(own)
        assert [cells[p, "drafted"][1] for p in range(1, g + 1)] == [token_text([t], tokenizer.decode)
                                                                     for t in step.drafted]
        assert [cells[p, "drafted"][0] for p in range(-3, 1)] == ["context"] * 4
    assert kinds == {"bonus", "correction"}, "the run should hold both a full and a partial acceptance"
    plain = acceptance.chain_step(result, None, prompt)  # no target: after the rejection nothing is known
    assert 0 < plain.accepted < len(plain.drafted) and plain.target[plain.accepted + 1:] == \
        [None] * (len(plain.drafted) - plain.accepted)
    no_debug = generate("draft_model", target, prompt, 8, draft=draft, gamma=3)
    with pytest.raises(ValueError, match="debug=True"):
        acceptance.chain_step(no_debug, 0, prompt)
    with pytest.raises(ValueError, match="not what step"):  # another target's argmax is not what the step read
        acceptance.chain_step(result, plain.step, prompt, target=draft)


# 2. Lookahead's window
def test_lookahead_windows_are_the_method_s_and_the_figure_shows_them(tiny_pair64, prompt):
    target, _, tokenizer = tiny_pair64
    result = generate("lookahead", target, prompt, 40, window=4, ngram=4, guesses=4, debug=True)
    assert result.new_tokens == generate("autoregressive", target, prompt, 40).new_tokens  # debug changes nothing
    windows = window_steps(result)
    assert windows and all(len(w.levels) <= 3 and len(w.predictions) == len(w.levels[0]) for w in windows)
    for w, after in zip(windows, windows[1:]):
        if w.ngrams:  # column j, top to bottom, then its prediction
            assert w.ngrams == [tuple(level[j] for level in w.levels) + (w.predictions[j],)
                                for j in range(len(w.predictions))]
            if after.step == w.step + 1:
                assert after.levels == w.levels[1:] + [w.predictions]  # the shift: level 0 dropped
        assert w.emitted[:len(w.accepted)] == w.accepted and w.emitted[-1] == w.next_token
    shown = next(w for w in windows if w.ngrams and w.accepted)
    assert any(g[:len(shown.accepted)] == shown.accepted for g in shown.guesses)
    fig = fumble.lookahead_window_figure(shown, tokenizer.decode)
    window, verified = _roles(fig.data[0]), _roles(fig.data[1])
    for j, gram in enumerate(shown.ngrams):  # each n-gram's cells: one role, on its diagonal, spelling it
        rows = [f"level {i}" for i in range(len(shown.levels))] + ["prediction"]
        assert [window[1 + i + j, row] for i, row in enumerate(rows)] == [
            (f"n-gram {j}", token_text([t], tokenizer.decode)) for t in gram]
    assert window[0, "root"][1] == token_text([shown.root], tokenizer.decode)
    accepted = [cell for (x, row), cell in verified.items() if row.startswith("guess") and cell[0] == "accepted"]
    assert len(accepted) == len(shown.accepted)
    emitted = sorted((x, cell) for (x, row), cell in verified.items() if row == "emitted")
    assert [text for _, (_, text) in emitted] == [token_text([t], tokenizer.decode) for t in shown.emitted]
    assert emitted[-1][1][0] == ("bonus" if shown.full else "correction")


# 3. the speedup model against a real benchmark
def test_speedup_against_model_on_a_real_bench(tiny_pair):
    prompts = SHIPPED_PROMPTS
    methods = ["autoregressive", "draft_model@gamma=2", "draft_model@gamma=4"]
    summary = bench.summarize(bench.run_bench(tiny_pair, prompts, methods, max_new_tokens=24, repeats=1, warmup=0,
                                              progress=False))
    table = pd.concat([costs.forward_cost(model, [1, 3, 5], prefix=16, repeats=3, warmup=1, name=name)
                       for name, model in (("target", tiny_pair.target), ("draft", tiny_pair.draft))])
    one_row = table[table.rows == 1].set_index("model").median_ms
    c = float(one_row["draft"] / one_row["target"])
    inputs = []
    for gamma in (2, 4):
        runs = [generate("draft_model", tiny_pair.target, tiny_pair.tokenizer(p, return_tensors="pt").input_ids, 24,
                         draft=tiny_pair.draft, gamma=gamma) for p in prompts]
        inputs.append(dict(method=f"draft_model@gamma={gamma}", gamma=gamma, cost_ratio=c,
                           alpha=acceptance.pooled_acceptance(acceptance.acceptance_by_depth(runs)),
                           verify_overhead=costs.verify_overhead(table, "target", gamma)))
    model = costs.speedup_against_model(summary, inputs)
    speed = summary.set_index("method").tokens_per_s
    for row in model.itertuples():
        assert row.baseline == "autoregressive"
        assert row.predicted_speedup == pytest.approx(costs.expected_speedup(row.alpha, row.gamma, c,
                                                                             row.verify_overhead))
        assert row.measured_speedup == pytest.approx(speed[row.method] / speed["autoregressive"])
        assert row.mat == pytest.approx(summary.set_index("method").mat[row.method])
        assert row.ratio == pytest.approx(row.measured_speedup / row.predicted_speedup)
    assert costs.speedup_against_model(summary, inputs, baseline="hf").measured_speedup.tolist() == pytest.approx(
        [speed[m] / speed["hf"] for m in model.method])
    fig = viz_costs.speedup_model_figure(model)
    line, points = fig.data
    assert list(line.x) == list(line.y)  # y = x
    assert list(points.x) == pytest.approx(model.predicted_speedup.tolist())
    assert list(points.y) == pytest.approx(model.measured_speedup.tolist()) and list(points.text) == \
        model.method.tolist()
    with pytest.raises(ValueError, match="no summary row"):
        costs.speedup_against_model(summary, [dict(inputs[0], method="cacheback")])


# 4. where a tree starts to pay
def flat(ms_by_rows: dict) -> pd.DataFrame:
    """A hand-made forward_cost table: ms at every row count given (1..n: nothing left to interpolate)."""
    return pd.DataFrame(dict(model="target", rows=list(ms_by_rows), median_ms=list(ms_by_rows.values())))


def test_tree_break_even_where_the_answer_is_known_by_construction():
    # one depth at 1/2: the chain's best is R = 2 (1.5 tokens in 1 ms); a tree of width 2 puts two candidates at
    # depth 1, right with probability 1 - 1/4 (either of two independent halves), 1.75 tokens at R = 3: it pays
    # there exactly when t(3) < 1.75 / 1.5 = 7/6 ms
    assert costs.tree_break_even(flat({1: 1.0, 2: 1.0, 3: 1.0}), [0.5], width=2).break_even == 3
    assert costs.tree_break_even(flat({1: 1.0, 2: 1.0, 3: 1.1}), [0.5], width=2).break_even == 3
    assert costs.tree_break_even(flat({1: 1.0, 2: 1.0, 3: 1.2}), [0.5], width=2).break_even is None
    paid = costs.tree_break_even(flat({1: 1.0, 2: 1.0, 3: 1.0}), [0.5], width=2)
    assert paid.best_chain_rows == 2 and paid.best_chain_tokens_per_ms == pytest.approx(1.5)
    assert paid.table.tree_tokens.tolist() == pytest.approx([1.0, 1.5, 1.75])
    assert paid.table.chain_tokens.tolist()[:2] == pytest.approx([1.0, 1.5]) and np.isnan(paid.table.chain_tokens[2])
    # a CPU: every row costs a one-row forward (t(R) = R): a plain step (1 token a ms) beats any draft, and a tree
    # of depth 1 yields at most 2 tokens for R >= 3 ms
    cpu = costs.tree_break_even(lambda r: float(r), [0.5], width=4)
    assert cpu.break_even is None and cpu.best_chain_rows == 1
    # a draft that is always right: a chain of R - 1 yields R tokens, a tree of width 2 only 1 + its depth
    sure = costs.tree_break_even(flat({1: 1.0}), [1.0, 1.0], width=2)
    assert sure.break_even is None and sure.table.tree_tokens.tolist() == pytest.approx([1, 2, 2, 3, 3])
    # two depths at 1/2, width 2, R = 5: depth 1 holds 2 candidates (3/4), depth 2 two more under the spine, reached
    # with 1/2 and right with 3/4: 1 + 3/4 + 3/8 tokens
    assert costs.tree_break_even(flat({1: 1.0}), [0.5, 0.5], width=2).table.tree_tokens[4] == pytest.approx(2.125)
    with pytest.raises(ValueError, match="width"):
        costs.tree_break_even(flat({1: 1.0}), [0.5], width=1)
    with pytest.raises(ValueError, match="rate"):
        costs.tree_break_even(flat({1: 1.0}), [float("nan")], width=2)


def test_break_even_figure_from_a_measured_curve_and_real_rates(tiny_pair64, prompt):
    target, draft, _ = tiny_pair64
    result = generate("draft_model", target, prompt, 24, draft=draft, gamma=3)
    rates = acceptance.acceptance_by_depth(result)["rate"]
    curve = costs.forward_cost(target, [1, 2, 4, 8], prefix=16, repeats=3, warmup=1, name="target")
    found = costs.tree_break_even(curve, rates, width=3)
    table = found.table
    deepest = int(rates.notna().cummin().sum())  # the rates up to the first depth never reached
    assert table.rows.tolist() == list(range(1, 2 + 3 * deepest))  # a tree of width 3 as deep as the rates go
    wins = table.rows[table.tree_tokens_per_ms > found.best_chain_tokens_per_ms * (1 + 1e-12)]
    assert found.break_even == (int(wins.iloc[0]) if len(wins) else None)
    fig = viz_costs.break_even_figure(found)
    by_name = {}
    for trace in fig.data:
        by_name.setdefault(trace.legendgroup, []).append(trace)
    for shape in ("chain", "tree"):
        part = table.dropna(subset=[f"{shape}_tokens"])
        tokens, per_ms = by_name[shape]
        assert list(tokens.x) == part.rows.tolist() and list(tokens.y) == pytest.approx(part[f"{shape}_tokens"])
        assert list(per_ms.y) == pytest.approx(part[f"{shape}_tokens_per_ms"].tolist())
    marked = [s for s in fig.layout.shapes if s.x0 == s.x1]
    assert len(marked) == (found.break_even is not None)
    if marked:
        assert marked[0].x0 == found.break_even


# 5. the speedup toy, no kernel needed
def test_speedup_slider_has_a_precomputed_state_per_alpha(tmp_path):
    alphas, cs, gammas = [0.3, 0.6, 0.9], (0.0, 0.1, 0.5), range(1, 9)
    fig = viz_costs.speedup_slider_figure(alphas, cs, gammas, verify_overhead=1.2, active=1)
    (slider,) = fig.layout.sliders
    assert len(slider.steps) == len(alphas) and slider.active == 1
    assert len(fig.data) == len(alphas) * len(cs)
    for alpha, step in zip(alphas, slider.steps):
        visible = [trace for trace, shown in zip(fig.data, step.args[0]["visible"]) if shown]
        assert [t.meta["cost_ratio"] for t in visible] == list(cs) and {t.meta["alpha"] for t in visible} == {alpha}
        for trace, c in zip(visible, cs):
            assert list(trace.x) == list(gammas)
            assert list(trace.y) == pytest.approx(costs.expected_speedup(alpha, np.array(gammas), c, 1.2).tolist())
    assert [t.visible for t in fig.data] == slider.steps[1].args[0]["visible"]  # the first state shown
    page = tmp_path / "toy.html"
    fig.write_html(page, include_plotlyjs=False)
    text = page.read_text()
    # the page holds every trace and every step's switch: nothing is left to compute when the slider moves
    assert text.count('"hovertemplate":"alpha ') == len(fig.data) and '"sliders"' in text
    for step in slider.steps:
        assert '"visible":' + json.dumps(list(step.args[0]["visible"]), separators=(",", ":")) in text
