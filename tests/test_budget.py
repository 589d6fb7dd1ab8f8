"""Draft budgets chosen from the cost curve (mechanisms/budget/, the methods' "auto" budgets).

With an injected curve the choices are deterministic and follow the arithmetic (expensive extra rows: small
budgets; flat curve: large ones); auto is lossless (greedy parity, seeded sampling == autoregressive); the
on-disk curve cache is reused and keyed by device / model / dtype."""
from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from specdec_lib import generate
from specdec_lib.mechanisms import budget as B
from specdec_lib.mechanisms.budget import cost_curve as C
from specdec_lib.mechanisms.draft_tree import DraftTree

from helpers import SHIPPED_PROMPTS, autoregressive_samples, random_lm, repeating_prompt

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore::specdec_lib.tables.NoFrozenTableWarning")]

FLAT = C.CostCurve.from_points({1: 10.0, 128: 10.5})            # extra rows nearly free (a GPU)
STEEP = C.CostCurve.from_points({1: 10.0, 2: 20.0, 128: 1280.0})  # every row costs a whole forward


# ---------------------------------------------------------------- the curve

def test_curve_interpolates_and_extends():
    curve = C.CostCurve.from_points([(1, 5.0), (5, 9.0), (9, 17.0)])
    assert curve(1) == 5.0 and curve(3) == 7.0 and curve(7) == 13.0
    assert curve(11) == 21.0  # the last slope (2 ms per row) goes on
    assert curve(0.5) == 5.0
    with pytest.raises(ValueError):
        C.CostCurve.from_points({0: 1.0})
    with pytest.raises(ValueError):
        C.CostCurve.from_points({1: -1.0})


def test_estimated_costs_time_nothing_and_write_nothing(tmp_path, monkeypatch):
    """SPECDEC_COSTS=estimate (every test but those marked measures_costs): a curve from the parameter count,
    1 ms a million weights for a row and 1/64 of that for each further row, with no forward timed or file written."""
    from specdec_lib.mechanisms.budget import step_cost

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setenv(C.ESTIMATE_ENV, "estimate")
    monkeypatch.setattr(C, "_MEMO", {})
    monkeypatch.setattr(step_cost, "verify_cost", lambda *a, **k: pytest.fail("a cost was timed"))
    model = random_lm(seed=3, context=256)
    million = sum(p.numel() for p in model.parameters()) / 1e6
    curve = C.CostCurve.measure(model, rows=(1, 65))
    assert curve.ms.tolist() == pytest.approx([million, 2 * million])  # 65 rows: 1 + 64/64 = 2x one row
    costs = C.ContextCosts.measure(model, upto=5000, prefixes=(64, 128, 4096))  # 4096 clipped to the context: 128
    assert costs.prefixes == [64, 128] and costs(1, context=3000) == pytest.approx(million)
    assert not (tmp_path / "costs").exists()
    monkeypatch.setenv(C.ESTIMATE_ENV, "fast")
    with pytest.raises(ValueError, match="SPECDEC_COSTS must be unset"):
        C.CostCurve.measure(model)


