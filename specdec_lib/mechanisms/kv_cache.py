"""The one place that works on a `DynamicCache`'s layers (what transformers names, and the version-sensitive
calls, are spelled in `compat`).

- `GrowableKV`: one layer's keys and values in preallocated buffers that double when full (write at a slot, read
  a prefix, crop); `ContiguousLayer` (a DynamicLayer) and EAGLE's `HeadKV` keep their entries in one.
- `new_cache(model, capacity)`: an empty DynamicCache for a model, every layer a full one (a sliding-window
  layer's too: the masks enforce its window, so rollback and compaction work on every layer); with a capacity its
  layers append in place into preallocated buffers (the loop's target cache: no copy of the whole cache per forward).
- `WindowedLayer`: a sliding-window layer keeping every position that hands attention its window only.
- `cache_length(cache)`: tokens the cache holds.
- `rollback(cache, length)`: keep the first `length` tokens. transformers changed `DynamicCache.crop` at
  5.15 (before, `crop(n)` kept n tokens; from 5.15, `crop(-n)` removes n tokens): `compat.crop` spells it.
- `compact(cache, keep_from, indices)`: keep a prefix plus chosen later entries (the accepted path of a
  verified draft tree), in place, with no re-feeding.
- `TrackedCache`: a draft model's cache with the token ids it holds (the draft side of draft-model SD, whose
  rollback follows the four scenarios of the DynamicCache blog; the target's cache is the loop's).

Simplifications: full-attention layers only (a sliding window is the masks' and WindowedLayer's view of a full
layer; no recurrent or shared-KV layers), batch size 1.
"""
from __future__ import annotations

import torch

from .. import compat
from ..env import check_int


GROWING = 1024  # first capacity of a cache whose final length is not known up front (a draft's): it doubles


def new_cache(model, capacity: int | None = None, windowed: bool = False):
    """An empty DynamicCache for `model` whose layers all keep every position; with `capacity`, they append in place
    into preallocated buffers (`ContiguousLayer`): no copy of the whole cache per forward.

    A sliding-window layer becomes a full one too: transformers' DynamicSlidingWindowLayer drops the positions
    that left its window, so a rejected draft could not be rolled back or compacted out of it. Every mask then
    hides what the window hides: ours (verify.build_forward, masks.render_layers), and transformers' own for a
    causal forward (its sliding mask is sized by each layer's `get_mask_sizes`, here the full length). Layers of
    other kinds (recurrent, chunked, KV-shared: compat.attention_layers' `other`) are left as transformers makes
    them, and `compact` refuses them. `windowed` (with a capacity): the sliding layers are `WindowedLayer`s,
    which hand attention only the keys a window reaches (for a cache that holds committed text only between
    forwards: the loop's target cache), where the model's attention takes dense masks (sdpa, eager: ours are
    sliced to the window there, verify.build_forward)."""
    if capacity is not None:
        check_int("capacity", capacity, 1)
    cache = compat.new_dynamic_cache(model.config)
    layers = compat.attention_layers(model.config)
    if layers.other:
        return cache
    windowed = windowed and (getattr(model.config, "_attn_implementation", None) or "sdpa") in ("sdpa", "eager")
    if capacity is None:
        cache.layers = [compat.DynamicLayer() for _ in cache.layers]
    else:
        cache.layers = [WindowedLayer(capacity, layers.window) if windowed and kind == compat.SLIDING
                        else ContiguousLayer(capacity) for kind in layers.types]
    return cache


