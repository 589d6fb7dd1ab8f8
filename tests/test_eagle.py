"""EAGLE (methods/eagle.py, eagle_head.py, training/train_eagle.py): the head, its loading, the dynamic tree, and
what the shipped head does on the tiny pair. Lossless greedy and sampling: the contract test (every METHOD)."""
from __future__ import annotations

import pytest
import torch

from specdec_lib import generate
from specdec_lib import compat
from specdec_lib.models.eagle_head import EagleHead, HeadKV, head_for, load_head, save_head, target_fingerprint
from specdec_lib.methods.eagle import Eagle
from specdec_lib.training import train_eagle

from helpers import SHIPPED_PROMPTS, WINDOW, family_lm, random_lm, repeating_prompt, with_head

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_shipped_head_is_found_for_the_tiny_target_in_any_dtype(tiny_pair, tiny_pair64):
    head = head_for(tiny_pair.target)
    assert isinstance(head, EagleHead) and head_for(tiny_pair.target) is head  # loaded once per target
    assert head_for(tiny_pair64[0]).fc.weight.dtype == torch.float64
    assert target_fingerprint(tiny_pair.target) == target_fingerprint(tiny_pair64[0])


def test_a_target_without_a_head_is_refused_with_the_way_out(tmp_path):
    target = random_lm("llama", seed=7)
    with pytest.raises(ValueError, match="no EAGLE head was trained for this target.*train_eagle"):
        generate("eagle", target, repeating_prompt(12, 0), 8)


def test_save_load_round_trip_and_another_target_refused(tmp_path):
    target = with_head(random_lm("llama", seed=4), steps=20)
    head = head_for(target)
    save_head(head, tmp_path / "h", target, dict(note="test"))
    again = load_head(tmp_path / "h", target)
    x = torch.randn(1, 5, 32, dtype=torch.float64)
    pos = torch.arange(5)[None]
    with torch.no_grad():
        assert torch.allclose(again(x, x, pos), head(x, x, pos), atol=2e-3)  # float16 on disk
    with pytest.raises(ValueError, match="trained for another target"):
        load_head(tmp_path / "h", random_lm("llama", seed=4, layers=3))


# the families of the family matrix, Phi-3 with a partial rotary too (its first half of each head's dims turned)
DECODED = {**{kind: dict(family=kind) for kind in ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "mistral", "phi3")},
           "phi3-partial": dict(family="phi3", partial_rotary_factor=0.5)}


@pytest.mark.parametrize("kind", sorted(DECODED))
def test_the_written_out_decode_is_the_heads_forward(kind):
    """EagleHead.decode (the decode-time path, its own KV buffers) against forward with a transformers cache, per
    family: a catch-up of causal rows past the copied layer's window (the head's layer is full-width in both),
    then tree rows at shared positions with a mask, a crop and more rows; GQA (4 heads, 2 KV), qwen2's biased
    projections, qwen3's and gemma3's q/k norms, phi3's fused projections, Gemma's 1 + w and sandwich norms,
    gemma2's soft-capped attention; every weight moved off its initial value (norms of ones or zeros would hide a
    norm read wrongly); the buffers grow past their first capacity."""
    target = family_lm(layers=2, seed=3, **DECODED[kind])
    head = EagleHead.for_target(target).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for param in head.parameters():
            param.add_(0.3 * torch.randn_like(param))
    P, d = 2 * WINDOW + 1, target.config.hidden_size
    feats, embeds = torch.randn(P + 3, d, dtype=torch.float64), torch.randn(P + 3, d, dtype=torch.float64)
    cache, kv = head.new_cache(), HeadKV(head, capacity=4)
    with torch.no_grad():
        causal = torch.ones(P, P, dtype=torch.bool).tril()
        want = head(feats[None, :P], embeds[None, :P], torch.arange(P)[None], causal[None, None], cache)[0]
        assert torch.allclose(head(feats[None, :P], embeds[None, :P], torch.arange(P)[None])[0], want, atol=1e-12)
        got = head.decode(feats[:P], embeds[:P], list(range(P)), causal, kv)
        assert kv.length == P and torch.allclose(got, want, atol=1e-12)
        sees = torch.zeros(3, P + 3, dtype=torch.bool)  # two siblings at P, a child of the first at P + 1
        sees[:, :P] = True
        sees[0, P] = sees[1, P + 1] = sees[2, P] = sees[2, P + 2] = True
        pos = [P, P, P + 1]
        for _ in range(2):  # the second time after cutting the tree rows back: the same rows again
            want = head(feats[None, P:], embeds[None, P:], torch.tensor([pos]), sees[None, None], cache)[0]
            got = head.decode(feats[P:], embeds[P:], pos, sees, kv)
            assert torch.allclose(got, want, atol=1e-12)
            compat.crop(cache, P)
            kv.crop(P)
    with pytest.raises(ValueError, match="cannot crop"):
        kv.crop(P + 1)
    layout = head.layout()
    assert (layout.qk_norm, layout.fused_qkv, layout.plus_one) == (kind in ("qwen3", "gemma3"), kind.startswith("phi3"),
                                                                  kind.startswith("gemma"))
    assert layout.softcap == (50.0 if kind == "gemma2" else None)


