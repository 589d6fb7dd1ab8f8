"""FlexAttention and transformers glue of FAFO's KV store (flex_layout.py): the version-sensitive calls live here.

- `block_mask_from_tables`: a BlockMask built from block tables (`BlockMask.from_kv_blocks`), never from a grid;
- `block_table(block_mask)`: which KV blocks each query block loads, for drawing and checks;
- `flex(...)`: flex_attention eager or compiled (`ATTENTION_MODES` says what each mode does);
- `choose_attention(...)`: the mode "auto" takes on a device, and why: compiled flex on a GPU where it compiles
  and runs for the model's shapes and dtype (probed once: Triton's kernels can exceed a small GPU's shared memory,
  a T4's for instance), else the dense mode, saying why;
- `layout_attention`: the attention function transformers calls for a model `attach`ed to the store (registered
  with `AttentionInterface` as ATTENTION_NAME; it finds the store through the BlockMask it is given).

Probed on torch 2.13 (CPU) / 2.11 (CUDA) and transformers 5.17-5.23: compiled flex on a CPU needs the
full-block tables present (zeros are fine); eager flex applies the mask_mod to every score and ignores the block
tables; compiled flex refuses float64 on a CPU; a model's attention function receives the BlockMask passed as
`attention_mask` unchanged (transformers' mask builders exit early on a 4D mask or a BlockMask).
"""
from __future__ import annotations

import numpy as np
import torch

from .. import compat

ATTENTION_NAME = "specdec_flex_layout"


