"""Tree attention inputs: flattened tokens, positions and the tree mask (Cacheback paper, section 3.2).

One target forward verifies a whole `DraftTree`. Its query holds q = 1 + n rows: row 0 is the root (the
last committed token, not yet in the KV cache) and row r = node r-1, in the tree's (topological) insertion
order. Against a cache of `prefix_len` tokens:
- `position_ids` = prefix_len + depth (root depth 0): every node gets the position it would have in its own
  branch, so rotary embeddings match sequential decoding along that branch (and after compaction the kept
  keys already sit at their final positions; see kv_cache.compact);
- the mask (1, 1, q, prefix_len + q): each row sees the whole prefix, its ancestors and itself, nothing else.

The mask lives here only, in the format the attention backend needs:
- "sdpa" and "eager": an ADDITIVE float mask (0 = see, finfo(dtype).min = hidden). Both backends accept it
  unchanged in transformers 5.x. A boolean 4D mask is right under sdpa but SILENTLY WRONG under eager, which
  adds the mask to the scores (True adds +1), so we never hand a boolean mask to a model;
- "flex_attention": a BlockMask built from `tree_mask_mod` (on CPU this is for teaching, not speed);
- "bool": the boolean mask itself, for drawing and checks only.
(transformers' `masking_utils.create_causal_mask(..., and_mask_function=...)` can build the same per backend;
we build it directly so that the tree is explicit, and test it against sequential decoding.)

Simplifications: batch size 1, one tree per forward, every head shares the mask.
"""
from __future__ import annotations

import numpy as np
import torch

from .draft_tree import DraftTree


def ancestor_matrix(parents) -> torch.Tensor:
    """Bool (q, q), q = 1 + len(parents): [r, c] is True when row c is an ancestor of row r or r itself.

    Row/column 0 is the root (an ancestor of every node); node i is row i + 1."""
    q = len(parents) + 1
    anc = np.zeros((q, q), dtype=bool)
    anc[0, 0] = True
    for i, p in enumerate(parents):  # parents precede children, so the parent's row is complete
        anc[i + 1] = anc[p + 1]
        anc[i + 1, i + 1] = True
    return torch.from_numpy(anc)


def dense_tree_mask(tree: DraftTree) -> torch.Tensor:
    """The tree part of the mask, bool (q, q) with the root first: what a figure draws."""
    return ancestor_matrix(tree.parents)


def tree_inputs(tree: DraftTree, prefix_len: int, device=None):
    """(input_ids (1, q), position_ids (1, q), node_order) for one tree forward; q = 1 + len(tree).

    node_order[r] is the tree node held by row r (-1 for the root row): rows follow insertion order."""
    ids = torch.tensor([[tree.root, *tree.tokens]], dtype=torch.long, device=device)  # (1, q)
    pos = torch.tensor([[0, *tree.depths]], dtype=torch.long, device=device) + prefix_len  # (1, q)
    return ids, pos, [-1, *range(len(tree))]


def tree_mask_mod(parents, prefix_len: int = 0):
    """A FlexAttention-style mask_mod(b, h, q_idx, kv_idx) -> bool for a tree behind `prefix_len` tokens.

    q_idx is the query row (0 = root), kv_idx the key index over prefix + rows. Pure: it indexes a
    precomputed ancestor matrix, so it works on ints and on broadcast index tensors (vmap in flex)."""
    anc = ancestor_matrix(parents)  # (q, q)

    def mask_mod(b, h, q_idx, kv_idx):
        q_idx, kv_idx = torch.as_tensor(q_idx), torch.as_tensor(kv_idx)
        in_prefix = kv_idx < prefix_len
        col = (kv_idx - prefix_len).clamp(min=0)  # tree column; ignored when in_prefix
        return in_prefix | anc[q_idx, col]

    return mask_mod


def tree_attention_mask(tree: DraftTree, prefix_len: int, dtype=torch.float32, backend: str = "sdpa",
                        device=None):
    """The attention_mask for a tree forward; see the module doc for the formats."""
    q = len(tree) + 1
    if backend == "flex_attention":
        from torch.nn.attention.flex_attention import create_block_mask

        return create_block_mask(tree_mask_mod(tree.parents, prefix_len), 1, None, q, prefix_len + q,
                                 device=device or "cpu")
    if backend not in ("sdpa", "eager", "bool"):
        raise ValueError(f"unknown attention backend {backend!r}: use 'sdpa', 'eager', 'flex_attention' "
                         f"or 'bool' (drawing only)")
    seen = torch.ones(1, 1, q, prefix_len + q, dtype=torch.bool, device=device)  # prefix: visible to all
    seen[0, 0, :, prefix_len:] = dense_tree_mask(tree).to(device)
    if backend == "bool":
        return seen
    if not dtype.is_floating_point:
        raise ValueError(f"an additive mask needs the model's float dtype, got {dtype}")
    mask = torch.zeros(1, 1, q, prefix_len + q, dtype=dtype, device=device)
    return mask.masked_fill_(~seen, torch.finfo(dtype).min)  # (1, 1, q, prefix_len + q)
