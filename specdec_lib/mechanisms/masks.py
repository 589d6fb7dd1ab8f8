"""Attention masks as small pure functions (mask_mods), composed per forward and rendered per backend.

Cacheback paper §3.2 (tree attention: one forward verifies every branch), in attention-gym's style: a
`mask_mod(b, h, q_idx, kv_idx) -> bool` says whether query row q_idx may see key kv_idx. Notation: R query rows,
K keys. The loop's ONE forward (verify.build_forward): the cache holds `cached` keys, row r's key is `cached + r`,
and the rows are, in order:
    pending[:-1]   committed tokens the cache lacks (the prompt on the first step; none afterwards): causal
    root           the last committed token (row `root_row`), position P = len(committed) - 1
    tree nodes     the DraftTree in insertion order, position P + depth: the prefix, their ancestors, themselves
    side rows      their own visibility (Lookahead's Jacobi rows, FAFO's fumble rows), position P + their depth

Pieces, each pure (it indexes precomputed tensors, so it works on ints, broadcast index grids and under vmap):
`causal(cached)`, `prefix(end)`, `tree(parents, root_row, cached)`, `visible(sees, first_row, first_key)`,
`window(rows_pos, size)` (a sliding window, by logical positions), composed by `and_masks` / `or_masks` /
`by_rows`. Each states `full_prefix`, how many leading keys EVERY row sees (BlockMask's "full blocks" at key
granularity); the dense renderer fills those columns without calling the mask_mod, so a tree step costs O(R * R),
not O(R * (cached + R)); a tree with its root at row 0 also states `rest`, its ancestor matrix, so rendering it
evaluates no grid at all (a window states neither: its grid is evaluated).

Renderers: `dense` (bool (R, K), for drawing and checks) and `render` (the backend's format):
- "sdpa" and "eager": an ADDITIVE float mask (0 = see, finfo(dtype).min = hidden), (1, 1, R, K). A boolean mask
  is right under sdpa but SILENTLY WRONG under eager (which adds it to the scores), so none is handed to a model;
- "flex_attention": a BlockMask from `create_block_mask` (on CPU for correctness and teaching, not speed);
- "bool": the boolean mask itself (drawing and checks only); `render_layers`: one per kind of layer (sliding ones).
Simplifications: batch size 1, one mask for every head; `dense` evaluates the whole grid past the full prefix.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from .. import compat
from .draft_tree import DraftTree

MaskMod = Callable  # (b, h, q_idx, kv_idx) -> bool tensor


def _full_prefix(mask_mod: MaskMod, keys: int) -> MaskMod:
    mask_mod.full_prefix = keys  # every row sees kv_idx < keys (see the module doc)
    return mask_mod


def full_prefix(mask_mod: MaskMod) -> int:
    """How many leading keys every row of `mask_mod` sees (0 when it does not say)."""
    return getattr(mask_mod, "full_prefix", 0)


def ancestor_matrix(parents) -> torch.Tensor:
    """Bool (R, R), R = 1 + len(parents): [r, c] is True when row c is an ancestor of row r or r itself.

    Row/column 0 is the root (an ancestor of every node); node i is row i + 1."""
    rows = len(parents) + 1
    anc = np.zeros((rows, rows), dtype=bool)
    anc[0, 0] = True
    for i, p in enumerate(parents):  # parents precede children, so the parent's row is complete
        anc[i + 1] = anc[p + 1]
        anc[i + 1, i + 1] = True
    return torch.from_numpy(anc)


def causal(cached: int = 0) -> MaskMod:
    """Row r sees every key up to its own (kv index cached + r): plain decoding, and the prompt's prefill."""
    def mask_mod(b, h, q_idx, kv_idx):
        return torch.as_tensor(kv_idx) <= torch.as_tensor(q_idx) + cached
    return _full_prefix(mask_mod, cached + 1)


def prefix(end: int) -> MaskMod:
    """Every row sees the keys before `end` (the committed text)."""
    def mask_mod(b, h, q_idx, kv_idx):
        return torch.as_tensor(kv_idx) < end
    return _full_prefix(mask_mod, end)


