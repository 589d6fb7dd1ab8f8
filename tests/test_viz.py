"""viz caches, acceptance, bench and costs, and the package as a whole: the cache bookkeeping matches the
draft_model method's real caches, every figure carries exactly the data it was given, and the modules keep to
their subjects (re-exported by name, no private names across modules, plotly only inside viz)."""
from __future__ import annotations

import ast
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

from specdec_lib import generate, loop, viz
from specdec_lib.decoding import GenerationResult
from specdec_lib.mechanisms import kv_cache
from specdec_lib.methods import draft_model as dm
from specdec_lib.viz import acceptance, bench, caches, common, costs
from specdec_lib.viz.caches import CacheStep, cache_steps

from helpers import random_lm

# prompt of 10; gamma 3: partial (1 of 3) on step 0, full on step 1, partial (0 of 3) after it, EOS cut inside
# an accepted run (2 accepted, the first of them EOS), then a step that drafted nothing (1 token left); the
# per-step record every method writes (only the keys viz reads)
STATS = [dict(tree_size=3, accepted=1, emitted=2, full=False), dict(tree_size=3, accepted=3, emitted=4, full=True),
         dict(tree_size=3, accepted=0, emitted=1, full=False), dict(tree_size=3, accepted=2, emitted=1, full=False),
         dict(tree_size=0, accepted=0, emitted=1, full=True)]


# caches: a chain method's bookkeeping, its timeline and explorer
def test_cache_steps_bookkeeping_by_hand():
    steps = cache_steps(STATS, prompt_length=10)
    assert all(isinstance(s, CacheStep) for s in steps)
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
        cache_steps([dict(tree_size=2, accepted=3, emitted=4, full=False)], 5)
    with pytest.raises(ValueError, match="not a valid step"):  # a chain runs off its end iff all were accepted
        cache_steps([dict(tree_size=2, accepted=1, emitted=2, full=True)], 5)
    assert [s.full for s in steps] == [step["full"] for step in STATS]


def test_cache_steps_match_the_real_caches(monkeypatch):
    """Run "draft_model" (greedy and sampling, with an EOS) and record each cache's length right before and
    after every commit (the target's: the loop's `commit`; the draft's: its TrackedCache's): they must equal the
    derived target_fed/after and draft_fed/after."""
    torch.manual_seed(0)
    target = random_lm("llama", vocab=23, layers=2, seed=3, logit_scale=8.0)
    draft = random_lm("llama", vocab=23, layers=1, seed=4, logit_scale=8.0)
    seen = []
    original_target, original_draft = loop.commit, dm.TrackedCache.commit

    def target_commit(cache, prefix_len, kept):
        fed = kv_cache.cache_length(cache)
        original_target(cache, prefix_len, kept)
        seen.append((True, fed, kv_cache.cache_length(cache)))

    def draft_commit(self, committed):
        fed = kv_cache.cache_length(self.cache)
        original_draft(self, committed)
        seen.append((self.model is target, fed, kv_cache.cache_length(self.cache)))

    monkeypatch.setattr(loop, "commit", target_commit)
    monkeypatch.setattr(dm.TrackedCache, "commit", draft_commit)
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
    fig = caches.cache_timeline_figure(steps)
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
    same = caches.cache_timeline_figure(STATS, prompt_length=10)
    assert list(same.data[4].base) == list(fig.data[4].base)
    short = caches.cache_timeline_figure(steps, max_steps=2)
    assert list(short.data[0].x) == [0, 1] and "first 2 of 5" in short.layout.title.text
    with pytest.raises(ValueError, match="prompt_length"):
        caches.cache_timeline_figure(STATS)


