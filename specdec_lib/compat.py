"""transformers' and torch's moving parts, in one module: every call whose spelling differs inside the supported range.

The library supports transformers >= 5.15 and torch >= 2.11; the rest of the library, the tests and the notebooks
call these, never the moving names:
- **The cache keyword of a forward**: `past_key_values=` up to 5.23, `cache=` from 5.24 (the old name warns).
  `forward(model, cache=..., **inputs)` passes the cache under the name this model's forward declares (read off
  its signature, so a model class that moves at another release is handled too).
- **Rolling a cache back**: from 5.15 `DynamicCache.crop(-n)` removes n tokens (a positive argument warns).
  `crop(cache, length)` keeps the first `length`.
- **Reading a forward from outside** (to count HF `generate`'s target forwards): 5.24 no longer passes
  `cache_position=` or `past_key_values=`, so `find_cache` finds the cache by its type and `query_rows` the new
  rows from the input's shape.
- **HF's assisted generation at 5.15**: `assisted_generation_fixed()` applies 5.16's cache rollback to HF's
  `AssistedCandidateGenerator` during the `hf_assisted` peer's call, so the peer runs on 5.15 too.
- **Caches of our own**: `transformers.cache_utils`' Cache, CacheLayerMixin and DynamicLayer are internal classes,
  named only here: kv_cache's `ContiguousLayer` subclasses `DynamicLayer`; FAFO's store (store/layout.py)
  subclasses `BufferCache`, whose layers are views of the subclass's buffers; `new_dynamic_cache` and
  `has_counting_layers` build and inspect caches, `attention_layers(config)` reads each layer's kind and window.
- **Attention kernels at decode time**: `decode_attention(device)` keeps CUDA decodes off cuDNN's SDPA.
- **Rotary modules**: `rotary_embeddings` passes the layer's attention kind where the forward takes one (Gemma 3).
- **Private torch ops**: `flash_attention_for_cpu()` (fused CPU attention with its log-sum-exp, for
  store/attention.py) and `packed_linear_ops()` (oneDNN's prepacked linear, for models/prepack.py), each None
  where this torch lacks it (or, for the linear, disagrees with `F.linear` on a probe).

Simplifications: batch size 1 for `query_rows`; `crop` and a `BufferCache` serve full-attention layers only.
"""
from __future__ import annotations

import inspect
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import lru_cache

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer

OLD_CACHE_KEYWORD, NEW_CACHE_KEYWORD = "past_key_values", "cache"


@lru_cache(maxsize=1)
def transformers_version() -> tuple[int, int]:
    """(major, minor) of the installed transformers, e.g. (5, 24)."""
    import transformers

    major, minor = transformers.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


@lru_cache(maxsize=None)
def _keyword_of(forward_fn) -> str:
    params = inspect.signature(forward_fn).parameters  # follows the decorators' __wrapped__
    if NEW_CACHE_KEYWORD in params:
        return NEW_CACHE_KEYWORD
    if OLD_CACHE_KEYWORD in params:
        return OLD_CACHE_KEYWORD
    # a forward that takes **kwargs only: trust the release
    return NEW_CACHE_KEYWORD if transformers_version() >= (5, 24) else OLD_CACHE_KEYWORD


def cache_keyword(model) -> str:
    """'cache' or 'past_key_values': the name under which `model`'s forward takes its KV cache."""
    return _keyword_of(type(model).forward)


def forward(model, cache=None, **inputs):
    """`model(**inputs)` with `cache` passed under the keyword its forward declares; returns the model's output.

    forward(target, input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits  # (1, 1, V)
    """
    if cache is not None:
        inputs[cache_keyword(model)] = cache
    return model(**inputs)


