"""Our prompt lookup decoding, what is particular to it: the n-gram index and the overlapping copy, greedy parity
for its options (and the same tokens as "hf_prompt_lookup"), the chain cut at EOS, max_new_tokens cuts,
config errors, the cache invariant, per-step stats, and equality with autoregressive sampling under the same
seed. The sampling chi-square and its negative control are the contract test's. Every parity run passes
debug=True."""
from __future__ import annotations

import pytest
import torch

from specdec_lib import generate, loop
from specdec_lib.methods.prompt_lookup import AUTO_MAX_TOKENS, READ_AFTER, NgramIndex, continuation

from helpers import SHIPPED_PROMPTS, autoregressive_samples, random_lm, repeating_prompt

VOCAB = 97

pytestmark = pytest.mark.usefixtures("one_thread")




def _looping_prompt(target, seed: int) -> torch.Tensor:
    """A prompt followed by the target's own greedy continuation: what comes next was seen before."""
    ids = repeating_prompt(24, seed)
    return torch.cat([ids, torch.tensor([generate("hf", target, ids, 30).new_tokens])], dim=1)


def _check_contract(result, n, num_tokens=AUTO_MAX_TOKENS):
    steps = result.stats["steps"]
    assert len(result.new_tokens) == n
    assert sum(result.accept_lengths) == len(result.new_tokens)
    assert result.target_forwards == len(result.accept_lengths) == len(steps)
    remaining = [n - sum(result.accept_lengths[:i]) for i in range(len(steps))]
    for s, emitted, r in zip(steps, result.accept_lengths, remaining):
        assert {"tree_size", "accepted", "draft_us", "verify_ms", "ngram"} <= set(s)
        assert s["emitted"] == emitted <= s["accepted"] + 1
        assert s["tree_size"] == s["depth"] <= min(num_tokens, r - 1)  # a chain, never longer than emittable
        assert (s["tree_size"] > 0) <= (s["ngram"] > 0)


@pytest.fixture(scope="module")
def models():
    return {(kind, seed): random_lm(kind, seed=seed, layers=3, logit_scale=20.0)
            for kind in ("llama", "qwen2") for seed in (0, 1)}


# ---------------------------------------------------------------- lookup


def test_index_recent_vs_earliest_and_longest_n_first():
    seq = [5, 1, 2, 3, 9, 1, 2, 4, 7, 1, 2]
    recent, earliest = NgramIndex(1, 3), NgramIndex(1, 3, earliest=True)
    recent.extend(seq), earliest.extend(seq)
    assert recent.lookup(seq) == (2, 7)  # "1 2" last seen at 5, followed by 4 at 7; "7 1 2" never before
    assert earliest.lookup(seq) == (2, 3)  # the original / HF choice: the first "1 2", followed by 3
    assert recent.lookup(seq + [6]) == (0, -1)  # 6 never seen before
    # the trailing n-gram itself is not a match; after extend, the n-grams of the new tokens are
    seq += [4, 7, 1, 2]
    recent.extend(seq)
    assert recent.lookup(seq) == (3, 11)  # "7 1 2" (seen at 8-10, followed by 4 at 11)
    assert NgramIndex(2, 3).lookup([1]) == (0, -1)  # shorter than every n


def test_continuation_copies_with_overlap_and_stops_at_eos():
    seq = [1, 2, 3, 1, 2, 3, 1]
    assert continuation(seq, 5, 6) == [3, 1, 3, 1, 3, 1]  # past the end: the copy goes on with itself
    assert continuation(seq, 1, 4) == [2, 3, 1, 2]
    assert continuation(seq, 1, 6, eos=1) == [2, 3, 1]  # nothing after an EOS can be emitted
    assert continuation(seq, 1, 0) == []


# ---------------------------------------------------------------- greedy parity


CONFIGS = [dict(), dict(match="earliest"), dict(max_ngram=1), dict(num_tokens=1), dict(num_tokens=24),
           dict(min_ngram=2, max_ngram=4)]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_parity_random_float64(models, kind, seed):
    target = models[kind, seed]
    for ids in (repeating_prompt(24, seed), _looping_prompt(target, seed)):
        reference = generate("hf", target, ids, 40).new_tokens
        for config in CONFIGS:
            result = generate("prompt_lookup", target, ids, 40, debug=True, **config)
            assert result.new_tokens == reference, config
            _check_contract(result, 40, config.get("num_tokens", AUTO_MAX_TOKENS))


def test_repetitive_prompt_gets_long_acceptances(models):
    target = models["llama", 0]
    ids = _looping_prompt(target, 0)
    result = generate("prompt_lookup", target, ids, 40, num_tokens=10, debug=True)
    assert result.new_tokens == generate("hf", target, ids, 40).new_tokens
    assert result.mat > 3 and max(result.accept_lengths) == 11  # 10 drafts + the bonus
    assert result.stats["acceptance_rate"] > 0.5


