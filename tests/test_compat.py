"""transformers' moving parts (`specdec_lib.compat`) on the installed release, whichever it is in the supported
range (the drift check, `make test-latest` / `make test-oldest`, runs this file at both ends):

- the cache keyword is the one the forward declares, and using it warns nothing;
- `crop` keeps exactly the first `length` entries;
- HF's decoders are counted from the forward's arguments by type and shape: hf's MAT is 1, and every peer's
  accept lengths agree with its tokens and with its target forwards counted independently;
- no method of the library warns (FutureWarning / DeprecationWarning) through its own calls.
"""
from __future__ import annotations

import functools
import inspect
import warnings

import pytest
import torch

from specdec_lib import METHODS, compat, generate
from specdec_lib.mechanisms import kv_cache

from helpers import random_lm, repeating_prompt, with_head

PEERS = ["hf", "hf_prompt_lookup", "hf_assisted"]


@pytest.fixture(scope="module")
def pair():
    target = with_head(random_lm("llama", seed=0, layers=2, logit_scale=20.0))
    return target, random_lm("llama", seed=1, layers=1, logit_scale=20.0)


def test_cache_keyword_is_what_the_forward_declares(pair):
    target, _ = pair
    for model in (target, target.model):
        keyword = compat.cache_keyword(model)
        assert keyword in inspect.signature(type(model).forward).parameters
        expected = "cache" if compat.transformers_version() >= (5, 24) else "past_key_values"
        assert keyword == expected, (keyword, compat.transformers_version())


def test_forward_through_compat_warns_nothing_and_fills_the_cache(pair):
    target, _ = pair
    ids = repeating_prompt(10, 0)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # a deprecation of the keyword would raise here
        cache = kv_cache.new_cache(target)
        logits = compat.forward(target, input_ids=ids, cache=cache, use_cache=True).logits  # (1, 10, V)
        step = compat.forward(target, input_ids=ids[:, :1], cache=cache, use_cache=True).logits[0, -1]
    assert kv_cache.cache_length(cache) == 11
    with torch.no_grad():
        full = target(input_ids=torch.cat([ids, ids[:, :1]], 1)).logits[0]  # (11, V), no cache at all
    torch.testing.assert_close(logits[0], full[:10])
    torch.testing.assert_close(step, full[10])


def test_crop_keeps_the_first_entries(pair):
    target, _ = pair
    ids = repeating_prompt(12, 1)
    cache = kv_cache.new_cache(target)
    with torch.no_grad():
        compat.forward(target, input_ids=ids, cache=cache, use_cache=True)
    before = [layer.keys.clone() for layer in cache.layers]
    compat.crop(cache, 7)
    assert kv_cache.cache_length(cache) == 7
    for layer, keys in zip(cache.layers, before):
        torch.testing.assert_close(layer.keys, keys[:, :, :7])
    compat.crop(cache, 7)  # a no-op
    assert kv_cache.cache_length(cache) == 7
    for bad in (8, -1):
        with pytest.raises(ValueError, match="cannot crop"):
            compat.crop(cache, bad)


def test_find_cache_and_query_rows_read_types_and_shapes_not_names(pair):
    target, _ = pair
    cache = kv_cache.new_cache(target)
    ids = torch.zeros(1, 5, dtype=torch.long)
    for keyword in ("cache", "past_key_values", "anything_else"):
        assert compat.find_cache((), {keyword: cache, "use_cache": True}) is cache
    assert compat.find_cache((ids, cache), {}) is cache
    assert compat.find_cache((ids,), {"use_cache": True}) is None
    assert compat.query_rows((), {"input_ids": ids}) == 5
    assert compat.query_rows((ids,), {}) == 5
    assert compat.query_rows((), {"inputs_embeds": torch.zeros(1, 3, 8)}) == 3
    with pytest.raises(ValueError):
        compat.query_rows((), {})


class _CallCounter:
    """Counts calls of a model's forward by wrapping it (independent of ForwardCounter's pre-hook)."""

    def __init__(self, model):
        self.model, self.calls, self._original = model, 0, model.forward

    def __enter__(self):
        @functools.wraps(self._original)
        def counted(*args, **kwargs):
            self.calls += 1
            return self._original(*args, **kwargs)

        self.model.forward = counted
        return self

    def __exit__(self, *exc):
        del self.model.forward  # back to the class's forward


@pytest.mark.parametrize("method", PEERS)
def test_hf_peers_accept_lengths_match_independent_counts(pair, method):
    target, draft = pair
    ids = repeating_prompt(30, 2)
    n = 24
    with _CallCounter(target) as counted:
        result = generate(method, target, ids, n, draft=draft if METHODS[method].needs_draft else None)
    assert len(result.new_tokens) == n
    assert result.target_forwards == counted.calls, (result.target_forwards, counted.calls)
    assert len(result.accept_lengths) == counted.calls
    assert all(a >= 1 for a in result.accept_lengths), result.accept_lengths
    assert sum(result.accept_lengths) == n
    assert result.mat == pytest.approx(n / counted.calls)
    if method == "hf":
        assert result.accept_lengths == [1] * n and result.mat == 1.0


def test_assisted_generation_fix_applies_at_5_15_only_and_is_undone():
    """5.15's AssistedCandidateGenerator crops the assistant's cache by a fixed count (HF's bug, fixed in 5.16):
    within `assisted_generation_fixed` it follows 5.16's rule, on 5.15 only; outside, HF's own method is back.
    (test_hf_peers_accept_lengths_match_independent_counts[hf_assisted] hits the bug without the fix.)"""
    from transformers.generation.candidate_generator import AssistedCandidateGenerator as generator

    before = generator.__dict__["_update_past_and_masks"]
    with compat.assisted_generation_fixed():
        inside = generator.__dict__["_update_past_and_masks"]
    assert generator.__dict__["_update_past_and_masks"] is before
    assert (inside is not before) == (compat.transformers_version() == (5, 15))


def test_forward_counter_sees_a_prefill_then_one_row_per_step(pair):
    from specdec_lib.methods.peers import ForwardCounter

    target, _ = pair
    ids = repeating_prompt(9, 3)
    with ForwardCounter(target) as counter:
        generate("hf", target, ids, 5)
    assert counter.rows == [9, 1, 1, 1, 1]
    assert counter.starts == [0, 9, 10, 11, 12]


@pytest.mark.filterwarnings("ignore::specdec_lib.tables.NoFrozenTableWarning")
@pytest.mark.parametrize("method", sorted(METHODS))
def test_no_method_warns_a_deprecation(pair, method):
    target, draft = pair
    ids = repeating_prompt(24, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        generate(method, target, ids, 8, draft=draft if METHODS[method].needs_draft else None)
    deprecations = [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught
                    if issubclass(w.category, (FutureWarning, DeprecationWarning))]
    assert not deprecations, deprecations


def test_decode_attention_leaves_cudnn_out_on_cuda_only():
    # the flags are process-wide switches (no GPU needed to set them): inside, cuDNN's SDPA is off and the others on
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with compat.decode_attention(torch.device("cuda")):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    with compat.decode_attention("cpu"):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before  # a CPU decode keeps torch's choice
