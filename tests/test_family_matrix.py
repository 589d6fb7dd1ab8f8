"""Every loop method on every model family a user may bring: lossless against HF greedy, or refused by name.

Small random float64 models built from configs (no hub): Llama (full attention only), Qwen2 and Qwen3 with
sliding-window layers above the first, Gemma 2 and Gemma 3 (sliding and full layers interleaved), Mistral and
Phi-3 with a sliding window on every layer, each window WINDOW tokens, and prompts of PROMPT tokens, so every
generation decodes across the window's edge many times. Each family has a target and a smaller draft of its own.
Every method of the one loop must give HF greedy's tokens (transformers' own sliding-window cache) token for
token, or refuse at `generate` with an error naming the family, the method and what to use instead (`REFUSED`).
A model whose cache has other stateful layers (LFM2's convolutions) is refused by every loop method.
Controls: the window changes HF's tokens on these models, our masks without it lose, and full-width sliding layers
(the masks alone) stay lossless; two sampling checks (EAGLE's on soft-capped Gemma 2); kv_cache.WindowedLayer by
hand.
"""
from __future__ import annotations

import pytest
import torch

from specdec_lib import METHODS, compat, generate
from specdec_lib.bench.lossless import lossless_check
from specdec_lib.mechanisms import kv_cache, masks, verify
from specdec_lib.mechanisms.draft_tree import ROOT, DraftTree

from helpers import WINDOW, family_lm, repeating_prompt, with_head

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore::specdec_lib.tables.NoFrozenTableWarning")]

PROMPT, NEW, VOCAB = 40, 40, 128  # WINDOW: helpers.family_lm's default window
LOOP = sorted(m for m in METHODS if METHODS[m].accepts("debug"))  # the loop's methods (HF's peers take no debug)
SLIDING = ("qwen2", "qwen3", "gemma2", "gemma3", "mistral", "phi3")
FAMILIES = ("llama",) + SLIDING
# settings under which each method drafts whatever this machine's costs (fixed budgets: an "auto" one stops
# drafting where the clock says it loses, budget/guard.py) (the tree variants: the drafts' own masks)
DRAFTING = {"card": dict(width=8), "card@tree": dict(width=4, tree=8), "draft_model": dict(gamma=4),
            "draft_model@topk": dict(topk=4, gamma=8), "eagle": dict(budget=8), "prompt_lookup": dict(num_tokens=4),
            "cacheback": dict(tdl=16), "lookahead": dict(guesses=7, window=5), "fafo": dict(streams=4, candidates=8)}
CASES = sorted(set(LOOP) | set(DRAFTING))
# (family or None for every sliding family, method) -> what the refusal must say besides the family and method
# (EAGLE's head, one decoder layer of the target's family, runs on all seven: its refusals are in test_eagle.py)
REFUSED = {(None, "fafo"): "use 'lookahead'"}


@pytest.fixture(scope="module")
def pairs():
    """{family: (target, draft, prompt)}: a 3-layer target, a 2-layer draft of the same family and vocabulary."""
    return {family: (family_lm(family, 3, seed=1), family_lm(family, 2, seed=101),
                     repeating_prompt(PROMPT, 1, VOCAB)) for family in FAMILIES}


def refusal(family: str, case: str) -> str | None:
    method = case.split("@")[0]
    if family in SLIDING and (None, method) in REFUSED:
        return REFUSED[None, method]
    return REFUSED.get((family, method))


def run_case(case: str, family: str, target, draft, ids):
    method = case.split("@")[0]
    if method == "eagle" and refusal(family, case) is None:
        with_head(target)  # a refusal comes before any head is looked for
    return generate(method, target, ids, NEW, draft=draft, debug=True, **DRAFTING.get(case, {}))


@pytest.mark.parametrize("case", CASES)
def test_every_family_lossless_or_refused(pairs, case):
    accepted = 0
    for family, (target, draft, ids) in pairs.items():
        said = refusal(family, case)
        if said is not None:
            with pytest.raises(ValueError) as caught:
                run_case(case, family, target, draft, ids)
            message = str(caught.value)
            assert target.config.model_type in message and repr(case.split("@")[0]) in message, message
            assert said in message and "instead" in message, message
            continue
        result = run_case(case, family, target, draft, ids)
        assert result.new_tokens == generate("hf", target, ids, NEW).new_tokens, family
        accepted += result.stats["accepted"]
        if case == "eagle":  # each family's head (its own layer kind, written out) drafts what its target accepts
            assert result.stats["accepted"] > 0, family
    if case != "autoregressive":  # drafts were verified and accepted: the masked steps ran
        assert accepted > 0, case