def test_the_heads_probabilities_and_the_rows_it_reads_are_the_soft_capped_targets():
    """Gemma 2 caps its logits (cap * tanh(logits / cap)): the head's drafts' logits and the verify rows an EAGLE
    step reads are the target's own, capped, not lm_head(hidden) (same argmax, other probabilities)."""
    from specdec_lib.mechanisms import kv_cache, verify
    from specdec_lib.mechanisms.draft_tree import DraftTree

    target = family_lm("gemma2", layers=2, seed=5, final_logit_softcapping=3.0)
    ids = repeating_prompt(20, 1, 128)
    with torch.no_grad():
        out = target(input_ids=ids)
        hidden = target.model(input_ids=ids).last_hidden_state[0]  # (T, d)
        head = EagleHead.for_target(target)
        assert torch.allclose(head.logits(target, hidden)[0], out.logits[0], atol=1e-12)
        assert out.logits.abs().max() < 3.0 < (hidden @ target.lm_head.weight.T).abs().max()  # the cap bites
        tree = DraftTree(int(ids[0, -1]), [3, 4], [-1, 0])
        cache = kv_cache.new_cache(target)
        prompt = ids[0].tolist()
        rows = verify.forward_proposal(target, cache, verify.Proposal(tree, features=True), prompt)
        want = target(input_ids=torch.tensor([prompt + [3, 4]])).logits[0, -3:]  # the root's row and the nodes'
        assert torch.allclose(rows.full(), want, atol=1e-9) and torch.allclose(rows[1], want[1], atol=1e-9)


def test_a_layer_decode_does_not_run_is_refused():
    """OLMo 2's layer norms after attention and MLP only (no input norm): not in the written-out decode, a clear
    error naming the parts, and `generate` refuses eagle by family and method with what to use instead; a model
    whose logits are not a known function of the hidden state (Cohere's logit scale) is refused before that."""
    from transformers import CohereConfig, CohereForCausalLM, Olmo2Config, Olmo2ForCausalLM

    common = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, eos_token_id=None)
    olmo = Olmo2ForCausalLM(Olmo2Config(**common)).eval()
    with pytest.raises(ValueError, match="cannot run Olmo2DecoderLayer: it lacks input_layernorm"):
        EagleHead.for_target(olmo).check_decodable()
    with pytest.raises(ValueError, match="'eagle' cannot decode with a olmo2 target: .*Olmo2DecoderLayer.*instead"):
        generate("eagle", olmo, repeating_prompt(12, 0), 8)
    cohere = CohereForCausalLM(CohereConfig(**common)).eval()
    with pytest.raises(ValueError, match="a cohere target: .*logits are not a function.*instead"):
        generate("eagle", cohere, repeating_prompt(12, 0), 8)
    EagleHead.for_target(random_lm("llama")).check_decodable()  # the layers decode runs pass


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        Eagle(topk=0)
    with pytest.raises(ValueError):
        Eagle(budget=0)
    with pytest.raises(TypeError, match="EagleHead"):
        Eagle(head="data/models/eagle-tiny")
    with pytest.raises(ValueError, match="head_ms"):
        Eagle(head_ms=-1.0)
    with pytest.raises(ValueError, match="head_ms"):
        Eagle(budget=4, head_ms=1.0)  # read only under "auto"
    wide, narrow = random_lm("llama", hidden=64, seed=1), random_lm("llama", seed=1)
    with pytest.raises(ValueError, match="width"):
        generate("eagle", narrow, repeating_prompt(12, 0), 8, head=EagleHead.for_target(wide))


def test_step_one_keeps_the_prompts_features_and_no_extra_target_pass(tiny_pair64, tiny_pair):
    target = tiny_pair64[0]
    ids = tiny_pair.encode(SHIPPED_PROMPTS[0])
    calls = []
    hook = target.model.register_forward_hook(lambda m, a, k, out: calls.append(out.last_hidden_state.shape[1]),
                                              with_kwargs=True)
    try:
        result = generate("eagle", target, ids, 24, budget=8, debug=True)
    finally:
        hook.remove()
    assert result.new_tokens == generate("hf", target, ids, 24).new_tokens
    assert len(calls) == result.target_forwards  # one target forward per step, the prompt's included
    assert calls[0] == ids.shape[1]  # step 1: a plain step whose forward keeps every prompt row
    assert result.stats["head_forwards"] > 0 and result.mat > 1.5


def test_the_shipped_head_drafts_deeper_than_the_draft_model_agrees(tiny_pair64, tiny_pair):
    """What the head was trained for: on held-out-style code, EAGLE's mean accepted tokens per step beat the
    draft model's at the same row budget (a chain of 6 against a tree of 6)."""
    target, draft, _ = tiny_pair64
    mats = {"eagle": [], "draft_model": []}
    for text in SHIPPED_PROMPTS:
        ids = tiny_pair.encode(text)
        mats["eagle"].append(generate("eagle", target, ids, 48, budget=6).mat)
        mats["draft_model"].append(generate("draft_model", target, ids, 48, draft=draft, gamma=6).mat)
    assert sum(mats["eagle"]) > sum(mats["draft_model"]), mats


def test_training_lowers_the_loss_and_raises_agreement():
    target = random_lm("llama", seed=2, logit_scale=20.0)
    data = train_eagle.own_text(target, sequences=8, length=96)
    head = EagleHead.for_target(target)
    before = train_eagle.agreement(head, target, data)
    history = train_eagle.train(head, target, data, None, 3e-3, 0.1, 0.05, 8, 0, steps=120, progress=False)
    assert history[-1]["loss"] < history[0]["loss"]
    assert train_eagle.agreement(head, target, data) > before + 0.2
    chain = train_eagle.chain_acceptance(head, target, data, depth=3, prefixes=16)
    assert len(chain) == 3 and 0.0 <= chain[0] <= 1.0
