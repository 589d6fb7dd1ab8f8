"""load_models (shipped pair, local directories, offline hub ids, vocabulary checks) and kv_cache.rollback."""
from __future__ import annotations

import pytest
import torch

from specdec_lib import compat, generate, load_models
from specdec_lib.mechanisms.kv_cache import cache_length, new_cache, rollback
from specdec_lib.env import TINY_DIR, resolve_device

from helpers import random_lm


def test_tiny_pair_shape_and_cost_budget(tiny_pair):
    target, draft = tiny_pair.target, tiny_pair.draft
    assert type(target).__name__ == "LlamaForCausalLM" and type(draft).__name__ == "LlamaForCausalLM"
    assert target.config.num_hidden_layers >= 6 and draft.config.num_hidden_layers <= 2
    assert target.config.vocab_size == draft.config.vocab_size == len(tiny_pair.tokenizer)
    assert tiny_pair.device == torch.device("cpu")
    weights = sum(p.stat().st_size for p in TINY_DIR.glob("*/model.safetensors"))
    assert weights <= 30_000_000, weights
    text = "def add(a, b):\n    return a + b\n"
    assert tiny_pair.decode(tiny_pair.encode(text)[0].tolist()) == text  # byte-level BPE round trip
    assert tiny_pair.tokenizer.eos_token == "<|endoftext|>"


def _word_tokenizer(names):
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({name: i for i, name in enumerate(names)}, unk_token=names[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=names[1], unk_token=names[0])


def test_local_directory_pair_roundtrip(tmp_path):
    target, draft = random_lm("llama", seed=1), random_lm("llama", seed=2, layers=1)
    tokenizer = _word_tokenizer([f"t{i}" for i in range(97)])
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    pair = load_models((tmp_path / "target", tmp_path / "draft"), device="cpu", dtype=torch.float64)
    ids = pair.encode("t5 t6 t7 t8")
    assert ids.tolist() == [[5, 6, 7, 8]]
    assert generate("autoregressive", pair.target, ids, 6).new_tokens == \
        generate("autoregressive", target, ids, 6).new_tokens


def test_draft_with_another_tokenizer_of_equal_size_is_refused(tmp_path):
    names = [f"t{i}" for i in range(97)]
    shuffled = names[:2] + names[2:][::-1]  # same size, other ids for the same strings
    for name, seed, tokenizer in (("target", 1, _word_tokenizer(names)), ("draft", 2, _word_tokenizer(shuffled))):
        random_lm("llama", seed=seed, layers=1).save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    with pytest.raises(ValueError, match="tokenizers differ \\(97 and 97 tokens"):
        load_models((tmp_path / "target", tmp_path / "draft"), device="cpu")


def test_mismatched_vocab_pair_is_refused(tmp_path):
    random_lm("llama", vocab=97, seed=1).save_pretrained(tmp_path / "target")
    random_lm("llama", vocab=64, seed=2, layers=1).save_pretrained(tmp_path / "draft")
    with pytest.raises(ValueError, match="target has 97 tokens, draft has 64"):
        load_models((tmp_path / "target", tmp_path / "draft"), device="cpu")


def test_hub_id_offline_says_use_tiny(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="load_models\\('tiny'\\)"):
        load_models(("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"), device="cpu")


def test_bad_specs_and_devices():
    with pytest.raises(TypeError, match="spec must be"):
        load_models("gpt2")
    with pytest.raises(TypeError, match="dtype"):
        load_models("tiny", device="cpu", dtype="float17")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            load_models("tiny", device="cuda")
        assert resolve_device("auto") == torch.device("cpu")


def test_rollback_equals_recompute():
    model = random_lm("llama", seed=4)
    ids = torch.randint(0, 97, (1, 20), generator=torch.Generator().manual_seed(0))
    cache = new_cache(model)
    with torch.no_grad():
        compat.forward(model, input_ids=ids, cache=cache, use_cache=True)
        assert cache_length(cache) == 20
        rollback(cache, 12)
        assert cache_length(cache) == 12
        assert all(layer.keys.shape[2] == 12 for layer in cache.layers)  # (B, kv_heads, seq, head_dim)
        after = compat.forward(model, input_ids=ids[:, 12:15], cache=cache, use_cache=True).logits
        fresh = model(input_ids=ids[:, :15]).logits[:, 12:15]
    torch.testing.assert_close(after, fresh, rtol=0, atol=1e-10)
    rollback(cache, 15)  # a no-op at the current length
    with pytest.raises(ValueError, match="cannot roll a cache of 15 tokens back to 16"):
        rollback(cache, 16)


def test_contiguous_cache_appends_in_place_and_equals_a_dynamic_cache():
    """The loop's target cache (kv_cache.ContiguousLayer): the same logits as a concatenating DynamicCache through
    appends, a buffer that doubles, a rollback, a compaction and a deepcopy; and no copy of its prefix per forward."""
    import copy

    from specdec_lib.mechanisms.kv_cache import compact

    model = random_lm("llama", seed=5)
    ids = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(1))
    plain, contiguous = new_cache(model), new_cache(model, capacity=8)
    with torch.no_grad():
        def both(chunk):
            a = compat.forward(model, input_ids=chunk, cache=plain, use_cache=True).logits
            b = compat.forward(model, input_ids=chunk, cache=contiguous, use_cache=True).logits
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
        both(ids[:, :6])
        buffer = contiguous.layers[0]._buffers[0]
        both(ids[:, 6:8])  # fills the 8 slots: the same buffer, the prefix not copied
        assert contiguous.layers[0]._buffers[0] is buffer and contiguous.layers[0].keys.data_ptr() == buffer.data_ptr()
        both(ids[:, 8:20])  # past capacity: a buffer of 20 (2 x 8 < 20), then 40 on the next growth
        assert contiguous.layers[0]._buffers[0].shape[2] == 20
        for cache in (plain, contiguous):
            rollback(cache, 15)
            compact(cache, 10, [0, 2, 4])  # keep 10 + the entries at 10, 12, 14
        assert cache_length(contiguous) == 13
        both(ids[:, 20:23])
        snapshot = copy.deepcopy(contiguous)
        both(ids[:, 23:30])  # the snapshot stays as it was
        assert cache_length(snapshot) == 16 and cache_length(contiguous) == 23
        assert contiguous.layers[0]._buffers[0].shape[2] == 40
    with pytest.raises(ValueError, match="capacity"):
        new_cache(model, capacity=0)


