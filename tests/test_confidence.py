"""EAGLE's "auto" budget from the head's own confidence (mechanisms/budget/confidence.py), on synthetic curves and
verdicts (the arithmetic of each decision), then on the tiny pair (lossless, priced, seeded)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from specdec_lib import generate
from specdec_lib.mechanisms.budget import confidence as K
from specdec_lib.mechanisms.budget.cost_curve import CostCurve
from specdec_lib.mechanisms.draft_tree import ROOT
from specdec_lib.methods.eagle import BUDGET_LADDER

from helpers import SHIPPED_PROMPTS

pytestmark = pytest.mark.usefixtures("one_thread")

FLAT = CostCurve.from_points({1: 10.0, 128: 10.5})  # extra rows nearly free (a GPU)
STEEP = CostCurve.from_points({1: 10.0, 2: 20.0, 128: 1280.0})  # every row costs a whole forward
MID = CostCurve.from_points({1: 10.0, 128: 391.0})  # each row 3 ms, 0.3 of a plain step


def budget(curve=FLAT, head_ms=1.0, **kwargs):
    return K.ConfidenceBudget(curve, BUDGET_LADDER, head_ms, **kwargs)


def test_calibration_starts_at_the_heads_probability_and_learns_the_targets_verdicts():
    b = budget()
    assert b.value(0.35) == pytest.approx(0.35) and b.value(0.95) == pytest.approx(0.95)  # bin middles
    for step in range(40):  # one node, q = 0.35, accepted 4 times in 5: the head is under-confident there
        b.record([ROOT], [0.35], [0] if step % 5 else [], 0.0)
    # bin [0.3, 0.4): prior 2 pseudo-counts at 0.35 (0.7 accepted), then 40 verdicts of which 32 accepted:
    # (0.7 + 32) / (2 + 40) = 32.7 / 42 = 0.7786
    assert b.value(0.35) == pytest.approx(0.778571, abs=1e-6)
    assert b.value(0.95) == pytest.approx(0.95)  # other bins untouched
    # a node whose parent was rejected was never judged: it teaches nothing
    before = b.value(0.75)
    b.record([ROOT, 0], [0.35, 0.75], [], 0.0)
    assert b.value(0.75) == before


# t(rows) of the three curves, worked out by hand from their points (t(1) = 10 ms for each)
BY_HAND = {"FLAT": lambda r: 10.0 + 0.5 * (r - 1) / 127,  # 0.5 ms over 127 rows
           "MID": lambda r: 10.0 + 3.0 * (r - 1),  # 381 ms over 127 rows: 3 ms a row
           "STEEP": lambda r: 10.0 * r}  # 20 ms at 2 rows, then 1260 ms over 126 rows: 10 ms a row


@pytest.mark.parametrize("name, curve, expected, saved, gain", [
    # 12 nodes: their values sum to 4.8, so 48 ms of plain steps for 12 rows of 0.5 / 127 ms; over the 13 rows
    ("FLAT", FLAT, 12, 48.0 - 12 * 0.5 / 127, 58.0 / (10.0 + 12 * 0.5 / 127)),
    # 6 nodes: 3.9 x 10 ms - 6 rows x 3 ms = 21 ms; 4.9 tokens x 10 ms over t(7) = 28 ms
    ("MID", MID, 6, 21.0, 49.0 / 28.0),
    # no node pays its row (each < 1 token for 10 ms): a plain verify, 1 token in t(1)
    ("STEEP", STEEP, 0, 0.0, 1.0)])
def test_the_size_is_the_ladder_rung_that_saves_the_most(name, curve, expected, saved, gain):
    """Node values 0.9, 0.8, ... 0.1, then 0.0001s: rows nearly free keep every node worth more than its row (the
    12 best; a 0.0001 node saves 0.001 ms against a row's 0.004); rows of 0.3 of a step keep the nodes worth more
    than 0.3 (6, the rung nearest the 7 that pay); rows costing a forward each keep none (no node is worth a
    whole step)."""
    values = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.1, 0.1, 0.1] + [0.0001] * 20
    b = budget(curve)
    size = b.size(values)
    # brute force over the rungs that fit, on the hand-made prices: E tokens x t(1) - the extra rows' price
    t = BY_HAND[name]
    rungs = [0, 1, 2, 4, 6, 8, 12, 16, 24, 32]
    saving = {r: sum(values[:r]) * t(1) - (t(r + 1) - t(1)) for r in rungs}
    assert size == expected == max(rungs, key=lambda r: (saving[r], -r))
    assert b.expected == pytest.approx(saved) == saving[size]  # what the step is expected to save (no drafting ms)
    assert b.gain == pytest.approx(gain)


def test_a_further_depth_is_drafted_only_where_it_pays_the_head_forward():
    frontier = [0.8, 0.5, 0.2, 0.0001]
    cheap, dear = budget(head_ms=0.5), budget(head_ms=50.0)
    assert cheap.expand(frontier) == 3  # the 0.0001 node's children do not pay their verify row
    assert dear.expand(frontier) == 0  # a forward dearer than the tokens it can add: stop
    assert budget(STEEP, head_ms=0.0).expand(frontier) == 0  # no child pays a whole step's row


def test_drafting_stops_where_it_loses_and_is_probed_again_within_the_trial_share():
    b = budget(head_ms=5.0, probe_every=16)
    plan = []
    # nothing is ever accepted: each drafted step loses its head forward and a row, t(2) - t(1) = 0.5 / 127 ms
    loss = 5.0 + 0.5 / 127
    for step in range(200):
        drafts = b.drafting(100)
        plan.append(drafts)
        if drafts:
            b.record([ROOT], [0.9], [], -loss)
    assert all(plan[:K.WARMUP])  # an opening is judged on WARMUP drafted steps, never on one
    probes = [i for i, d in enumerate(plan) if d and i >= K.WARMUP]
    gaps = [later - earlier for earlier, later in zip(probes, probes[1:])]
    assert probes and min(gaps) > 16  # plain runs of probe_every steps or more, the loss within the share
    assert sum(plan) * loss <= K.TRIAL_SHARE * 200 * 10.0 + K.WARMUP * loss  # t(1) = 10 ms
    # by hand: 8 warm-up steps (0-7), then ceil(5.004 ms / (3 % x 10 ms)) = 17 plain steps (> probe_every) before
    # each probe: probes at 8 + 17 = 25, then every 18th step
    assert probes == list(range(25, 200, 18)) and sum(plan) == 8 + 10
    assert b.stats()["plain_steps"] == 200 - sum(plan)


def test_a_probe_that_pays_turns_drafting_back_on():
    b = budget(head_ms=1.0, probe_every=4)
    for _ in range(K.WARMUP):
        b.drafting(100)
        b.record([ROOT], [0.9], [], -1.0)
    assert b.saving < 0
    while not b.drafting(100):
        pass
    for _ in range(3):  # the text turned easy: long chains, expected to save several plain steps
        b.record([ROOT, 0, 1, 2], [0.9] * 4, [0, 1, 2, 3], 30.0)
    assert b.saving > 0 and all(b.drafting(100) for _ in range(10))


def test_eagle_auto_is_lossless_priced_by_its_head_and_learns_the_calibration(tiny_pair64, tiny_pair, monkeypatch):
    """The same rows nearly free, the head free or a hundred steps per forward: a dear head drafts at most the
    warm-up's trees and then decodes plainly (probes aside), a free one drafts deep trees; the tokens are the
    target's either way; an injected price is never moved by the clock, a measured one moves to what drafting
    took per head forward."""
    target = tiny_pair64[0]
    ids = tiny_pair.encode(SHIPPED_PROMPTS[0])
    reference = generate("hf", target, ids, 48).new_tokens
    flat = {1: 1.0, 128: 1.05}
    free = generate("eagle", target, ids, 48, costs=flat, head_ms=0.0, debug=True)
    dear = generate("eagle", target, ids, 48, costs=flat, head_ms=100.0, debug=True)
    assert free.new_tokens == dear.new_tokens == reference
    sizes = {name: [s["draft_size"] for s in r.stats["steps"] if "draft_size" in s] for name, r in
             (("free", free), ("dear", dear))}
    assert sum(sizes["dear"]) < sum(sizes["free"]) and dear.stats["plain_steps"] > 0, sizes
    assert free.stats["plain_steps"] == 0 and max(sizes["free"]) >= 8, sizes
    assert dear.stats["head_ms"] == 100.0 and free.stats["head_ms"] == 0.0  # injected: as given
    assert sum(free.stats["calibration_counts"]) > 0  # the verdicts were counted
    # a measured price moves to what drafting took per head forward: on a clock that advances 0.05 ms in each
    # head forward and never otherwise, every drafted step took exactly 0.05 ms per forward (the start, timed on
    # that clock by bare head forwards outside the method's own, is 0 ms, or cached or estimated elsewhere)
    from specdec_lib.methods import eagle as E

    clock = [100.0]
    head = E.Eagle._head

    def ticking_head(self, *args, **kwargs):
        clock[0] += 5e-5
        return head(self, *args, **kwargs)
    monkeypatch.setattr(E, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(E.Eagle, "_head", ticking_head)
    timed = generate("eagle", target, ids, 48, costs=flat, debug=True)
    assert timed.new_tokens == reference
    assert timed.stats["head_ms"] == pytest.approx(0.05, abs=1e-3), timed.stats
    drafted = sum(1 for s in timed.stats["steps"] if s.get("draft_size"))
    assert timed.stats["head_forwards"] > drafted > 0  # some steps ran several head forwards: ms / forwards


def test_seeded_sampling_learns_no_timing(tiny_pair):
    """Under sampling the head's price is never moved by the clock: two runs of one seed draft the same trees
    and end with the same estimates (the budget's choices, then the draws, would otherwise follow the machine)."""
    ids = tiny_pair.encode(SHIPPED_PROMPTS[0])
    flat = {1: 1.0, 128: 1.05}
    run = lambda: generate("eagle", tiny_pair.target, ids, 40, costs=flat, temperature=0.8, seed=5,  # noqa: E731
                           debug=True)
    a, b = run(), run()
    assert a.new_tokens == b.new_tokens and a.accept_lengths == b.accept_lengths
    assert a.stats["head_ms"] == b.stats["head_ms"] and a.stats["calibration"] == b.stats["calibration"]
    assert [s.get("draft_size") for s in a.stats["steps"]] == [s.get("draft_size") for s in b.stats["steps"]]