def block_table(block_mask, batch: int = 0, head: int = 0) -> np.ndarray:
    """Bool (query blocks, KV blocks): which KV blocks each query block of a BlockMask loads (partial or full)."""
    kv_blocks = -(-block_mask.seq_lengths[1] // block_mask.BLOCK_SIZE[1])
    out = np.zeros((block_mask.kv_num_blocks.shape[-1], kv_blocks), dtype=bool)
    tables = [(block_mask.kv_num_blocks, block_mask.kv_indices)]
    if block_mask.full_kv_num_blocks is not None:
        tables.append((block_mask.full_kv_num_blocks, block_mask.full_kv_indices))
    for num, idx in tables:
        num, idx = num[batch, head].cpu().numpy(), idx[batch, head].cpu().numpy()  # (QB,), (QB, KB)
        for qb, count in enumerate(num):
            out[qb, idx[qb, :count]] = True
    return out


def block_mask_from_tables(q_blocks, kv_blocks, block_size, mask_mod, seq_lengths, device):
    """A BlockMask whose block tables the caller fills in place: kv_num_blocks (1, 1, QB) zeros, kv_indices
    (1, 1, QB, KB) = 0, 1, 2, ... per query block; no create_block_mask (no mask evaluation)."""
    from torch.nn.attention.flex_attention import BlockMask

    num = torch.zeros(1, 1, q_blocks, dtype=torch.int32, device=device)  # (B, H, QB)
    idx = torch.arange(kv_blocks, dtype=torch.int32, device=device).repeat(1, 1, q_blocks, 1)  # (B, H, QB, KB)
    # compiled flex on a CPU needs the full-block tables (zeros: every loaded block applies the mask_mod)
    full_num, full_idx = torch.zeros_like(num), torch.zeros_like(idx)
    try:
        return BlockMask.from_kv_blocks(num, idx, full_num, full_idx, BLOCK_SIZE=block_size, mask_mod=mask_mod,
                                        seq_lengths=seq_lengths, compute_q_blocks=False)
    except TypeError:  # torch without compute_q_blocks (q tables serve the backward pass only)
        return BlockMask.from_kv_blocks(num, idx, full_num, full_idx, BLOCK_SIZE=block_size, mask_mod=mask_mod,
                                        seq_lengths=seq_lengths)


_COMPILED_FLEX = None

ATTENTION_MODES = {
    "compiled": "torch.compile(flex_attention): block-sparse, loads only the listed KV blocks (float32/bf16)",
    "eager": "flex_attention unfused: applies the mask_mod to every score through vmap, ignores the block "
             "tables (exact, float64 too; slow: on a CPU many times the dense mode's cost per call)",
    "dense": "the same mask_mod rendered once per forward to a bool mask for sdpa (exact; every row pays for "
             "every committed slot)",
    "split": "each row group against its committed slots with no mask (full rows: all of them, compressed rows: "
             "the fixed region only), and the forward's own rows under `sees`, merged by log-sum-exp (exact; a "
             "compressed row's cost does not grow with the context: the CPU default)",
}


def flex(query, key, value, block_mask, scale=None, compiled=False):
    """flex_attention, eager or compiled (see ATTENTION_MODES). query (1, heads, R, dim), key/value
    (1, kv_heads, K, dim); grouped-query attention when the head counts differ."""
    global _COMPILED_FLEX
    from torch.nn.attention.flex_attention import flex_attention

    fn = flex_attention
    if compiled:
        if _COMPILED_FLEX is None:
            # one compiled graph per (row count, key length, mask_mod code): a notebook or benchmark that times
            # several masks at several lengths passes dynamo's default limit of 8, after which it would SILENTLY
            # run flex_attention eager (every score materialised); decoding through one store adds none per step
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
            torch._dynamo.config.accumulated_cache_size_limit = max(
                torch._dynamo.config.accumulated_cache_size_limit, 1024)
            _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
        fn = _COMPILED_FLEX
    return fn(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=query.shape[1] != key.shape[1])


_PROBED: dict[tuple, str | None] = {}


def compiled_flex_problem(device, dtype, heads: int, kv_heads: int, head_dim: int) -> str | None:
    """None when compiled flex_attention runs on this GPU for these shapes, else why it does not (probed once per
    device, dtype and shape: one compile and one call on zeros)."""
    key = (str(device), dtype, heads, kv_heads, head_dim)
    if key not in _PROBED:
        _PROBED[key] = _probe_compiled_flex(torch.device(device), dtype, heads, kv_heads, head_dim)
    return _PROBED[key]


def _probe_compiled_flex(device, dtype, heads, kv_heads, head_dim) -> str | None:
    try:
        import triton  # noqa: F401  (inductor's GPU kernels are Triton kernels)
    except ImportError:
        return "compiled FlexAttention on a GPU needs triton, which is not installed"
    try:
        query = torch.zeros(1, heads, 16, head_dim, dtype=dtype, device=device)  # (1, heads, rows, dim)
        key = torch.zeros(1, kv_heads, 128, head_dim, dtype=dtype, device=device)  # (1, kv_heads, keys, dim)
        flex(query, key, key, None, compiled=True)
        torch.cuda.synchronize(device)
    except Exception as err:  # Triton's OutOfResources, an unsupported dtype or architecture, a compile error
        first = (str(err).strip().splitlines() or [""])[0][:200]
        return (f"compiled flex_attention failed here for {dtype} and head_dim {head_dim} "
                f"({type(err).__name__}: {first})")
    return None


def choose_attention(device, dtype, heads: int, kv_heads: int, head_dim: int) -> tuple[str, str]:
    """(mode, why) for attention="auto": "split" on a CPU, "compiled" on a GPU where it runs, else "split"."""
    device = torch.device(device)
    if device.type != "cuda":
        return "split", ("split on a CPU: each row reads only the committed slots it sees (a compressed row the "
                         "fixed region), exact, and faster there than compiled flex")
    problem = compiled_flex_problem(device, dtype, heads, kv_heads, head_dim)
    if problem:
        return "split", f"split, since {problem}"
    return "compiled", "compiled flex_attention: block-sparse, loads only the listed KV blocks"


def layout_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The attention function transformers calls (registered as ATTENTION_NAME); query (1, heads, R, dim)."""
    store = getattr(attention_mask, "specdec_store", None)
    if store is None:
        raise ValueError(f"a model switched to {ATTENTION_NAME!r} takes the BlockMask of FlexLayoutStore.prepare "
                         f"as attention_mask (got {type(attention_mask).__name__})")
    store.note_query(module.layer_idx, query)
    if store.attention == "split":
        out = split_attention(store, query, key, value, scaling)
    elif store.attention == "dense":
        end = store.valid_slots()  # slots past the forward's own rows hold nothing: leave them out
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key[:, :, :end], value[:, :, :end], attn_mask=store.dense_mask()[..., :end], scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1])  # (1, heads, R, dim)
    else:
        out = flex(query, key, value, attention_mask, scaling, store.attention == "compiled")
    return out.transpose(1, 2).contiguous(), None


def split_attention(store, query, key, value, scale=None):
    """Attention of the forward in flight in two parts per row: its committed slots with no mask (slots < base
    for full rows, < compressed for compressed rows: FAFO's fixed region, a contiguous slice) and the forward's
    own rows under `sees`; the parts merge exactly through their log-sum-exps. query (1, heads, R, dim),
    key/value (1, kv_heads, capacity, dim); returns (1, heads, R, dim)."""
    base, rows, compressed, sees, flags, causal = store.forward_parts()
    own_k, own_v = key[:, :, base:base + rows], value[:, :, base:base + rows]  # (1, kv_heads, R, dim)
    groups = query.shape[1] // key.shape[1]  # grouped-query attention: heads per kv head
    if base == 0 and causal:  # a prompt's prefill: causal over its own rows, nothing committed yet
        return torch.nn.functional.scaled_dot_product_attention(query, own_k, own_v, is_causal=True, scale=scale,
                                                                enable_gqa=groups > 1)
    blocked, parts = _split_plan(store, base, rows, compressed, sees, flags, query.dtype, groups)
    out, lse = _folded(compat.attention_with_lse, query, own_k, own_v, blocked, scale, groups)
    for pick, end in parts:  # full rows against every committed slot, compressed rows the fixed region
        part, part_lse = _folded(compat.attention_with_lse, query[:, :, pick], key[:, :, :end], value[:, :, :end],
                                 None, scale, groups)
        total = torch.logaddexp(lse[:, :, pick], part_lse)  # (1, heads, r)
        out[:, :, pick] = (out[:, :, pick] * (lse[:, :, pick] - total).exp()[..., None].to(out.dtype)
                           + part * (part_lse - total).exp()[..., None].to(out.dtype))
    return out


def _split_plan(store, base: int, rows: int, compressed: int, sees, flags, dtype, groups: int):
    """What every layer of one forward shares in split_attention, made by its first layer and kept on the store
    until the next `prepare` clears it: the own rows' additive mask, folded per group (1, 1, groups * R, R), and
    per row kind (row pick, committed slots it reads), a pick being a slice where the rows are contiguous."""
    if store._split_plan is not None:
        return store._split_plan
    device = store.keys.device
    blocked = torch.zeros(rows, rows, dtype=dtype, device=device)  # additive (R, R)
    blocked.masked_fill_(~sees.to(device), torch.finfo(dtype).min)
    parts = []
    for flag, end in ((False, base), (True, compressed)):
        index = (flags == flag).nonzero()[:, 0]
        if end == 0 or len(index) == 0:
            continue
        first, last = int(index[0]), int(index[-1])
        pick = slice(first, last + 1) if last - first + 1 == len(index) else index.to(device)
        parts.append((pick, end))
    store._split_plan = (blocked.repeat(groups, 1)[None, None], parts)
    return store._split_plan


def _folded(attend, query, key, value, mask, scale, groups):
    """attend() with the query heads of each kv head folded into its rows (no copy of the keys):
    (1, heads, R, dim) -> (1, kv_heads, groups * R, dim), the mask given folded (see _split_plan); unfolded after."""
    batch, heads, rows, dim = query.shape
    folded = query.reshape(batch, heads // groups, groups * rows, dim)
    out, lse = attend(folded, key, value, mask, scale)  # mask: already (1, 1, groups * R, K)
    return out.reshape(batch, heads, rows, dim), lse.reshape(batch, heads, rows)


def attach(model):
    """Switch `model` to the store's attention function; returns the previous implementation's name."""
    from transformers import AttentionInterface

    cfg = model.config
    if not getattr(model, "_supports_attention_backend", False):
        raise ValueError(f"{type(model).__name__} does not take custom attention functions "
                         f"(AttentionInterface): it cannot decode through a FlexLayoutStore")
    kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"} or getattr(cfg, "use_sliding_window", False):
        raise ValueError(f"the store holds full-attention layers only; this model has {sorted(kinds)}"
                         f"{' and a sliding window' if getattr(cfg, 'use_sliding_window', False) else ''}")
    previous = getattr(cfg, "_attn_implementation", None) or "sdpa"
    AttentionInterface.register(ATTENTION_NAME, layout_attention)
    model.set_attn_implementation(ATTENTION_NAME)
    return previous