def visible(sees: torch.Tensor, first_row: int, first_key: int, device=None) -> MaskMod:
    """Rows first_row.. see keys first_key.. where sees[row - first_row, key - first_key] (a bool (R, K) matrix);
    keys outside the block are not seen. `device`: where the index tensors will live (the matrix moves there)."""
    rows, keys = sees.shape
    sees = sees.to(device) if device is not None else sees
    # the grid fast path below: the block padded with one unseen column, as numpy on a CPU
    padded = torch.cat([sees, torch.zeros(rows, 1, dtype=torch.bool, device=sees.device)], dim=1)  # (R, K + 1)
    padded_np = padded.numpy() if padded.device.type == "cpu" else None

    def mask_mod(b, h, q_idx, kv_idx):
        q_idx, kv_idx = torch.as_tensor(q_idx), torch.as_tensor(kv_idx)
        if padded_np is not None and q_idx.device.type == "cpu" and q_idx.dim() == 2 and q_idx.shape[1] == 1 \
                and kv_idx.dim() == 2 and kv_idx.shape[0] == 1:  # a dense (R, 1) x (1, K) grid on a CPU (the `dense` renderer)
            # numpy fancy indexing: one cheap call, where ~20 small torch ops each pay the dispatcher on a CPU
            row = (q_idx.numpy()[:, 0] - first_row).clip(0, rows - 1)
            col = kv_idx.numpy()[0] - first_key
            col = np.where((col >= 0) & (col < keys), col, keys)  # outside the block: the unseen column
            return torch.from_numpy(padded_np[row[:, None], col[None, :]])  # (R, K)
        row = (q_idx - first_row).clamp(0, rows - 1)
        col = (kv_idx - first_key).clamp(0, keys - 1)  # clamped: ignored outside the block
        inside = (kv_idx >= first_key) & (kv_idx < first_key + keys)
        return inside & sees.to(q_idx.device)[row, col]  # a no-op where they share a device
    return mask_mod


def tree(parents: Sequence[int], root_row: int = 0, cached: int = 0, device=None) -> MaskMod:
    """The root (row root_row) and the tree nodes after it see every key before the root's and their ancestors."""
    root_key = cached + root_row
    anc = ancestor_matrix(parents)
    mask_mod = or_masks(prefix(root_key), visible(anc, root_row, root_key, device))
    if root_row == 0:  # every row is a tree row: past the full prefix the mask IS the ancestor matrix
        mask_mod.rest = anc.to(device) if device is not None else anc
    return mask_mod


def window(rows_pos, size: int, first_key: int = 0, keys_pos=None, device=None) -> MaskMod:
    """A sliding-window layer's limit: row r (at logical position rows_pos[r]) sees a key only if the key's position
    is above rows_pos[r] - size (transformers' rule). The cache holds every position: key k < first_key sits at
    position k (the committed text, in order), key first_key + j at keys_pos[j] (default: rows_pos, the forward's
    own rows). AND it with the rest of the mask."""
    rows_pos = torch.as_tensor(rows_pos, dtype=torch.long, device=device)  # (R,)
    keys_pos = rows_pos if keys_pos is None else torch.as_tensor(keys_pos, dtype=torch.long, device=device)
    last_row, last_key = len(rows_pos) - 1, max(len(keys_pos) - 1, 0)
    keys_pos = keys_pos if len(keys_pos) else torch.zeros(1, dtype=torch.long, device=device)

    def mask_mod(b, h, q_idx, kv_idx):
        q_idx, kv_idx = torch.as_tensor(q_idx), torch.as_tensor(kv_idx)
        after = keys_pos.to(kv_idx.device)[(kv_idx - first_key).clamp(0, last_key)]
        key_pos = torch.where(kv_idx < first_key, kv_idx, after)
        return key_pos > rows_pos.to(q_idx.device)[q_idx.clamp(0, last_row)] - size
    return mask_mod


def and_masks(*mods: MaskMod) -> MaskMod:
    def mask_mod(b, h, q_idx, kv_idx):
        out = mods[0](b, h, q_idx, kv_idx)
        for mod in mods[1:]:
            out = out & mod(b, h, q_idx, kv_idx)
        return out
    return _full_prefix(mask_mod, min(map(full_prefix, mods)))


def or_masks(*mods: MaskMod) -> MaskMod:
    def mask_mod(b, h, q_idx, kv_idx):
        out = mods[0](b, h, q_idx, kv_idx)
        for mod in mods[1:]:
            out = out | mod(b, h, q_idx, kv_idx)
        return out
    return _full_prefix(mask_mod, max(map(full_prefix, mods)))


def by_rows(segments: Sequence[tuple[int, MaskMod]]) -> MaskMod:
    """One mask_mod from row segments [(first_row, mod), ...] (first rows increasing, the first one 0)."""
    if len(segments) == 1:
        return segments[0][1]
    def mask_mod(b, h, q_idx, kv_idx):
        q_idx = torch.as_tensor(q_idx)
        out = segments[0][1](b, h, q_idx, kv_idx)
        for start, mod in segments[1:]:
            out = torch.where(q_idx >= start, mod(b, h, q_idx, kv_idx), out)
        return out
    return _full_prefix(mask_mod, min(full_prefix(mod) for _, mod in segments))


def _evaluate(mask_mod: MaskMod, q_len: int, kv_len: int, device=None) -> tuple[int, torch.Tensor]:
    """(full, rest): every row sees the first `full` keys; rest = the mask_mod on keys full.. , bool (R, K - full)."""
    full = min(full_prefix(mask_mod), kv_len)
    rest = getattr(mask_mod, "rest", None)  # a piece that knows its columns past the full prefix (`tree`)
    if rest is not None and tuple(rest.shape) == (q_len, kv_len - full):
        return full, rest.to(device)
    q_idx = torch.arange(q_len, device=device)[:, None]  # (R, 1)
    kv_idx = torch.arange(full, kv_len, device=device)[None, :]  # (1, K - full)
    return full, torch.broadcast_to(mask_mod(0, 0, q_idx, kv_idx), (q_len, kv_len - full)).to(device)


