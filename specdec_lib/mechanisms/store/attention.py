"""The attention of FAFO's KV store (layout.py), one small object per mode: HOW one forward's rows read it.

FAFO paper §4.4 and Appendix E: one forward mixes rows that see the compressed KV C(kv) only (the fixed region,
slots < compressed) with rows that see every committed entry (slots < base), and each row sees the forward's own
rows (slots base..base + R) where `sees` (R, R) says so. The store says WHERE every entry sits and which row sees
what (`forward_parts`, its BlockMask and mask_mod); a mode computes the attention from that:

- `Flex` ("compiled", "eager"): flex_attention over the store's BlockMask (flex_backend.flex);
- `Dense` ("dense", the masked mode): the mask_mod rendered once per forward to a bool mask for SDPA;
- `Split` ("split", the CPU default): per row group, its committed slots read with no mask (a contiguous slice:
  FAFO's fixed region for compressed rows) and the own rows under `sees`, merged exactly by their log-sum-exps
  (`attention_with_lse`);
- `Causal`: a prompt's prefill (nothing committed, causal rows), SDPA's causal kernel: what `Split` runs then;
  and a plain step (one full row, which sees every committed slot and itself: one unmasked SDPA call).

`make_mode(attention, ...)` gives the store its mode ("auto": `choose_attention`, compiled flex on a GPU where it
compiles and runs, else split). A mode keeps what every layer of one forward shares (the dense mask, the split
plan), made by the first layer and dropped by `new_forward()`, which the store's `prepare` calls; the model's
attention function (flex_backend.layout_attention) calls `store.attention_mode(store, query, key, value, ...)`.

Simplifications: batch size 1; one mask for every layer and head; masks are additive finfo.min, not -inf.
"""
from __future__ import annotations

from functools import partial

import torch

from ... import compat
from .flex_backend import compiled_flex_problem, flex

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


def attention_with_lse(query, key, value, mask=None, scale=None):
    """(out (B, H, R, D), lse (B, H, R) float32 or the dtype's) of softmax attention; `mask` an additive float
    mask broadcastable to (B, H, R, K), or None. Same head counts for query and key (fold groups beforehand).
    The log-sum-exp is what lets two attentions over disjoint key sets merge exactly (Split)."""
    op = compat.flash_attention_for_cpu()
    if query.device.type == "cpu" and op is not None:
        try:
            return op(query, key, value, 0.0, False, attn_mask=mask, scale=scale)
        except RuntimeError:  # a dtype or shape the fused kernel refuses: the explicit form below
            pass
    scale = scale if scale is not None else query.shape[-1] ** -0.5
    exact = torch.float64 if query.dtype == torch.float64 else torch.float32
    scores = (query @ key.transpose(-1, -2)).to(exact) * scale  # (B, H, R, K)
    if mask is not None:
        scores = scores + mask.to(exact)
    lse = scores.logsumexp(-1)  # (B, H, R)
    return ((scores - lse[..., None]).exp().to(value.dtype) @ value), lse


