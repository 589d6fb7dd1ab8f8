"""FAFO's KV layout (mechanisms/store/layout.py, attention.py, compression.py): exact against slow references.

- attention over the managed (swapped, compacted) layout equals attention over the logical sets gathered the
  slow way, for full and compressed rows, random appends / compactions / swaps (float64, 1e-10), in the three
  attention modes (eager flex, dense, split; compiled flex in float32);
- decoding through the store with full rows = HF greedy (shipped target, random Llama and Qwen2);
- decoding with StreamingLLM rows = a naive reference (DynamicCache + an explicit mask over logical positions);
- the block tables: compressed rows load the fixed blocks and their own, full rows every valid block;
- bad input: clear errors.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch

from helpers import SHIPPED_PROMPTS, random_lm
from specdec_lib import compat, generate
from specdec_lib.mechanisms.store import layout as fl
from specdec_lib.mechanisms.store.compression import CacheView, Quest, StreamingLLM
from specdec_lib.methods.autoregressive import greedy_through_store


def attached(model):
    model = copy.deepcopy(model)
    fl.attach(model)
    return model


def logical_reference(log, rows, sees, flags, compression, queries=None):
    """Per row: softmax(q . k / sqrt(d)) v over the keys it may see, gathered from the LOGICAL record `log`
    (position -> (keys (layers, kv_heads, dim), values)) and the forward's own rows. Returns (layers, heads, R, d)."""
    positions = sorted(log)
    q, k_new, v_new = rows  # (layers, heads, R, dim), (layers, kv_heads, R, dim) x 2
    empty = k_new[:, :, :0]
    keys = torch.stack([log[p][0] for p in positions], dim=2) if log else empty  # (layers, kv_heads, L, dim)
    values = torch.stack([log[p][1] for p in positions], dim=2) if log else empty  # logical order
    pos_t = torch.tensor(positions)
    keep = compression.select(CacheView(pos_t, keys, queries)) if positions else torch.zeros(0, dtype=torch.bool)
    layers, heads, r, dim = q.shape
    group = heads // keys.shape[1]
    out = torch.zeros_like(q)
    for row in range(r):
        committed = keep if flags[row] else torch.ones(len(positions), dtype=torch.bool)
        ks = torch.cat([keys[:, :, committed], k_new[:, :, sees[row]]], dim=2)  # (layers, kv_heads, n, dim)
        vs = torch.cat([values[:, :, committed], v_new[:, :, sees[row]]], dim=2)
        ks, vs = ks.repeat_interleave(group, 1), vs.repeat_interleave(group, 1)  # (layers, heads, n, dim)
        w = torch.softmax((q[:, :, row, None] * ks).sum(-1) / math.sqrt(dim), dim=-1)  # (layers, heads, n)
        out[:, :, row] = (w[..., None] * vs).sum(2)
    return out


def layout_attention(store, q):
    """Attention of every layer through the store's mask and buffers, run by its attention mode (attention.py) as
    the model's attention function runs it."""
    mask = store.block_mask_in_flight()
    outs = []
    for layer in range(store.layers_n):
        k, v = store.keys[layer][None], store.values[layer][None]  # (1, kv_heads, capacity, dim)
        outs.append(store.attention_mode(store, q[layer][None], k, v, mask)[0])
    return torch.stack(outs)  # (layers, heads, R, dim)