class GrowableKV:
    """One layer's keys and values in preallocated buffers that grow by doubling: rows written at a slot, a prefix
    read as views (no copy), `crop` only moves the length. The loop's target and draft caches (ContiguousLayer)
    and EAGLE's head cache (eagle_head.HeadKV) keep their entries in one of these.

    capacity: the first buffers' slots; shape (B, H, D), dtype, device: allocate them now (else the first write
    does, shaped like its rows). A write past the slots moves the first `length` rows into buffers of
    max(capacity, end, 2 x slots) slots: appends cost amortised O(1) copies of the cache."""

    def __init__(self, capacity: int, shape: tuple[int, int, int] | None = None, dtype=None, device=None):
        self.capacity, self.length = check_int("capacity", capacity, 1), 0
        self.keys = self.values = None  # (B, H, slots, D) each, slots >= length
        if shape is not None:
            batch, heads, dim = shape
            self.keys = torch.zeros(batch, heads, capacity, dim, dtype=dtype, device=device)  # (B, H, capacity, D)
            self.values = torch.zeros_like(self.keys)

    @property
    def slots(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def adopt(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Hold these (B, H, L, D) tensors as the first L rows (the next write that needs room copies them)."""
        self.keys, self.values, self.length = keys, values, keys.shape[-2]

    def write(self, start: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store keys, values (B, H, R, D) at slots start..start + R (start <= length: rows after it are dropped);
        returns the first start + R rows of each buffer (views)."""
        if not 0 <= start <= self.length:
            raise ValueError(f"cannot write at slot {start} of a KV holding {self.length} rows")
        end = start + keys.shape[-2]
        if end > self.slots:  # grow: the first `start` rows into larger buffers
            size = max(self.capacity, end, 2 * self.slots)
            batch, heads, _, dim = keys.shape
            like = keys if self.keys is None else self.keys  # the buffers keep their dtype and device
            grown = [torch.empty(batch, heads, size, dim, dtype=like.dtype, device=like.device)  # (B, H, size, D)
                     for _ in range(2)]
            if start:
                grown[0][:, :, :start] = self.keys[:, :, :start]
                grown[1][:, :, :start] = self.values[:, :, :start]
            self.keys, self.values = grown
        self.keys[:, :, start:end] = keys
        self.values[:, :, start:end] = values
        self.length = end
        return self.prefix()

    def prefix(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `length` rows of keys and values, (B, H, length, D) views."""
        return self.keys[:, :, :self.length], self.values[:, :, :self.length]

    def crop(self, length: int) -> None:
        """Keep the first `length` rows (nothing is copied or freed)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a KV of {self.length} rows to {length}")
        self.length = length


class ContiguousLayer(compat.DynamicLayer):
    """A DynamicLayer that appends in place. DynamicLayer.update concatenates: every forward copies the layer's
    whole cache (at a long context the copies cost about as much as a one-row step's attention on a CPU). This
    one writes the new rows into a GrowableKV and keeps `keys`/`values` as views of its first entries, so crop
    and `compact` (which slice and write those views) work unchanged."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity, self._kv = capacity, GrowableKV(capacity)

    @property
    def _buffers(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The GrowableKV's (keys, values) buffers, (B, kv_heads, slots, head_dim) each (None before a write)."""
        return None if self._kv.keys is None else (self._kv.keys, self._kv.values)

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.keys.shape[-2] if self.keys.dim() == 4 else 0  # DynamicLayer.crop slices the views
        if start and not self._holds_views():  # someone replaced keys/values (a concatenation, a deepcopy)
            self._kv.adopt(self.keys, self.values)
        self.keys, self.values = self._kv.write(start, key_states, value_states)  # (B, kv_heads, start + R, D)
        return self.keys, self.values

    def _holds_views(self) -> bool:
        """False when keys/values are tensors of their own, not views of the GrowableKV's buffers."""
        return self._kv.keys is not None and (self.keys.data_ptr() == self._kv.keys.data_ptr()
                                              and self.values.data_ptr() == self._kv.values.data_ptr())


class WindowedLayer(ContiguousLayer):
    """A sliding-window layer that keeps every position (rollback and compact work as on a full layer) but hands
    attention only the keys its window reaches, as views: a forward after `length` cached entries reads entries
    `window_start()`.. = max(0, length - window + 1).., what its first row (at position `length`) can see, and
    `get_mask_sizes` says so, as transformers' DynamicSlidingWindowLayer does. Right where the cache holds the
    committed text in order before each forward (the loop's target cache); a draft's tree rows break it."""

    is_sliding = True

    def __init__(self, capacity: int, window: int):
        super().__init__(capacity)
        self.window = check_int("window", window, 1)

    def window_start(self) -> int:
        """The first entry the next forward reads (its first row sits at the cached length)."""
        return max(0, self.get_seq_length() - self.window + 1)

    def update(self, key_states, value_states, *args, **kwargs):
        start = self.window_start()  # before the rows are written
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        return keys[:, :, start:], values[:, :, start:]  # (B, kv_heads, length + R - start, D) views

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        start = self.window_start()
        return self.get_seq_length() + query_length - start, start


def window_start(cache) -> int:
    """The first entry the next forward's sliding-window layers read (0 where none is a WindowedLayer)."""
    layer = next((layer for layer in cache.layers if isinstance(layer, WindowedLayer)), None)
    return 0 if layer is None else layer.window_start()


def cache_length(cache) -> int:
    return int(cache.get_seq_length())


def rollback(cache, length: int) -> None:
    """Drop every cached token after the first `length` (in place)."""
    current = cache_length(cache)
    if not 0 <= length <= current:
        raise ValueError(f"cannot roll a cache of {current} tokens back to {length}")
    compat.crop(cache, length)


def compact(cache, keep_from: int, indices) -> None:
    """Keep the first `keep_from` tokens plus the entries at offsets `indices` after them, in that order.

    After a tree forward the cache holds prefix (keep_from) + root + n tree nodes; keeping offset 0 (the
    root) and 1 + each accepted node, in path order, leaves exactly the cache sequential decoding of the
    accepted tokens would have built: each node's key was rotated at prefix + depth, which is its final
    position, so nothing is re-rotated or re-fed. Per layer, keys/values are (batch, kv_heads, seq,
    head_dim): index_select the kept entries (a copy), write them to keep_from.., then slice like `crop`.
    In place: tensors taken from the cache before the call see the overwrite (deepcopy for snapshots).
    """
    if hasattr(cache, "compact"):  # a cache with its own layout (flex_layout.FlexLayoutStore) does it itself
        cache.compact(keep_from, indices)
        return
    current = cache_length(cache)
    idx = [int(i) for i in indices]
    if any(not 0 <= i < current - keep_from for i in idx) or keep_from < 0:
        raise ValueError(f"offsets {idx} after {keep_from} do not fit a cache of {current} tokens")
    if compat.has_counting_layers(cache):  # sliding-window layers
        raise NotImplementedError("compact supports full-attention (DynamicLayer) caches only")
    if idx == list(range(len(idx))):  # already contiguous: a plain crop is the same thing
        rollback(cache, keep_from + len(idx))
        return
    end = keep_from + len(idx)
    for layer in cache.layers:
        src = torch.tensor(idx, dtype=torch.long, device=layer.keys.device) + keep_from
        keys = layer.keys.index_select(2, src)  # (B, kv_heads, len(indices), head_dim), a copy
        values = layer.values.index_select(2, src)
        if layer.keys.is_inference() and not torch.is_inference_mode_enabled():
            # inference tensors refuse in-place writes outside inference_mode: copy the prefix instead
            layer.keys = torch.cat([layer.keys[:, :, :keep_from], keys], dim=2)
            layer.values = torch.cat([layer.values[:, :, :keep_from], values], dim=2)
            continue
        layer.keys[:, :, keep_from:end] = keys  # in place: the prefix is never copied
        layer.values[:, :, keep_from:end] = values
        layer.keys = layer.keys[:, :, :end]  # a view, exactly what DynamicLayer.crop leaves
        layer.values = layer.values[:, :, :end]


class TrackedCache:
    """A model, its DynamicCache, and the token ids the cache holds: all cache-length bookkeeping lives here.

    Invariant, checked by `check` after every step in debug mode: cache_length(cache) == len(tokens), and
    `tokens` is a prefix of the committed sequence. Between steps the target's cache holds every committed
    token but the last; the draft's every committed token but the last one (or two, after a full acceptance).
    """

    def __init__(self, model):
        self.model, self.cache, self.tokens = model, new_cache(model, capacity=GROWING), []
        self.device = next(model.parameters()).device

    def feed(self, ids: list[int], keep: int = 1) -> torch.Tensor:
        """Forward `ids` after the cached tokens; the logits of the last `keep` positions, (keep, V)."""
        inputs = torch.tensor([ids], device=self.device)  # (1, len(ids))
        # logits_to_keep: the LM head runs on the rows we read only (on step 1 that skips the prompt's rows)
        out = compat.forward(self.model, input_ids=inputs, cache=self.cache, use_cache=True, logits_to_keep=keep)
        self.tokens.extend(ids)
        return out.logits[0]  # (keep, V)

    def commit(self, committed: list[int]) -> None:
        """Roll back to the longest cached prefix of `committed` that leaves its last token unfed.

        What the cache holds agrees with `committed` up to the first rejected draft, and the last committed
        token (bonus or resampled) was never fed, so that prefix has min(len(tokens), len(committed) - 1)
        tokens: for the target len(committed) - 1; for the draft too, except after a full acceptance where it
        never fed its last draft (len(committed) - 2: scenario 3)."""
        keep = min(len(self.tokens), len(committed) - 1)
        rollback(self.cache, keep)
        del self.tokens[keep:]

    def check(self, committed: list[int], name: str) -> None:
        length = cache_length(self.cache)
        if length != len(self.tokens) or self.tokens != committed[:length] or length >= len(committed):
            raise AssertionError(f"{name} cache holds {length} entries, its tokens {len(self.tokens)}, "
                                 f"committed {len(committed)} (prefix match: {self.tokens == committed[:length]})")