def test_rollback_explorer_runs_and_redraws():
    calls = []

    def run(prompt, gamma, temperature):
        calls.append((prompt, gamma, temperature))
        stats = [dict(tree_size=gamma, accepted=gamma, emitted=gamma + 1, full=True),
                 dict(tree_size=gamma, accepted=0, emitted=1, full=False)]
        result = GenerationResult(list(range(gamma + 2)), [gamma + 1, 1], 2, wall_seconds=0.1,
                                  stats=dict(steps=stats, acceptance_rate=0.5))
        return result, len(prompt)

    box = caches.rollback_explorer(run, ["abc", {"id": "p1", "prompt": "hello"}], decode=lambda ids: "x",
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


# acceptance: per token and per step, and the output distribution
def test_token_kinds_and_acceptance_html():
    result = GenerationResult(list(range(9)), [2, 4, 1, 1, 1], 5, stats=dict(steps=STATS))
    steps, kinds = acceptance.token_kinds(result)
    assert steps == [0, 0, 1, 1, 1, 1, 2, 3, 4]
    assert kinds == ["draft", "correction", "draft", "draft", "draft", "bonus", "correction", "draft", "bonus"]
    # without per-step stats (e.g. hf_assisted): accept lengths, drafts then one target token
    plain = GenerationResult([5, 6, 7], [2, 1], 2)
    assert acceptance.token_kinds(plain) == ([0, 0, 1], ["draft", "bonus", "bonus"])
    with pytest.raises(ValueError, match="account for"):
        acceptance.token_kinds(GenerationResult([1], [2], 1))
    texts = ["a", "<b>", " c", "\n", "d", "e", "f", "g", "h"]
    page = acceptance.acceptance_html(texts, steps, kinds, prompt="x" * 400, title="T & U")
    assert isinstance(page, str) and "T &amp; U" in page
    assert page.count("class='tok-draft'") == 5 and page.count("class='tok-bonus'") == 2
    assert page.count("class='tok-correction'") == 2 and page.count("underline wavy") == 2 + 1  # + legend
    assert "'>&lt;b&gt;</span>" in page and "'><b></span>" not in page  # token text is escaped
    assert "↵" in page and "…" + "x" * 300 in page
    assert page.count(f"background:{acceptance.STEP_COLORS[1]}") == 4  # the four tokens of step 1
    as_bools = acceptance.acceptance_html(["a", "b"], [0, 0], [False, True], legend=False)
    assert as_bools.count("tok-bonus") == 1 and "background = decoding step" not in as_bools
    with pytest.raises(ValueError, match="2 tokens"):
        acceptance.acceptance_html(["a", "b"], [0], [True])
    with pytest.raises(ValueError, match="unknown token kinds"):
        acceptance.acceptance_html(["a"], [0], ["drafted"])


def test_steps_and_draft_time_figures_read_the_step_records():
    records = [dict(s, draft_us=10.0 * i) for i, s in enumerate(STATS)]
    result = GenerationResult(list(range(9)), [2, 4, 1, 1, 1], 5, stats=dict(steps=records))
    fig = acceptance.steps_figure(result)
    assert list(fig.data[0].y) == [3, 3, 3, 3, 0]  # tree_size: a chain's length, 0 when nothing was drafted
    assert list(fig.data[1].y) == [2, 4, 1, 1, 1]
    fig = acceptance.draft_time_figure({"run": result, "values": [1.0, 2.0]})
    assert list(fig.data[0].y) == [0.0, 10.0, 20.0, 30.0, 40.0] and list(fig.data[1].y) == [1.0, 2.0]
    fig = acceptance.acceptance_figure(result)
    assert list(fig.data[0].y) == [2, 4, 1, 1, 1]


def test_distribution_figure_orders_pools_and_bands():
    exact = {(0, 0): 0.5, (0, 1): 0.3, (1, 0): 0.15, (1, 1): 0.05}
    counts = Counter({(0, 0): 480, (0, 1): 310, (1, 0): 150, (1, 1): 55, (2, 2): 5})  # (2, 2) is impossible
    fig = acceptance.distribution_figure(exact, counts, top=2,
                                         labels=lambda k: "".join("ab"[i] if i < 2 else "?" for i in k))
    exact_bar, emp = fig.data
    assert list(exact_bar.x) == ["aa", "ab", "other (3)"]
    np.testing.assert_allclose(exact_bar.y, [0.5, 0.3, 0.2])
    np.testing.assert_allclose(emp.y, [0.48, 0.31, 0.21])  # other = (1,0) + (1,1) + the impossible (2,2)
    assert "n=1000" in emp.name
    np.testing.assert_allclose(exact_bar.error_y.array, [2 * (p * (1 - p) / 1000) ** 0.5 for p in (0.5, 0.3, 0.2)])
    # two series side by side, frequencies (no band), list inputs with list labels
    fig = acceptance.distribution_figure(exact, {"right": {(0, 0): 0.5, (0, 1): 0.5},
                                                 "wrong": {(1, 1): 1.0}}, top=10)
    assert [t.name for t in fig.data] == ["exact (enumeration)", "right", "wrong"]
    assert fig.data[0].error_y.array is None
    assert list(fig.data[0].x) == ["0 0", "0 1", "1 0", "1 1"]
    np.testing.assert_allclose(fig.data[2].y, [0, 0, 0, 1.0])
    fig = acceptance.distribution_figure([0.2, 0.8], [3, 7], labels=["x", "y"])
    assert list(fig.data[0].x) == ["y", "x"] and list(fig.data[1].y) == [0.7, 0.3]


# bench and costs
def test_gamma_sweep_figure_one_line_per_method():
    table = pd.DataFrame(dict(gamma=[4, 2, 4, 2], method=["hf", "hf", "draft_model", "draft_model"],
                              tokens_per_s=[100.0, 98.0, 150.0, 120.0], mat=[1.0, 1.0, 2.5, 1.8]))
    fig = bench.gamma_sweep_figure(table)
    assert [(t.name, t.xaxis) for t in fig.data] == [("hf", "x"), ("hf", "x2"), ("draft_model", "x"),
                                                     ("draft_model", "x2")]
    assert list(fig.data[2].x) == [2, 4] and list(fig.data[2].y) == [120.0, 150.0]  # sorted by gamma
    assert list(fig.data[3].y) == [1.8, 2.5]
    assert [t.showlegend for t in fig.data] == [True, False, True, False]
    assert list(fig.layout.xaxis.tickvals) == [2, 4]
    only = bench.gamma_sweep_figure(table, methods=["draft_model"])
    assert len(only.data) == 2
    with pytest.raises(KeyError, match="no column tokens_per_s"):
        bench.gamma_sweep_figure(table.drop(columns="tokens_per_s"))


def test_cost_figure_one_line_per_group():
    import pandas as pd

    df = pd.DataFrame(dict(LC=[1, 10, 100] * 2, us=[1.0, 1.1, 1.2, 2.0, 2.1, 2.2], FC=[4] * 3 + [64] * 3))
    fig = costs.cost_figure(df, "LC", "us", "FC", log_x=True)
    assert [t.name for t in fig.data] == ["FC=4", "FC=64"]
    assert list(fig.data[1].y) == [2.0, 2.1, 2.2] and fig.layout.xaxis.type == "log"


def test_summary_figures_read_one_name_per_quantity():
    table = pd.DataFrame(dict(method=["a"], tokens_per_s=[1.0], mat=[2.0]))
    common.need_columns(table, "tokens_per_s", "mat")
    with pytest.raises(KeyError, match="no column mat; columns"):
        common.need_columns(table.drop(columns="mat"), "tokens_per_s", "mat")
    assert bench.bench_figure(table).data[1].y == (2.0,)  # the same names in every summary figure
    with pytest.raises(KeyError, match="no column tokens_per_s"):  # no other spelling is read
        bench.bench_figure(table.rename(columns={"tokens_per_s": "tokens_per_second"}))


# the package: one module per subject, re-exported by name
VIZ = Path(viz.__file__).parent


def test_viz_reexports_each_public_function_from_its_subject_module():
    modules = {"common", "tables", "trees", "masks", "caches", "acceptance", "costs", "layout", "fumble", "timeline",
               "compare", "bench"}
    assert {p.stem for p in VIZ.glob("*.py")} == modules | {"__init__"}
    for name in viz.__all__:
        obj = getattr(viz, name)
        home = obj.__module__.rsplit(".", 1)[-1]
        assert home in modules and getattr(getattr(viz, home), name) is obj, name
    assert viz.tree_figure is viz.trees.tree_figure and viz.cache_steps is caches.cache_steps


def test_viz_modules_share_no_private_names_and_never_show():
    for path in VIZ.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:  # within the package
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports {private} from {node.module}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                assert node.func.attr != "show", f"{path.name}:{node.lineno} calls show()"
        doc = ast.get_docstring(tree)
        assert doc and len(doc.splitlines()) > 1, f"{path.name} opens without a docstring saying what it draws"


def test_the_library_imports_without_plotly_or_ipywidgets():
    """Only specdec_lib.viz may need plotly/ipywidgets: every other module imports with both missing (other
    missing optional packages are not this test's business)."""
    root = VIZ.parent
    names = sorted(".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
                   for p in root.rglob("*.py")
                   if "viz" not in p.relative_to(root).parts and p.stem != "__main__")  # __main__ runs a CLI
    code = ("import importlib, sys\n"
            "sys.modules.update(plotly=None, ipywidgets=None)  # None in sys.modules: importing them fails\n"
            f"for name in {names!r}:\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "    except ImportError as err:\n"
            "        if 'plotly' in str(err) or 'ipywidgets' in str(err):\n"
            "            print(name, err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "", out.stdout