@contextmanager
def assisted_generation_fixed():
    """Within: HF's AssistedCandidateGenerator rolls the assistant's cache back as 5.16 does (5.15 only).

    5.15.0 and 5.15.1 crop the assistant's cache by a fixed count each round, whatever the cache holds, so after a
    rejected draft the assistant is soon fed an empty input and fails with a reshape error; 5.16 crops to the
    length the new input needs."""
    if transformers_version() != (5, 15):
        yield
        return
    from transformers.generation import candidate_generator as hf

    def update_past_and_masks(self, input_ids, remove_from_pkv: int = 0, num_added_tokens: int = 1) -> bool:
        cache = self.assistant_kwargs.get("past_key_values")
        if cache is None:
            return False
        # the assistant re-feeds the last `num_added_tokens` (+ removed) tokens of input_ids: keep what precedes
        keep = input_ids.shape[-1] - 1 - remove_from_pkv - num_added_tokens
        if cache.get_seq_length() > keep:
            crop(cache, keep)
        length, encoder_decoder = input_ids.shape[-1], self.assistant_model.config.is_encoder_decoder
        self.assistant_kwargs = hf._prepare_attention_mask(self.assistant_kwargs, length, encoder_decoder)
        self.assistant_kwargs = hf._prepare_position_ids(self.assistant_kwargs, length, encoder_decoder)
        self.assistant_kwargs = hf._prepare_token_type_ids(self.assistant_kwargs, length)
        return True

    cls = hf.AssistedCandidateGenerator
    original = cls.__dict__["_update_past_and_masks"]
    cls._update_past_and_masks = update_past_and_masks
    try:
        yield
    finally:
        cls._update_past_and_masks = original


def crop(cache, length: int) -> None:
    """Keep the first `length` tokens of a cache that holds more (in place)."""
    current = int(cache.get_seq_length())
    if not 0 <= length <= current:
        raise ValueError(f"cannot crop a cache of {current} tokens to {length}")
    if length == current:
        return
    if transformers_version() >= (5, 15):
        cache.crop(length - current)  # a negative count: remove (current - length) tokens
    else:  # pragma: no cover - older transformers are outside the supported range
        cache.crop(length)


def find_cache(args: tuple, kwargs: dict):
    """The KV cache among a forward's arguments (found by type, whatever its keyword), or None."""
    for value in (*kwargs.values(), *args):
        if isinstance(value, Cache):
            return value
    return None


def query_rows(args: tuple, kwargs: dict) -> int:
    """How many new positions a forward feeds: the length of its input_ids (or inputs_embeds) along dim 1."""
    for name in ("input_ids", "inputs_embeds"):
        value = kwargs.get(name)
        if isinstance(value, torch.Tensor):
            return int(value.shape[1])
    if args and isinstance(args[0], torch.Tensor):  # input_ids passed positionally
        return int(args[0].shape[1])
    raise ValueError("a forward without input_ids or inputs_embeds")


# ---- caches of our own ------------------------------------------------------------------------------------

def new_dynamic_cache(config=None):
    """An empty DynamicCache for a model of `config` (one layer per decoder layer, sliding-window ones included);
    without a config, full-width layers made as the forward meets them."""
    from transformers import DynamicCache

    return DynamicCache(config=config) if config is not None else DynamicCache()


def has_counting_layers(cache) -> bool:
    """Whether a cache holds layers that count their tokens beside their keys (`cumulative_length`: sliding-window,
    static and quantized layers), a count that writing keys/values directly would leave wrong."""
    return any(hasattr(layer, "cumulative_length") for layer in cache.layers)


FULL, SLIDING = "full_attention", "sliding_attention"  # transformers' names of the two attention kinds


@dataclass(frozen=True)
class AttentionLayers:
    """What a model's decoder layers attend to: `types`, one kind per layer ("full_attention", "sliding_attention",
    or another kind of transformers': chunked, linear, conv, KV-shared "dummy", ...); `window`, how many positions a
    sliding layer's row sees (itself included: key position > row position - window, as transformers masks it);
    `by_type`: the decoder's forward takes a dict {kind: mask} as attention_mask (its config lists `layer_types`),
    else one mask for every layer (all layers sliding: Mistral, Phi-3 with a sliding_window)."""
    types: tuple[str, ...]
    window: int | None
    by_type: bool

    @property
    def sliding(self) -> bool:
        return SLIDING in self.types

    @property
    def other(self) -> tuple[str, ...]:
        """The kinds other than full and sliding-window attention, in order of first appearance."""
        return tuple(dict.fromkeys(t for t in self.types if t not in (FULL, SLIDING)))


