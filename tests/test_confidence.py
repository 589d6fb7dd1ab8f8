"""EAGLE's "auto" budget from the head's own confidence (mechanisms/confidence.py), on synthetic curves and
verdicts (the arithmetic of each decision), then on the tiny pair (lossless, priced, seeded)."""
from __future__ import annotations

import pytest

from specdec_lib import generate
from specdec_lib.mechanisms import confidence as K
from specdec_lib.mechanisms.cost_curve import CostCurve
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
    assert 0.75 < b.value(0.35) < 0.85 and b.value(0.95) == pytest.approx(0.95)  # other bins untouched
    # a node whose parent was rejected was never judged: it teaches nothing
    before = b.value(0.75)
    b.record([ROOT, 0], [0.35, 0.75], [], 0.0)
    assert b.value(0.75) == before


@pytest.mark.parametrize("curve, expected", [(FLAT, 12), (MID, 6), (STEEP, 0)])
def test_the_size_is_the_ladder_rung_that_saves_the_most(curve, expected):
    """Node values 0.9, 0.8, ... 0.1, then 0.0001s: rows nearly free keep every node worth more than its row (the
    12 best; a 0.0001 node saves 0.001 ms against a row's 0.004); rows of 0.3 of a step keep the nodes worth more
    than 0.3 (6, the rung nearest the 7 that pay); rows costing a forward each keep none (no node is worth a
    whole step)."""
    values = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.1, 0.1, 0.1] + [0.0001] * 20
    b = budget(curve)
    size = b.size(values)
    rungs = [r for r in BUDGET_LADDER if r <= len(values)]
    saving = {r: sum(values[:r]) * b.t1 - (b.step_ms(r + 1) - b.t1) for r in rungs}
    assert size == expected == max(rungs, key=lambda r: (saving[r], -r))
    assert b.expected == pytest.approx(saving[size])  # what the step is expected to save (no drafting ms given)
    assert b.gain == pytest.approx((1 + sum(values[:size])) * b.t1 / b.step_ms(size + 1))


def test_a_further_depth_is_drafted_only_where_it_pays_the_head_forward():
    frontier = [0.8, 0.5, 0.2, 0.0001]
    cheap, dear = budget(head_ms=0.5), budget(head_ms=50.0)
    assert cheap.expand(frontier) == 3  # the 0.0001 node's children do not pay their verify row
    assert dear.expand(frontier) == 0  # a forward dearer than the tokens it can add: stop
    assert budget(STEEP, head_ms=0.0).expand(frontier) == 0  # no child pays a whole step's row


def test_drafting_stops_where_it_loses_and_is_probed_again_within_the_trial_share():
    b = budget(head_ms=5.0, probe_every=16)
    plan = []
    loss = 5.0 + b.step_ms(2) - b.t1  # nothing is ever accepted: each drafted step loses its head forward and a row
    for step in range(200):
        drafts = b.drafting(100)
        plan.append(drafts)
        if drafts:
            b.record([ROOT], [0.9], [], -loss)
    assert all(plan[:K.WARMUP])  # an opening is judged on WARMUP drafted steps, never on one
    probes = [i for i, d in enumerate(plan) if d and i >= K.WARMUP]
    gaps = [later - earlier for earlier, later in zip(probes, probes[1:])]
    assert probes and min(gaps) > 16  # plain runs of probe_every steps or more, the loss within the share
    assert sum(plan) * loss <= K.TRIAL_SHARE * 200 * b.t1 + K.WARMUP * loss
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


def test_eagle_auto_is_lossless_priced_by_its_head_and_learns_the_calibration(tiny_pair64, tiny_pair):
    """The same rows nearly free, the head free or a hundred steps per forward: a dear head drafts at most the
    warm-up's trees and then decodes plainly (probes aside), a free one drafts deep trees; the tokens are the
    target's either way; an injected price is never moved by the clock."""
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
    timed = generate("eagle", target, ids, 48, costs=flat, debug=True)
    assert timed.new_tokens == reference and timed.stats["head_ms"] > 0


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
