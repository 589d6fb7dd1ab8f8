"""FAFO's KV layout: the compressed KV kept physically contiguous, read through ONE static FlexAttention BlockMask.

FAFO paper §4.4 ("Physically Contiguous, Logically Sparse": KV layout = [C(kv) || R(kv)], a static block mask
that loads only the first B_fixed blocks), Appendix H (between steps, swap newly selected entries into the fixed
blocks and expired ones out to the tail) and Appendix E (one forward mixes rows that see C(kv) only with rows that
see the full KV). `FlexLayoutStore` is a transformers `Cache` for the target: per layer one preallocated key/value
buffer of `capacity` slots (a multiple of `block`, 128 by default), and `slot_pos`, the logical position of every
slot. Keys are stored rotated at their logical positions, so moving an entry between slots is a plain copy. Slots:

    [0, compressed)            C's selection (the "fixed region": at most B_fixed = ceil(kv_budget / block) blocks)
    [compressed, length)       every other committed entry (the tail: logically kept, physically skipped)
    [base, base + R)           the rows of the forward in flight (base = length when `prepare` was called)

One forward: `mask = store.prepare(positions, sees, compressed_rows)`, then `compat.forward(model, ...,
cache=store, attention_mask=mask)`; `sees` (R, R) says which rows of the forward each row sees, and a row in
`compressed_rows` sees the fixed region only. The BlockMask is built ONCE per row count R, each step writing a
few block counts and indices in place, so compiled flex never recompiles; the store's `attention_mode`
(attention.py) computes the attention from the layout. Between steps (`compress`, run by the next `prepare`): C
picks the entries to keep; those outside the fixed region swap places with unselected ones inside it (one
batched index copy for all layers). Simplifications: batch size 1; one layout for every layer and head; rollback
only of the rows of the last forward (what the loop needs: committed entries are not in logical order).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ... import compat
from ...env import check_int
from .. import masks
from .attention import ATTENTION_MODES, make_mode
from .compression import CacheView, Compression, StreamingLLM
from .flex_backend import ATTENTION_NAME, attach, block_mask_from_tables, block_table, check_model, flex

__all__ = ["ATTENTION_MODES", "ATTENTION_NAME", "BLOCK", "CacheView", "FlexLayoutStore", "LayoutSnapshot", "attach",
           "below", "block_table", "check_model", "flex", "own_rows", "rows_where"]

BLOCK = 128


# ---- mask_mod pieces (pure: they index tensors the store updates in place) -----------------------------

def below(end: torch.Tensor) -> masks.MaskMod:
    """Keys at slots < end (a 0-d tensor): every committed entry (end = base) or the fixed region (compressed)."""
    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx < end
    return mask_mod


def rows_where(flag: torch.Tensor, when_true: masks.MaskMod, when_false: masks.MaskMod) -> masks.MaskMod:
    """Row q uses `when_true` where flag[q] (a bool (R,) tensor), else `when_false`."""
    def mask_mod(b, h, q_idx, kv_idx):
        return torch.where(flag[q_idx], when_true(b, h, q_idx, kv_idx), when_false(b, h, q_idx, kv_idx))
    return mask_mod


def own_rows(sees: torch.Tensor, base: torch.Tensor) -> masks.MaskMod:
    """The forward's own rows: key base + j is seen by row q where sees[q, j] (bool (R, R))."""
    rows = sees.shape[0]

    def mask_mod(b, h, q_idx, kv_idx):
        j = kv_idx - base
        return (j >= 0) & (j < rows) & sees[q_idx, j.clamp(0, rows - 1)]
    return mask_mod


@dataclass
class _Forward:
    """The static mask of forwards with R rows and the tensors its mask_mod reads."""
    sees: torch.Tensor  # bool (R, R)
    compressed_rows: torch.Tensor  # bool (R,)
    block_mask: object  # BlockMask, seq_lengths (R, capacity)
    tail_written: list  # per query block: True when its kv_indices hold the fixed blocks + own-row blocks


@dataclass
class LayoutSnapshot:
    """The physical layout at one moment, for drawing: slot s holds logical position positions[s] (-1: empty)."""
    positions: np.ndarray  # (capacity,)
    length: int
    compressed: int
    block: int
    fixed_blocks: int


