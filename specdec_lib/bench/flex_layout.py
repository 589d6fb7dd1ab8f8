"""Per-step cost of attention over a compressed KV: FAFO's contiguous layout vs the alternatives (notebook 08).

FAFO paper §4.4 and Appendix H claim that (a) keeping C(kv) contiguous in the first blocks, read through one
static BlockMask, costs about the same at every context length, while (b) the same selection left where it is
makes the kernel load every block that holds a selected entry, (c) full attention grows with the context, and
(d) rebuilding the BlockMask every step (`create_block_mask`) costs more than full attention. Measured here,
side by side in one run, at each context length:

    (a) layout     FlexLayoutStore: prepare (C + swaps + in-place block tables) + compiled flex, compressed rows
    (b) fragmented the same selected entries in place: a static mask listing every block that holds one
    (c) full       compiled flex over every valid block (the rows see the whole KV)
    (d) rebuild    create_block_mask for the fragmented selection, then compiled flex, every step (and the
                   create_block_mask call alone)
    sdpa           torch's scaled_dot_product_attention over the whole KV (the dense reference)

The selection is Quest-shaped (the kv_budget in pages of 16 positions, the sinks and the newest page kept, the
other pages drawn at random) so that in place it is scattered; (a) holds the same number of entries.
Also, the whole decode step of a real model (the tiny target by default) with one row: through the store
with full rows, with compressed rows, and with a DynamicCache (sdpa), its KV filled with random keys.

    python -m specdec_lib.bench.flex_layout                  # CPU: 1k-32k, 32 heads x 128 dims, float32
    python -m specdec_lib.bench.flex_layout --lengths 4096 65536 --dtype bfloat16   # on a GPU

Simplifications: one layer and batch size 1 for the kernel rows (the attention of one layer); random keys; the
rebuild row uses eager create_block_mask (what a per-step rebuild costs without compiling the mask too).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

from .. import compat
from ..mechanisms.store import layout as fl
from ..mechanisms import kv_cache
from ..mechanisms.store.compression import Compression
from ..env import DATA_DIR, median_ms

RESULTS_DIR = DATA_DIR / "results"


class RandomPages(Compression):
    """The benchmark's C: the sinks' page, the newest page and random other pages, `kv_budget` tokens in all."""

    def __init__(self, kv_budget: int, page: int = 16, seed: int = 0):
        self.kv_budget, self.page, self.seed = kv_budget, page, seed

    def select(self, view):
        pos = view.positions
        pages = int(pos.max()) // self.page + 1
        g = torch.Generator().manual_seed(self.seed)
        chosen = torch.randperm(pages - 2, generator=g)[: self.kv_budget // self.page - 2] + 1
        keep = torch.zeros(pages, dtype=torch.bool)
        keep[chosen], keep[0], keep[-1] = True, True, True
        return keep.to(pos.device)[pos // self.page]


class AttentionConfig:
    """The fields of a model config FlexLayoutStore reads: an attention shape without a model."""
    def __init__(self, heads, kv_heads, head_dim, layers=1):
        self.num_hidden_layers, self.num_attention_heads = layers, heads
        self.num_key_value_heads, self.head_dim = kv_heads, head_dim


def kernel_rows(length: int, rows: int, kv_budget: int, heads: int, kv_heads: int, head_dim: int, block: int,
                dtype, device, repeats: int) -> list[dict]:
    """Rows (a)-(d) and sdpa at one context length: per-step milliseconds and KV blocks loaded."""
    from torch.nn.attention.flex_attention import create_block_mask

    capacity = -(-(length + rows) // block) * block
    store = fl.FlexLayoutStore(AttentionConfig(heads, kv_heads, head_dim), capacity, RandomPages(kv_budget),
                               block=block, q_block=max(rows, 16), attention="compiled", dtype=dtype, device=device)
    g = torch.Generator(device=device).manual_seed(0)
    k = torch.randn(1, kv_heads, length, head_dim, generator=g, device=device, dtype=dtype)
    store.prepare(torch.arange(length, device=device))
    store.update(k, torch.randn_like(k), 0)
    selected = RandomPages(kv_budget).select(fl.CacheView(torch.arange(length, device=device), None))  # in place
    q = torch.randn(1, heads, rows, head_dim, generator=g, device=device, dtype=dtype)
    new = torch.randn(1, kv_heads, rows, head_dim, generator=g, device=device, dtype=dtype)
    keys, values = store.keys[0][None], store.values[0][None]  # (1, kv_heads, capacity, head_dim)
    positions = torch.arange(length, length + rows, device=device)
    flags = [True] * rows

    def layout_step():  # (a): per-step upkeep + the attention of the compressed rows
        store.rollback(length)  # drop the previous timing step's rows (keeps the layout compressed)
        mask = store.prepare(positions, compressed_rows=flags)
        store.update(new, new, 0)
        store.attention_mode(store, q, keys, values, mask)  # compiled flex, rows padded as a forward pads them

    layout_step()
    in_fixed = store.compressed
    # (b)/(d): the same selection in place, i.e. in logical order at slots 0..length-1, plus the rows' own slots
    sel = torch.zeros(capacity, dtype=torch.bool, device=device)
    sel[:length] = selected
    sel[length:length + rows] = True
    blocks = sel.view(-1, block).any(1)  # (KB,) blocks that hold a selected entry
    frag_num = torch.tensor([[[int(blocks.sum())]]], dtype=torch.int32, device=device)
    frag_idx = torch.cat([blocks.nonzero()[:, 0], (~blocks).nonzero()[:, 0]]).to(torch.int32)[None, None, None]

    def selected_mod(b, h, q_idx, kv_idx):
        return sel[kv_idx]

    frag = fl.block_mask_from_tables(1, capacity // block, (max(rows, 1), block), selected_mod, (rows, capacity),
                                   device)
    frag.kv_num_blocks.copy_(frag_num)
    frag.kv_indices.copy_(frag_idx)
    valid = torch.tensor(length + rows, device=device)

    def valid_mod(b, h, q_idx, kv_idx):
        return kv_idx < valid

    full = fl.block_mask_from_tables(1, capacity // block, (max(rows, 1), block), valid_mod, (rows, capacity), device)
    full.kv_num_blocks.fill_(-(-(length + rows) // block))

    def rebuild_mask():  # what a per-step rebuild adds: the mask_mod evaluated on the (rows, capacity) grid
        return create_block_mask(selected_mod, 1, None, rows, capacity, device=device,
                                 BLOCK_SIZE=(max(rows, 1), block))

    def rebuild_step():  # (d)
        fl.flex(q, keys, values, rebuild_mask(), compiled=True)

    kv_len = length + rows
    cases = [
        ("(a) layout", layout_step, store.loaded_blocks(rows)[0]),
        ("(b) fragmented", lambda: fl.flex(q, keys, values, frag, compiled=True), int(frag_num)),
        ("(c) full", lambda: fl.flex(q, keys, values, full, compiled=True), int(full.kv_num_blocks.sum())),
        ("(d) rebuild", rebuild_step, int(frag_num)),
        ("(d) its create_block_mask alone", rebuild_mask, int(frag_num)),
        ("sdpa (dense)", lambda: torch.nn.functional.scaled_dot_product_attention(
            q, keys[:, :, :kv_len], values[:, :, :kv_len], enable_gqa=heads != kv_heads), -(-kv_len // block)),
    ]
    out = []
    for name, fn, loaded in cases:
        out.append(dict(length=length, case=name, ms=median_ms(fn, repeats, device), kv_blocks=loaded,
                        selected=in_fixed))
    return out


@torch.no_grad()
def model_rows(model, length: int, kv_budget: int, block: int, repeats: int) -> list[dict]:
    """One decode step of `model` (one row) with `length` cached tokens: store full / compressed, DynamicCache."""
    from transformers import DynamicCache

    param = next(model.parameters())
    device, dtype = param.device, param.dtype
    cfg = model.config
    capacity = -(-(length + 1) // block) * block
    store = fl.FlexLayoutStore(model, capacity, RandomPages(kv_budget), block=block, attention="compiled")
    store.prepare(torch.arange(length, device=device))
    cache = DynamicCache(config=cfg)
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    for layer in range(cfg.num_hidden_layers):  # random keys: the cost does not depend on them
        k = torch.randn(1, kv_heads, length, head_dim, device=device, dtype=dtype)
        store.update(k, k, layer)
        cache.update(k, k, layer)
    token = torch.tensor([[1]], device=device)
    pos = torch.tensor([[length]], device=device)

    def through_store(compressed):
        def step():
            store.rollback(length)
            mask = store.prepare(pos[0], compressed_rows=[compressed])
            compat.forward(model, input_ids=token, position_ids=pos, cache=store, attention_mask=mask,
                           logits_to_keep=1)
        return step

    def dynamic_step():
        compat.forward(model, input_ids=token, position_ids=pos, cache=cache, logits_to_keep=1)
        kv_cache.rollback(cache, length)  # drop the step's own entry

    previous = fl.attach(model)  # the model may come attached already (notebook 08): restored as found
    plain = previous if previous != fl.ATTENTION_NAME else "sdpa"
    try:
        store_full = median_ms(through_store(False), repeats, device)
        store_comp = median_ms(through_store(True), repeats, device)
        model.set_attn_implementation(plain)
        dynamic = median_ms(dynamic_step, repeats, device)
    finally:
        model.set_attn_implementation(previous)
    return [dict(length=length, case="step: store, full rows", ms=store_full),
            dict(length=length, case="step: store, compressed rows", ms=store_comp),
            dict(length=length, case=f"step: DynamicCache ({plain})", ms=dynamic)]


def main(argv=None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--rows", type=int, default=16, help="compressed query rows per step (fumble rows)")
    parser.add_argument("--kv-budget", type=int, default=1024, help="entries C keeps (tokens)")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block", type=int, default=fl.BLOCK)
    parser.add_argument("--dtype", default="auto", help="auto: float32 on CPU, bf16 or fp16 on a GPU by capability")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--no-model", action="store_true", help="skip the tiny target's decode step")
    parser.add_argument("--out", default=None, help="CSV path (default data/results/flex_layout_<machine>.csv)")
    args = parser.parse_args(argv)
    from .harness import machine_info

    from ..env import resolve_device, resolve_dtype

    device = resolve_device("auto")
    dtype = resolve_dtype(args.dtype, device)  # "auto": by capability (bf16 from sm_80, fp16 below, fp32 on CPU)
    info = machine_info()
    if device.type == "cuda":
        info["device"] = torch.cuda.get_device_name(device)
    rows = []
    model = None
    if not args.no_model:
        from ..models.loading import load_models

        model = load_models("tiny", device=device).target
    for length in args.lengths:
        rows += kernel_rows(length, args.rows, args.kv_budget, args.heads, args.kv_heads, args.head_dim, args.block,
                            dtype, device, args.repeats)
        if model is not None:
            rows += model_rows(model, length, args.kv_budget, args.block, args.repeats)
        print(pd.DataFrame([r for r in rows if r["length"] == length]).to_string(index=False), flush=True)
    table = pd.DataFrame(rows)
    table["device"], table["dtype"] = info["device"], str(dtype).replace("torch.", "")
    table["torch"], table["rows"], table["kv_budget"] = info["torch"], args.rows, args.kv_budget
    slug = "gpu-" + info["device"].split()[-1].lower() if device.type == "cuda" else "cpu"
    out = Path(args.out) if args.out else RESULTS_DIR / f"flex_layout_{slug}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(out, index=False)
    wide = table.pivot_table(index="case", columns="length", values="ms", sort=False)
    print(f"\n{info['device']}, {dtype}: median ms per step\n{wide.round(3).to_string()}\nwritten to {out}")
    return table


if __name__ == "__main__":
    main()
