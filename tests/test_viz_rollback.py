"""viz_rollback: the cache bookkeeping matches the draft_model method's real caches, and every figure carries
exactly the data it was given."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

from specdec_lib import draft_model as dm
from specdec_lib import generate, kv_cache, viz_rollback
from specdec_lib.decoding import GenerationResult
from specdec_lib.viz_rollback import CacheStep, cache_steps

from conftest import random_lm

# prompt of 10; gamma 3: partial (1 of 3) on step 0, full on step 1, partial (0 of 3) after it, EOS cut inside
# an accepted run (2 accepted, the first of them EOS), then a step that drafted nothing (1 token left)
STATS = [dict(drafted=3, accepted=1, emitted=2), dict(drafted=3, accepted=3, emitted=4),
         dict(drafted=3, accepted=0, emitted=1), dict(drafted=3, accepted=2, emitted=1),
         dict(drafted=0, accepted=0, emitted=1)]


def test_cache_steps_bookkeeping_by_hand():
    steps = cache_steps(STATS, prompt_length=10)
    rows = [(s.committed_before, s.target_before, s.target_fed, s.target_after, s.draft_before, s.draft_fed,
             s.draft_after) for s in steps]
    assert rows == [
        (10, 0, 13, 11, 0, 12, 11),  # step 1: the prompt + 3 drafts fed at once; keep 10 + 2 - 1 = 11
        (12, 11, 15, 15, 11, 14, 14),  # full: the target keeps all it fed, the draft is 2 behind (16 committed)
        (16, 15, 19, 16, 14, 18, 16),  # the draft's input was 2 tokens; nothing accepted: back to 17 - 1
        (17, 16, 20, 17, 16, 19, 17),  # EOS cut: 1 emitted although 2 were accepted
        (18, 17, 18, 18, 17, 17, 17),  # no drafts: only the target's forward of 1 token
    ]
    assert [s.target_input for s in steps] == [13, 4, 4, 4, 1]
    assert [s.draft_input for s in steps] == [10, 1, 2, 1, 0]
    assert [s.scenarios for s in steps] == [["1 first step", "2 partial"], ["3 full"], ["2 partial"],
                                            ["2 partial", "4 EOS cut"], []]
    assert [s.full_acceptance for s in steps] == [False, True, False, False, False]
    result = GenerationResult([0] * 9, [2, 4, 1, 1, 1], 5, stats=dict(steps=STATS))
    assert cache_steps(result, 10) == steps
    with pytest.raises(ValueError, match="not a valid step"):
        cache_steps([dict(drafted=2, accepted=3, emitted=4)], 5)


def test_cache_steps_match_the_real_caches(monkeypatch):
    """Run "draft_model" (greedy and sampling, with an EOS) and record each TrackedCache's length right before
    and after every commit: they must equal the derived target_fed/after and draft_fed/after."""
    torch.manual_seed(0)
    target = random_lm("llama", vocab=23, layers=2, seed=3, logit_scale=8.0)
    draft = random_lm("llama", vocab=23, layers=1, seed=4, logit_scale=8.0)
    seen = []
    original = dm.TrackedCache.commit

    def commit(self, committed):
        fed = kv_cache.cache_length(self.cache)
        original(self, committed)
        seen.append((self.model is target, fed, kv_cache.cache_length(self.cache)))

    monkeypatch.setattr(dm.TrackedCache, "commit", commit)
    ids = torch.randint(0, 23, (1, 7), generator=torch.Generator().manual_seed(1))
    free = generate("draft_model", target, ids, 30, draft=draft, gamma=3).new_tokens
    eos = free[12]
    kinds_seen = set()
    for kwargs in (dict(gamma=3), dict(gamma=5, eos_token_id=eos), dict(gamma=2, temperature=1.0, seed=5),
                   dict(gamma=4, adaptive=True)):
        seen.clear()
        result = generate("draft_model", target, ids, 30, draft=draft, debug=True, **kwargs)
        steps = cache_steps(result.stats["steps"], ids.shape[1])
        target_rows = [(f, a) for is_target, f, a in seen if is_target]
        draft_rows = [(f, a) for is_target, f, a in seen if not is_target]
        assert target_rows == [(s.target_fed, s.target_after) for s in steps], kwargs
        assert draft_rows == [(s.draft_fed, s.draft_after) for s in steps], kwargs
        assert sum(s.emitted for s in steps) == len(result.new_tokens)
        kinds_seen |= {name for s in steps for name in s.scenarios}
    assert {"1 first step", "2 partial", "3 full"} <= kinds_seen


def _trace(fig, name):
    return next(t for t in fig.data if t.name == name)


def test_cache_timeline_figure_bars_are_the_cache_lengths():
    steps = cache_steps(STATS, 10)
    fig = viz_rollback.cache_timeline_figure(steps)
    assert isinstance(fig, go.Figure)
    assert list(_trace(fig, "drafted").y) == [3, 3, 3, 3, 0]
    assert list(_trace(fig, "accepted").y) == [1, 3, 0, 2, 0]
    bonus, correction = _trace(fig, "target's token: bonus"), _trace(fig, "target's token: correction")
    assert list(bonus.x) == [1, 4] and list(bonus.base) == [3, 0]  # stacked on the accepted drafts
    assert list(correction.x) == [0, 2]  # step 3 was cut by EOS: no target token drawn
    kept = [t for t in fig.data if t.name == "cache: kept"]
    dropped = [t for t in fig.data if t.name == "cache: rolled back"]
    assert len(kept) == len(dropped) == 2 and [t.showlegend for t in kept] == [True, False]
    target_kept, draft_kept = kept
    assert list(target_kept.base) == [s.target_before for s in steps]
    assert list(target_kept.y) == [s.target_after - s.target_before for s in steps]
    assert list(dropped[0].base) == [s.target_after for s in steps]
    assert list(dropped[0].y) == [2, 0, 3, 3, 0]
    assert list(draft_kept.base) == [s.draft_before for s in steps]
    assert list(dropped[1].y) == [1, 0, 2, 2, 0]
    assert target_kept.yaxis == "y2" and draft_kept.yaxis == "y3"
    diamonds = _trace(fig, "draft input: 2 tokens")
    assert list(diamonds.x) == [2]  # the step after the full acceptance
    low, high = fig.layout.yaxis2.range
    assert low == 10 and high == 21  # from the smallest later length - 1 to the largest fed + 1
    # per-step dicts + prompt length draw the same figure; max_steps cuts and says so
    same = viz_rollback.cache_timeline_figure(STATS, prompt_length=10)
    assert list(same.data[4].base) == list(fig.data[4].base)
    short = viz_rollback.cache_timeline_figure(steps, max_steps=2)
    assert list(short.data[0].x) == [0, 1] and "first 2 of 5" in short.layout.title.text
    with pytest.raises(ValueError, match="prompt_length"):
        viz_rollback.cache_timeline_figure(STATS)


def test_distribution_figure_orders_pools_and_bands():
    exact = {(0, 0): 0.5, (0, 1): 0.3, (1, 0): 0.15, (1, 1): 0.05}
    counts = Counter({(0, 0): 480, (0, 1): 310, (1, 0): 150, (1, 1): 55, (2, 2): 5})  # (2, 2) is impossible
    fig = viz_rollback.distribution_figure(exact, counts, labels=lambda k: "".join("ab"[i] if i < 2 else "?" for i in k),
                                           top=2)
    exact_bar, emp = fig.data
    assert list(exact_bar.x) == ["aa", "ab", "other (3)"]
    np.testing.assert_allclose(exact_bar.y, [0.5, 0.3, 0.2])
    np.testing.assert_allclose(emp.y, [0.48, 0.31, 0.21])  # other = (1,0) + (1,1) + the impossible (2,2)
    assert "n=1000" in emp.name
    np.testing.assert_allclose(exact_bar.error_y.array, [2 * (p * (1 - p) / 1000) ** 0.5 for p in (0.5, 0.3, 0.2)])
    # two series side by side, frequencies (no band), list inputs with list labels
    fig = viz_rollback.distribution_figure(exact, {"right": {(0, 0): 0.5, (0, 1): 0.5},
                                                   "wrong": {(1, 1): 1.0}}, top=10)
    assert [t.name for t in fig.data] == ["exact (enumeration)", "right", "wrong"]
    assert fig.data[0].error_y.array is None
    assert list(fig.data[0].x) == ["0 0", "0 1", "1 0", "1 1"]
    np.testing.assert_allclose(fig.data[2].y, [0, 0, 0, 1.0])
    fig = viz_rollback.distribution_figure([0.2, 0.8], [3, 7], labels=["x", "y"])
    assert list(fig.data[0].x) == ["y", "x"] and list(fig.data[1].y) == [0.7, 0.3]


def test_gamma_sweep_figure_one_line_per_method():
    table = pd.DataFrame(dict(gamma=[4, 2, 4, 2], method=["hf", "hf", "draft_model", "draft_model"],
                              tokens_per_s=[100.0, 98.0, 150.0, 120.0], mat=[1.0, 1.0, 2.5, 1.8]))
    fig = viz_rollback.gamma_sweep_figure(table)
    assert [(t.name, t.xaxis) for t in fig.data] == [("hf", "x"), ("hf", "x2"), ("draft_model", "x"),
                                                     ("draft_model", "x2")]
    assert list(fig.data[2].x) == [2, 4] and list(fig.data[2].y) == [120.0, 150.0]  # sorted by gamma
    assert list(fig.data[3].y) == [1.8, 2.5]
    assert [t.showlegend for t in fig.data] == [True, False, True, False]
    assert list(fig.layout.xaxis.tickvals) == [2, 4]
    only = viz_rollback.gamma_sweep_figure(table.rename(columns={"mat": "mean_accepted"}), methods=["draft_model"])
    assert len(only.data) == 2
    with pytest.raises(KeyError, match="tokens/s"):
        viz_rollback.gamma_sweep_figure(table.drop(columns="tokens_per_s"))


def test_token_kinds_and_acceptance_html():
    result = GenerationResult(list(range(9)), [2, 4, 1, 1, 1], 5, stats=dict(steps=STATS))
    steps, kinds = viz_rollback.token_kinds(result)
    assert steps == [0, 0, 1, 1, 1, 1, 2, 3, 4]
    assert kinds == ["draft", "correction", "draft", "draft", "draft", "bonus", "correction", "draft", "bonus"]
    # without per-step stats (e.g. hf_assisted): accept lengths, drafts then one target token
    plain = GenerationResult([5, 6, 7], [2, 1], 2)
    assert viz_rollback.token_kinds(plain) == ([0, 0, 1], ["draft", "bonus", "bonus"])
    with pytest.raises(ValueError, match="account for"):
        viz_rollback.token_kinds(GenerationResult([1], [2], 1))
    texts = ["a", "<b>", " c", "\n", "d", "e", "f", "g", "h"]
    page = viz_rollback.acceptance_html(texts, steps, kinds, prompt="x" * 400, title="T & U")
    assert isinstance(page, str) and "T &amp; U" in page
    assert page.count("class='tok-draft'") == 5 and page.count("class='tok-bonus'") == 2
    assert page.count("class='tok-correction'") == 2 and page.count("underline wavy") == 2 + 1  # + legend
    assert "'>&lt;b&gt;</span>" in page and "'><b></span>" not in page  # token text is escaped
    assert "↵" in page and "…" + "x" * 300 in page
    assert page.count(f"background:{viz_rollback.STEP_COLORS[1]}") == 4  # the four tokens of step 1
    as_bools = viz_rollback.acceptance_html(["a", "b"], [0, 0], [False, True], legend=False)
    assert as_bools.count("tok-bonus") == 1 and "background = decoding step" not in as_bools
    with pytest.raises(ValueError, match="2 tokens"):
        viz_rollback.acceptance_html(["a", "b"], [0], [True])
    with pytest.raises(ValueError, match="unknown token kinds"):
        viz_rollback.acceptance_html(["a"], [0], ["drafted"])


def test_rollback_explorer_runs_and_redraws():
    calls = []

    def run(prompt, gamma, temperature):
        calls.append((prompt, gamma, temperature))
        stats = [dict(drafted=gamma, accepted=gamma, emitted=gamma + 1), dict(drafted=gamma, accepted=0, emitted=1)]
        result = GenerationResult(list(range(gamma + 2)), [gamma + 1, 1], 2, wall_seconds=0.1,
                                  stats=dict(steps=stats, acceptance_rate=0.5))
        return result, len(prompt)

    box = viz_rollback.rollback_explorer(run, ["abc", {"id": "p1", "prompt": "hello"}], decode=lambda ids: "x",
                                         gamma=3)
    assert calls == [("abc", 3, 0.0)]
    state = box.state
    assert [s.target_after for s in state["steps"]] == [3 + 4 - 1, 3 + 5 - 1]
    assert "tok-bonus" in state["html"] and isinstance(state["figure"], go.Figure)
    widgets = {}
    stack = [box]
    while stack:
        w = stack.pop()
        if getattr(w, "description", None):
            widgets[w.description] = w
        stack.extend(getattr(w, "children", ()))
    first = state["figure"]
    widgets["gamma"].value = 5
    assert calls[-1] == ("abc", 5, 0.0) and box.state["figure"] is not first
    assert list(box.state["figure"].data[0].y) == [5, 5]
    widgets["prompt"].value = "hello"
    widgets["temperature"].value = 1.0
    assert calls[-1] == ("hello", 5, 1.0)