def test_the_window_matters_and_our_masks_carry_it(pairs, monkeypatch):
    """Controls: with a window as wide as the text HF's own tokens change on every sliding family (the tests above
    are not vacuous); with the target's sliding layers full (no kv_cache.WindowedLayer: every key read, the window
    the masks' alone, as for a backend other than sdpa/eager) the tree methods stay lossless; and a tree method
    whose masks leave the window out loses on at least one family."""
    for family in SLIDING:
        target, _, ids = pairs[family]
        wide = family_lm(family, 3, seed=1, window=256)
        assert generate("hf", wide, ids, NEW).new_tokens != generate("hf", target, ids, NEW).new_tokens, family
    new_cache = kv_cache.new_cache
    monkeypatch.setattr(kv_cache, "new_cache", lambda model, capacity=None, windowed=False: new_cache(model, capacity))
    for family in SLIDING:
        for method in ("cacheback", "lookahead"):
            tokens = run_case(method, family, *pairs[family]).new_tokens
            assert tokens == generate("hf", pairs[family][0], pairs[family][2], NEW).new_tokens, (family, method)
    monkeypatch.setattr(masks, "window", lambda *args, **kwargs: lambda b, h, q_idx, kv_idx: torch.as_tensor(True))
    lost = [family for family in SLIDING for method in ("cacheback", "lookahead")
            if run_case(method, family, *pairs[family]).new_tokens
            != generate("hf", pairs[family][0], pairs[family][2], NEW).new_tokens]
    assert lost, "no family lost with the window left out of the masks"


def test_other_stateful_layers_are_refused_by_name():
    """LFM2's short convolutions keep a state per layer that no rollback undoes: every loop method refuses."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    torch.manual_seed(0)
    config = Lfm2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention"],
                        max_position_embeddings=256, bos_token_id=0, eos_token_id=None, pad_token_id=0)
    target = Lfm2ForCausalLM(config).to(torch.float64).eval()
    ids = repeating_prompt(PROMPT, 2, VOCAB)
    assert len(generate("hf", target, ids, 4).new_tokens) == 4
    for method in LOOP:
        with pytest.raises(ValueError, match=r"lfm2 target: its conv layers .* use 'hf'") as caught:
            generate(method, target, ids, 4, draft=target)
        assert repr(method) in str(caught.value)


def test_sampling_matches_the_target_distribution_on_a_sliding_window_model():
    """The sampling contract (test_contract.py) on Gemma 3 with a window shorter than the prompt: draft_model's
    speculative-sampling rule over the loop's masked chain, its draft sliding too."""
    target = family_lm("gemma3", 2, seed=3, window=4, vocab=8, hidden=16)
    draft = family_lm("gemma3", 2, seed=4, window=4, vocab=8, hidden=16)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 1, 2, 3]])
    report = lossless_check("draft_model", target, ids, length=3, n_samples=1500, draft=draft, temperature=0.7,
                            gamma=3)
    assert report.passed, str(report)


def test_eagle_sampling_matches_a_soft_capped_target():
    """EAGLE under sampling on Gemma 2 with a window shorter than the prompt and a strong final logit cap (3): the
    walk draws from the target's capped distribution (verify.output_head); from lm_head(hidden) it would fail this
    check by far (chi-square p ~ 1e-90 on these seeds)."""
    target = with_head(family_lm("gemma2", 2, seed=3, window=4, vocab=8, hidden=16, final_logit_softcapping=3.0))
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 1, 2, 3]])
    report = lossless_check("eagle", target, ids, length=3, n_samples=500, temperature=0.7, budget=4)
    assert report.passed, str(report)
    assert sum(generate("eagle", target, ids, 3, temperature=0.7, seed=s, budget=4).stats["accepted"]
               for s in range(20)) > 5  # drafts are accepted: the check tests the walk over them


def test_a_windowed_layer_keeps_every_position_and_reads_its_window():
    """kv_cache.WindowedLayer (the target's sliding layers): transformers' sliding-layer mask sizes, and every
    position kept: a tree forward past the window's edge, committed to its second branch, leaves the logits a
    fresh forward of the committed text gives."""
    model = family_lm("mistral", 2)
    ids = repeating_prompt(24, 3, VOCAB)[0].tolist()
    cache = kv_cache.new_cache(model, capacity=64, windowed=True)
    assert all(isinstance(layer, kv_cache.WindowedLayer) for layer in cache.layers)
    with torch.inference_mode():
        compat.forward(model, input_ids=torch.tensor([ids[:19]]), cache=cache, use_cache=True)
        assert cache.layers[0].get_mask_sizes(1) == (WINDOW, 19 - WINDOW + 1)
        tree = DraftTree(ids[19], [5, 6, ids[20], ids[21]], [ROOT, 0, ROOT, 2])  # the second branch is the text's
        verify.tree_logits(model, cache, tree, 19)
        verify.commit(cache, 19, [2, 3])
        assert kv_cache.cache_length(cache) == 22 and kv_cache.window_start(cache) == 22 - WINDOW + 1
        ours = compat.forward(model, input_ids=torch.tensor([[ids[22]]]), cache=cache, use_cache=True).logits[0, -1]
        fresh = model(input_ids=torch.tensor([ids[:23]])).logits[0, -1]
    assert torch.allclose(ours, fresh, atol=1e-9)