class FlexLayoutStore(compat.BufferCache):
    """The target's KV cache in FAFO's layout (see the module doc); a transformers Cache.

    model: the model the store serves (or its config, with `dtype` and `device`: kernel benchmarks need no
    weights); capacity: slots per layer (a multiple of `block`); compression: C (StreamingLLM() by default); block: KV
    block size of the BlockMask (128, FlexAttention's default); q_block: query block size; attention: how the
    attention function runs the mask (see `ATTENTION_MODES`; "auto": "compiled" on a GPU where compiled flex runs
    for this model, else "split"; `attention_reason` says why, and a fallback on a GPU is printed). The store
    keeps the layout; `attention_mode` (attention.py) computes the attention from it."""

    def __init__(self, model, capacity: int, compression: Compression | None = None, block: int = BLOCK,
                 q_block: int = 128, attention: str = "auto", dtype=None, device=None):
        check_int("block", block, 1)
        check_int("capacity", capacity, block)
        if capacity % block:
            raise ValueError(f"block={block} does not divide capacity={capacity}: the buffer is whole blocks")
        self.compression = compression if compression is not None else StreamingLLM()
        if not isinstance(self.compression, Compression):
            raise TypeError(f"compression must be a Compression, got {type(compression).__name__}")
        kv_budget = self.compression.kv_budget
        check_int("compression kv_budget", kv_budget, 1)
        if kv_budget > capacity:
            raise ValueError(f"the compression keeps up to {kv_budget} entries, more than capacity={capacity}")
        cfg = getattr(model, "config", model)
        self.layers_n = cfg.num_hidden_layers
        heads = cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        if hasattr(model, "parameters"):
            param = next(model.parameters())
            dtype, device = dtype or param.dtype, device or param.device
        device = torch.device(device or "cpu")
        dtype = dtype or torch.float32
        shape = (self.layers_n, kv_heads, capacity, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # every layer in one buffer: a
        self.values = torch.zeros_like(self.keys)  # swap is one index copy for all layers
        self.slot_pos = torch.full((capacity,), -1, dtype=torch.long, device=device)
        self.queries = (torch.zeros(self.layers_n, heads, head_dim, dtype=dtype, device=device)
                        if self.compression.needs_queries else None)
        self.attention_mode, self.attention_reason = make_mode(attention, device, dtype, heads, kv_heads, head_dim,
                                                                  (q_block, block))
        self.capacity, self.block, self.q_block = capacity, block, q_block
        self.fixed_blocks = -(-kv_budget // block)  # B_fixed
        self.length = self.compressed = self._base = self._rows = 0
        self._in_flight: _Forward | None = None  # the forward `prepare` made ready (read by every layer)
        self._causal = self._sees_pending = False
        self._queried = False
        self._dirty = False  # entries changed since the last compress
        self.base_t = torch.zeros((), dtype=torch.long, device=device)  # read by the mask_mods
        self.compressed_t = torch.zeros((), dtype=torch.long, device=device)
        self._forwards: dict[int, _Forward] = {}
        super().__init__(self.layers_n)  # the layers transformers sees: views of keys/values (compat)

    @property
    def attention(self) -> str:
        """The attention mode's name: one of ATTENTION_MODES."""
        return self.attention_mode.name

    # -- the Cache side: transformers calls these ------------------------------------------------------
    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        """Write the forward's R rows at slots base..base+R of layer `layer_idx`; return the whole buffers."""
        rows = key_states.shape[2]
        if rows != self._rows:
            raise RuntimeError(f"the forward has {rows} rows but store.prepare was told {self._rows}: call "
                               f"prepare(...) before every forward through the store")
        self.keys[layer_idx, :, self._base:self._base + rows] = key_states[0]
        self.values[layer_idx, :, self._base:self._base + rows] = value_states[0]
        if layer_idx == self.layers_n - 1:
            self.length, self._dirty = self._base + rows, True
        return self.keys[layer_idx][None], self.values[layer_idx][None]  # (1, kv_heads, capacity, head_dim)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    # -- one forward ---------------------------------------------------------------------------------------
    def prepare(self, positions, sees=None, compressed_rows=None):
        """The BlockMask of the next forward: R rows at logical `positions` (R,), seeing each other where
        sees[r, j] (default causal) and the committed entries (C's only where compressed_rows[r])."""
        positions = torch.as_tensor(positions, dtype=torch.long, device=self.slot_pos.device).reshape(-1)
        rows = positions.numel()
        if rows == 0:
            raise ValueError("a forward needs at least one row")
        if self.length + rows > self.capacity:
            raise ValueError(f"the store holds {self.length} of {self.capacity} slots; {rows} more rows do not "
                             f"fit (make capacity larger)")
        if self._dirty:
            self.compress()
        causal = sees is None
        # a prompt's prefill in a mode without `prefill_pattern` (split: SDPA's causal kernel) reads no (R, R)
        # pattern: the pattern, P x P at a long prompt's length, is written only if something draws it (dense_mask)
        pending = causal and not self.attention_mode.prefill_pattern and self.length == 0
        if pending:
            sees = None
        elif causal:
            sees = torch.ones(rows, rows, dtype=torch.bool).tril()
        else:
            sees = torch.as_tensor(sees)
        flags = torch.zeros(rows, dtype=torch.bool) if compressed_rows is None else torch.as_tensor(compressed_rows)
        if (sees is not None and sees.shape != (rows, rows)) or flags.shape != (rows,):
            raise ValueError(f"sees must be ({rows}, {rows}) and compressed_rows ({rows},) for {rows} positions")
        fwd = self._forward(rows)
        padded = fwd.sees.shape[0] > rows  # compiled flex's padded rows (Flex.padded_rows)
        if padded:  # a larger forward of the same size class left its pattern: a real row must not see
            fwd.sees.zero_()  # the slots past its own forward's rows
        if sees is not None:
            fwd.sees[:rows, :rows].copy_(sees)
        self._sees_pending = pending
        fwd.compressed_rows[:rows].copy_(flags)
        self._base, self._rows, self._causal, self._in_flight = self.length, rows, causal, fwd
        self.base_t.fill_(self.length)
        self.slot_pos[self.length:self.length + rows] = positions
        self._write_blocks(fwd, flags.tolist())
        self.attention_mode.new_forward()  # drop what the attention made for the last forward
        return fwd.block_mask

    def _forward(self, rows: int) -> _Forward:
        """The static mask of R-row forwards, made once per size: R itself, or the padded size compiled flex
        runs (`Flex.padded_rows`: one kernel serves every R up to it)."""
        size = getattr(self.attention_mode, "padded_rows", int)(rows)
        if size not in self._forwards:  # once per size: the mask_mod and block tables are reused after
            device = self.slot_pos.device
            sees = torch.zeros(size, size, dtype=torch.bool, device=device)  # written by each prepare before use
            flags = torch.zeros(size, dtype=torch.bool, device=device)
            mask_mod = masks.or_masks(rows_where(flags, below(self.compressed_t), below(self.base_t)),
                                      own_rows(sees, self.base_t))
            q_blocks, kv_blocks = -(-size // self.q_block), self.capacity // self.block
            block_mask = block_mask_from_tables(q_blocks, kv_blocks, (self.q_block, self.block), mask_mod,
                                                (size, self.capacity), device)
            block_mask.specdec_store = self  # how the attention function finds the store
            self._forwards[size] = _Forward(sees, flags, block_mask, [False] * q_blocks)
        return self._forwards[size]

    def block_mask_in_flight(self):
        """The BlockMask of the forward in flight (what `prepare` returned)."""
        return self._in_flight.block_mask

    def _write_blocks(self, fwd: _Forward, flags: list[bool]) -> None:
        """In place: per query block, how many KV blocks it loads and which (the O(1) per-step upkeep)."""
        num, idx = fwd.block_mask.kv_num_blocks[0, 0], fwd.block_mask.kv_indices[0, 0]  # (QB,), (QB, KB)
        end = -(-(self._base + self._rows) // self.block)  # blocks holding anything valid
        fixed = -(-self.compressed // self.block)
        own = max(self._base // self.block, fixed)  # the forward's own rows' blocks, after the fixed ones
        for qb in range(num.shape[0]):
            if all(flags[qb * self.q_block:(qb + 1) * self.q_block]):  # compressed rows only
                idx[qb, fixed:fixed + end - own] = torch.arange(own, end, dtype=idx.dtype, device=idx.device)
                num[qb] = fixed + end - own
                fwd.tail_written[qb] = True
            else:
                if fwd.tail_written[qb]:  # restore 0, 1, 2, ...
                    idx[qb] = torch.arange(idx.shape[1], dtype=idx.dtype, device=idx.device)
                    fwd.tail_written[qb] = False
                num[qb] = end

    # -- between steps ---------------------------------------------------------------------------------------
    def compress(self) -> int:
        """Run C over the committed entries and swap its selection into the fixed region; returns the swaps."""
        self._dirty = False
        n = self.length
        view = CacheView(self.slot_pos[:n], self.keys[:, :, :n], self.queries if self._queried else None)
        keep = self.compression.select(view).to(self.slot_pos.device)  # (n,) bool
        selected = int(keep.sum())
        if selected > self.fixed_blocks * self.block:
            raise RuntimeError(f"{self.compression} selected {selected} entries, more than its budget")
        out_ = (~keep[:selected]).nonzero()[:, 0]  # unselected entries inside the fixed region
        in_ = keep[selected:].nonzero()[:, 0] + selected  # selected entries outside it (as many)
        if len(out_):
            src, dst = torch.cat([in_, out_]), torch.cat([out_, in_])
            for buf in (self.keys, self.values):  # (layers, kv_heads, capacity, head_dim)
                buf[:, :, dst] = buf[:, :, src]  # the right side is a copy: a true swap
            self.slot_pos[dst] = self.slot_pos[src]
        self.compressed = selected
        self.compressed_t.fill_(selected)
        return len(out_)

    def compact(self, keep_from: int, indices) -> None:
        """Keep slots < keep_from and the entries at keep_from + indices (in order): the accepted rows of the
        last forward, as kv_cache.compact does for a DynamicCache."""
        idx = [int(i) for i in indices]
        if keep_from < self._base or any(not 0 <= i < self.length - keep_from for i in idx):
            raise ValueError(f"compact keeps rows of the last forward only (slots >= {self._base}); got "
                             f"keep_from={keep_from}, offsets {idx} with {self.length} slots in use")
        src = torch.tensor(idx, dtype=torch.long, device=self.slot_pos.device) + keep_from
        dst = slice(keep_from, keep_from + len(idx))
        self.keys[:, :, dst] = self.keys[:, :, src]
        self.values[:, :, dst] = self.values[:, :, src]
        self.slot_pos[dst] = self.slot_pos[src]
        self.rollback(keep_from + len(idx))

    def rollback(self, length: int) -> None:
        """Drop the last forward's rows from slot `length` on."""
        if not self._base <= length <= self.length:
            raise ValueError(f"the store rolls back only the last forward's rows ({self._base}..{self.length}); "
                             f"got {length}")
        self.slot_pos[length:self.length] = -1
        self.length, self._dirty = length, True

    # -- reading ---------------------------------------------------------------------------------------------
    def note_query(self, layer: int, query: torch.Tensor) -> None:
        """Keep the last row's query of this layer (for query-aware compressions). query (1, heads, R, dim)."""
        if self.queries is not None:
            self.queries[layer] = query[0, :, -1]
            self._queried = True

    def forward_parts(self):
        """The forward in flight, as the attention modes read it: (base, rows, compressed, sees (R, R),
        compressed_rows (R,), causal): rows see slots < base (< compressed when flagged) and each other by sees."""
        fwd, rows = self._in_flight, self._rows  # per layer: no lookup, and a slice only where compiled flex pads
        sees, flags = (fwd.sees, fwd.compressed_rows) if len(fwd.sees) == rows else \
            (fwd.sees[:rows, :rows], fwd.compressed_rows[:rows])
        return self._base, rows, self.compressed, sees, flags, self._causal

    def valid_slots(self) -> int:
        """Slots in use during the forward in flight: committed entries and its own rows."""
        return self._base + self._rows

    def dense_mask(self) -> torch.Tensor:
        """The forward in flight's mask_mod evaluated on every (row, slot): bool (1, 1, R, capacity) (only the
        first valid_slots() columns are evaluated; the rest are False). Rendered on each call: the dense mode
        keeps it for the forward's other layers."""
        fwd = self._in_flight
        if self._sees_pending:  # a split-mode prefill skipped writing its causal pattern: write it now
            fwd.sees[:self._rows, :self._rows].copy_(torch.ones(self._rows, self._rows, dtype=torch.bool).tril())
            self._sees_pending = False
        mask = torch.zeros(self._rows, self.capacity, dtype=torch.bool, device=self.slot_pos.device)  # (R, slots)
        mask[:, :self.valid_slots()] = masks.dense(fwd.block_mask.mask_mod, self._rows, self.valid_slots(),
                                                   self.slot_pos.device)
        return mask[None, None]

    def logical_mask(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(mask, key positions) of the forward in flight with the committed keys in LOGICAL order, for drawing:
        bool (R, length + R) and the logical position of each column (committed ones sorted, then the rows)."""
        dense = self.dense_mask()[0, 0]  # (R, capacity), physical slots
        order = torch.cat([self.slot_pos[:self._base].argsort(),
                           torch.arange(self._base, self._base + self._rows, device=self.slot_pos.device)])
        return dense[:, order], self.slot_pos[order]

    def snapshot(self) -> LayoutSnapshot:
        return LayoutSnapshot(self.slot_pos.cpu().numpy().copy(), self.length, self.compressed, self.block,
                              self.fixed_blocks)

    def loaded_blocks(self, rows: int) -> list[int]:
        """KV blocks each query block of the last R-row forward loads."""
        return self._forward(rows).block_mask.kv_num_blocks[0, 0].tolist()