def random_walk(attention, compression, dtype=torch.float64, steps=14, seed=0, tol=1e-10):
    """Random forwards (1-6 rows, random sees and row kinds), random compactions; every forward checked."""
    g = torch.Generator().manual_seed(seed)
    model = random_lm("llama", layers=2, hidden=32).to(dtype)
    store = fl.FlexLayoutStore(model, capacity=128, compression=compression, block=16, q_block=4,
                               attention=attention)
    layers, kv_heads, heads, dim = 2, 2, 4, 8
    log, next_pos, queries = {}, 0, None
    for step in range(steps):
        r = 9 if step == 0 else int(torch.randint(1, 7, (1,), generator=g))
        sees = torch.rand(r, r, generator=g) < 0.5
        sees = (sees & torch.ones(r, r, dtype=torch.bool).tril()) | torch.eye(r, dtype=torch.bool)
        flags = torch.rand(r, generator=g) < 0.6 if step else torch.zeros(r, dtype=torch.bool)
        keep = sorted(torch.randperm(r, generator=g)[:int(torch.randint(1, r + 1, (1,), generator=g))].tolist())
        positions = torch.full((r,), next_pos + r)  # dropped rows: any position; kept rows: the next ones
        positions[keep] = torch.arange(next_pos, next_pos + len(keep))
        store.prepare(positions, sees, flags)
        expect_keep = store.compression.select(CacheView(
            torch.tensor(sorted(log)), torch.stack([log[p][0] for p in sorted(log)], 2), queries)) if log else None
        if expect_keep is not None:  # the fixed region holds exactly C's selection
            fixed = set(store.slot_pos[:store.compressed].tolist())
            assert fixed == {p for p, k in zip(sorted(log), expect_keep.tolist()) if k}
        q = torch.randn(layers, heads, r, dim, generator=g, dtype=dtype)
        k = torch.randn(layers, kv_heads, r, dim, generator=g, dtype=dtype)
        v = torch.randn(layers, kv_heads, r, dim, generator=g, dtype=dtype)
        for layer in range(layers):
            store.update(k[layer][None], v[layer][None], layer)
            store.note_query(layer, q[layer][None])
        got = layout_attention(store, q)
        want = logical_reference(log, (q, k, v), sees, flags.tolist(), store.compression, queries)
        assert (got - want).abs().max().item() < tol, f"step {step}"
        if compression.needs_queries:
            queries = q[:, :, -1].clone()
        base = store.length - r
        store.compact(base, keep)  # keep some of the forward's rows, as the loop keeps an accepted path
        for j, row in enumerate(keep):
            log[next_pos + j] = (k[:, :, row], v[:, :, row])
        next_pos += len(keep)
    assert store.compressed <= store.fixed_blocks * store.block
    return store


@pytest.mark.parametrize("attention", ["eager", "dense", "split"])
@pytest.mark.parametrize("compression", [StreamingLLM(2, 10), Quest(32, 8)], ids=["streaming", "quest"])
def test_layout_attention_equals_the_logical_gather(attention, compression):
    random_walk(attention, compression, seed=hash((attention, type(compression).__name__)) % 1000)


def test_compiled_flex_equals_the_logical_gather():
    """Compiled flex pads every forward of 1-16 rows to 16 (one kernel, where an H200 compiled one per row count
    for minutes): a larger forward's pattern left in the shared buffers must not leak into a smaller one's."""
    store = random_walk("compiled", StreamingLLM(2, 10), dtype=torch.float32, steps=8, tol=2e-5)
    assert sorted(store._forwards) == [16], "every forward of 1-9 rows ran the 16-row kernel"
    assert [store.attention_mode.padded_rows(r) for r in (1, 16, 17, 100, 128, 129, 300)] == \
        [16, 16, 32, 128, 128, 256, 384]


def test_store_entries_are_swapped_not_shifted():
    """StreamingLLM in steady state: one swap per step; the evicted entry goes to the tail."""
    model = random_lm("llama")
    store = fl.FlexLayoutStore(model, capacity=64, compression=StreamingLLM(2, 6), block=8)
    store.prepare(torch.arange(20))
    store.update(torch.randn(1, 2, 20, 8, dtype=torch.float64), torch.randn(1, 2, 20, 8, dtype=torch.float64), 0)
    store.update(torch.randn(1, 2, 20, 8, dtype=torch.float64), torch.randn(1, 2, 20, 8, dtype=torch.float64), 1)
    assert store.compress() == 6  # the 6 recent entries (14..19) swap with 2..7
    assert sorted(store.slot_pos[:8].tolist()) == [0, 1, 14, 15, 16, 17, 18, 19]
    before = store.keys[:, :, :8].clone()
    store.prepare([20])
    for layer in range(2):
        store.update(torch.randn(1, 2, 1, 8, dtype=torch.float64), torch.randn(1, 2, 1, 8, dtype=torch.float64), layer)
    assert store.compress() == 1
    evicted = int((store.slot_pos[:8] == 20).nonzero())  # 20 took the slot of 14, and 14 went to slot 20
    assert store.slot_pos[20] == 14 and torch.equal(store.keys[:, :, 20], before[:, :, evicted])


def test_a_split_prefill_writes_its_causal_pattern_only_when_drawn():
    """A prompt's prefill in split mode skips its (P, P) pattern (SDPA's causal kernel needs none); drawing it
    still shows the causal mask, as the dense mode's store (which writes it at once) does."""
    model = random_lm("llama")
    store = fl.FlexLayoutStore(model, capacity=64, compression=StreamingLLM(2, 6), block=8, attention="split")
    store.prepare(torch.arange(12))
    assert store._sees_pending
    mask, _ = store.logical_mask()
    assert torch.equal(mask, torch.ones(12, 12, dtype=torch.bool).tril())
    dense = fl.FlexLayoutStore(model, capacity=64, compression=StreamingLLM(2, 6), block=8, attention="dense")
    dense.prepare(torch.arange(12))
    assert not dense._sees_pending and torch.equal(dense.logical_mask()[0], mask)