def test_auto_takes_the_tiny_pair_on_a_cpu_and_says_so(capsys):
    pair = load_models("auto", device="cpu")
    assert pair.name == "tiny" and pair.device.type == "cpu"
    out = capsys.readouterr().out
    assert "MODELS='auto': the shipped tiny pair" in out
    assert "device cpu: asked for" in out and "dtype float32: on a CPU" in out
    assert pair.target.dtype == torch.float32


def test_auto_on_a_gpu_falls_back_to_tiny_offline(monkeypatch, capsys):
    """On a GPU runtime "auto" asks for the hub pair; offline that fails and the tiny pair is loaded instead."""
    import specdec_lib.models.loading as models

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # the GPU branch without a GPU: "auto" resolves to cuda, every later placement stays on the CPU
    monkeypatch.setattr(models, "resolve_device", lambda d: torch.device("cuda" if d == "auto" else "cpu"))
    # ... and Colab's free GPU: a T4, compute capability 7.5
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    pair = load_models("auto")
    assert pair.name == "tiny"
    out = capsys.readouterr().out
    assert "could not be loaded" in out and models.HUB_PAIR[0] in out
    assert "device cuda: Tesla T4 (sm_75)" in out and "dtype float16: Tesla T4 (sm_75) has no native bfloat16" in out
    assert pair.target.dtype == torch.float16


@pytest.mark.parametrize("capability, name, expected", [((7, 5), "Tesla T4", torch.float16),
                                                         ((7, 0), "Tesla V100", torch.float16),
                                                         ((8, 0), "NVIDIA A100", torch.bfloat16),
                                                         ((9, 0), "NVIDIA H100", torch.bfloat16)])
def test_auto_dtype_goes_by_native_support_not_by_is_bf16_supported(monkeypatch, capability, name, expected):
    """torch.cuda.is_bf16_supported() is True on a T4 too (emulated): "auto" reads the compute capability."""
    from specdec_lib.env import auto_dtype, resolve_dtype

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    cuda = torch.device("cuda")
    dtype, why = auto_dtype(cuda)
    assert dtype == expected and resolve_dtype("auto", cuda) == expected
    assert f"{name} (sm_{capability[0]}{capability[1]})" in why
    assert resolve_dtype("float32", cuda) == torch.float32  # an explicit dtype is kept
    assert auto_dtype(torch.device("cpu"))[0] == torch.float32
