"""Cacheback decoding, what is particular to it: greedy parity for every option (dual tables, TDL/CRT, merge,
LL/FL, lazy head, frozen only), max_new_tokens cuts under those options, config errors, the frozen-table
resolution and its warning, the cache invariant, per-step stats, the lazy LM head, and token-for-token equality
with autoregressive sampling under the same seed (the tree walk draws one sample per emitted token). Default
parity, EOS, and the sampling chi-square with its negative control are the contract test's.

Every parity run passes debug=True: after each step the cache must hold every committed token but the last.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from specdec_lib import compat, generate, loop
from specdec_lib.mechanisms import verify as tree_verify
from specdec_lib import tables as cb
from specdec_lib.mechanisms.ngram_table import FrozenNgramTable
from specdec_lib.tables import frozen_table_path

from helpers import SHIPPED_PROMPTS, autoregressive_samples, random_lm, repeating_prompt

VOCAB = 97

pytestmark = pytest.mark.usefixtures("one_thread")




def _quiet(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cb.NoFrozenTableWarning)
        return generate(*args, **kwargs)


def _check_contract(result, n, tdl=96):
    steps = result.stats["steps"]
    assert len(result.new_tokens) == n
    assert sum(result.accept_lengths) == len(result.new_tokens)
    assert result.target_forwards == len(result.accept_lengths) == len(steps)
    assert all(a >= 1 for a in result.accept_lengths)
    for s, emitted in zip(steps, result.accept_lengths):
        assert {"tree_size", "accepted", "draft_us", "verify_ms", "update_us"} <= set(s)
        assert s["emitted"] == emitted <= s["accepted"] + 1 and s["accepted"] <= s["depth"] <= s["tree_size"]
        assert s["tree_size"] <= tdl - 1 and s["draft_us"] > 0 and s["verify_ms"] > 0
    assert result.stats["drafted"] == sum(s["tree_size"] for s in steps)
    remaining = [n - sum(result.accept_lengths[:i]) for i in range(len(steps))]
    assert all(s["depth"] <= r - 1 for s, r in zip(steps, remaining))  # never verifies what cannot be emitted


@pytest.fixture(scope="module")
def models():
    return {(kind, seed): random_lm(kind, seed=seed, layers=3, logit_scale=20.0)
            for kind in ("llama", "qwen2") for seed in (0, 1)}


def _corpus_table(ll=1, fl=3, vocab=VOCAB, seed=5, **kw):
    """A frozen table counted from random streams, tagged with the vocabulary size (what build_frozen_table does)."""
    g = torch.Generator().manual_seed(seed)
    streams = [torch.randint(0, vocab, (200,), generator=g) for _ in range(3)]
    return FrozenNgramTable.from_token_streams(streams, ll, fl, 2**20, kw.get("fc", 128), progress=False,
                                               meta={"vocab_size": vocab})


CONFIGS = [dict(), dict(merge=True), dict(tdl=8, crt=2), dict(tdl=2, crt=0), dict(ll=2, fl=2), dict(fl=1, fc=4),
           dict(frozen="corpus"), dict(frozen="corpus_ll2", merge=True, tdl=24, crt=4), dict(lazy_head=False),
           dict(frozen="corpus", dynamic=False, tdl=16, crt=4)]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_parity_random_float64(models, kind, seed):
    target = models[kind, seed]
    ids = repeating_prompt(24, seed)
    reference = generate("hf", target, ids, 40).new_tokens
    tables = {"corpus": _corpus_table(), "corpus_ll2": _corpus_table(ll=2, fl=2)}
    for config in CONFIGS:
        config = {k: tables.get(v, v) if k == "frozen" else v for k, v in config.items()}
        result = _quiet("cacheback", target, ids, 40, debug=True, **config)
        assert result.new_tokens == reference, config
        _check_contract(result, 40, config.get("tdl", 96))
        assert (result.stats["frozen"] is not None) == ("frozen" in config)


def test_repetitive_prompt_gets_long_acceptances(models):
    """The target's own greedy output repeated in the prompt: the dynamic table predicts it."""
    target = models["llama", 0]
    ids = repeating_prompt(24, 0)
    own = generate("hf", target, ids, 40).new_tokens
    ids = torch.cat([ids, torch.tensor([own])], dim=1)
    reference = generate("hf", target, ids, 40).new_tokens
    # rows nearly free (an injected curve, not this machine's timing): the budget is not what is tested here
    result = _quiet("cacheback", target, ids, 40, debug=True, costs={1: 10.0, 128: 10.5})
    assert result.new_tokens == reference
    assert result.mat > 3 and max(result.accept_lengths) >= 8
    assert result.stats["acceptance_rate"] > 0


