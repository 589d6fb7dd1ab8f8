"""The one place that touches transformers' `DynamicCache` internals (version-sensitive calls live here).

- `new_cache(model)`: an empty DynamicCache for a model.
- `cache_length(cache)`: tokens the cache holds.
- `rollback(cache, length)`: keep the first `length` tokens. transformers changed `DynamicCache.crop` at
  5.15: before, `crop(n)` kept n tokens; from 5.15, `crop(-n)` removes n tokens and a positive argument
  raises. We support >= 5.15 and wrap it once here.

Simplifications: full-attention caches only (no sliding-window layers), batch size 1.
"""
from __future__ import annotations

from functools import lru_cache

import torch


@lru_cache(maxsize=1)
def transformers_version() -> tuple[int, int]:
    import transformers

    major, minor = transformers.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def new_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def cache_length(cache) -> int:
    return int(cache.get_seq_length())


def rollback(cache, length: int) -> None:
    """Drop every cached token after the first `length` (in place)."""
    current = cache_length(cache)
    if not 0 <= length <= current:
        raise ValueError(f"cannot roll a cache of {current} tokens back to {length}")
    if length == current:
        return
    if transformers_version() >= (5, 15):
        cache.crop(length - current)  # a negative count: remove (current - length) tokens
    else:  # pragma: no cover - older transformers are outside the supported range
        cache.crop(length)


def layer_keys(cache, layer: int) -> torch.Tensor:
    """Keys of one layer, (batch, kv_heads, seq, head_dim)."""
    return cache.layers[layer].keys
