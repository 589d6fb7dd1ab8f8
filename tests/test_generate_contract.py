"""The `generate` contract around the methods: EOS None, seeded sampling, accept-length bookkeeping of HF's
decoders, the registry, and bad input (a clear error or a documented choice). Parity, EOS, max_new_tokens and
lossless sampling for every method are in test_contract.py."""
from __future__ import annotations

import math

import pytest
import torch

import specdec_lib
from specdec_lib import METHODS, generate
from specdec_lib.methods.peers import accept_lengths_from_starts

from helpers import random_lm, repeating_prompt, with_head

GREEDY_METHODS = [m for m in sorted(METHODS) if m != "hf"]




def test_shipped_pair_float32_parity_and_speculation(tiny_pair):
    ids = tiny_pair.encode("def parse(self, text):\n    tokens = []\n    for line in text.splitlines():\n")
    reference = generate("hf", tiny_pair.target, ids, 64)
    assisted = generate("hf_assisted", tiny_pair.target, ids, 64, draft=tiny_pair.draft, gamma=4)
    assert assisted.new_tokens == reference.new_tokens
    # The assistant really drafts: fewer target forwards than tokens, gamma draft forwards per step at most.
    assert assisted.target_forwards < len(assisted.new_tokens)
    assert assisted.mat > 1.0
    assert assisted.stats["draft_forwards"] >= assisted.target_forwards
    autoregressive = generate("autoregressive", tiny_pair.target, ids, 64)
    assert autoregressive.accept_lengths == [1] * 64 and autoregressive.mat == 1.0


def test_eos_none_never_stops_even_at_the_models_default_eos():
    """eos_token_id=None means no EOS stop, also for HF, whose generation_config carries a default EOS."""
    target = with_head(random_lm("llama", seed=3, logit_scale=20.0))
    draft = random_lm("llama", seed=4, layers=1, logit_scale=20.0)
    ids = repeating_prompt(12, 3)
    free = generate("autoregressive", target, ids, 30).new_tokens
    target.generation_config.eos_token_id = free[0]  # HF would stop after one token if it used this default
    try:
        for method in ["hf"] + GREEDY_METHODS:
            assert generate(method, target, ids, 30, draft=draft).new_tokens == free, method
    finally:
        target.generation_config.eos_token_id = None


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


@pytest.mark.full
def test_first_token_distribution_matches_target():
    """The autoregressive sampler draws the first token from softmax(logits / T): chi-square over 3000 seeds.
    make test: the contract's autoregressive sampling test checks the joint law of the first tokens, this one's
    marginal with it (tests/test_contract.py::test_sampling_matches_the_target_distribution)."""
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
    (dict(input_ids=[5, -1]), ValueError, "outside the target's vocabulary"),
    (dict(eos_token_id=97), ValueError, "eos_token_id 97 is outside the target's vocabulary of 97"),
    (dict(eos_token_id=-1), ValueError, "eos_token_id -1 is outside"),
    (dict(eos_token_id=True), TypeError, "eos_token_id must be an int"),
    (dict(temperature=1.0, top_p=0.0), ValueError, "top_p must be in"),
    (dict(temperature=1.0, top_p=float("nan")), ValueError, "top_p must be in"),
    (dict(temperature=1.0, top_p="0.5"), TypeError, "top_p must be a number"),
    (dict(temperature=1.0, top_k=True), TypeError, "top_k must be an int"),
    (dict(top_p=0.9), ValueError, "temperature=0 is greedy"),
    (dict(top_k=5), ValueError, "temperature=0 is greedy"),
    (dict(input_ids=torch.zeros((1, 250), dtype=torch.long), max_new_tokens=7), ValueError, "exceeds the target's context"),
    (dict(method="draft_model", draft="meta"), ValueError, "draft is on meta"),
])
def test_bad_input_gets_clear_error(kwargs, error, match):
    target = random_lm("llama", seed=8)
    args = dict(method="autoregressive", input_ids=torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]]), max_new_tokens=4)
    args.update(kwargs)
    method, ids, n = args.pop("method"), args.pop("input_ids"), args.pop("max_new_tokens")
    if args.get("draft") == "meta":  # a draft on another device than the target
        args["draft"] = random_lm("llama", seed=8, layers=1).to("meta")
    with pytest.raises(error, match=match):
        generate(method, target, ids, n, **args)


def test_prompt_exactly_at_the_context_limit_is_fine():
    target = with_head(random_lm("llama", seed=8, context=64))
    ids = torch.randint(0, 97, (1, 60), generator=torch.Generator().manual_seed(0))
    reference = generate("hf", target, ids, 4).new_tokens  # 60 + 4 == 64: the last token is never fed
    for method in GREEDY_METHODS:
        assert generate(method, target, ids, 4, draft=target).new_tokens == reference, method
    with pytest.raises(ValueError, match="exceeds the target's context of 64"):
        generate("autoregressive", target, ids, 5)


def test_draft_in_another_dtype_is_a_documented_choice():
    """q is computed in float32 whatever the draft's dtype: a float32 draft for a float64 target works."""
    target = random_lm("llama", seed=3, logit_scale=20.0)
    draft = random_lm("llama", seed=3, logit_scale=20.0).to(torch.float32)  # the target itself, in float32
    ids = repeating_prompt(12, 3)
    result = generate("draft_model", target, ids, 20, draft=draft, gamma=4, debug=True)  # gamma fixed: it drafts
    assert result.new_tokens == generate("hf", target, ids, 20).new_tokens and result.mat > 1.5


def test_mismatched_draft_vocabulary():
    target = random_lm("llama", vocab=97, seed=9)
    draft = random_lm("llama", vocab=50, seed=9, layers=1)
    with pytest.raises(ValueError, match="target has 97 tokens, draft has 50"):
        generate("hf_assisted", target, [1, 2, 3], 4, draft=draft)


def test_package_exports():
    for name in ("load_models", "generate", "METHODS", "GenerationResult", "ModelPair"):
        assert hasattr(specdec_lib, name)
