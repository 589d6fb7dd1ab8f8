"""The `generate` contract: greedy parity with HF, accept-length bookkeeping, seeded sampling, bad input."""
from __future__ import annotations

import math

import pytest
import torch

import specdec_lib
from specdec_lib import METHODS, generate
from specdec_lib.peers import accept_lengths_from_starts

from conftest import SHIPPED_PROMPTS, random_lm, repeating_prompt

GREEDY_METHODS = ["autoregressive", "hf_prompt_lookup", "hf_assisted"]




@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_parity_random_float64(kind, seed):
    target = random_lm(kind, seed=seed, layers=3, logit_scale=20.0)
    draft = random_lm(kind, seed=seed + 100, layers=1, logit_scale=20.0)
    ids = repeating_prompt(24, seed, target.config.vocab_size)
    reference = generate("hf", target, ids, 40)
    assert len(reference.new_tokens) == 40
    for method in GREEDY_METHODS:
        result = generate(method, target, ids, 40, draft=draft)
        assert result.new_tokens == reference.new_tokens, method
        assert sum(result.accept_lengths) == len(result.new_tokens)
        assert result.target_forwards == len(result.accept_lengths)
        assert all(n >= 1 for n in result.accept_lengths)


def test_greedy_parity_shipped_pair_float64(tiny_pair64, tiny_pair):
    target, draft, tok = tiny_pair64
    prompts = SHIPPED_PROMPTS
    for text in prompts:
        ids = tiny_pair.encode(text)
        reference = generate("hf", target, ids, 48)
        for method in GREEDY_METHODS:
            assert generate(method, target, ids, 48, draft=draft).new_tokens == reference.new_tokens, method


def test_shipped_pair_float32_parity_and_speculation(tiny_pair):
    ids = tiny_pair.encode("def parse(self, text):\n    tokens = []\n    for line in text.splitlines():\n")
    reference = generate("hf", tiny_pair.target, ids, 64)
    assisted = generate("hf_assisted", tiny_pair.target, ids, 64, draft=tiny_pair.draft, gamma=4)
    assert assisted.new_tokens == reference.new_tokens
    # The assistant really drafts: fewer target forwards than tokens, gamma draft forwards per step at most.
    assert assisted.target_forwards < len(assisted.new_tokens)
    assert assisted.mean_accepted > 1.0
    assert assisted.stats["draft_forwards"] >= assisted.target_forwards
    autoregressive = generate("autoregressive", tiny_pair.target, ids, 64)
    assert autoregressive.accept_lengths == [1] * 64 and autoregressive.mean_accepted == 1.0


def test_eos_stops_every_method():
    target = random_lm("llama", seed=3, logit_scale=20.0)
    draft = random_lm("llama", seed=4, layers=1, logit_scale=20.0)
    ids = repeating_prompt(12, 3)
    free = generate("autoregressive", target, ids, 30).new_tokens
    eos = free[7]  # a token the greedy continuation reaches: output must stop at its first occurrence
    expected = free[: free.index(eos) + 1]
    for method in ["hf"] + GREEDY_METHODS:
        result = generate(method, target, ids, 30, draft=draft, eos_token_id=eos)
        assert result.new_tokens == expected, method
        assert sum(result.accept_lengths) == len(expected)


def test_eos_none_never_stops_even_at_the_models_default_eos():
    """eos_token_id=None means no EOS stop, also for HF, whose generation_config carries a default EOS."""
    target = random_lm("llama", seed=3, logit_scale=20.0)
    draft = random_lm("llama", seed=4, layers=1, logit_scale=20.0)
    ids = repeating_prompt(12, 3)
    free = generate("autoregressive", target, ids, 30).new_tokens
    target.generation_config.eos_token_id = free[0]  # HF would stop after one token if it used this default
    try:
        for method in ["hf"] + GREEDY_METHODS:
            assert generate(method, target, ids, 30, draft=draft).new_tokens == free, method
    finally:
        target.generation_config.eos_token_id = None


def test_max_new_tokens_zero_and_exact():
    target = random_lm("llama", seed=5)
    ids = repeating_prompt(8, 5)
    assert generate("autoregressive", target, ids, 0).new_tokens == []
    for n in (1, 2, 17):
        assert len(generate("autoregressive", target, ids, n).new_tokens) == n