def test_shipped_pair_float64_with_and_without_frozen_table(tiny_pair64, tiny_pair):
    target, _, tokenizer = tiny_pair64
    texts = SHIPPED_PROMPTS
    for text in texts:
        ids = tiny_pair.encode(text)
        reference = generate("hf", target, ids, 48).new_tokens
        for config in (dict(), dict(frozen=False), dict(merge=True), dict(tdl=16, crt=4),
                       dict(tokenizer=tokenizer, fc=8)):
            result = generate("cacheback", target, ids, 48, debug=True, **config)
            assert result.new_tokens == reference, (text, config)
            _check_contract(result, 48, config.get("tdl", 96))
            used = result.stats["frozen"]
            assert (used is None) == (config.get("frozen") is False)
            if used is not None:
                assert used.endswith(frozen_table_path(1, 3).name)
        # the frozen table drafts from the first step on, whatever the prompt; rows nearly free (an injected curve):
        # under this machine's curve the budget may rightly stop drafting after one losing step of a short run
        dual = generate("cacheback", target, ids, 48, costs={1: 10.0, 128: 10.5})
        assert dual.stats["steps"][0]["tree_size"] > 0 and dual.mat > 1


def test_frozen_table_is_cut_to_lc_fc(tiny_pair64):
    target = tiny_pair64[0]
    full = cb.resolve_frozen(True, target, 1, 3, 2**20, 128)
    small = cb.resolve_frozen(True, target, 1, 3, 10, 4)
    assert len(small) == 10 and small.follower_capacity == 4
    leader = small.leaders()[0]
    assert small.query(leader) == full.query(leader)[:4] and full.leaders()[:10] == small.leaders()
    assert cb.resolve_frozen(True, target, 1, 3, 10, 4) is small  # loaded and cut once per process


@pytest.mark.parametrize("n", [1, 2, 7, 13])
def test_exact_max_new_tokens(models, n):
    target = models["llama", 1]
    ids = repeating_prompt(24, 1)
    ids = torch.cat([ids, torch.tensor([generate("hf", target, ids, 30).new_tokens])], dim=1)
    reference = generate("hf", target, ids, n).new_tokens
    for config in (dict(), dict(merge=True, tdl=8, crt=2)):
        result = _quiet("cacheback", target, ids, n, debug=True, **config)
        assert result.new_tokens == reference
        _check_contract(result, n, config.get("tdl", 96))


@pytest.mark.parametrize("config, error, match", [
    (dict(ll=0), ValueError, "ll must be an int >= 1"), (dict(fl=0), ValueError, "fl must be an int >= 1"),
    (dict(lc=0), ValueError, "lc must be an int >= 1"), (dict(fc=-2), ValueError, "fc must be an int >= 1"),
    (dict(tdl=0), ValueError, "tdl must be an int >= 1"), (dict(tdl=1, crt=0), ValueError, "tdl >= 2"),
    (dict(tdl=16, crt=16), ValueError, "crt <= tdl - 2"), (dict(tdl=16, crt=15), ValueError, "crt <= tdl - 2"),
    (dict(crt=-1), ValueError, "crt <= tdl - 2"), (dict(ll=1.5), TypeError, "ll must be an int"),
    (dict(tdl=True), TypeError, "tdl must be an int"), (dict(merge="yes"), TypeError, "merge must be"),
])
def test_invalid_config_raises(models, config, error, match):
    with pytest.raises(error, match=match):
        _quiet("cacheback", models["llama", 0], [1, 2, 3], 4, **config)


def test_bad_frozen_argument(models):
    target = models["llama", 0]
    with pytest.raises(TypeError, match="frozen must be"):
        generate("cacheback", target, [1, 2, 3], 4, frozen=3)
    with pytest.raises(ValueError, match="vocabulary of 50 tokens"):
        generate("cacheback", target, [1, 2, 3], 4, frozen=_corpus_table(vocab=50))
    with pytest.raises(ValueError, match="vocabulary of 4096 tokens"):  # an explicit path must fit
        generate("cacheback", target, [1, 2, 3], 4, frozen=frozen_table_path(1, 3))