def test_block_tables_compressed_rows_load_fixed_and_own_blocks():
    model = random_lm("llama")
    store = fl.FlexLayoutStore(model, capacity=256, compression=StreamingLLM(4, 20), block=16, q_block=2)
    ids = torch.arange(100)
    store.prepare(ids)
    for layer in range(2):
        store.update(torch.randn(1, 2, 100, 8, dtype=torch.float64), torch.randn(1, 2, 100, 8, dtype=torch.float64),
                     layer)
    # rows 0-1 (one query block) compressed, rows 2-3 full
    mask = store.prepare(torch.arange(100, 104), compressed_rows=[True, True, False, True])
    assert store.fixed_blocks == 2 and store.compressed == 24
    assert store.loaded_blocks(4) == [3, 7]  # 2 fixed blocks + the block of slots 100..103 | ceil(104 / 16)
    assert mask.kv_indices[0, 0, 0, :3].tolist() == [0, 1, 6]
    mask = store.prepare(torch.arange(100, 104))  # same row count, all full: the indices are restored
    assert store.loaded_blocks(4) == [7, 7] and mask.kv_indices[0, 0, 0, :7].tolist() == list(range(7))


def test_full_rows_reproduce_greedy_on_the_shipped_target(tiny_pair64, tiny_pair):
    target = attached(tiny_pair64[0])
    for text in SHIPPED_PROMPTS[:1]:  # one prompt: the store's rows do not depend on the text (the random models below)
        ids = tiny_pair.encode(text)
        want = generate("autoregressive", tiny_pair64[0], ids, 24).new_tokens
        for attention, steps in (("split", 24), ("dense", 24), ("eager", 3)):  # eager flex: ~0.5 s per forward
            store = fl.FlexLayoutStore(target, capacity=128, compression=StreamingLLM(4, 12), block=16,
                                       attention=attention)
            assert greedy_through_store(target, store, ids[0].tolist(), steps) == want[:steps]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_full_rows_reproduce_hf_greedy_on_random_models(kind):
    model = random_lm(kind, seed=3, logit_scale=8.0)
    ids = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(1))
    want = model.generate(ids, max_new_tokens=30, do_sample=False)[0, 12:].tolist()
    target = attached(model)
    store = fl.FlexLayoutStore(target, capacity=64, compression=StreamingLLM(2, 6), block=8)
    assert greedy_through_store(target, store, ids[0].tolist(), 30) == want
    assert store.length == 12 + 29  # every token but the last is cached, and C kept its kv_budget
    # C ran before the last forward, over positions 0..39
    assert store.compressed == 8 and sorted(store.slot_pos[:8].tolist()) == [0, 1, *range(34, 40)]


@torch.no_grad()
def naive_streaming_greedy(model, ids, steps, sinks, recent):
    """The reference: a DynamicCache and an explicit additive mask over LOGICAL positions, rebuilt each step."""
    from transformers import DynamicCache

    cache, out, row = DynamicCache(), [], torch.tensor([ids])
    logits = compat.forward(model, input_ids=row, cache=cache).logits[0, -1]
    while True:
        out.append(int(logits.argmax()))
        if len(out) == steps:
            return out
        pos = len(ids) + len(out) - 1  # the new row's position; the cache holds 0..pos-1
        keys = torch.arange(pos + 1)
        seen = (keys < sinks) | (keys > pos - 1 - recent)  # C over 0..pos-1, and the row itself
        mask = torch.zeros(1, 1, 1, pos + 1, dtype=torch.float64).masked_fill(~seen, torch.finfo(torch.float64).min)
        logits = compat.forward(model, input_ids=torch.tensor([[out[-1]]]), position_ids=torch.tensor([[pos]]),
                                attention_mask=mask, cache=cache).logits[0, -1]