def dense(mask_mod: MaskMod, q_len: int, kv_len: int, device=None) -> torch.Tensor:
    """The mask as a bool (q_len, kv_len) = (R, K) tensor: the mask_mod evaluated on the index grid, except the
    leading `full_prefix(mask_mod)` keys, which every row sees."""
    full, rest = _evaluate(mask_mod, q_len, kv_len, device)
    if not full:
        return rest
    return torch.cat([torch.ones(q_len, full, dtype=torch.bool, device=device), rest], dim=1)  # (R, K)


def render(mask_mod: MaskMod, q_len: int, kv_len: int, backend: str = "sdpa", dtype=torch.float32, device=None):
    """The attention_mask a model with `backend` takes for this mask_mod; see the module doc for the formats."""
    if backend == "flex_attention":
        from torch.nn.attention.flex_attention import create_block_mask

        return create_block_mask(mask_mod, 1, None, q_len, kv_len, device=device or "cpu")
    if backend not in ("sdpa", "eager", "bool"):
        raise ValueError(f"unknown attention backend {backend!r}: use 'sdpa', 'eager', 'flex_attention' "
                         f"or 'bool' (drawing only)")
    if backend == "bool":
        return dense(mask_mod, q_len, kv_len, device)[None, None]
    if not dtype.is_floating_point:
        raise ValueError(f"an additive mask needs the model's float dtype, got {dtype}")
    full, rest = _evaluate(mask_mod, q_len, kv_len, device)  # rest: (R, K - full)
    mask = torch.zeros(q_len, kv_len, dtype=dtype, device=device)  # the full columns stay 0 (seen)
    mask[:, full:].masked_fill_(~rest, torch.finfo(dtype).min)
    return mask[None, None]  # (1, 1, R, K)


def render_layers(mask_mod: MaskMod, q_len: int, kv_len: int, layers=None, window_mod: MaskMod | None = None,
                  backend: str = "sdpa", dtype=torch.float32, device=None, first_key: int = 0):
    """The attention_mask for a model whose layers are `layers` (compat.AttentionLayers; None: full attention):
    `render(mask_mod)` where no layer slides; where some do, the sliding layers' mask is mask_mod AND `window_mod`
    (a `window` piece): one mask when every layer slides, else {"full_attention": .., "sliding_attention": ..}
    (a decoder that lists its layer types picks each layer's by its kind). `first_key`: the sliding layers read
    keys first_key..kv_len only (kv_cache.WindowedLayer), so their mask has kv_len - first_key columns."""
    if layers is None or not layers.sliding:
        return render(mask_mod, q_len, kv_len, backend, dtype, device)
    if window_mod is None:
        raise ValueError("a model with sliding-window layers needs the window's mask piece (masks.window)")
    inner = and_masks(mask_mod, window_mod)
    shifted = inner if not first_key else lambda b, h, q_idx, kv_idx: inner(b, h, q_idx, torch.as_tensor(kv_idx)
                                                                              + first_key)
    sliding = render(shifted, q_len, kv_len - first_key, backend, dtype, device)
    if not layers.by_type:
        return sliding
    return {compat.FULL: render(mask_mod, q_len, kv_len, backend, dtype, device), compat.SLIDING: sliding}


# ---- the tree forward of notebooks 02, 03 and 05 (root + nodes against a cache of prefix_len tokens) ----------

def dense_tree_mask(tree_: DraftTree) -> torch.Tensor:
    """The tree part of the mask, bool (R, R) with the root first: what a figure draws."""
    return ancestor_matrix(tree_.parents)


def tree_inputs(tree_: DraftTree, prefix_len: int, device=None):
    """(input_ids (1, R), position_ids (1, R), node_order) for one tree forward; R = 1 + len(tree).

    node_order[r] is the tree node held by row r (-1 for the root row): rows follow insertion order."""
    ids = torch.tensor([[tree_.root, *tree_.tokens]], dtype=torch.long, device=device)  # (1, R)
    pos = torch.tensor([[0, *tree_.depths]], dtype=torch.long, device=device) + prefix_len  # (1, R)
    return ids, pos, [-1, *range(len(tree_))]


def tree_mask_mod(parents, prefix_len: int = 0, device=None) -> MaskMod:
    """The mask_mod of a tree forward behind `prefix_len` cached tokens (row 0 = the root)."""
    return tree(parents, root_row=0, cached=prefix_len, device=device)


def tree_attention_mask(tree_: DraftTree, prefix_len: int, dtype=torch.float32, backend: str = "sdpa",
                        device=None):
    """The attention_mask of a tree forward, (1, 1, R, prefix_len + R) or a BlockMask; R = 1 + len(tree)."""
    rows = len(tree_) + 1
    return render(tree_mask_mod(tree_.parents, prefix_len, device), rows, prefix_len + rows, backend, dtype, device)
