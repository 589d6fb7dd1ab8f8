"""The glue of FAFO's KV store (layout.py) to FlexAttention and to transformers; the attention modes
themselves (flex, dense, split, causal) are in attention.py.

- `block_mask_from_tables`: a BlockMask built from block tables (`BlockMask.from_kv_blocks`), never from a grid;
- `block_table(block_mask)`: which KV blocks each query block loads, for drawing and checks;
- `flex(...)`: flex_attention eager or compiled (attention.ATTENTION_MODES: "eager", "compiled");
- `compiled_flex_problem(...)`: whether compiled flex compiles and runs on a GPU for the model's shapes and dtype,
  and if not why (probed once: Triton's kernels can exceed a small GPU's shared memory, a T4's for instance);
  attention.choose_attention reads it for "auto";
- `layout_attention`: the attention function transformers calls for a model `attach`ed to the store (registered
  with `AttentionInterface` as ATTENTION_NAME; it finds the store through the BlockMask it is given and runs the
  store's attention mode).

Probed on torch 2.13 (CPU) / 2.11 (CUDA) and transformers 5.17-5.23: compiled flex on a CPU needs the
full-block tables present (zeros are fine); eager flex applies the mask_mod to every score and ignores the block
tables; compiled flex refuses float64 on a CPU; a model's attention function receives the BlockMask passed as
`attention_mask` unchanged (transformers' mask builders exit early on a 4D mask or a BlockMask).
"""
from __future__ import annotations

import numpy as np
import torch

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

def flex(query, key, value, block_mask, scale=None, compiled=False):
    """flex_attention, eager or compiled (see attention.ATTENTION_MODES). query (1, heads, R, dim), key/value
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
    options = kernel_options(block_mask, query.device) if compiled else None
    return fn(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=query.shape[1] != key.shape[1],
              kernel_options=options)


def kernel_options(block_mask, device) -> dict | None:
    """Triton tile sizes that divide the BlockMask's (q, kv) block sizes, on a GPU. The compiled kernel's default
    tiles (64-128) must divide them, and a block layout with small KV blocks (FAFO's store at block=16, notebook
    05) otherwise fails to compile ("Q and KV block size must be divisible by BLOCK_M and BLOCK_N", seen on an
    H100); None (the defaults) on a CPU and for the default 128 x 128 blocks."""
    if device.type != "cuda" or block_mask is None:
        return None
    q_size, kv_size = block_mask.BLOCK_SIZE

    def tile(size: int) -> int:  # the largest power of two <= 64 dividing size (Triton's dot needs >= 16)
        tile = 64
        while tile > 16 and size % tile:
            tile //= 2
        return tile

    if q_size % 64 == 0 and kv_size % 64 == 0:
        return None
    if q_size % 16 or kv_size % 16:
        raise ValueError(f"compiled flex_attention on a GPU needs block sizes that are multiples of 16, got "
                         f"{q_size} x {kv_size}: build the BlockMask with larger blocks")
    return {"BLOCK_M": tile(q_size), "BLOCK_N": tile(kv_size)}


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


def layout_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The attention function transformers calls (registered as ATTENTION_NAME); query (1, heads, R, dim). It
    finds the store through the BlockMask it is given and runs the store's attention mode (attention.py)."""
    store = getattr(attention_mask, "specdec_store", None)
    if store is None:
        raise ValueError(f"a model switched to {ATTENTION_NAME!r} takes the BlockMask of FlexLayoutStore.prepare "
                         f"as attention_mask (got {type(attention_mask).__name__})")
    store.note_query(module.layer_idx, query)
    out = store.attention_mode(store, query, key, value, attention_mask, scaling)  # (1, heads, R, dim)
    return out.transpose(1, 2).contiguous(), None


def check_model(model) -> None:
    """The ValueError `attach` raises for a model the store cannot serve (one that takes no custom attention
    function, or has other than full-attention layers), before anything is changed; None where it can (notebook 08
    asks first, to decode through another target)."""
    cfg = model.config
    if not getattr(model, "_supports_attention_backend", False):
        raise ValueError(f"{type(model).__name__} does not take custom attention functions "
                         f"(AttentionInterface): it cannot decode through a FlexLayoutStore")
    kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"} or getattr(cfg, "use_sliding_window", False):
        raise ValueError(f"the store holds full-attention layers only; this model has {sorted(kinds)}"
                         f"{' and a sliding window' if getattr(cfg, 'use_sliding_window', False) else ''}")


def attach(model):
    """Switch `model` to the store's attention function (`check_model` first); returns the previous
    implementation's name."""
    from transformers import AttentionInterface

    check_model(model)
    cfg = model.config
    previous = getattr(cfg, "_attn_implementation", None) or "sdpa"
    AttentionInterface.register(ATTENTION_NAME, layout_attention)
    model.set_attn_implementation(ATTENTION_NAME)
    return previous