def test_streaming_rows_equal_a_naive_recompute(tiny_pair64, tiny_pair):
    ids = tiny_pair.encode(SHIPPED_PROMPTS[0])[0].tolist()
    reference = copy.deepcopy(tiny_pair64[0])
    reference.set_attn_implementation("sdpa")
    want = naive_streaming_greedy(reference, ids, 30, sinks=4, recent=8)
    target = attached(tiny_pair64[0])
    store = fl.FlexLayoutStore(target, capacity=128, compression=StreamingLLM(4, 8), block=16)
    got = greedy_through_store(target, store, ids, 30, compressed=True)
    assert got == want
    full = greedy_through_store(target, fl.FlexLayoutStore(target, capacity=128, block=16,
                                                               compression=StreamingLLM(4, 8)), ids, 30)
    assert got != full  # the compressed rows really saw less (else this test could not fail)


def test_bad_input_is_refused():
    model = random_lm("llama")
    with pytest.raises(ValueError, match="more than capacity"):
        fl.FlexLayoutStore(model, capacity=64, compression=StreamingLLM(4, 100), block=16)
    with pytest.raises(ValueError, match="does not divide"):
        fl.FlexLayoutStore(model, capacity=100, compression=StreamingLLM(2, 6), block=16)
    with pytest.raises(ValueError):
        StreamingLLM(0, 0)  # a compression budget of 0
    with pytest.raises(ValueError):
        Quest(kv_budget=0)
    with pytest.raises(ValueError, match="attention must be"):
        fl.FlexLayoutStore(model, capacity=64, compression=StreamingLLM(2, 6), block=16, attention="fast")
    store = fl.FlexLayoutStore(model, capacity=64, compression=StreamingLLM(2, 6), block=16)
    with pytest.raises(ValueError, match="do not fit"):
        store.prepare(torch.arange(65))
    with pytest.raises(ValueError, match="at least one row"):
        store.prepare([])
    plain = copy.deepcopy(model)
    with pytest.raises(RuntimeError, match="call prepare"):  # a forward the store was not told about
        with torch.no_grad():
            compat.forward(plain, input_ids=torch.tensor([[1, 2]]), cache=store)
    model = attached(model)
    with pytest.raises(ValueError, match="BlockMask of FlexLayoutStore.prepare"):
        with torch.no_grad():
            model(torch.tensor([[1, 2]]))
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sliding = Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                           num_attention_heads=2, num_key_value_heads=1, use_sliding_window=True,
                                           sliding_window=8, max_window_layers=0))
    before = sliding.config._attn_implementation
    for refuse in (fl.check_model, fl.attach):  # check_model: attach's refusal, asked first (notebook 08)
        with pytest.raises(ValueError, match="full-attention layers only"):
            refuse(sliding)
    assert sliding.config._attn_implementation == before and fl.check_model(model) is None
    with pytest.raises(ValueError, match="empty"):
        greedy_through_store(model, fl.FlexLayoutStore(model, capacity=64, block=16,
                                                          compression=StreamingLLM(2, 6)), [], 3)


def test_views_draw_the_layout_and_the_block_tables():
    from specdec_lib import viz

    model = random_lm("llama")
    store = fl.FlexLayoutStore(model, capacity=64, compression=StreamingLLM(2, 6), block=8)
    store.prepare(torch.arange(20))
    for layer in range(2):
        store.update(torch.randn(1, 2, 20, 8, dtype=torch.float64), torch.randn(1, 2, 20, 8, dtype=torch.float64),
                     layer)
    store.compress()
    mask = store.prepare([20], compressed_rows=[True])
    snap = store.snapshot()
    fig = viz.layout_figure([snap, snap], sinks=2)
    positions, roles = fig.data[0].z, fig.data[1].z  # (blocks, block) grids
    # the sinks sit in slots 0-1
    assert len(positions) == 8 and list(positions[0][:2]) == [0, 1] and list(roles[0][:2]) == [3, 3]
    assert sorted(v for row in positions[:1] for v in row) == [0, 1, 14, 15, 16, 17, 18, 19]  # the fixed block
    assert roles[1][0] == 1 and roles[2][4] == 4 and roles[2][5] == 0  # the tail, the row in flight, empty slots
    assert len(fig.frames) == 2
    table = fl.block_table(mask)
    assert table.tolist() == [[True, False, True] + [False] * 5]  # the fixed block and the row's own block
    heat = viz.block_map_figure(table, block=8)
    assert [list(r) for r in heat.data[0].z] == [[1, 0, 1, 0, 0, 0, 0, 0]] and "2 of 8" in heat.layout.title.text
    sel = viz.selection_figure({"a": [1, 0, 1], "b": [0, 1, 1]}, ["x", "y", "z"])
    assert [list(r) for r in sel.data[0].z] == [[1, 0, 1], [0, 1, 1]] and list(sel.data[0].y) == ["a (2)", "b (2)"]