def test_no_frozen_table_warns_once(models, tiny_pair64, monkeypatch):
    monkeypatch.setattr(cb, "_WARNED", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed in (0, 1):
            generate("cacheback", models["llama", seed], repeating_prompt(12, seed), 6)
        generate("cacheback", models["llama", 0], repeating_prompt(12, 0), 6, frozen=False)
    assert [w.category for w in caught] == [cb.NoFrozenTableWarning]
    assert "vocabulary of 4096 tokens" in str(caught[0].message) and "the target has 97" in str(caught[0].message)
    # the tiny pair with an LL/FL that has no shipped table: the same warning (a fresh process would give it)
    monkeypatch.setattr(cb, "_WARNED", False)
    with pytest.warns(cb.NoFrozenTableWarning, match="no table for LL=2, FL=3"):
        result = generate("cacheback", tiny_pair64[0], [5, 6, 7, 5, 6], 3, ll=2)
    assert result.stats["frozen"] is None


def test_debug_invariant_catches_a_missing_commit(models, monkeypatch):
    target = models["llama", 0]
    ids = repeating_prompt(24, 0)
    monkeypatch.setattr(loop, "commit", lambda cache, prefix_len, kept: None)  # forget compaction
    with pytest.raises(AssertionError, match="cache holds"):
        _quiet("cacheback", target, ids, 20, debug=True)


def test_dynamic_false_needs_a_frozen_table(models):
    target = models["llama", 0]
    with pytest.raises(ValueError, match="leave no table"):
        generate("cacheback", target, [1, 2, 3], 4, frozen=False, dynamic=False)
    with pytest.raises(ValueError, match="dynamic=False needs a frozen table"):
        _quiet("cacheback", target, [1, 2, 3], 4, dynamic=False)
    with pytest.raises(TypeError, match="dynamic must be"):
        generate("cacheback", target, [1, 2, 3], 4, dynamic="yes")
    with pytest.raises(ValueError, match="needs tokenizer"):
        generate("cacheback", target, [1, 2, 3], 4, frozen="build")
    only = generate("cacheback", target, repeating_prompt(24, 0), 12, frozen=_corpus_table(), dynamic=False)
    assert only.stats["dynamic_leaders"] == 0 and only.stats["config"]["dynamic"] is False


def test_full_flag_and_token_kinds(models):
    """steps[i]["full"]: the walk ran off a leaf (then the target's token is a bonus, else a correction)."""
    from specdec_lib.viz.acceptance import token_kinds

    target = models["llama", 0]
    ids = repeating_prompt(24, 0)
    own = generate("hf", target, ids, 30).new_tokens
    result = _quiet("cacheback", target, torch.cat([ids, torch.tensor([own])], dim=1), 30, tdl=8, crt=2)
    steps = result.stats["steps"]
    assert any(s["full"] for s in steps)
    step_ids, kinds = token_kinds(result)
    assert len(kinds) == 30 and kinds.count("draft") == sum(s["accepted"] for s in steps)
    for i, s in enumerate(steps):
        own_kind = [k for j, k in zip(step_ids, kinds) if j == i and k != "draft"]
        if s["emitted"] == s["accepted"] + 1:
            assert own_kind == ["bonus" if s["full"] else "correction"]
        if s["tree_size"] == 0:
            assert s["full"]


def test_row_logits_equal_the_full_logits(tiny_pair64, models):
    """The lazy LM head gives the plain forward's logits row for row (and falls back where it must)."""
    from specdec_lib.mechanisms import kv_cache
    from specdec_lib.mechanisms.draft_tree import DraftTree

    for target in (tiny_pair64[0], models["qwen2", 0]):
        tree = DraftTree(5)
        first = tree.add_chain(-1, [7, 8, 9])
        tree.add_chain(first[0], [10, 11])
        tree.add_chain(-1, [12])
        ids = torch.tensor([[1, 2, 3, 4, 6, 2]])
        caches = []
        for lazy in (False, True):
            cache = kv_cache.new_cache(target)
            compat.forward(target, input_ids=ids, cache=cache, use_cache=True)
            caches.append((cache, tree_verify.tree_logits(target, cache, tree, ids.shape[1], lazy=lazy)))
        (_, full), (_, rows) = caches
        assert isinstance(rows, tree_verify.RowLogits) and rows.shape == tuple(full.shape)
        for r in range(len(tree) + 1):
            torch.testing.assert_close(rows[r], full[r])
        torch.testing.assert_close(rows.full(), full)
    llama = models["llama", 0]
    assert tree_verify.lazy_head_ok(llama)
    other = type(llama.config)(**llama.config.to_dict())
    other.model_type = "gemma2"  # soft-capped logits: the lazy head would be wrong, so it is not used
    original = llama.config
    try:
        llama.config = other
        assert not tree_verify.lazy_head_ok(llama)
    finally:
        llama.config = original


def test_seeded_sampling_equals_autoregressive_sampling(models):
    """One seeded draw per emitted token, from the same distribution: the same tokens as "autoregressive"."""
    target = models["qwen2", 0]
    ids = repeating_prompt(24, 0)
    ids = torch.cat([ids, torch.tensor([generate("hf", target, ids, 30).new_tokens])], dim=1)
    accepted = 0
    for sampling, expected in autoregressive_samples(target, ids, 30):
        result = _quiet("cacheback", target, ids, 30, debug=True, **sampling)
        assert result.new_tokens == expected, sampling
        _check_contract(result, 30)
        accepted += result.stats["accepted"]
    assert accepted > 0


def test_capped_proposal_keeps_the_shallow_part_of_every_branch():
    from specdec_lib.mechanisms.draft_tree import DraftTree

    tree = DraftTree(9)
    a = tree.add_chain(-1, [1, 2, 3])
    tree.add_chain(-1, [4])
    tree.add_chain(a[0], [5, 6])
    tree.add_chain(a[2], [7])
    q = torch.arange(len(tree), dtype=torch.float64)[:, None].repeat(1, 3)  # row i marks node i
    proposal = loop.Proposal(tree, q=q)
    capped = proposal.capped(2).tree
    assert capped.depth == 2 and capped.root == 9
    assert sorted(map(capped.path_tokens, range(len(capped)))) == sorted(
        tree.path_tokens(i) for i in range(len(tree)) if tree.depths[i] <= 2)
    kept = [i for i in range(len(tree)) if tree.depths[i] <= 2]
    assert proposal.capped(2).q[:, 0].tolist() == kept  # q rows follow their nodes
    assert proposal.capped(4) is proposal and len(proposal.capped(0).tree) == 0
