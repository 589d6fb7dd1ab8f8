"""Draft-model speculative decoding, what is particular to it: greedy parity over gammas and draft kinds (full,
partial, no acceptance), the gamma cut at max_new_tokens, the adaptive schedule, the four cache scenarios, the
draft cache's invariant, the speculative-sampling rule's edge cases and the exact-enumeration helpers.
Parity with HF, EOS, max_new_tokens and the lossless-sampling chi-square (with negative controls) are the
contract test's (tests/test_contract.py), for every method.

Every draft_model call here passes debug=True: after each step both caches must hold exactly the tokens
they were fed (a prefix of the output) and the target's all committed tokens but the last.

"""
from __future__ import annotations

import copy

import pytest
import torch

from specdec_lib import generate
from specdec_lib.bench.lossless import chi_square_test, exact_sequence_distribution, total_variation
from specdec_lib.mechanisms import kv_cache
from specdec_lib.mechanisms.kv_cache import TrackedCache
from specdec_lib.mechanisms.verify import residual, speculative_chain
from specdec_lib.sampling import SamplingConfig

from helpers import SHIPPED_PROMPTS, random_lm

VOCAB = 97


pytestmark = pytest.mark.usefixtures("one_thread")




def _random_prompt(length: int, seed: int, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def _noisy_copy(model, scale: float, seed: int):
    """The target with noise on its LM head: a draft that agrees often, not always (partial acceptance)."""
    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = draft.lm_head.weight
        w.add_(scale * w.std() * torch.randn(w.shape, generator=g, dtype=w.dtype))
    return draft


@pytest.fixture(scope="module")
def pairs():
    """{kind: (target, {"same": target, "noisy": near copy, "unrelated": random draft})} per seed."""
    out = {}
    for kind in ("llama", "qwen2"):
        for seed in (0, 1):
            target = random_lm(kind, seed=seed, layers=3, logit_scale=20.0)
            drafts = {"same": target, "noisy": _noisy_copy(target, 1.0, seed),
                      "unrelated": random_lm(kind, seed=seed + 100, layers=1, logit_scale=20.0)}
            out[kind, seed] = (target, drafts)
    return out


def _check_contract(result, n):
    assert len(result.new_tokens) == n
    assert sum(result.accept_lengths) == len(result.new_tokens)
    assert result.target_forwards == len(result.accept_lengths) == len(result.stats["steps"])
    assert all(a >= 1 for a in result.accept_lengths)
    steps = result.stats["steps"]
    assert result.stats["draft_forwards"] == sum(s["tree_size"] for s in steps)
    assert all(s["emitted"] <= s["accepted"] + 1 and s["tree_size"] <= s["draft_size"] for s in steps)


def gammas_of(result) -> list[int]:
    """The gamma each step ran with (the step records' draft_size)."""
    return [s["draft_size"] for s in result.stats["steps"]]


def _remaining(result) -> list[int]:
    """Tokens still to make at the start of each step."""
    n = len(result.new_tokens)
    return [n - sum(result.accept_lengths[:i]) for i in range(len(result.accept_lengths))]


# ---------------------------------------------------------------- greedy parity


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_parity_random_float64(pairs, kind, seed):
    target, drafts = pairs[kind, seed]
    ids = _random_prompt(20, seed)
    reference = generate("hf", target, ids, 40).new_tokens
    for gamma in (1, 3, 5, 8):
        for name, draft in drafts.items():
            result = generate("draft_model", target, ids, 40, draft=draft, gamma=gamma, debug=True)
            assert result.new_tokens == reference, (gamma, name)
            _check_contract(result, 40)
            steps = result.stats["steps"]
            if name == "same":  # full acceptance every step (scenario 3 each time), the last one clipped
                assert all(s["accepted"] == s["tree_size"] for s in steps)
                assert result.accept_lengths[:-1] == [gamma + 1] * (len(steps) - 1)
            elif name == "unrelated":  # rejection at once
                assert steps[0]["accepted"] == 0 and result.stats["acceptance_rate"] < 0.2
            else:  # partial acceptance somewhere
                assert any(0 < s["accepted"] < s["tree_size"] for s in steps) or gamma == 1
                assert 0 < result.stats["acceptance_rate"] < 1


def test_adaptive_gamma_parity_shipped_pair_float64(tiny_pair64, tiny_pair):
    target, draft, _ = tiny_pair64
    for text in SHIPPED_PROMPTS:
        ids = tiny_pair.encode(text)
        reference = generate("hf", target, ids, 48).new_tokens
        for settings in (dict(gamma=2), dict(gamma=5), dict(gamma=4, adaptive=True)):
            result = generate("draft_model", target, ids, 48, draft=draft, debug=True, **settings)
            assert result.new_tokens == reference, (text, settings)
            _check_contract(result, 48)


@pytest.mark.parametrize("draft_name", ["same", "noisy", "unrelated"])
def test_eos_inside_accepted_run(pairs, draft_name):
    target, drafts = pairs["llama", 0]
    ids = _random_prompt(12, 3)
    free = generate("hf", target, ids, 30).new_tokens
    gammas = (3, 4, 8)
    # an EOS the greedy output reaches, first seen at a position that is a draft (not a bonus) for every gamma
    # when the draft is the target: bonus tokens sit at indices (g + 1) m - 1
    first = next(j for j in range(5, 30) if free.index(free[j]) == j and all(j % (g + 1) != g for g in gammas))
    eos = free[first]
    expected = free[: first + 1]
    for gamma in gammas:
        result = generate("draft_model", target, ids, 30, draft=drafts[draft_name], gamma=gamma,
                          eos_token_id=eos, debug=True)
        assert result.new_tokens == expected, gamma
        assert sum(result.accept_lengths) == len(expected)
        if draft_name == "same":  # the EOS was an accepted draft (not the bonus): the step's run was cut
            last = result.stats["steps"][-1]
            assert last["emitted"] <= last["accepted"]


@pytest.mark.parametrize("n", [1, 2, 7, 13, 17])
def test_max_new_tokens_not_a_multiple_of_gamma(pairs, n):
    target, drafts = pairs["qwen2", 0]
    ids = _random_prompt(10, n)
    reference = generate("hf", target, ids, n).new_tokens
    for gamma in (4, 5):
        for name in ("same", "noisy"):
            result = generate("draft_model", target, ids, n, draft=drafts[name], gamma=gamma, debug=True)
            assert result.new_tokens == reference
            _check_contract(result, n)
            assert gammas_of(result) == [min(gamma, r - 1) for r in _remaining(result)]
            if name == "same":  # never drafts a token that cannot be emitted
                assert result.stats["drafted"] == n - result.target_forwards


def test_adaptive_gamma_is_lossless_and_follows_hf_schedule(pairs):
    target, drafts = pairs["llama", 1]
    ids = _random_prompt(16, 5)
    reference = generate("hf", target, ids, 60).new_tokens
    for name, draft in drafts.items():
        result = generate("draft_model", target, ids, 60, draft=draft, gamma=3, adaptive=True, debug=True)
        assert result.new_tokens == reference, name
        _check_contract(result, 60)
    same = generate("draft_model", target, ids, 60, draft=drafts["same"], gamma=3, adaptive=True)
    assert gammas_of(same)[:4] == [3, 5, 7, 9]  # +2 after every full acceptance
    unrelated = generate("draft_model", target, ids, 60, draft=drafts["unrelated"], gamma=3, adaptive=True)
    assert gammas_of(unrelated)[:4] == [3, 2, 1, 1]  # -1 after a rejection, never below 1
    fixed = generate("draft_model", target, ids, 60, draft=drafts["noisy"], gamma=3)
    assert gammas_of(fixed) == [min(3, r - 1) for r in _remaining(fixed)]  # off by default


# ---------------------------------------------------------------- caches


def test_tracked_cache_four_scenarios(pairs):
    """Scenario by scenario, the lengths `commit` leaves (prompt of 5, gamma 3)."""
    target, _ = pairs["llama", 0]
    prompt = [3, 1, 4, 1, 5]
    with torch.no_grad():
        t, d = TrackedCache(target), TrackedCache(target)
        # 1. first step: the draft prefills the prompt and drafts; the target scores prompt + 3 drafts
        d.feed(prompt), d.feed([7]), d.feed([8])  # drafts 7, 8, 9 (9 never fed)
        rows = t.feed(prompt + [7, 8, 9], keep=4)
        assert rows.shape == (4, VOCAB) and kv_cache.cache_length(t.cache) == 8
        # 3. all accepted + bonus 2: the target keeps 8, the draft its 7 (it has not seen 9 nor 2)
        committed = prompt + [7, 8, 9, 2]
        t.commit(committed), d.commit(committed)
        assert (kv_cache.cache_length(t.cache), kv_cache.cache_length(d.cache)) == (8, 7)
        t.check(committed, "target"), d.check(committed, "draft")
        assert committed[len(d.tokens):] == [9, 2]  # the draft's next input is two tokens
        # 2. next step: drafts 6, 6, 6; one accepted, then the target's 0
        d.feed([9, 2]), d.feed([6]), d.feed([6])
        t.feed([2, 6, 6, 6], keep=4)
        committed += [6, 0]
        t.commit(committed), d.commit(committed)
        assert len(t.tokens) == len(d.tokens) == len(committed) - 1 == 10
        t.check(committed, "target"), d.check(committed, "draft")


def test_debug_check_catches_a_missing_rollback(pairs, monkeypatch):
    target, drafts = pairs["llama", 0]
    ids = _random_prompt(8, 0)
    monkeypatch.setattr(kv_cache, "rollback", lambda cache, length: None)  # forget to crop
    with pytest.raises(AssertionError, match="cache holds"):
        generate("draft_model", target, ids, 20, draft=drafts["unrelated"], gamma=3, debug=True)


# ---------------------------------------------------------------- errors, reproducibility


@pytest.mark.parametrize("gamma", [0, -1, 2.5, True, "3", None])
def test_bad_gamma(pairs, gamma):
    target, drafts = pairs["llama", 0]
    error = ValueError if isinstance(gamma, int) and not isinstance(gamma, bool) else TypeError
    with pytest.raises(error, match="gamma must be an int >= 1"):
        generate("draft_model", target, [1, 2, 3], 4, draft=drafts["noisy"], gamma=gamma)


def test_mismatched_vocabulary_names_both_sizes():
    target = random_lm("llama", vocab=97, seed=9)
    draft = random_lm("llama", vocab=50, seed=9, layers=1)
    with pytest.raises(ValueError, match="target has 97 tokens, draft has 50"):
        generate("draft_model", target, [1, 2, 3], 4, draft=draft)
    with pytest.raises(ValueError, match="needs a draft"):
        generate("draft_model", target, [1, 2, 3], 4)


def test_seeded_sampling_is_reproducible(pairs):
    target, drafts = pairs["qwen2", 1]
    ids = _random_prompt(10, 7)
    run = lambda seed, **kw: generate("draft_model", target, ids, 24, draft=drafts["noisy"], temperature=1.0,
                                      seed=seed, debug=True, **kw)
    a, b, c = run(11), run(11), run(12)
    assert a.new_tokens == b.new_tokens and a.accept_lengths == b.accept_lengths
    assert a.new_tokens != c.new_tokens
    _check_contract(a, 24)
    # top_k=1 makes p and q one-hot: sampling reduces to greedy, whatever the temperature
    greedy = generate("hf", target, ids, 24).new_tokens
    assert run(3, top_k=1).new_tokens == greedy
    # sampling with EOS: the output stops right after the first EOS
    eos = a.new_tokens[5]
    for seed in range(5):
        out = run(seed, eos_token_id=eos).new_tokens
        assert eos not in out[:-1] and (out[-1] == eos or len(out) == 24)


def test_speculative_verify_edge_cases():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    gen = torch.Generator().manual_seed(0)
    # q == p: every draft is accepted, then the bonus comes from the last row
    k, _ = speculative_chain(p, p[:1].clone(), [1], gen)
    assert k == 1
    # the draft is sure of a token the target never picks: always rejected, resampled from the residual
    q = torch.tensor([[0.0, 0.0, 1.0]])
    for _ in range(20):
        k, nxt = speculative_chain(p, q, [2], gen)
        assert k == 0 and nxt in (0, 1)
    assert torch.equal(residual(p[0], p[0]), p[0])  # all-zero residual: fall back to p


# ---------------------------------------------------------------- lossless sampling


SMALL_VOCAB = 8
PROMPT = torch.tensor([[1, 2, 3]])


@pytest.fixture(scope="module")
def peaked_pair():
    """Tiny vocab-8 target and an unrelated draft; scaled LM heads make p and q peaked and different
    (next-token max p ~0.3, min(p, q) mass ~0.46: many rejections, so the residual matters)."""
    target = random_lm("llama", vocab=SMALL_VOCAB, layers=1, hidden=16, seed=1, logit_scale=20.0)
    draft = random_lm("qwen2", vocab=SMALL_VOCAB, layers=1, hidden=16, seed=2, logit_scale=20.0)
    return target, draft


def test_exact_distribution_and_chi_square_helpers(peaked_pair):
    target, _ = peaked_pair
    exact = exact_sequence_distribution(target, PROMPT, 2, SamplingConfig(1.0))
    assert len(exact) == SMALL_VOCAB ** 2 and abs(sum(exact.values()) - 1) < 1e-12
    with torch.no_grad():  # the first token's marginal is p itself
        p = torch.softmax(target(PROMPT).logits[0, -1].float(), -1).double()
    marginal = torch.zeros(SMALL_VOCAB, dtype=torch.float64)
    for (x, _), m in exact.items():
        marginal[x] += m
    assert torch.allclose(marginal, p, atol=1e-6)
    topk = exact_sequence_distribution(target, PROMPT, 2, SamplingConfig(1.0, top_k=2))
    assert len(topk) == 4
    # counts equal to expectations pass; an impossible sequence fails outright
    counts = {k: round(v * 10_000) for k, v in exact.items()}
    assert chi_square_test(exact, counts).passed and total_variation(exact, counts) < 1e-3
    assert not chi_square_test(topk, {**{k: 100 for k in topk}, (7, 7): 1}).passed
    skewed = dict(counts)
    top = max(exact, key=exact.get)
    skewed[top] = int(skewed[top] * 1.3)
    assert not chi_square_test(exact, skewed).passed


# ---------------------------------------------------------------- the draft's tree (topk > 1)

def _check_tree(result, n, depth):
    """_check_contract for a tree: a drafted step runs one draft forward per depth it drafted, at least as many as
    its kept tree's depth, at most `depth`."""
    assert len(result.new_tokens) == n and sum(result.accept_lengths) == n
    steps = result.stats["steps"]
    assert result.target_forwards == len(result.accept_lengths) == len(steps)
    assert all(s["emitted"] <= s["accepted"] + 1 and s["tree_size"] <= s["draft_size"] for s in steps)
    drafted = [s for s in steps if s["tree_size"]]
    assert sum(s["depth"] for s in drafted) <= result.stats["draft_forwards"] <= depth * len(steps)

@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_tree_greedy_parity_random_float64(pairs, kind):
    """A tree of the draft's top-k children (fixed sizes, fixed depths, and "auto" with draft forwards priced at a
    tenth of the target's) verifies to HF's greedy tokens with every draft; the draft's cache keeps the committed
    text only between steps (debug=True checks it after each)."""
    target, drafts = pairs[kind, 0]
    ids = _random_prompt(20, 0)
    reference = generate("hf", target, ids, 40).new_tokens
    auto = dict(gamma="auto", costs={1: 1.0, 128: 1.05}, draft_costs={1: 0.1, 128: 0.2})
    for settings in (dict(topk=2, gamma=3), dict(topk=4, gamma=12), dict(topk=3, gamma=6, depth=2),
                     dict(topk=4, **auto)):
        for name, draft in drafts.items():
            result = generate("draft_model", target, ids, 40, draft=draft, debug=True, **settings)
            assert result.new_tokens == reference, (settings, name)
            _check_tree(result, 40, settings.get("depth", 8))
            steps = result.stats["steps"][1:]
            assert all(s["tree_size"] <= settings["gamma"] for s in steps if settings["gamma"] != "auto")
            assert all(s["depth"] <= settings.get("depth", 8) for s in steps)
            if name == "same":  # the draft's argmax child scores above every other node: it is kept, and accepted
                assert all(s["accepted"] >= 1 for s in steps if s["tree_size"])


def test_tree_greedy_parity_shipped_pair_float64(tiny_pair64, tiny_pair):
    target, draft, _ = tiny_pair64
    for text in SHIPPED_PROMPTS:
        ids = tiny_pair.encode(text)
        reference = generate("hf", target, ids, 48).new_tokens
        chain = generate("draft_model", target, ids, 48, draft=draft, gamma=4, debug=True)
        tree = generate("draft_model", target, ids, 48, draft=draft, gamma=12, topk=4, depth=4, debug=True)
        assert tree.new_tokens == reference == chain.new_tokens, text
        # a real tree: some step verifies a node with a sibling
        assert any(s["tree_size"] > s["depth"] for s in tree.stats["steps"])


def test_tree_sampling_matches_the_target_distribution():
    """Under sampling the tree is the draft's deterministic top-k, verified by the tree walk: the emitted
    continuations follow the target's exact distribution (chi-square; the contract's check, the same peaked pair)."""
    from specdec_lib.bench.lossless import lossless_check
    from helpers import with_head
    target = with_head(random_lm("llama", vocab=8, layers=1, hidden=16, seed=3, logit_scale=20.0))
    draft = random_lm("qwen2", vocab=8, layers=1, hidden=16, seed=2, logit_scale=20.0)
    base = [1, 2, 3]
    ids = torch.tensor([base + generate("autoregressive", target, base, 12).new_tokens])
    for sampling in (dict(temperature=0.7), dict(temperature=1.3, top_k=3)):
        report = lossless_check("draft_model", target, ids, length=3, n_samples=1500, draft=draft, topk=3, gamma=4,
                                **sampling)
        assert report.passed, str(report)
    accepted = sum(generate("draft_model", target, ids, 3, draft=draft, temperature=1.0, seed=s, topk=3, gamma=4
                            ).stats["accepted"] for s in range(100))
    assert accepted > 15  # the check above tested accepted drafts (27 in 100 runs here), not plain steps


def test_bad_tree_settings(pairs):
    target, drafts = pairs["llama", 0]
    bad = [(dict(topk=0), ValueError, "topk must be an int >= 1"),
           (dict(depth=3), ValueError, "depth is read only for a tree"),
           (dict(topk=4, depth=0), ValueError, "depth must be an int >= 1"),
           (dict(topk=2, gamma=4, adaptive=True), ValueError, "adaptive=True is HF's schedule for a chain")]
    for settings, error, message in bad:
        with pytest.raises(error, match=message):
            generate("draft_model", target, [1, 2, 3], 4, draft=drafts["noisy"], **settings)