def test_benchmark_counts_the_blocks_each_case_loads():
    """bench.flex_layout's cases: (a) loads the fixed blocks + its own, (b)/(d) every block holding a selected
    entry, (c) every valid block (block counts, not timings)."""
    from specdec_lib.bench import flex_layout as bf

    rows = {r["case"]: r for r in bf.kernel_rows(1024, rows=4, kv_budget=128, heads=2, kv_heads=2, head_dim=16,
                                                 block=64, dtype=torch.float32, device=torch.device("cpu"),
                                                 repeats=1)}
    assert rows["(a) layout"]["kv_blocks"] == 2 + 1 and rows["(a) layout"]["selected"] == 128
    assert rows["(c) full"]["kv_blocks"] == 17  # ceil(1028 / 64)
    fragmented = rows["(b) fragmented"]["kv_blocks"]  # 8 pages of 16 scattered over 16 blocks, + the rows' own
    assert fragmented == rows["(d) rebuild"]["kv_blocks"] and rows["(a) layout"]["kv_blocks"] < fragmented <= 9
    assert all(r["ms"] > 0 for r in rows.values())


def test_auto_attention_falls_back_to_split_where_compiled_flex_fails(monkeypatch):
    """On a GPU "auto" takes compiled flex only where it compiles and runs for the model's shapes (probed once);
    a T4's shared memory, say, refuses Triton's kernel: then split, saying why. The probe is faked here."""
    from specdec_lib.mechanisms.store import attention, flex_backend

    assert attention.choose_attention("cpu", torch.float32, 8, 2, 64)[0] == "split"
    probes = []

    def fake_probe(device, dtype, heads, kv_heads, head_dim):
        probes.append((dtype, head_dim))
        return None if dtype == torch.bfloat16 else "OutOfResources: out of resource: shared memory"

    monkeypatch.setattr(flex_backend, "_probe_compiled_flex", fake_probe)
    monkeypatch.setattr(flex_backend, "_PROBED", {})
    mode, why = attention.choose_attention("cuda", torch.float16, 8, 2, 64)
    assert mode == "split" and "shared memory" in why
    assert attention.choose_attention("cuda", torch.float16, 8, 2, 64)[0] == "split"
    assert attention.choose_attention("cuda", torch.bfloat16, 8, 2, 64)[0] == "compiled"
    assert probes == [(torch.float16, 64), (torch.bfloat16, 64)], "each device/dtype/shape is probed once"
    # notebook 08 draws 2-row query blocks: Triton's kernels need multiples of 16 (an H200 refused 2 x 16), so
    # "auto" takes split there, saying why, before any probe
    mode, why = attention.choose_attention("cuda", torch.bfloat16, 8, 2, 64, blocks=(2, 16))
    assert mode == "split" and "2 x 16" in why and len(probes) == 2
    assert attention.choose_attention("cuda", torch.bfloat16, 8, 2, 64, blocks=(16, 32))[0] == "compiled"


def test_the_compiled_flex_probe_reports_a_failure_instead_of_raising():
    """The real probe on a device it cannot run on (a CPU tensor asked for on a missing GPU) returns why."""
    from specdec_lib.mechanisms.store import flex_backend

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the probe would succeed")
    why = flex_backend._probe_compiled_flex(torch.device("cuda"), torch.float16, 4, 2, 32)
    assert isinstance(why, str) and why


def test_compiled_flex_tiles_fit_small_blocks_on_a_gpu():
    """Seen on an H100: compiled flex_attention refused the store's 16-entry KV blocks ("Q and KV block size must
    be divisible by BLOCK_M and BLOCK_N"); flex() now passes Triton tiles that divide the BlockMask's blocks."""
    from types import SimpleNamespace

    from specdec_lib.mechanisms.store.flex_backend import kernel_options

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    mask = lambda q, kv: SimpleNamespace(BLOCK_SIZE=(q, kv))  # noqa: E731 (only BLOCK_SIZE is read)
    assert kernel_options(mask(128, 16), cuda) == {"BLOCK_M": 64, "BLOCK_N": 16}
    assert kernel_options(mask(16, 32), cuda) == {"BLOCK_M": 16, "BLOCK_N": 32}
    assert kernel_options(mask(128, 128), cuda) is None  # the defaults fit
    assert kernel_options(mask(128, 16), cpu) is None and kernel_options(None, cuda) is None
    with pytest.raises(ValueError, match="multiples of 16"):
        kernel_options(mask(4, 16), cuda)
