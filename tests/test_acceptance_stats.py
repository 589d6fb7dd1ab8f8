"""bench.acceptance (notebook 04): acceptance by draft depth counted from the step records, the i.i.d. alpha and
E[tokens] by depth, the tested positions, the overlap sum_x min(p, q) of the two models (the acceptance of
speculative sampling, argmax agreement when greedy), and their two figures. Real runs on the shipped tiny pair."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specdec_lib import generate
from specdec_lib.bench import acceptance as acc
from specdec_lib.bench.costs import expected_tokens_per_step, measured_agreement
from specdec_lib.mechanisms import verify
from specdec_lib.viz import acceptance as viz_acceptance

from helpers import SHIPPED_PROMPTS

# gamma 3: 1 of 3 accepted, 3 of 3, 0 of 3, a step capped at 2 drafts (both accepted), a step that drafted nothing
RECORDS = [dict(tree_size=3, depth=3, accepted=1, emitted=2, full=False),
           dict(tree_size=3, depth=3, accepted=3, emitted=4, full=True),
           dict(tree_size=3, depth=3, accepted=0, emitted=1, full=False),
           dict(tree_size=2, depth=2, accepted=2, emitted=3, full=True),
           dict(tree_size=0, depth=0, accepted=0, emitted=1, full=True)]


def test_depth_counts_of_hand_made_records():
    table = acc.acceptance_by_depth(RECORDS)
    assert table.depth.tolist() == [1, 2, 3]
    assert table.reached.tolist() == [4, 3, 1]  # depth 3: only the full step (the capped one had no depth 3)
    assert table.accepted.tolist() == [3, 2, 1]
    np.testing.assert_allclose(table.rate, [3 / 4, 2 / 3, 1.0])
    np.testing.assert_allclose(table.share_reached, [1.0, 3 / 4, 1 / 4])
    assert acc.pooled_acceptance(table) == pytest.approx(6 / 8)
    assert acc.acceptance_by_depth([RECORDS[:2], RECORDS[2:]]).equals(table)  # several runs pool
    deeper = acc.acceptance_by_depth(RECORDS, max_depth=4)
    assert deeper.reached.tolist()[-1] == 0 and math.isnan(deeper.rate.iloc[-1])
    with pytest.raises(ValueError, match="tree"):
        acc.acceptance_by_depth([dict(tree_size=5, depth=2, accepted=1)])
    assert acc.tested_positions(SimpleNamespace(stats=dict(steps=RECORDS), new_tokens=[0] * 11)) == [
        True, True, True, True, True, False, True, True, True, False, False]


def test_expected_tokens_by_depth():
    for a, g in ((0.3, 1), (0.7, 4), (1.0, 3), (0.0, 2)):
        assert acc.expected_tokens_by_depth([a] * g) == pytest.approx(expected_tokens_per_step(a, g))
    assert acc.expected_tokens_by_depth([0.5, 1.0, 0.2]) == pytest.approx(1 + 0.5 + 0.5 + 0.1)
    with pytest.raises(ValueError):
        acc.expected_tokens_by_depth([0.5, float("nan")])
    with pytest.raises(ValueError):
        acc.expected_tokens_by_depth([1.2])


@pytest.fixture(scope="module")
def greedy_runs(tiny_pair64, tiny_pair):
    target, draft, _ = tiny_pair64
    runs = [generate("draft_model", target, tiny_pair.encode(p), 48, draft=draft, gamma=4, debug=True)
            for p in SHIPPED_PROMPTS]
    return target, draft, runs


def test_depth_counts_of_real_runs_equal_counts_by_hand(greedy_runs, tiny_pair):
    target, draft, runs = greedy_runs
    table = acc.acceptance_by_depth(runs)
    reached, accepted = [0] * 5, [0] * 5
    steps = [s for r in runs for s in r.stats["steps"] if s["tree_size"]]
    for s in steps:  # a chain tests depths 1.. until its first rejection or its end
        for d in range(1, min(s["accepted"] + 1, s["depth"]) + 1):
            reached[d] += 1
        for d in range(1, s["accepted"] + 1):
            accepted[d] += 1
    assert table.reached.tolist() == reached[1:] and table.accepted.tolist() == accepted[1:]
    assert table.reached.iloc[0] == len(steps) and table.reached.is_monotonic_decreasing
    summary = acc.acceptance_summary(runs)
    assert table.accepted.sum() == summary["accepted"] == sum(r.stats["accepted"] for r in runs)
    assert summary["drafted"] == sum(r.stats["drafted"] for r in runs)
    assert summary["mat"] == pytest.approx(sum(len(r.new_tokens) for r in runs) / sum(r.target_forwards for r in runs))
    # the rates of the steps that drafted all 4 telescope: their product formula is the measured tokens per step
    full = [s for s in steps if s["depth"] == 4]
    rates = acc.acceptance_by_depth(full).rate.fillna(0.0)
    assert acc.expected_tokens_by_depth(rates) == pytest.approx(np.mean([s["accepted"] + 1 for s in full]))
    # every test is one tested position, and greedy acceptance is the argmax agreement there, exactly
    tested = [acc.tested_positions(r) for r in runs]
    assert sum(map(sum, tested)) == table.reached.sum()
    for prompt, run, flags in zip(SHIPPED_PROMPTS, runs, tested):
        ids = tiny_pair.encode(prompt)[0].tolist()
        beta = acc.overlap_along(target, draft, ids + run.new_tokens, len(ids), [0.0])[0]
        assert beta.shape == (len(run.new_tokens),)
        drafts = [kind for kind, flag in zip(_kinds(run), flags) if flag]
        assert beta[np.array(flags)].tolist() == [1.0 if k == "draft" else 0.0 for k in drafts]


def _kinds(run):
    return viz_acceptance.token_kinds(run)[1]


def test_overlap_is_the_acceptance_of_speculative_sampling():
    gen = torch.Generator().manual_seed(0)
    p_logits, q_logits = torch.randn(6, 50, generator=gen) * 3, torch.randn(6, 50, generator=gen) * 3
    for t in (0.5, 1.0, 2.0):
        beta = acc.overlap(p_logits, q_logits, t)
        p, q = (p_logits / t).softmax(-1), (q_logits / t).softmax(-1)
        torch.testing.assert_close(beta, 1 - 0.5 * (p - q).abs().sum(-1))  # 1 - total variation
        torch.testing.assert_close(beta, (q * verify.accept_probability(p, q)).sum(-1))  # E_{x~q} min(1, p/q)
        torch.testing.assert_close(acc.overlap(p_logits, p_logits, t), torch.ones(6))
    agree = (p_logits.argmax(-1) == q_logits.argmax(-1)).float()
    assert acc.overlap(p_logits, q_logits, 0.0).tolist() == agree.tolist()
    top = acc.overlap(p_logits, q_logits, 1.0, top_k=1)  # top-1 sampling is greedy
    assert top.tolist() == acc.overlap(p_logits, q_logits, 0.0).tolist()
    with pytest.raises(ValueError, match="shape"):
        acc.overlap(p_logits, q_logits[:, :10], 1.0)


def test_overlap_along_a_text_at_temperature_zero_is_the_measured_agreement(tiny_pair):
    ids = tiny_pair.encode(SHIPPED_PROMPTS[0])[0].tolist()
    beta = acc.overlap_along(tiny_pair.target, tiny_pair.draft, ids, 1, [0.0, 1.0])
    assert beta.shape == (2, len(ids) - 1) and ((beta >= 0) & (beta <= 1 + 1e-6)).all()
    assert beta[0].mean() == pytest.approx(measured_agreement(tiny_pair.target, tiny_pair.draft, [ids[:-1]]))
    with pytest.raises(ValueError, match="start"):
        acc.overlap_along(tiny_pair.target, tiny_pair.draft, ids, len(ids), [1.0])


def test_sampled_acceptance_matches_the_overlap_at_the_tested_positions(tiny_pair, one_thread):
    """Speculative sampling accepts a test with probability sum_x min(p, q) of its prefix: over a few seeded runs at
    T = 1, the measured accepted / tested is the mean overlap at the tested positions, within sampling noise."""
    ids = tiny_pair.encode(SHIPPED_PROMPTS[1])
    hits, expected, variance = 0, 0.0, 0.0
    for seed in range(4):
        run = generate("draft_model", tiny_pair.target, ids, 64, draft=tiny_pair.draft, gamma=3, temperature=1.0,
                       seed=seed)
        flags = np.array(acc.tested_positions(run))
        beta = acc.overlap_along(tiny_pair.target, tiny_pair.draft, ids[0].tolist() + run.new_tokens, ids.shape[1],
                                 [1.0])[0][flags]
        table = acc.acceptance_by_depth(run)
        assert table.reached.sum() == flags.sum()
        hits += table.accepted.sum()
        expected += beta.sum()
        variance += (beta * (1 - beta)).sum()
    assert abs(hits - expected) <= 4 * math.sqrt(variance) + 1, (hits, expected, variance)


def test_depth_and_temperature_figures_carry_the_numbers():
    import pandas as pd

    table = acc.acceptance_by_depth(RECORDS)
    fig = viz_acceptance.depth_acceptance_figure(table)
    bars, reach, iid = fig.data
    np.testing.assert_allclose(bars.y, table.rate)
    assert [tuple(c) for c in bars.customdata] == [(3, 4), (2, 3), (1, 1)]
    np.testing.assert_allclose(reach.y, table.share_reached)
    np.testing.assert_allclose(iid.y, [0.75 ** (d - 1) for d in (1, 2, 3)])
    assert fig.layout.shapes[0].y0 == pytest.approx(0.75)  # the pooled alpha
    temps = pd.DataFrame(dict(temperature=[1.0, 0.0], acceptance_rate=[0.4, 0.6], test_rate=[0.5, 0.7],
                              overlap=[0.52, 0.7], mat=[1.8, 2.2], accepted=[40, 60], drafted=[100, 100]))
    fig = viz_acceptance.temperature_acceptance_figure(temps)
    assert [t.name for t in fig.data][:3] == ["accepted / drafted", "accepted / tested (P(accept | reached))",
                                             "predicted: mean sum_x min(p, q)"]
    assert list(fig.data[0].x) == [0.0, 1.0] and list(fig.data[0].y) == [0.6, 0.4]  # sorted by temperature
    assert list(fig.data[-1].y) == [2.2, 1.8]
    bare = viz_acceptance.temperature_acceptance_figure(temps[["temperature", "acceptance_rate", "mat"]])
    assert len(bare.data) == 2