@pytest.mark.measures_costs
def test_measure_caches_on_disk_keyed_by_model_and_dtype(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(C, "_MEMO", {})
    model = random_lm(seed=3, context=256)
    first = C.CostCurve.measure(model, rows=(1, 4, 16), repeats=2)
    files = list((tmp_path / "costs").glob("curve_*.json"))
    assert len(files) == 1 and first.path == files[0]
    data = json.loads(files[0].read_text())
    assert data["key"]["dtype"] == "torch.float64" and data["key"]["device"].startswith("cpu:")
    assert data["key"]["params"] == sum(p.numel() for p in model.parameters())
    assert np.all(first.ms >= first.ms[0])  # floored at one row (medians as measured: a kernel switch may dip)
    # a new process (no in-memory copy) reads the file instead of measuring: mark the file to see it read
    data["ms"] = [1.0, 2.0, 3.0]
    files[0].write_text(json.dumps(data))
    monkeypatch.setattr(C, "_MEMO", {})
    assert C.CostCurve.measure(model, rows=(1, 4, 16)).ms.tolist() == [1.0, 2.0, 3.0]
    # another dtype or another model is another curve
    C.CostCurve.measure(model.to(torch.float32), rows=(1, 4), repeats=1)
    C.CostCurve.measure(random_lm(seed=4, layers=3, context=256), rows=(1, 4), repeats=1)
    assert len(list((tmp_path / "costs").glob("curve_*.json"))) == 3
    # one CPU name covers several generations: the vector unit torch's kernels use is in the key
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    monkeypatch.setattr(C, "_MEMO", {})
    assert ":DEFAULT:" in C.model_key(model)["device"]
    C.CostCurve.measure(model, rows=(1, 4), repeats=1)
    assert len(list((tmp_path / "costs").glob("curve_*.json"))) == 4


# ---------------------------------------------------------------- the choosers' arithmetic

def test_chain_budget_follows_the_curve():
    for curve, expected in ((FLAT, 16), (STEEP, 0)):  # STEEP: no chain pays (0: a plain step)
        chooser = B.ChainBudget(curve, max_len=16, explore=0.0)
        for _ in range(20):
            chooser.record(16, 14)  # a high acceptance at every depth
        assert chooser.choose() == expected
    # the formula: E[tokens | g] = 1 + sum_d prod_{j<=d} a_j
    chooser = B.ChainBudget(FLAT, max_len=3, strength=1e-9, explore=0.0, decay=1.0)  # plain counts
    chooser.record(3, 1)  # depth 1 accepted, depth 2 rejected, depth 3 not reached
    chooser.record(3, 3)
    # reached: depth 1 twice, depth 2 twice, depth 3 once; accepted: depth 1 twice, depth 2 once, depth 3 once
    assert np.allclose(chooser.rates(), [1.0, 0.5, 1.0])
    # by hand: 1 + 1 + 1 x 0.5 + 1 x 0.5 x 1 = 3 tokens for g = 3 (2 and 2.5 for g = 1, 2)
    assert np.allclose(chooser.expected_tokens(), [1.0, 2.0, 2.5, 3.0])


def test_chain_budget_forgets_an_easy_opening():
    # an answer's first lines accepted well, its body not: the decayed counts follow the body, plain counts lag
    forgetting, counting = B.ChainBudget(FLAT, max_len=4), B.ChainBudget(FLAT, max_len=4, decay=1.0)
    for chooser in (forgetting, counting):
        for step in range(40):
            chooser.record(4, 4 if step < 10 else 0)
    assert forgetting.rates()[0] < 0.15 < counting.rates()[0]
    with pytest.raises(ValueError, match="decay"):
        B.ChainBudget(FLAT, decay=0.0)


def test_chain_budget_draft_cost_shortens_chains():
    cheap = B.ChainBudget(FLAT, max_len=16, explore=0.0)
    dear = B.ChainBudget(FLAT, max_len=16, draft_ms=lambda g: 5.0 * g, explore=0.0)
    for chooser in (cheap, dear):
        for _ in range(20):
            chooser.record(16, 8)
    assert dear.choose() < cheap.choose()
    assert dear.choose(limit=2) <= 2


def test_tree_budget_follows_the_curve():
    ladder = [4, 16, 64]
    yields = {4: (2, 5), 16: (3, 17), 64: (4, 65)}  # (tokens, rows): bigger trees yield a little more
    for curve, first, others, expected in ((FLAT, 64, [16], 64), (STEEP, 4, [16], 4)):
        chooser = B.TreeBudget(curve, ladder, probe_every=1000)
        # no data: the largest nearly free candidate; counterfactuals for the next smaller and larger ones
        assert chooser.choose() == (first, others)
        chooser.record(yields, verified=first)
        assert chooser.choose()[0] == expected
    chooser = B.TreeBudget(STEEP, ladder, probe_every=2, trial_share=None)
    chooser.record(yields, verified=4)
    assert [chooser.choose()[0] for _ in range(4)] == [4, 16, 4, 16]  # every 2nd step probes one rung up
    # where a probe is dear (16 rows at 10 ms each for about the same tokens), it waits until 3 % of the steps'
    # time since the last covers what it is expected to lose
    bounded = B.TreeBudget(STEEP, ladder, probe_every=2, trial_share=0.03)
    bounded.record(yields, verified=4)
    # by hand: the level (2 + 1) / (1 + 1) = 1.5 tokens, so 4 yields 1.5 x 3 / 3 = 1.5 and 16 yields 1.5 x 4 / 3 = 2
    # tokens; STEEP prices 5 rows at 50 ms and 17 at 170 ms; a probe at 16 loses 170 - 2 x 50 / 1.5 = 103.3 ms
    # against 4's speed, which 3 % of 50 ms steps covers after ceil(103.3 / 1.5) = 69 of them
    wait = 69
    assert bounded.probe_wait(0) == wait
    assert [bounded.choose()[0] for _ in range(2 * wait)] == ([4] * (wait - 1) + [16]) * 2


def test_tree_budget_compares_candidates_on_the_same_steps():
    chooser = B.TreeBudget(FLAT, [4, 16, 64])
    chooser.record({16: (3, 17), 4: (2, 5)}, verified=16)
    tokens, _ = chooser.estimates()
    # the verified yield's level (3 + 1) / (1 + 1) = 2, times each one's ratio to it on the same steps,
    # shrunk one pseudo-step toward 1 (an unseen candidate: ratio 1)
    assert np.allclose(tokens, [2 * 3 / 4, 2 * 4 / 4, 2.0])
    # a hard stretch of text lowers every yield alike: the ratio, and so the ranking, holds
    for _ in range(30):
        chooser.record({16: (1, 17), 4: (1, 5)}, verified=16)
    tokens, _ = chooser.estimates()
    assert tokens[0] < tokens[1]


def test_tree_budget_prices_a_plain_step_at_one_token_before_any_data():
    """Candidate 0 (no tree) yields the root's token, exactly: never the verified yield's level, which made an
    unseen plain step look as productive as the trees (EAGLE fell to plain steps on the tiny pair so)."""
    chooser = B.TreeBudget(FLAT, [0, 4, 16])
    chooser.record({16: (3, 17), 4: (2, 5)}, verified=16)
    tokens, _ = chooser.estimates()
    assert tokens[0] == 1.0 and tokens[2] == pytest.approx(2.0)  # 16: the level (3 + 1) / (1 + 1)


def test_tree_budget_learns_how_far_past_a_censored_bound_a_larger_tree_goes():
    chooser = B.TreeBudget(FLAT, [4, 16, 64])
    for _ in range(50):  # verified 16 went 3 tokens further than 4 would have: 2 past 4's censored bound (2 + 1)
        chooser.record({16: (5, 17), 4: (2, 5)}, verified=16)
    assert chooser.extra_sum / chooser.extra_weight == pytest.approx(2.0)
    before = chooser.tokens[2]
    chooser.record({16: (2, 17), 64: (3, 65, True)}, verified=16)  # 64 holds the whole path: at least 3
    added = chooser.tokens[2] - before * 0.97
    # by hand: 50 steps each 2 tokens past the bound, decayed by 0.97 a step: weight W = sum_k<50 0.97^k
    # = (1 - 0.97^50) / 0.03 = 26.0645, sum 2 W; with the prior (half a token, one pseudo-step) the extra is
    # (2 W + 0.5) / (W + 1) = 52.629 / 27.0645 = 1.94458 past the bound 3
    assert added == pytest.approx(4.94458, abs=1e-5)  # the bound + about 2 learnt tokens, not the bound alone


def test_tree_budget_switches_only_past_the_margin():
    curve = C.CostCurve.from_points({1: 10.0, 128: 10.0})
    chooser = B.TreeBudget(curve, [4, 16], margin=0.10, decide_every=1)
    assert chooser.choose()[0] == 16
    for _ in range(20):  # 4 yields 5% more than 16 on the same steps (at equal cost): not enough to switch
        chooser.record({16: (20, 17), 4: (21, 5)}, verified=16)
        assert chooser.choose()[0] == 16
    for _ in range(40):  # 25% more: switch
        chooser.record({16: (20, 17), 4: (25, 5)}, verified=16)
    assert chooser.choose()[0] == 4


def test_tree_budget_first_step_is_the_largest_nearly_free_candidate():
    cpu_like = C.CostCurve.from_points({1: 6.0, 9: 6.2, 17: 6.6, 25: 7.8, 97: 14.5})
    assert B.TreeBudget(cpu_like, [8, 16, 24, 96]).choose()[0] == 16  # 6.6 <= 1.15 x 6.0 < 7.8
    assert B.TreeBudget(cpu_like, [8, 16, 24, 96], free=0.5).choose()[0] == 24


def test_tree_yield():
    tree = DraftTree(7)
    tree.add_chain(-1, [1, 2, 3])
    tree.add_chain(-1, [1, 5])
    assert B.tree_yield(tree, [1, 2, 9]) == (3, False)  # leaves the path at the third token
    assert B.tree_yield(tree, [1, 5, 6, 0]) == (3, False)
    assert B.tree_yield(tree, [4]) == (1, False) and B.tree_yield(tree, [8, 8]) == (1, False)
    assert B.tree_yield(tree, [1, 2]) == (3, True)  # holds the bonus token too: at least 3, maybe more


def test_cost_curve_keeps_a_kernel_switch_and_floors_at_one_row():
    # 2 rows dearer than 4: a kernel switch (a real pair on this CPU), priced as measured, not smoothed away
    curve = C.CostCurve.from_points({1: 6.1, 2: 8.5, 4: 6.2, 8: 6.4})
    assert [curve(r) for r in (1, 2, 3, 4, 8)] == pytest.approx([6.1, 8.5, 7.35, 6.2, 6.4])
    below = C.CostCurve.from_points({1: 6.1, 2: 6.0, 4: 6.3})  # cheaper than a plain step: noise, floored
    assert [below(r) for r in (1, 2, 4)] == pytest.approx([6.1, 6.1, 6.3])


def test_chain_budget_drafts_past_a_kernel_switch_or_not_at_all():
    # 2 rows cost 12 % more than 1 and 3-6 rows nothing more: with a weak draft a single draft never pays, a
    # longer one does when the draft is free, and nothing does when each draft costs its forward
    switch = C.CostCurve.from_points({1: 38.5, 2: 43.1, 3: 38.6, 6: 38.5, 8: 42.4, 16: 50.3})
    free = B.ChainBudget(switch, max_len=8)
    for _ in range(60):
        free.record(4, 0 if _ % 2 else 1)  # depth 1 accepted half the time, nothing deeper
    assert free.choose() >= 2
    dear = B.ChainBudget(switch, max_len=8, draft_ms=lambda g: 5.6 * g)
    for _ in range(60):
        dear.record(4, 1 if _ % 8 == 0 else 0)  # a weak draft: depth 1 one time in eight
    assert dear.choose() == 0


def test_chain_budget_prices_rows_by_what_the_loops_steps_took():
    """The curve says a 2-row step costs 5 % more than a plain one, so a draft accepted 30 % of the time pays;
    the loop's own 2-row steps take 40 % more (as SmolLM2's did on a CPU): recorded, they stop the drafting.
    A row count never run is scaled by the mean factor of those run (the machine's speed now); one slow step moves a
    factor a fifth of the way (COST_RATE), not all of it."""
    curve = C.CostCurve.from_points({1: 40.0, 2: 42.0, 3: 60.0, 64: 900.0})
    chain = B.ChainBudget(curve, max_len=1, probe_every=1000)
    for i in range(40):
        chain.record(1, 1 if i % 10 < 3 else 0)
    assert chain.choose() == 1, "by the curve one draft pays"
    for _ in range(20):
        chain.record_ms(1, 44.0)  # plain steps: the machine runs 10 % slower than when the curve was measured
    assert chain.step_ms(1) == pytest.approx(44.0, rel=0.01) and chain.step_ms(3) == pytest.approx(66.0, rel=0.01)
    assert chain.choose() == 1, "a uniform slowdown changes nothing"
    chain.record_ms(2, 120.0)  # one outlier: 1.1 + 0.2 x (2.86 - 1.1) = 1.45, not 2.86
    assert chain.step_ms(2) == pytest.approx(42.0 * 1.452, rel=0.01)
    for _ in range(20):
        chain.record_ms(2, 58.8)  # 2-row steps: 40 % above the curve
    assert chain.choose() == 0, "priced by what its steps took, the draft no longer pays"


def test_tree_budget_prices_rows_by_what_the_loops_steps_took():
    """A tree chooser without cheap side rows corrects the curve as a chain does; with FAFO's cheap rows the
    step's rows are not the tree's, so nothing is recorded there (budget.Budget.record) and the curve stands."""
    curve = C.CostCurve.from_points({1: 10.0, 64: 20.0})
    tree = B.TreeBudget(curve, [0, 4, 8])
    for _ in range(30):
        tree.record_ms(5, 1.5 * curve(5))  # 5-row steps took 1.5x what the curve says
    assert tree.step_ms(5) == pytest.approx(1.5 * curve(5), rel=0.02)
    assert tree.step_ms(1) == pytest.approx(1.5 * curve(1), rel=0.02), "an unseen row count: the mean factor"


def test_draft_model_learns_its_draft_forwards_cost_unless_injected():
    """gamma="auto" with a measured draft curve moves t_draft(1) and the rollback toward what they took
    (DRAFT_MS_RATE); injected draft_costs are taken as given."""
    from specdec_lib.methods import draft_model as D
    from specdec_lib.sampling import SamplingConfig

    learned = D.DraftModel(gamma="auto", costs=C.CostCurve.from_points({1: 10.0, 64: 20.0}))
    learned.forward_ms, learned.rollback_ms, learned.sampling = 4.0, 0.0, SamplingConfig()  # greedy
    for _ in range(30):
        learned._learn("forward_ms", 6.0), learned._learn("rollback_ms", 1.0)
    assert learned.drafting_ms(3) == pytest.approx(3 * 6.0 + 1.0, rel=0.01) and learned.drafting_ms(0) == 0.0
    given = D.DraftModel(gamma="auto", draft_costs=C.CostCurve.from_points({1: 4.0, 64: 9.0}))
    given.forward_ms, given.rollback_ms, given.sampling = 4.0, 0.0, SamplingConfig()
    given._learn("forward_ms", 6.0)
    assert given.drafting_ms(3) == 12.0
    # under sampling the choices must not follow timings (a seed reproduces its tokens)
    sampled = D.DraftModel(gamma="auto", costs=C.CostCurve.from_points({1: 10.0, 64: 20.0}))
    sampled.forward_ms, sampled.rollback_ms, sampled.sampling = 4.0, 0.0, SamplingConfig(temperature=1.0)
    sampled._learn("forward_ms", 6.0)
    assert sampled.drafting_ms(3) == 12.0


# ---------------------------------------------------------------- synthetic curves: the best expected speed, or none

CHEAP = C.CostCurve.from_points({1: 10.0, 8: 10.5, 64: 12.0})      # rows nearly free (a GPU)
DEAR = C.CostCurve.from_points({1: 10.0, 2: 17.0, 64: 450.0})      # every row costs most of a forward
KERNEL = C.CostCurve.from_points({1: 10.0, 2: 18.0, 8: 19.0, 64: 40.0})  # a kernel switch at 2 rows, flat after


def _chain_speeds(rate, curve, top):
    """Expected tokens per ms of g = 0..top drafts (drafting free), each depth accepted independently with
    probability `rate`: E[tokens | g] by enumerating the 2^g accept/reject outcomes of the g drafts (the accepted
    prefix + the target's own token), over t(g + 1)."""
    speeds = []
    for g in range(top + 1):
        tokens = 0.0
        for outcome in itertools.product([True, False], repeat=g):
            accepted = next((i for i, ok in enumerate(outcome) if not ok), g)  # up to the first rejection
            tokens += math.prod(rate if ok else 1 - rate for ok in outcome) * (accepted + 1)
        speeds.append(tokens / curve(g + 1))
    return speeds


@pytest.mark.parametrize("curve, rate, expected", [(CHEAP, 0.6, "draft"), (DEAR, 0.6, 0), (KERNEL, 0.6, "draft"),
                                                    (KERNEL, 0.3, 0), (DEAR, 0.97, "draft")])
def test_chain_budget_picks_the_best_expected_speed_on_synthetic_curves(curve, rate, expected):
    """Every depth accepted with probability `rate`: the chooser's g is the brute-force argmax of
    E[tokens | g] / t(g + 1) over g = 0..max_len, and 0 (no draft) exactly where no chain beats a plain step.
    KERNEL: one draft costs 80 % more than a plain step, but seven cost barely more than one, so a chooser
    that only looked one row ahead would never draft; at rate 0.3 nothing pays."""
    chooser = B.ChainBudget(curve, max_len=12, explore=0.0, strength=1e-9)
    for d in range(1, 13):  # per-depth rates exactly `rate`: reached 1000 times, accepted rate x 1000
        chooser.reached[d], chooser.accepted[d] = 1000, 1000 * rate
    speeds = _chain_speeds(rate, curve, 12)
    g = chooser.choose()
    assert g == int(np.argmax(speeds)), (g, speeds)
    assert (g == 0) == (expected == 0), (g, speeds)
    if curve is KERNEL and expected == "draft":
        assert g >= 5 and speeds[1] < speeds[0]  # one draft alone would lose to a plain step
    assert chooser.gain == pytest.approx(speeds[g] / speeds[0])


def test_chain_budget_probes_a_draft_after_plain_steps():
    """Where no chain pays, every `probe_every`-th step drafts (a probe), or later where a probe is expected to lose
    more than `trial_share` of the plain steps' time since the last one."""
    def acceptance_30(chooser):
        for d in range(1, 9):
            chooser.reached[d], chooser.accepted[d] = 100, 30
        return chooser

    chooser = acceptance_30(B.ChainBudget(DEAR, max_len=8, explore=0.0, probe_every=5, trial_share=None))
    picks = [chooser.choose() for _ in range(10)]
    assert picks[:4] == [0] * 4 and picks[4] >= 1 and picks[5:9] == [0] * 4 and picks[9] >= 1, picks
    assert B.ChainBudget(DEAR, max_len=8, plain=False).choose() >= 1  # plain=False: always a chain
    bounded = acceptance_30(B.ChainBudget(DEAR, max_len=8, explore=0.0, probe_every=5, trial_share=0.03))
    # by hand: every depth's rate is (30 + 0.3 x 2) / (100 + 2) = 0.3 (the pooled rate is 0.3 too), so a probe at
    # g = 1 costs 17 ms for 1.3 tokens: 17 - 1.3 x 10 = 4 ms lost, covered by 3 % of ceil(4 / 0.3) = 14 plain steps
    wait = 14
    assert bounded.probe_wait(1) == wait
    picks = [bounded.choose() for _ in range(2 * wait)]
    assert picks == ([0] * (wait - 1) + [1]) * 2, picks


def test_budget_learns_from_chains_it_did_not_draft():
    """A proposer whose drafts cost nothing to make (prompt lookup) reads a plain step's chain against the text that
    followed (`Budget.record_unverified`): the counts move between probes."""
    budget = B.Budget("num_tokens", "auto", costs=DEAR)
    budget.chooser = B.ChainBudget(DEAR, max_len=8, explore=0.0, probe_every=50, trial_share=None)
    for _ in range(10):
        budget.chooser.record(8, 0)  # drafts rejected at depth 1: plain steps pay
    assert [budget.choose(10) for _ in range(3)] == [0, 0, 0]
    for _ in range(30):
        budget.record_unverified(4, 4)  # the text repeats: 4 depths accepted, deeper ones unknown
    assert budget.choose(10) >= 2 and budget.chooser.reached[5:].sum() < 1  # unread depths: not reached
    fixed = B.Budget("num_tokens", 4)
    fixed.record_unverified(8, 8)  # a fixed budget learns nothing
    assert fixed.choose(10) == 4


@pytest.mark.parametrize("curve, winner", [(CHEAP, 32), (DEAR, 0), (KERNEL, 8)])
def test_tree_budget_picks_the_best_expected_speed_on_synthetic_curves(curve, winner):
    """Ladder 0 (a plain step: 1 token for 1 row) .. 32 nodes, each yielding what a tree of that size would on
    every step; after many steps the chooser verifies the candidate with the best tokens per ms (the same
    ranking the brute force gives), and 0 where no tree pays."""
    ladder = [0, 1, 2, 8, 32]
    yields = {0: 1.0, 1: 1.5, 2: 1.7, 8: 2.4, 32: 2.8}
    best = max(ladder, key=lambda b: yields[b] / curve(b + 1))
    assert best == winner  # the brute force, for the record
    chooser = B.TreeBudget(curve, ladder, window=len(ladder), above=len(ladder), decide_every=1,
                           probe_every=10 ** 6, margin=0.0)
    for _ in range(60):
        size, others = chooser.choose()
        chooser.record({b: (yields[b], b + 1) for b in [size, *others]}, verified=size)
    assert chooser.choose()[0] == winner
    assert chooser.gain == pytest.approx(yields[winner] / curve(winner + 1) * curve(1), rel=0.05)


def test_a_method_budget_honours_a_fixed_value_and_records_its_auto_choices():
    fixed = B.Budget("gamma", 3, 1)
    assert not fixed.auto and fixed.choose(100, limit=1) == 3 and fixed.info(3) == dict(draft_size=3)
    assert fixed.carry(lambda b: None) == {} and fixed.stats() == {}
    with pytest.raises(ValueError, match="costs"):
        B.Budget("gamma", 3, 1, costs={1: 1.0})
    with pytest.raises(ValueError, match=">= 1"):
        B.Budget("gamma", 0, 1)
    assert B.Budget("query", None, optional=True).choose(10) is None  # no budget of its own
    with pytest.raises(TypeError, match="gamma must be an int"):
        B.Budget("gamma", None)


def test_methods_decode_plainly_where_no_draft_pays_and_stay_lossless():
    """Each row costs more than a whole plain step (so even a draft accepted every time loses): prompt lookup
    and a draft model fall to plain steps (draft size 0) on most steps, probe a draft now and then, and emit the
    target's own tokens; the records carry each step's expected gain."""
    never = C.CostCurve.from_points({1: 10.0, 2: 21.0, 64: 700.0})
    target = random_lm(seed=5, logit_scale=20.0)
    ids = repeating_prompt(30, 5, target.config.vocab_size)
    reference = generate("hf", target, ids, 64).new_tokens
    for method, kwargs in (("prompt_lookup", dict(num_tokens="auto", costs=never)),
                           ("draft_model", dict(gamma="auto", costs=never, draft=random_lm(seed=9, layers=1),
                                                draft_costs=C.CostCurve.from_points({1: 5.0, 64: 9.0})))):
        result = generate(method, target, ids, 64, **kwargs)
        assert result.new_tokens == reference, method
        sizes = _budgets(result, method)
        assert sizes.count(0) > len(sizes) / 2 and max(sizes) >= 1, (method, sizes)
        gains = [s["expected_gain"] for s in result.stats["steps"] if "draft_size" in s]
        assert all(g is not None and g > 0 for g in gains), gains


def test_side_rows_stop_where_they_do_not_pay_and_are_probed_again():
    """SideBudget: on while the steps with the side rows make more tokens per ms than the text's own guesses
    would have; off after `warmup` steps of evidence that they do not; on again for `probe_len` steps every
    `probe_every` off steps, judged on those (the old evidence decays meanwhile)."""
    side = B.SideBudget(FLAT, probe_every=10, probe_len=3, warmup=4, decay=0.5)
    pays = (3.0, 12.0, 1.0, 10.0)  # 0.25 tokens/ms with the rows, 0.1 without
    loses = (1.0, 20.0, 1.0, 10.0)  # the rows cost 10 ms and yield nothing
    for _ in range(6):
        assert side.choose()
        side.record(*pays)
    assert side.gain == pytest.approx(2.5)
    losing = 0
    while side.choose():  # the first off step counts toward the probe
        side.record(*loses)
        losing += 1
    assert losing == 2  # decay 0.5: two losing steps outweigh six paying ones
    runs = [side.choose() for _ in range(9)]
    assert runs == [False] * 8 + [True]  # the 10th off step is a probe
    for _ in range(2):
        side.record(*pays)
        assert side.choose()  # the probe runs its 3 steps before judging
    side.record(*pays)
    assert side.choose() and side.stats()["side_on_steps"] == 6 + 2 + 4
    side.record(*loses)  # judged on decayed sums: the paying probe still wins
    assert side.choose()
    assert B.text_tree_yield(DraftTree.chain(0, [5, 6]), [5, 6]) == 3.5  # censored: + half a token


def test_trying_side_rows_costs_a_bounded_share_of_the_time():
    """SideBudget's trials (the warm-up, each probe) may lose `trial_share` x the plain time they are set against:
    side rows that double a step's time and yield nothing are off after the first step of a 20-token
    generation (allowance 0.03 x 20 x 10 ms = 6 ms), where the unbounded warm-up would have run 12 steps; the next probe waits
    until 3 % of the plain time of every step since the first covers what the warm-up lost and a probe's loss, and a
    probe that pays keeps them on."""
    loses = (1.0, 20.0, 1.0, 10.0)  # 10 ms lost per step; a plain step is 10 ms a token
    pays = (3.0, 12.0, 1.0, 10.0)
    side = B.SideBudget(FLAT, probe_len=3, warmup=12, horizon=20, trial_share=0.03)
    assert side.choose()
    side.record(*loses)
    assert not side.choose() and side.stats()["side_trials_cut"] == 1 and side.lost() == pytest.approx(10.0)
    # the warm-up lost 10 ms and a probe may lose 3 steps x 10 ms: 3 % of 10 ms a step covers 40 ms after 134 steps
    offs = 1
    while not side.choose():
        offs += 1
    assert offs == 132  # the warm-up's step and 132 plain steps, the 134th probes
    for _ in range(3):  # this probe pays: judged after its probe_len steps, on
        side.record(*pays)
        assert side.choose()
    # a step that loses 4 ms: after it, a second would pass the 6 ms (4 + 4 = 8): off after one, not after two
    mild = B.SideBudget(FLAT, probe_len=3, warmup=12, horizon=20, trial_share=0.03)
    assert mild.choose()
    mild.record(1.0, 14.0, 1.0, 10.0)
    assert not mild.choose() and mild.lost() == pytest.approx(4.0)  # within the allowance
    unbounded = B.SideBudget(FLAT, probe_len=3, warmup=12, trial_share=None, horizon=20)
    runs = 0
    while unbounded.choose() and runs < 50:
        unbounded.record(*loses)
        runs += 1
    assert runs == 12  # the whole warm-up, then off
    with pytest.raises(ValueError, match="trial_share"):
        B.SideBudget(FLAT, trial_share=1.5)


def test_a_warm_up_that_cannot_reach_its_verdict_is_not_run():
    """`side_rows`: two rows priced at 5 ms over a 10 ms plain step, a 12-step warm-up, 96 tokens: 12 x 5 = 60 ms
    against an allowance of 0.03 x 96 x 10 = 28.8 ms, so the warm-up could only end in its verdict if the rows paid
    from its first steps: they start off, and the first probe waits until 3 % of the plain time covers its 3 x 5 ms
    (50 steps). One row, 2 ms a step (24 ms): the warm-up runs as before. Rows that read only the compressed KV
    are priced at its length (here a curve 5x cheaper: 8 such rows, 2 ms)."""
    full = C.CostCurve.from_points({1: 10.0, 2: 12.0, 3: 15.0, 9: 20.0})
    compressed = C.CostCurve.from_points({1: 2.0, 9: 4.0})
    class Costs:  # a curve per context, as ContextCosts: the full KV at 500 tokens, the compressed one at 64
        def at(self, context):
            return full if context > 100 else compressed

    costs = Costs()
    dear = B.SideBudget(costs, context=500, probe_every=10, probe_len=3, warmup=12, horizon=96, side_rows=(2, 0))
    runs = [dear.choose() for _ in range(50)]
    assert runs == [False] * 49 + [True] and dear.stats()["side_warmup_skipped"]
    cheap = B.SideBudget(costs, context=500, probe_every=10, probe_len=3, warmup=12, horizon=96, side_rows=(1, 0))
    assert cheap.choose() and not cheap.stats()["side_warmup_skipped"]
    fumble = B.SideBudget(costs, context=500, cheap_context=64, probe_every=10, probe_len=3, warmup=12, horizon=96,
                          side_rows=(0, 8))
    assert fumble.choose() and not fumble.stats()["side_warmup_skipped"]
    dear_fumble = B.SideBudget(costs, context=500, cheap_context=64, probe_every=10, probe_len=3, warmup=12,
                               horizon=96, side_rows=(0, 40))  # 41 rows at 12 ms against 2: 10 ms over
    assert not dear_fumble.choose() and dear_fumble.stats()["side_warmup_skipped"]


@pytest.mark.parametrize("method, knob", [("lookahead", "window"), ("fafo", "streams")])
def test_side_rows_run_only_while_they_pay(method, knob):
    """Lookahead's window and FAFO's streams, "auto", the text's n-grams left out of the pool (so a step without
    the side rows is a plain step): with rows nearly free they run every step; when every row costs a whole
    forward they stop after the warm-up and run only as probes; the tokens stay the target's."""
    target = random_lm(seed=5, logit_scale=20.0)
    ids = repeating_prompt(30, 5, target.config.vocab_size)
    reference = generate("hf", target, ids, 96).new_tokens
    on = {}
    for name, curve in (("flat", FLAT), ("steep", STEEP)):
        result = generate(method, target, ids, 96, costs=curve, from_text=False, debug=True)
        assert result.new_tokens == reference, name
        assert result.stats["config"][knob] == "auto"
        # FAFO's prompt step is plain (its store prefills with the causal kernel alone): one step fewer
        on[name] = result.stats["side_on_steps"] / (result.target_forwards - (method == "fafo"))
    assert on["flat"] == 1.0 and on["steep"] < 0.6, on


@pytest.mark.parametrize("mode", ["sync", "thread"])
def test_card_drafts_only_while_it_beats_a_plain_step(mode):
    """CARD's width="auto": a drafted step, as measured, against a plain one priced at the curve's t(1) until a
    plain step is measured. A plain step priced at a second: drafting always wins; at a nanosecond: it stops after
    the warm-up and the target decodes plainly (probing now and then), its plain steps timed for the next probe;
    the tokens are the target's either way."""
    target, draft = random_lm(seed=5, logit_scale=20.0), random_lm(seed=9, layers=1)
    ids = repeating_prompt(30, 5, target.config.vocab_size)
    reference = generate("hf", target, ids, 64).new_tokens
    dear = generate("card", target, ids, 64, draft=draft, mode=mode, costs={1: 1000.0, 128: 1001.0})
    cheap = generate("card", target, ids, 64, draft=draft, mode=mode, costs={1: 1e-6, 128: 2e-6})
    assert dear.new_tokens == cheap.new_tokens == reference
    first = mode == "sync"  # sync mode's prompt step is plain (the drafter's prefill belongs to its first trial)
    assert dear.stats["plain_steps"] == first and dear.stats["config"]["width"] == "auto"
    assert cheap.stats["plain_steps"] > cheap.target_forwards / 3, cheap.stats["plain_steps"]
    assert dear.stats["plain_step_ms"] is None and cheap.stats["plain_step_ms"] > 1e-3  # measured: not the curve's
    fixed = generate("card", target, ids, 64, draft=draft, mode=mode, width=8)
    assert fixed.new_tokens == reference and fixed.stats["plain_steps"] == 0 and "side_on_steps" not in fixed.stats


# ---------------------------------------------------------------- the cost at a context

def test_context_costs_interpolate_in_the_prefix_and_never_fall():
    short = C.CostCurve.from_points({1: 5.0, 9: 6.0})
    long = C.CostCurve.from_points({1: 9.0, 9: 18.0})
    costs = C.ContextCosts({256: short, 1280: long})
    assert costs.at(0) is short and costs.at(256) is short
    assert costs(1, 768) == pytest.approx(7.0) and costs(9, 768) == pytest.approx(12.0)  # halfway
    assert costs(9, 2304) == pytest.approx(30.0)  # beyond the last prefix: its slope goes on (12 ms per 1024)
    assert costs.at(800) is costs.at(800 + C.CONTEXT_STEP - 800 % C.CONTEXT_STEP - 1)  # memoised per step
    noisy = C.ContextCosts({256: long, 1280: short})  # a longer prefix measured cheaper: noise, not a saving
    assert noisy(9, 5000) == long(9)
    assert C.CostCurve.from_points({1: 5.0}).at(10**6)(1) == 5.0  # one curve serves every context


@pytest.mark.measures_costs
def test_context_costs_measure_each_prefix_once(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(C, "_MEMO", {})
    model = random_lm(seed=3, context=512)
    costs = C.ContextCosts.measure(model, upto=300, prefixes=(64, 256, 400), rows=(1, 4), repeats=1)
    assert costs.prefixes == [64, 256]  # up to the context the generation reaches
    assert len(list((tmp_path / "costs").glob("curve_*.json"))) == 2
    costs = C.ContextCosts.measure(model, upto=10**4, prefixes=(64, 256, 400, 1024), rows=(1, 4), repeats=1)
    assert costs.prefixes == [64, 256, 400, 508]  # 1024 clipped to the model's context: 512 - 4 rows
    assert len(list((tmp_path / "costs").glob("curve_*.json"))) == 4  # 64 and 256 read back, not measured
    monkeypatch.setattr(C, "_MEMO", {})  # a new process: every curve read from its file
    again = C.ContextCosts.measure(model, upto=10**4, prefixes=(64, 256, 400, 1024), rows=(1, 4), repeats=1)
    assert again.prefixes == costs.prefixes and repr(again) == repr(costs)


def test_budgets_shrink_as_the_context_grows():
    costs = C.ContextCosts({256: FLAT, 16384: STEEP})  # rows nearly free at 256 tokens, a forward each at 16k
    chain = B.ChainBudget(costs, max_len=16, explore=0.0)
    tree = B.TreeBudget(costs, [4, 16, 64], probe_every=1000, decide_every=1)
    for _ in range(20):
        chain.record(16, 14)
        tree.record({16: (3, 17), 4: (2, 5), 64: (4, 65)}, verified=16)
    assert chain.choose(context=256) == 16 and chain.choose(context=16384) == 0  # 16k: no chain pays
    assert tree.choose(context=256)[0] == 64 and tree.choose(context=16384)[0] == 4
    assert B.TreeBudget(costs, [4, 16, 64], context=16384).choose()[0] == 4  # the first guess reads it too


def test_a_rung_that_drafts_nothing_is_never_the_first_guess_nor_taken_on_little_evidence():
    """Cacheback's TDL 2 is a plain step: the first guess starts at `first`, and the chooser falls to the plain
    step only after probe_every steps show drafting costs more than it yields (STEEP: every row a forward)."""
    chooser = B.TreeBudget(STEEP, [2, 4, 8], probe_every=6, decide_every=1, first=4)
    pick, picks = chooser.choose()[0], []
    assert pick == 4
    for _ in range(12):
        chooser.record({4: (1, 5), 2: (1, 1), 8: (1, 9)}, verified=pick)  # no draft token is ever accepted
        pick = chooser.choose()[0]
        picks.append(pick)
    assert picks[:4] == [4] * 4 and picks[-1] == 2, picks  # (step 6 probes 8)
    with pytest.raises(ValueError, match="first"):
        B.TreeBudget(STEEP, [2, 4], first=3)


def test_the_floor_at_first_lifts_once_its_steps_lose_their_share_of_the_horizon():
    """EAGLE's and Cacheback's floor (`first`) holds for probe_every steps, or until the steps held there have lost
    trial_share of the plain time of the `horizon` tokens: on STEEP each step at 4 costs 5 rows (50 ms) for one
    token (10 ms plain), 40 ms lost, so a 20-token horizon (3 %: 6 ms) lifts it after one step, 10 000 tokens
    (3 000 ms) never within probe_every."""
    def picks(horizon):
        chooser = B.TreeBudget(STEEP, [2, 4, 8], probe_every=6, decide_every=1, first=4, horizon=horizon)
        pick, out = chooser.choose()[0], []
        for _ in range(4):
            chooser.record({4: (1, 5), 2: (1, 1), 8: (1, 9)}, verified=pick)  # no draft token is ever accepted
            pick = chooser.choose()[0]
            out.append(pick)
        return out, chooser.floor_lost
    (short, lost), (long, _) = picks(20), picks(10_000)
    assert short == [2] * 4 and lost == pytest.approx(40.0), (short, lost)
    assert long == [4] * 4, long
    with pytest.raises(ValueError, match="horizon"):
        B.TreeBudget(STEEP, [2, 4], first=4, horizon=0)


def test_cheap_rows_are_priced_at_their_own_context():
    """FAFO's fumble rows read C(kv) only: a step of r full rows + 60 cheap ones costs t_ctx(r) + what the 60
    add at the compressed length."""
    costs = C.ContextCosts({128: C.CostCurve.from_points({1: 5.0, 61: 8.0, 128: 11.35}),
                            16384: C.CostCurve.from_points({1: 20.0, 128: 147.0})})
    chooser = B.TreeBudget(costs, [0, 1, 4], context=16384, cheap_rows=60, cheap_context=128)
    assert chooser.step_ms(1) == pytest.approx(20.0 + 8.0 - 5.0)
    assert chooser.step_ms(5) == pytest.approx(24.0 + (8.0 + 0.05 * 4) - (5.0 + 0.05 * 4))
    # the first guess, the largest nearly free (<= 1.15 x a root-only step, 23 ms): one candidate (24 ms), not four
    assert chooser.choose()[0] == 1  # (27 ms); priced all at 16k, the 60 rows alone would cost 60 ms more
    assert B.TreeBudget(costs, [0, 1, 4], context=16384).step_ms(61) == pytest.approx(80.0)


# ---------------------------------------------------------------- the methods

def test_bad_settings():
    with pytest.raises(TypeError, match="auto"):
        generate("cacheback", random_lm(), repeating_prompt(12, 0), 4, tdl="fast")
    with pytest.raises(ValueError, match="costs"):
        generate("prompt_lookup", random_lm(), repeating_prompt(12, 0), 4, num_tokens=4, costs={1: 1.0})
    with pytest.raises(TypeError, match="costs"):
        generate("prompt_lookup", random_lm(), repeating_prompt(12, 0), 4, num_tokens="auto", costs=[1.0])
    with pytest.raises(ValueError, match="adaptive"):
        generate("draft_model", random_lm(), repeating_prompt(12, 0), 4, draft=random_lm(seed=1), gamma="auto",
                 adaptive=True)
    with pytest.raises(ValueError, match="crt"):
        generate("cacheback", random_lm(), repeating_prompt(12, 0), 4, tdl="auto", crt=200)
    with pytest.raises(ValueError, match="costs"):
        generate("fafo", random_lm(), repeating_prompt(12, 0), 4, candidates=3, streams=4, costs={1: 1.0})
    with pytest.raises(ValueError, match="costs"):
        generate("lookahead", random_lm(), repeating_prompt(12, 0), 4, guesses=3, window=4, costs={1: 1.0})
    with pytest.raises(TypeError, match="auto"):
        generate("card", random_lm(), repeating_prompt(12, 0), 4, draft=random_lm(seed=1), query="long")
    with pytest.raises(ValueError, match="costs"):
        generate("card", random_lm(), repeating_prompt(12, 0), 4, draft=random_lm(seed=1), width=8, costs={1: 1.0})


AUTO = {"cacheback": dict(tdl="auto"), "prompt_lookup": dict(num_tokens="auto"), "draft_model": dict(gamma="auto"),
        "lookahead": dict(guesses="auto"), "fafo": dict(candidates="auto"), "card": dict(query="auto", width=8)}


def _auto(method, curve):
    kwargs = dict(AUTO[method], costs=curve)
    if method == "draft_model":
        kwargs["draft_costs"] = C.CostCurve.from_points({1: 2.0, 128: 4.0})
    return kwargs


def _budgets(result, method):
    """The draft sizes the steps ran with (every method records them under one key)."""
    return [s["draft_size"] for s in result.stats["steps"] if "draft_size" in s]


@pytest.mark.parametrize("method", sorted(AUTO))
def test_auto_is_lossless_and_deterministic(tiny_pair64, tiny_pair, method):
    target, draft, _ = tiny_pair64
    means = []
    for text in SHIPPED_PROMPTS:
        ids = tiny_pair.encode(text)
        reference = generate("hf", target, ids, 48).new_tokens
        runs = {name: [generate(method, target, ids, 48, draft=draft, debug=True, **_auto(method, curve))
                       for _ in range(2)] for name, curve in (("flat", FLAT), ("steep", STEEP))}
        for name, (a, b) in runs.items():
            assert a.new_tokens == b.new_tokens == reference, (text, name)
            assert _budgets(a, method) == _budgets(b, method)  # same curve, same history: same choices
        means.append([np.mean(_budgets(runs[n][0], method)[1:]) for n in ("flat", "steep")])
    flat, steep = np.array(means).T
    assert steep.mean() < flat.mean(), means  # expensive rows: smaller budgets (on average: probes explore)


@pytest.mark.parametrize("method", ["cacheback", "prompt_lookup", "lookahead", "fafo"])
def test_auto_sampling_matches_autoregressive(method):
    """Deterministic drafts + one seeded draw per emitted token: the tokens are autoregressive's, whatever
    budget the chooser picks."""
    target = random_lm(seed=5, logit_scale=20.0)
    ids = repeating_prompt(30, 5, target.config.vocab_size)
    for kwargs, expected in autoregressive_samples(target, ids, 24, seeds=range(3)):
        result = generate(method, target, ids, 24, **kwargs, **_auto(method, FLAT))
        assert result.new_tokens == expected, kwargs


def test_draft_model_auto_sampling_is_seeded():
    target, draft = random_lm(seed=6, logit_scale=5.0), random_lm(seed=7, layers=1, logit_scale=5.0)
    ids = repeating_prompt(20, 6, target.config.vocab_size)
    runs = [generate("draft_model", target, ids, 24, draft=draft, temperature=0.8, seed=11,
                     **_auto("draft_model", FLAT)) for _ in range(2)]
    assert runs[0].new_tokens == runs[1].new_tokens and len(runs[0].new_tokens) == 24


@pytest.mark.parametrize("method", ["cacheback", "prompt_lookup", "fafo"])
def test_auto_budgets_follow_the_context_and_stay_lossless(method):
    """Rows free up to 64 tokens of context and a whole forward each from 96 on: the budgets late in the
    generation are smaller than early ones, and the tokens are still the target's own."""
    target = random_lm(seed=5, logit_scale=20.0)
    ids = repeating_prompt(30, 5, target.config.vocab_size)
    reference = generate("hf", target, ids, 96).new_tokens
    result = generate(method, target, ids, 96, **_auto(method, C.ContextCosts({64: FLAT, 96: STEEP})))
    assert result.new_tokens == reference
    sizes = _budgets(result, method)
    assert max(sizes[:3]) > max(sizes[-3:]), sizes


def test_budget_figure_draws_the_chosen_budgets():
    from specdec_lib import viz

    target = random_lm(seed=5, logit_scale=20.0)
    ids = repeating_prompt(30, 5, target.config.vocab_size)
    result = generate("cacheback", target, ids, 24, **_auto("cacheback", STEEP))
    fig = viz.budget_figure(result)
    bars, line = fig.data
    assert list(bars.y) == [s["emitted"] for s in result.stats["steps"]]
    assert list(line.y) == _budgets(result, "cacheback") and line.name == "draft size"
    fixed = viz.budget_figure(generate("cacheback", target, ids, 8, tdl=8))  # a fixed budget: a flat line
    assert set(fixed.data[1].y) == {8}
    with pytest.raises(ValueError, match="draft_size"):
        viz.budget_figure(generate("autoregressive", target, ids, 8))
