"""FAFO (methods/fafo.py): the pool, the fused forward's fumble rows against a naive recompute, clean-up, errors.

Greedy parity, EOS, max_new_tokens and the sampling distribution come from test_contract.py (fafo is registered).
"""
from __future__ import annotations

import copy

import pytest
import torch

from helpers import SHIPPED_PROMPTS, random_lm
from specdec_lib import generate
from specdec_lib.loop import LoopState
from specdec_lib.decoding import Request
from specdec_lib.mechanisms.store.compression import StreamingLLM
from specdec_lib.mechanisms.verify import commit, forward_spec, verify
from specdec_lib.methods.fafo import Fafo, FumblePool


def test_pool_longest_prefix_first_capped_lru():
    pool = FumblePool(cap=2)
    pool.add([1, 2, 3], (7, 8))  # cached under (3,), (2, 3), (1, 2, 3)
    pool.add([9, 3], (5, 6))  # under (3,), (9, 3)
    assert pool.lookup([0, 1, 2, 3], n=5, max_prefix=3) == [(3, (7, 8)), (1, (5, 6))]
    pool.add([3], (4, 4))  # (3,) now holds three: the least recently used, (7, 8), goes
    assert [sub for _, sub in pool.lookup([5, 3], n=5, max_prefix=3)] == [(4, 4), (5, 6)]
    assert pool.lookup([0, 1, 2, 3], n=1, max_prefix=3) == [(3, (7, 8))]  # still under the longer prefixes
    assert pool.lookup([42], n=3, max_prefix=3) == []


def test_pool_from_text_caches_each_run_under_the_tokens_before_it():
    pool = FumblePool(cap=3)
    pool.add_text([1, 2, 3, 4, 5, 1, 2, 3], k=2)  # (3, 4) under (1, 2) and (2,), (4, 5) under (2, 3), ...
    assert pool.lookup([9, 1, 2], n=3, max_prefix=2) == [(2, (3, 4))]
    assert pool.lookup([9, 5, 1], n=3, max_prefix=2) == [(2, (2, 3))]  # (1,) holds (2, 3) again: one candidate
    pool.add_text([1, 2, 3, 4, 5, 1, 2, 3, 6, 6], k=2, start=7)  # only the runs the new tokens complete
    assert [sub for _, sub in pool.lookup([0, 2, 3], n=3, max_prefix=2)] == [(6, 6), (4, 5)]
    # the size is counted as entries come and go (evictions included), not recounted over the table
    for i in range(20):
        pool.add([i % 4], (i, i))
    assert len(pool) == sum(len(entries) for entries in pool.table.values())


def test_paper_pool_and_row_budget_are_lossless(tiny_pair):
    """The paper's FAFO as written (the streams' pool, n candidates) and the default (text in the pool, a budget of
    verified rows from the cost curve): both emit greedy decoding's tokens; the budget counts tree nodes."""
    target = tiny_pair.target
    ids = tiny_pair.encode(SHIPPED_PROMPTS[0])
    want = generate("autoregressive", target, ids, 32).new_tokens
    paper = generate("fafo", target, ids, 32, from_text=False, candidates=None, streams=4, guess_len=3)
    ours = generate("fafo", target, ids, 32, streams=4, guess_len=3)
    assert paper.new_tokens == want and ours.new_tokens == want
    assert not paper.stats["config"]["from_text"] and ours.stats["config"]["from_text"]
    assert all(s["tree_size"] <= s["draft_size"] for s in ours.stats["steps"] if "draft_size" in s)
    assert ours.stats["pool_size"] > paper.stats["pool_size"]  # the prompt's runs are in the pool too