def test_auto_plain_steps_learn_from_the_text_that_followed(models):
    """num_tokens="auto" where the prior (a weak draft) says no chain pays at 5 ms a row: on a looping text the plain
    steps' chains, read against the tokens emitted after them, turn drafting on once READ_AFTER tokens have followed
    the first; with nothing learnt from plain steps the first draft would wait for a probe (15 steps here)."""
    from specdec_lib.mechanisms.budget.cost_curve import CostCurve

    target = models["llama", 0]
    ids = _looping_prompt(target, 0)
    curve = CostCurve.from_points({1: 10.0, 2: 15.0, 33: 170.0})  # injected: no clock, the same choices each run
    result = generate("prompt_lookup", target, ids, 40, num_tokens="auto", costs=curve, debug=True)
    assert result.new_tokens == generate("hf", target, ids, 40).new_tokens
    sizes = [step.get("draft_size") for step in result.stats["steps"]]
    first = next(i for i, size in enumerate(sizes) if size)
    assert sizes[1] == 0 and first <= READ_AFTER + 2, sizes  # plain at first (the prior), then read the text
    assert result.mat > 2


def test_shipped_pair_float64(tiny_pair64, tiny_pair):
    target = tiny_pair64[0]
    for text in SHIPPED_PROMPTS:
        ids = tiny_pair.encode(text)
        reference = generate("hf", target, ids, 48).new_tokens
        for config in (dict(), dict(match="earliest", max_ngram=2)):
            result = generate("prompt_lookup", target, ids, 48, debug=True, **config)
            assert result.new_tokens == reference, (text, config)
            _check_contract(result, 48)
        assert generate("hf_prompt_lookup", target, ids, 48).new_tokens == reference


def test_eos_inside_an_accepted_run(models):
    target = models["qwen2", 1]
    ids = _looping_prompt(target, 1)
    free = generate("prompt_lookup", target, ids, 40, num_tokens=10)
    bonus_at = {sum(free.accept_lengths[:i + 1]) - 1 for i in range(len(free.accept_lengths))}
    j = next(j for j in range(1, 40) if free.new_tokens.index(free.new_tokens[j]) == j and j not in bonus_at)
    eos = free.new_tokens[j]
    result = generate("prompt_lookup", target, ids, 40, num_tokens=10, eos_token_id=eos, debug=True)
    assert result.new_tokens == free.new_tokens[: j + 1] == generate("hf", target, ids, 40, eos_token_id=eos).new_tokens
    assert sum(result.accept_lengths) == j + 1
    # the run that reached the EOS was accepted as a draft; the chain stops at it (nothing after is proposed)
    last = result.stats["steps"][-1]
    assert last["emitted"] <= last["accepted"]


@pytest.mark.parametrize("n", [1, 2, 7, 13])
def test_exact_max_new_tokens(models, n):
    target = models["llama", 1]
    ids = _looping_prompt(target, 1)
    result = generate("prompt_lookup", target, ids, n, debug=True)
    assert result.new_tokens == generate("hf", target, ids, n).new_tokens
    _check_contract(result, n)


@pytest.mark.parametrize("config, match", [
    (dict(num_tokens=0), "num_tokens must be an int >= 1"), (dict(max_ngram=0), "max_ngram must be"),
    (dict(min_ngram=0), "min_ngram must be"), (dict(min_ngram=3, max_ngram=2), "min_ngram .* <= max_ngram"),
    (dict(match="longest"), "match must be"),
])
def test_invalid_config_raises(models, config, match):
    with pytest.raises(ValueError, match=match):
        generate("prompt_lookup", models["llama", 0], [1, 2, 3], 4, **config)
    for not_an_int in (2.0, True):
        with pytest.raises(TypeError, match="num_tokens must be an int"):
            generate("prompt_lookup", models["llama", 0], [1, 2, 3], 4, num_tokens=not_an_int)


def test_debug_invariant_catches_a_missing_commit(models, monkeypatch):
    target, ids = models["llama", 0], repeating_prompt(24, 0)
    # a fixed draft size: under "auto" whether a step drafts at all follows this machine's timings
    steps = generate("prompt_lookup", target, ids, 20, num_tokens=4).stats["steps"]
    assert any(s["accepted"] < s["tree_size"] for s in steps[1:])  # a rejected draft after the first step
    monkeypatch.setattr(loop, "commit", lambda cache, prefix_len, kept: None)
    with pytest.raises(AssertionError, match="cache holds"):
        generate("prompt_lookup", target, ids, 20, num_tokens=4, debug=True)


def test_seeded_sampling_equals_autoregressive_sampling(models):
    target = models["qwen2", 0]
    ids = _looping_prompt(target, 0)
    accepted = 0
    for sampling, expected in autoregressive_samples(target, ids, 30):
        result = generate("prompt_lookup", target, ids, 30, debug=True, **sampling)
        assert result.new_tokens == expected, sampling
        _check_contract(result, 30)
        accepted += result.stats["accepted"]
    assert accepted > 0