def attention_layers(config) -> AttentionLayers:
    """The attention kind of each decoder layer of a model of `config` (its text decoder's, for a multimodal one),
    read as transformers' DynamicCache(config=...) reads it: `layer_types` when listed, else a sliding window (or a
    chunk size) set for every layer."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    listed = getattr(text, "layer_types", None)
    types = list(listed) if listed is not None else []
    if not types:
        window, chunk = getattr(text, "sliding_window", None), getattr(text, "attention_chunk_size", None)
        kind = SLIDING if window is not None else "chunked_attention" if chunk is not None else FULL
        types = [kind] * int(text.num_hidden_layers)
    if getattr(text, "kv_sharing_modes", None) is not None:  # layers reading another layer's KV (Gemma 4)
        types = ["dummy" if mode == "reuse" else t for t, mode in zip(types, text.kv_sharing_modes)]
    window = getattr(text, "sliding_window", None) if SLIDING in types else None
    if SLIDING in types and window is None:
        raise ValueError(f"{text.model_type} lists sliding-window layers but no sliding_window in its config")
    return AttentionLayers(tuple(types), None if window is None else int(window), listed is not None)


class BufferCache(Cache):
    """A transformers Cache over buffers its subclass keeps: `keys`/`values` (layers, kv_heads, capacity,
    head_dim), `update(key_states, value_states, layer)`, `length` and `capacity`. Call
    `super().__init__(layers_n)` once the buffers exist: each layer transformers sees is a view of them."""

    def __init__(self, layers_n: int):
        super().__init__(layers=[_BufferLayer(self, i) for i in range(layers_n)])


class _BufferLayer(CacheLayerMixin):
    """One layer of a BufferCache as transformers sees it (keys/values: views of the owner's buffers)."""

    def __init__(self, owner, layer):
        super().__init__()
        self.owner, self.layer, self.is_initialized = owner, layer, True
        self.keys, self.values = owner.keys[layer][None], owner.values[layer][None]  # (1, kv_heads, capacity, dim)

    def lazy_initialization(self, key_states, value_states):
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        return self.owner.update(key_states, value_states, self.layer)

    def get_mask_sizes(self, query_length):
        return self.owner.capacity, 0

    def get_seq_length(self):
        return self.owner.length

    def get_max_length(self):
        return self.owner.capacity


# ---- attention kernels at decode time ------------------------------------------------------------------------

def decode_attention(device):
    """The SDPA kernels a decode may use on `device`: on CUDA every backend but cuDNN's, elsewhere torch's choice.

    torch may pick cuDNN attention first on a recent GPU, and cuDNN builds an execution plan (CPU work, per layer
    call) for every new shape and stride it meets, cached per shape: a decode meets a new KV length at every step,
    so each step paid it (cuDNN's attention then dominated the profiled CPU time: the runs are in
    data/results/gpu/). Flash and memory-efficient attention need no plan. Entered by `generate` and by the
    cost-curve timings, so both price the same kernels.
    """
    if torch.device(device).type != "cuda":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


# ---- rotary modules ------------------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _takes_layer_type(forward_fn) -> bool:
    return "layer_type" in inspect.signature(forward_fn).parameters  # follows dynamic_rope_update's __wrapped__


def rotary_embeddings(rotary, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None):
    """(cos, sin), each (B, R, rotary dim), of a decoder's rotary module at position_ids (B, R): `rotary(x,
    position_ids)`, or with `layer_type` (one of its config's layer_types) where the module keeps one table per
    attention kind (Gemma 3: the local rope of sliding layers, the global one of full layers)."""
    if _takes_layer_type(type(rotary).forward):
        return rotary(x, position_ids, layer_type)
    return rotary(x, position_ids)


# ---- private torch ops ------------------------------------------------------------------------------------

def flash_attention_for_cpu():
    """torch's fused CPU flash attention that also returns the log-sum-exp, op(query, key, value, dropout,
    is_causal, attn_mask=, scale=) -> (out, lse), or None where this torch lacks it (a private aten op)."""
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


@lru_cache(maxsize=1)
def packed_linear_ops():
    """(pack, linear) with pack(weight) -> an opaque packed weight and linear(x, packed, bias) -> x @ W.T + b,
    or None where this torch build lacks them (no oneDNN) or they disagree with F.linear on a probe."""
    ops = getattr(torch.ops, "mkldnn", None)
    if not torch.backends.mkldnn.is_available() or ops is None:
        return None
    try:
        pack_op, linear_op = ops._reorder_linear_weight, ops._linear_pointwise

        def pack(weight):
            return pack_op(weight.detach(), None)

        def linear(x, packed, bias):
            return linear_op(x, packed, bias, "none", [], "")

        generator = torch.Generator().manual_seed(0)
        weight, bias = torch.randn(24, 16, generator=generator), torch.randn(24, generator=generator)
        x = torch.randn(1, 3, 16, generator=generator)
        if not torch.allclose(linear(x, pack(weight), bias), torch.nn.functional.linear(x, weight, bias), atol=1e-4):
            return None
    except (AttributeError, RuntimeError):
        return None
    return pack, linear