def test_fumble_rows_see_compressed_kv_and_their_stream_only():
    """Step 2 of a run: each stream's last row equals a naive forward over the LOGICAL text with an explicit mask
    (C's positions, the root, the stream's earlier tokens), float64."""
    from specdec_lib import SamplingConfig

    target = random_lm("llama", layers=2, seed=5, logit_scale=4.0)
    ids = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(2))
    work = copy.deepcopy(target)  # the copy runs through the store; `target` stays the sdpa reference
    req = Request(work, ids, 10, SamplingConfig(), None, None)
    fafo = Fafo(streams=3, guess_len=4, kv_budget=12, sinks=2, block=16)
    state = LoopState(req, ids[0].tolist())
    fafo.start(state)
    store = fafo.target_cache(state)
    try:
        spec = forward_spec(work)
        for step in range(2):
            streams = [list(s) for s in fafo.streams]  # what this step's fumble rows hold
            verdict = verify(work, store, fafo.propose(state, 9), state.committed, spec=spec)
            commit(store, verdict.prefix_len, [])  # keep the root only (a plain step)
            state.committed.append(verdict.next_token)
            if step == 0:
                fafo.observe(state, verdict)
    finally:
        fafo.finish(state)
    # the second forward: 40 committed entries cached (the prompt), the root at position 40
    cached, root = 40, state.committed[40]
    positions = torch.arange(cached)
    keep = (positions < 2) | (positions >= cached - 10)  # StreamingLLM(2, 10) over positions 0..39
    hidden = torch.finfo(torch.float64).min
    for i, stream in enumerate(streams):
        rows = [root] + stream
        mask = torch.full((cached + 5, cached + 5), hidden, dtype=torch.float64)
        mask[:cached, :cached].masked_fill_(torch.ones(cached, cached, dtype=torch.bool).tril(), 0)  # the text
        mask[cached:, :cached][:, keep] = 0  # root and stream rows see C(kv) ...
        mask[cached:, cached:].masked_fill_(torch.ones(5, 5, dtype=torch.bool).tril(), 0)  # ... and each other
        mask[cached, :cached] = 0  # the root (a verify row) sees everything
        pos = list(range(cached + 1)) + [cached + 1 + i + j for j in range(4)]
        with torch.no_grad():
            logits = target(torch.tensor([state.committed[:cached] + rows]), position_ids=torch.tensor([pos]),
                            attention_mask=mask[None, None]).logits[0, -1]
        assert (verdict.side_logits[i] - logits).abs().max() < 1e-9, i


def test_quest_and_the_target_restored(tiny_pair):
    target = tiny_pair.target
    ids = tiny_pair.encode(SHIPPED_PROMPTS[0])
    want = generate("autoregressive", target, ids, 24).new_tokens
    got = generate("fafo", target, ids, 24, compression="quest", kv_budget=64, page=16, streams=4, guess_len=3)
    assert got.new_tokens == want
    assert target.config._attn_implementation == "sdpa"  # attach() was undone


def test_two_forward_ablation_is_lossless_and_counts_its_forwards(tiny_pair64, tiny_pair):
    target = tiny_pair64[0]
    ids = tiny_pair.encode(SHIPPED_PROMPTS[1])
    want = generate("autoregressive", target, ids, 20).new_tokens
    got = generate("fafo", target, ids, 20, fused=False, streams=4, guess_len=3, debug=True)
    assert got.new_tokens == want
    assert got.stats["fumble_forwards"] == got.target_forwards - 1  # every step but the prefill's


def test_target_restored_when_a_step_raises(monkeypatch):
    target = random_lm("llama")
    monkeypatch.setattr(Fafo, "observe", lambda self, state, verdict: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        generate("fafo", target, torch.tensor([[1, 2, 3]]), 5)
    assert target.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("settings, match", [
    (dict(streams=0), "streams"), (dict(guess_len=0), "guess_len"), (dict(kv_budget=4, sinks=4), "exceed"),
    (dict(compression="snap"), "compression must be"), (dict(attention="fast"), "attention must be")])
def test_bad_settings_are_refused(settings, match):
    with pytest.raises((ValueError, TypeError), match=match):
        generate("fafo", random_lm("llama"), torch.tensor([[1, 2, 3]]), 5, **settings)


def test_views_draw_streams_and_pool_without_touching_it():
    from specdec_lib import viz

    pool = FumblePool(cap=3)
    pool.add([1, 2], (3, 4))
    pool.add([2], (5, 6))
    order = list(pool.table[(2,)])
    fig = viz.pool_figure(pool, [7, 1, 2], n=4, k=2)
    assert [list(r) for r in fig.data[0].text] == [["3", "4"], ["5", "6"]]  # the m=2 match first
    assert list(fig.data[0].y)[0].startswith("0. m=2") and list(pool.table[(2,)]) == order  # LRU untouched
    history = [[[1, 2, 3], [4, 5, 6]], [[2, 3, 9], [5, 6, 8]]]
    streams = viz.streams_figure(history)
    assert len(streams.frames) == 2 and [list(r) for r in streams.frames[1].data[0].z] == [[0, 0, 1], [0, 0, 1]]
    assert [list(r) for r in streams.frames[0].data[0].text] == [["1", "2", "3"], ["4", "5", "6"]]