def test_seeded_sampling_is_reproducible_and_varies():
    target = random_lm("llama", seed=6, logit_scale=5.0)
    ids = repeating_prompt(8, 6)
    a = generate("autoregressive", target, ids, 20, temperature=1.0, seed=11).new_tokens
    b = generate("autoregressive", target, ids, 20, temperature=1.0, seed=11).new_tokens
    c = generate("autoregressive", target, ids, 20, temperature=1.0, seed=12).new_tokens
    assert a == b and a != c
    h1 = generate("hf", target, ids, 20, temperature=1.0, seed=11).new_tokens
    assert h1 == generate("hf", target, ids, 20, temperature=1.0, seed=11).new_tokens
    # top_k=1 is greedy whatever the temperature.
    greedy = generate("autoregressive", target, ids, 20).new_tokens
    assert generate("autoregressive", target, ids, 20, temperature=2.0, top_k=1, seed=3).new_tokens == greedy


def test_first_token_distribution_matches_target():
    """The autoregressive sampler draws the first token from softmax(logits / T): chi-square over 3000 seeds."""
    target = random_lm("llama", vocab=11, seed=7, logit_scale=30.0)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        p = torch.softmax(target(input_ids=ids).logits[0, -1] / 0.7, -1)
    n = 3000
    counts = torch.zeros(11)
    for seed in range(n):
        counts[generate("autoregressive", target, ids, 1, temperature=0.7, seed=seed).new_tokens[0]] += 1
    expected = p * n
    keep = expected >= 5  # pool rare tokens so the chi-square approximation holds
    observed = torch.cat([counts[keep], counts[~keep].sum()[None]])
    expect = torch.cat([expected[keep], expected[~keep].sum()[None]])
    observed, expect = observed[expect > 0], expect[expect > 0]
    chi2 = float(((observed - expect) ** 2 / expect).sum())
    dof = len(expect) - 1
    # 99.9th percentile of chi-square via the Wilson-Hilferty approximation: false failure rate 0.1%.
    z = 3.09
    critical = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    assert chi2 < critical, (chi2, critical)


def test_accept_lengths_from_starts():
    # Greedy HF: prefill at 0, then one token per forward.
    assert accept_lengths_from_starts([0, 5, 6, 7], 5, 4) == [1, 1, 1, 1]
    # Assisted: first forward accepts 2 drafts + bonus, the next one accepts none, the last gains 4.
    assert accept_lengths_from_starts([0, 7, 8], 5, 8) == [3, 1, 4]


def test_registry_lists_methods():
    assert {"autoregressive", "hf", "hf_prompt_lookup", "hf_assisted"} <= set(METHODS)
    assert METHODS["hf_assisted"].needs_draft and not METHODS["autoregressive"].needs_draft


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(method="nope"), ValueError, "known methods: .*autoregressive"),
    (dict(input_ids=torch.zeros((1, 0), dtype=torch.long)), ValueError, "empty"),
    (dict(input_ids=[]), ValueError, "empty"),
    (dict(input_ids=torch.zeros((2, 4), dtype=torch.long)), ValueError, "batch size 2"),
    (dict(input_ids=torch.zeros((1, 4))), TypeError, "integer token ids"),
    (dict(input_ids="hello"), TypeError, "tensor or a list"),
    (dict(input_ids=[5, 200]), ValueError, "outside the target's vocabulary"),
    (dict(max_new_tokens=-1), ValueError, ">= 0"),
    (dict(max_new_tokens=2.5), TypeError, "int"),
    (dict(max_new_tokens=250), ValueError, "exceeds the target's context of 256"),
    (dict(temperature=float("nan")), ValueError, "finite"),
    (dict(temperature=float("inf")), ValueError, "finite"),
    (dict(temperature=-0.5), ValueError, ">= 0"),
    (dict(top_p=1.5), ValueError, "top_p"),
    (dict(top_k=0), ValueError, "top_k"),
    (dict(method="hf_assisted"), ValueError, "needs a draft"),
    (dict(method="autoregressive", unknown_option=3), TypeError, "unknown_option"),
])
def test_bad_input_gets_clear_error(kwargs, error, match):
    target = random_lm("llama", seed=8)
    args = dict(method="autoregressive", input_ids=torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]]), max_new_tokens=4)
    args.update(kwargs)
    method, ids, n = args.pop("method"), args.pop("input_ids"), args.pop("max_new_tokens")
    with pytest.raises(error, match=match):
        generate(method, target, ids, n, **args)


def test_mismatched_draft_vocabulary():
    target = random_lm("llama", vocab=97, seed=9)
    draft = random_lm("llama", vocab=50, seed=9, layers=1)
    with pytest.raises(ValueError, match="target has 97 tokens, draft has 50"):
        generate("hf_assisted", target, [1, 2, 3], 4, draft=draft)


def test_package_exports():
    for name in ("load_models", "generate", "METHODS", "GenerationResult", "ModelPair"):
        assert hasattr(specdec_lib, name)