class Flex:
    """flex_attention over the store's BlockMask, compiled (block-sparse) or eager (every score masked)."""
    prefill_pattern = True  # reads the (R, R) pattern `sees` on every forward, a prompt's prefill too

    def __init__(self, compiled: bool):
        self.compiled, self.name = compiled, "compiled" if compiled else "eager"

    def padded_rows(self, rows: int) -> int:
        """The query rows the kernel runs for a forward of `rows`: compiled flex builds one kernel per query
        length (dynamic=False), and a decode under "auto" budgets meets a new row count at almost every step
        (each new length compiles again, which costs far more than a forward), so compiled runs pad to a few
        sizes: 16, 32, 64, 128, then multiples of 128. The padded rows see nothing of the forward and are sliced off."""
        if not self.compiled:
            return rows
        if rows > 128:
            return -(-rows // 128) * 128
        return max(16, 1 << (rows - 1).bit_length())

    def new_forward(self) -> None:
        pass  # nothing shared between layers: the BlockMask is the store's

    def __call__(self, store, query, key, value, block_mask, scale=None):
        rows = query.shape[2]
        padded = block_mask.seq_lengths[0]
        if padded > rows:  # (1, heads, padded, dim): zeros in the padded rows, whose outputs are dropped
            query = torch.nn.functional.pad(query, (0, 0, 0, padded - rows))
        return flex(query, key, value, block_mask, scale, self.compiled)[:, :, :rows]  # (1, heads, R, dim)


class Dense:
    """The store's mask_mod rendered to a bool mask, once per forward (by its first layer), for SDPA."""
    name, prefill_pattern = "dense", True

    def __init__(self):
        self._mask = None

    def new_forward(self) -> None:
        self._mask = None

    def __call__(self, store, query, key, value, block_mask, scale=None):
        if self._mask is None:  # slots past the forward's own rows hold nothing: leave them out
            self._mask = store.dense_mask()[..., :store.valid_slots()]  # bool (1, 1, R, base + R)
        end = self._mask.shape[-1]
        return torch.nn.functional.scaled_dot_product_attention(
            query, key[:, :, :end], value[:, :, :end], attn_mask=self._mask, scale=scale,
            enable_gqa=query.shape[1] != key.shape[1])  # (1, heads, R, dim)


class Causal:
    """A prompt's prefill: nothing committed, each row sees the rows before it; SDPA's causal kernel reads no
    (R, R) pattern, so the store need not write one (`prefill_pattern`)."""
    name, prefill_pattern = "causal", False

    def new_forward(self) -> None:
        pass

    def __call__(self, store, query, key, value, block_mask=None, scale=None):
        base, rows = store.forward_parts()[:2]
        return torch.nn.functional.scaled_dot_product_attention(
            query, key[:, :, base:base + rows], value[:, :, base:base + rows], is_causal=True, scale=scale,
            enable_gqa=query.shape[1] != key.shape[1])  # (1, heads, R, dim)


class Split:
    """Attention of a forward in two parts per row: its committed slots with no mask (slots < base for full rows,
    < compressed for compressed rows: contiguous slices) and the forward's own rows under `sees`; the parts merge
    exactly through their log-sum-exps. A compressed row's cost does not grow with the context."""
    name, prefill_pattern = "split", False  # its prefill is Causal's

    def __init__(self):
        self.causal, self._plan, self._plain = Causal(), None, None

    def new_forward(self) -> None:
        self._plan = self._plain = None

    def __call__(self, store, query, key, value, block_mask=None, scale=None):
        base, rows, compressed, sees, flags, causal = store.forward_parts()
        if base == 0 and causal:  # a prompt's prefill: causal over its own rows, nothing committed yet
            return self.causal(store, query, key, value, block_mask, scale)
        if self._plain is None:  # asked once per forward (a host sync), by its first layer
            self._plain = rows == 1 and not bool(flags[0]) and bool(sees[0, 0])
        if self._plain:  # a plain step: its row reads slots 0..base, contiguous, with no mask and no merge
            return torch.nn.functional.scaled_dot_product_attention(
                query, key[:, :, :base + 1], value[:, :, :base + 1], scale=scale,
                enable_gqa=query.shape[1] != key.shape[1])  # (1, heads, 1, dim)
        own_k, own_v = key[:, :, base:base + rows], value[:, :, base:base + rows]  # (1, kv_heads, R, dim)
        groups = query.shape[1] // key.shape[1]  # grouped-query attention: heads per kv head
        blocked, parts = self._forward_plan(base, rows, compressed, sees, flags, query.dtype, groups, key.device)
        out, lse = _folded(query, own_k, own_v, blocked, scale, groups)  # (1, heads, R, dim), (1, heads, R)
        for pick, end in parts:  # full rows against every committed slot, compressed rows the fixed region
            part, part_lse = _folded(query[:, :, pick], key[:, :, :end], value[:, :, :end], None, scale, groups)
            total = torch.logaddexp(lse[:, :, pick], part_lse)  # (1, heads, r)
            out[:, :, pick] = (out[:, :, pick] * (lse[:, :, pick] - total).exp()[..., None].to(out.dtype)
                               + part * (part_lse - total).exp()[..., None].to(out.dtype))
        return out

    def _forward_plan(self, base, rows, compressed, sees, flags, dtype, groups, device):
        """What every layer of one forward shares, made by its first layer: the own rows' additive mask, folded
        per group (1, 1, groups * R, R), and per row kind (row pick, committed slots it reads), a pick being a
        slice where the rows are contiguous (a view, not a gather)."""
        if self._plan is None:
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
            self._plan = (blocked.repeat(groups, 1)[None, None], parts)
        return self._plan


def _folded(query, key, value, mask, scale, groups):
    """attention_with_lse with the query heads of each kv head folded into its rows (no copy of the keys):
    (1, heads, R, dim) -> (1, kv_heads, groups * R, dim), the mask given folded (see Split); unfolded after."""
    batch, heads, rows, dim = query.shape
    folded = query.reshape(batch, heads // groups, groups * rows, dim)
    out, lse = attention_with_lse(folded, key, value, mask, scale)  # mask: already (1, 1, groups * R, K)
    return out.reshape(batch, heads, rows, dim), lse.reshape(batch, heads, rows)


_MODES = {"compiled": partial(Flex, True), "eager": partial(Flex, False), "dense": Dense, "split": Split}


def choose_attention(device, dtype, heads: int, kv_heads: int, head_dim: int,
                     blocks: tuple[int, int] = (128, 128)) -> tuple[str, str]:
    """(mode, why) for attention="auto": "split" on a CPU, "compiled" on a GPU where it runs, else "split".
    blocks: the BlockMask's (query, KV) block sizes; Triton's kernels need multiples of 16 (a drawing's 2-row query
    blocks in notebook 08 are not)."""
    device = torch.device(device)
    if device.type != "cuda":
        return "split", ("split on a CPU: each row reads only the committed slots it sees (a compressed row the "
                         "fixed region), exact, and faster there than compiled flex")
    if any(size % 16 for size in blocks):
        return "split", (f"split, since compiled flex_attention on a GPU needs blocks that are multiples of 16 "
                         f"(query x KV blocks here: {blocks[0]} x {blocks[1]})")
    problem = compiled_flex_problem(device, dtype, heads, kv_heads, head_dim)
    if problem:
        return "split", f"split, since {problem}"
    return "compiled", "compiled flex_attention: block-sparse, loads only the listed KV blocks"


def make_mode(attention: str, device, dtype, heads: int, kv_heads: int, head_dim: int,
              blocks: tuple[int, int] = (128, 128)):
    """(mode object, why) for a store's `attention` argument: "auto" resolved by choose_attention (a fallback on
    a GPU is printed), one of ATTENTION_MODES taken as asked for, anything else refused."""
    reason = "asked for"
    if attention == "auto":
        attention, reason = choose_attention(device, dtype, heads, kv_heads, head_dim, blocks)
        if torch.device(device).type == "cuda" and attention != "compiled":
            print(f"FlexLayoutStore: {reason}")
    if attention not in ATTENTION_MODES:
        raise ValueError(f"attention must be 'auto' or one of {sorted(ATTENTION_MODES)}, got {attention!r}")
    return _MODES[attention](), reason
