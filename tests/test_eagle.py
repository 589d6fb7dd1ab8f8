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

from helpers import SHIPPED_PROMPTS, random_lm, repeating_prompt, with_head

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


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_the_written_out_decode_is_the_heads_forward(kind):
    """EagleHead.decode (the decode-time path, its own KV buffers) against forward with a DynamicCache: a catch-up
    of causal rows, then tree rows at shared positions with a mask, a crop and more rows; GQA (4 heads, 2 KV),
    and qwen2's biased projections; the buffers grow past their first capacity."""
    target = random_lm(kind, seed=3)
    head = EagleHead.for_target(target).eval()
    torch.manual_seed(0)
    P, d = 9, target.config.hidden_size
    feats, embeds = torch.randn(P + 3, d, dtype=torch.float64), torch.randn(P + 3, d, dtype=torch.float64)
    cache, kv = compat.new_dynamic_cache(head.config), HeadKV(head, capacity=4)
    with torch.no_grad():
        causal = torch.ones(P, P, dtype=torch.bool).tril()
        want = head(feats[None, :P], embeds[None, :P], torch.arange(P)[None], causal[None, None], cache)[0]
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


def test_a_layer_decode_does_not_run_is_refused():
    """Qwen3's per-head q/k norms are not in the written-out decode: a clear error, not silently other drafts."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    target = Qwen3ForCausalLM(Qwen3Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=8)).eval()
    with pytest.raises(ValueError, match="Llama-style decoder layers; Qwen3DecoderLayer has q_norm, k_norm"):
        EagleHead.for_target(target).check_decodable()
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
