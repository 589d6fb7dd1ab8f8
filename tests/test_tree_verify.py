"""Draft trees, tree masks, one-pass tree verification and KV compaction (notebook 02).

Tolerances: random float64 models under `sdpa` compute attention in float64, so tree logits equal
sequential decoding to 1e-9 (measured ~2e-15). Under `eager`, transformers' softmax runs in float32 even
for float64 models, so the eager check uses 1e-5 (measured ~4e-7).
"""
from __future__ import annotations

import copy
import random

import pytest
import torch

from specdec_lib import compat
from specdec_lib.mechanisms.draft_tree import ROOT, DraftTree, grow_tree
from specdec_lib.mechanisms.kv_cache import cache_length, compact, new_cache, rollback
from specdec_lib.sampling import SamplingConfig, make_generator, pick_token, probs
from specdec_lib.mechanisms import ngram_table as ngram
from specdec_lib.mechanisms.masks import (dense_tree_mask, tree_attention_mask, tree_inputs, tree_mask_mod)
from specdec_lib.mechanisms.verify import verify_tree, walk_tree

from helpers import random_lm

VOCAB = 97
TOL = 1e-9


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def models():
    # a scaled lm_head makes the next-token distribution peaked enough that argmax is far from ties
    return {kind: random_lm(kind, vocab=VOCAB, seed=7, logit_scale=20.0) for kind in ("llama", "qwen2")}


@torch.no_grad()
def prefill(model, ids: list[int]):
    cache = new_cache(model)
    if ids:
        compat.forward(model, input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
    return cache


def greedy_continuation(model, cache, first: int, steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Feed `first`, then `steps - 1` greedy tokens one at a time; return the tokens picked and the logits."""
    tokens, logits, feed = [], [], first
    for _ in range(steps):
        row = compat.forward(model, input_ids=torch.tensor([[feed]]), cache=cache, use_cache=True).logits[0, -1]
        logits.append(row)
        feed = int(row.argmax())
        tokens.append(feed)
    return tokens, logits


def random_tree(rng: random.Random, root: int, chain: list[int], n_random: int, max_depth: int = 8,
                max_width: int = 16) -> DraftTree:
    """Random parents/tokens, with `chain` (the target's greedy tokens) woven in at random insertion times
    after at least one random root child, so the accepted path is rarely the first k nodes."""
    tree = DraftTree(root)
    ops = ["r"] + rng.sample(["r"] * (n_random - 1) + ["c"] * len(chain), n_random - 1 + len(chain))
    last = ROOT
    for op in ops:
        if op == "c":
            last = tree.add_chain(last, [chain[tree.depths[last] if last != ROOT else 0]])[0]
            continue
        open_nodes = [ROOT] + [i for i in range(len(tree)) if tree.depths[i] < max_depth]
        open_nodes = [i for i in open_nodes if len(tree.children(i)) < max_width]
        parent = ROOT if rng.random() < 0.3 else rng.choice(open_nodes)
        if len(tree.children(parent)) >= max_width:
            parent = rng.choice(open_nodes)
        tree.add_chain(parent, [rng.randrange(VOCAB)])
    return tree


CASES = [(kind, seed) for kind in ("llama", "qwen2") for seed in range(6)]


@pytest.mark.parametrize("kind,seed", CASES)
def test_tree_step_matches_sequential_decoding(models, kind, seed):
    model, rng = models[kind], random.Random(seed)
    prefix = [rng.randrange(VOCAB) for _ in range(rng.choice([0, 1, 5, 13]))]
    root = rng.randrange(VOCAB)
    base = prefill(model, prefix)
    with torch.no_grad():
        greedy, _ = greedy_continuation(model, copy.deepcopy(base), root, 9)
        tree = random_tree(rng, root, greedy[: rng.randint(1, 8)], n_random=rng.randint(5, 60))
        assert tree.depth <= 8 and max(len(tree.children(i)) for i in [ROOT, *range(len(tree))]) <= 16 + 1

        cache = copy.deepcopy(base)
        accepted, tokens, next_token, logits = verify_tree(model, cache, tree, len(prefix))
        assert logits.shape == (len(tree) + 1, VOCAB)

        # (a) every row equals sequential decoding along its own path (one leaf path covers its ancestors)
        for leaf in tree.leaves():
            path = tree.path_to(leaf)
            seq = copy.deepcopy(base)
            feed = [root] + [tree.tokens[i] for i in path]
            rows = compat.forward(model, input_ids=torch.tensor([feed[:1]]), cache=seq, use_cache=True).logits[0]
            ref = [rows[-1]]
            for tok in feed[1:]:
                ref.append(compat.forward(model, input_ids=torch.tensor([[tok]]), cache=seq).logits[0, -1])
            got = logits[[0] + [i + 1 for i in path]]
            torch.testing.assert_close(got, torch.stack(ref), rtol=0, atol=TOL)

        # (b) the accepted path is the sequential greedy walk: the first child carrying each greedy token
        node, walk = ROOT, []
        for tok in greedy:
            child = next((c for c in tree.children(node) if tree.tokens[c] == tok), None)
            if child is None:
                break
            walk.append(child)
            node = child
        assert accepted == walk and tokens == greedy[: len(walk)] and next_token == greedy[len(walk)]

        # (c) compaction: the cache now holds prefix + root + accepted; decoding goes on exactly
        assert cache_length(cache) == len(prefix) + 1 + len(accepted)
        cont, cont_logits = greedy_continuation(model, cache, next_token, 3)
        full = prefix + [root] + tokens + [next_token] + cont[:2]
        fresh = model(input_ids=torch.tensor([full])).logits[0, -3:]
        torch.testing.assert_close(torch.stack(cont_logits), fresh, rtol=0, atol=TOL)

        # (d) negative control: a plain crop keeps the first k tree nodes, not the accepted path
        if accepted and accepted != list(range(len(accepted))):
            cropped = copy.deepcopy(base)
            verify_tree(model, cropped, tree, len(prefix), compact=False)
            rollback(cropped, len(prefix) + 1 + len(accepted))
            _, wrong = greedy_continuation(model, cropped, next_token, 1)
            assert (wrong[0] - fresh[0]).abs().max() > 1e-3


def test_negative_control_happens(models):
    """(d) above is only meaningful if the seeds produce accepted paths that are not the first k nodes."""
    hits = 0
    for kind, seed in CASES:
        model, rng = models[kind], random.Random(seed)
        prefix = [rng.randrange(VOCAB) for _ in range(rng.choice([0, 1, 5, 13]))]
        root = rng.randrange(VOCAB)
        with torch.no_grad():
            greedy, _ = greedy_continuation(model, prefill(model, prefix), root, 9)
            tree = random_tree(rng, root, greedy[: rng.randint(1, 8)], n_random=rng.randint(5, 60))
            accepted = verify_tree(model, prefill(model, prefix), tree, len(prefix)).accepted
        hits += bool(accepted) and accepted != list(range(len(accepted)))
    assert hits >= len(CASES) // 2


def test_eager_backend_additive_mask_and_bool_mask_is_wrong():
    model = random_lm("llama", vocab=VOCAB, seed=3, logit_scale=20.0)
    model.config._attn_implementation = "eager"
    prefix, tree = [3, 1, 4, 1, 5], DraftTree(9, [2, 6, 5, 3, 5], [-1, -1, 0, 0, 2])
    with torch.no_grad():
        logits = verify_tree(model, prefill(model, prefix), tree, len(prefix)).logits
        ref = torch.stack([model(input_ids=torch.tensor([prefix + [9] + tree.path_tokens(i)])).logits[0, -1]
                           for i in [ROOT, *range(len(tree))]])
        torch.testing.assert_close(logits, ref, rtol=0, atol=1e-5)  # eager softmax runs in float32
        ids, pos, _ = tree_inputs(tree, len(prefix))
        bool_mask = tree_attention_mask(tree, len(prefix), backend="bool")
        wrong = compat.forward(model, input_ids=ids, position_ids=pos, attention_mask=bool_mask,
                               cache=prefill(model, prefix)).logits[0]
    assert (wrong - ref).abs().max() > 1e-3  # True is added as +1: silently wrong under eager


def test_empty_tree_is_one_autoregressive_step(models):
    model = models["llama"]
    with torch.no_grad():
        cache = prefill(model, [5, 6, 7])
        accepted, tokens, next_token, logits = verify_tree(model, cache, DraftTree(8), 3)
        expected = int(model(input_ids=torch.tensor([[5, 6, 7, 8]])).logits[0, -1].argmax())
    assert (accepted, tokens, next_token, cache_length(cache)) == ([], [], expected, 4)


def test_walk_follows_every_sibling_that_repeats_a_token(models):
    """Unmerged trees repeat first tokens among siblings; the chain that continues may hang under the second
    copy. The walk must find it (a first-child-only walk would stop after one token)."""
    model = models["llama"]
    prefix = [5, 6, 7]
    with torch.no_grad():
        g, _ = greedy_continuation(model, prefill(model, prefix), 8, 4)  # g[0..2] follow the root; g[3] comes next
        wrong = (g[1] + 1) % VOCAB
        tree = DraftTree(8)
        tree.add_chain(ROOT, [g[0], wrong])  # first copy of g[0]: a dead end after one token
        deep = tree.add_chain(ROOT, [g[0], g[1], g[2]])  # second copy: the target's whole continuation
        assert tree.children(ROOT) == [0, 2]  # two siblings carry g[0]
        cache = prefill(model, prefix)
        verdict = verify_tree(model, cache, tree, len(prefix))
        after = compat.forward(model, input_ids=torch.tensor([[g[3]]]), cache=cache, use_cache=True).logits[0, -1]
        fresh = model(input_ids=torch.tensor([prefix + [8] + g])).logits[0, -1]
    assert verdict.accepted == deep and verdict.tokens == g[:3] and verdict.next_token == g[3]
    torch.testing.assert_close(after, fresh, rtol=0, atol=1e-9)  # the committed cache is that chain's


def test_verify_refuses_a_cache_holding_the_root(models):
    model = models["llama"]
    with torch.no_grad(), pytest.raises(ValueError, match="prefix_len"):
        verify_tree(model, prefill(model, [5, 6, 7]), DraftTree(7, [1], [-1]), 2)


# ---- masks and inputs ------------------------------------------------------------------------------

def test_trie_merges_prefixes_and_keeps_a_node_budget():
    chains = [(1, 2, 3), (1, 4, 5), (6, 7)]
    assert DraftTree.trie(0, chains, 2).tokens == [1, 2, 4, 6, 7]  # cut to 2 tokens each, the shared 1 merged
    assert DraftTree.trie(0, chains, 3, nodes=4).paths() == [[0, 1, 2], [0, 3]]  # (1, 4, 5) cut to fit: 1, 4
    assert DraftTree.trie(0, chains, 3, nodes=2).tokens == [1, 2]  # the likeliest chain's first tokens
    assert len(DraftTree.trie(0, chains, 3, nodes=0)) == 0
    assert len(DraftTree.trie(0, chains, 3, nodes=100)) == 7


def test_hand_drawn_mask_and_inputs():
    #        root(9)
    #       /      \
    #    n0(2)    n1(6)
    #    /   \
    # n2(5)  n3(3)
    #   |
    # n4(5)
    tree = DraftTree(9, [2, 6, 5, 3, 5], [-1, -1, 0, 0, 2])
    expected = torch.tensor([[1, 0, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0, 0],
                             [1, 0, 1, 0, 0, 0],
                             [1, 1, 0, 1, 0, 0],
                             [1, 1, 0, 0, 1, 0],
                             [1, 1, 0, 1, 0, 1]], dtype=torch.bool)
    assert torch.equal(dense_tree_mask(tree), expected)
    ids, pos, order = tree_inputs(tree, prefix_len=4)
    assert ids.tolist() == [[9, 2, 6, 5, 3, 5]] and pos.tolist() == [[4, 5, 5, 6, 6, 7]]
    assert order == [-1, 0, 1, 2, 3, 4]
    full = torch.cat([torch.ones(6, 4, dtype=torch.bool), expected], dim=1)  # prefix visible to every row
    for dtype in (torch.float32, torch.float64):
        mask = tree_attention_mask(tree, 4, dtype=dtype, backend="sdpa")
        assert mask.shape == (1, 1, 6, 10) and mask.dtype == dtype
        assert torch.equal(mask[0, 0] == 0, full)
        assert torch.all(mask[0, 0][~full] == torch.finfo(dtype).min)
        assert torch.equal(tree_attention_mask(tree, 4, dtype=dtype, backend="eager"), mask)
    assert torch.equal(tree_attention_mask(tree, 4, backend="bool")[0, 0], full)
    mod = tree_mask_mod(tree.parents, prefix_len=4)
    grid = mod(0, 0, torch.arange(6)[:, None], torch.arange(10)[None, :])
    assert torch.equal(grid, full) and bool(mod(0, 0, 5, 7)) and not bool(mod(0, 0, 2, 5))
    block = tree_attention_mask(tree, 4, backend="flex_attention")
    assert tuple(block.shape) == (1, 1, 6, 10)
    with pytest.raises(ValueError, match="unknown attention backend"):
        tree_attention_mask(tree, 4, backend="flash")


# ---- KV compaction ---------------------------------------------------------------------------------

def test_compact_selects_entries_in_order(models):
    model = models["qwen2"]
    with torch.no_grad():
        cache = prefill(model, list(range(10, 22)))  # 12 tokens
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    compact(cache, 4, [0, 3, 5])
    assert cache_length(cache) == 7
    for (keys, values), layer in zip(before, cache.layers):
        keep = torch.tensor([0, 1, 2, 3, 4, 7, 9])
        assert torch.equal(layer.keys, keys[:, :, keep]) and torch.equal(layer.values, values[:, :, keep])
    with pytest.raises(ValueError, match="do not fit"):
        compact(cache, 4, [3])
    with torch.inference_mode():  # inference tensors, compacted outside inference_mode: the copy path
        cache = prefill(model, list(range(10, 22)))
    compact(cache, 4, [1, 2])
    assert cache_length(cache) == 6 and torch.equal(cache.layers[0].keys[:, :, 4:], before[0][0][:, :, 5:7])


# ---- sampling walk -----------------------------------------------------------------------------------

def test_sampled_first_token_follows_p():
    """Chi-square goodness of fit of the first accepted token against the warped p at the root.

    Every vocabulary token is a child of the root, so the first token is always accepted and is a draw
    from p. 2000 draws with seeds 0..1999 (the walk over one verified forward's logits; the first 40 seeds
    also run the whole verify_tree and must agree draw for draw). We fail when the p-value < 1e-3: a 0.1%
    false-failure rate for a fresh set of seeds; with these fixed seeds the outcome is deterministic."""
    vocab, n = 11, 2000
    model = random_lm("llama", vocab=vocab, seed=5, logit_scale=20.0)
    cfg = SamplingConfig(temperature=0.8, top_k=8)
    tree = DraftTree(3, list(range(vocab)), [-1] * vocab)
    counts = torch.zeros(vocab, dtype=torch.float64)
    with torch.no_grad():
        cache = prefill(model, [1, 2, 4])
        logits = verify_tree(model, cache, tree, 3, compact=False).logits
        for seed in range(n):
            accepted, tokens, next_token = walk_tree(tree, logits, cfg, make_generator(seed, "cpu"))
            counts[tokens[0]] += 1
            if seed < 40:
                rollback(cache, 3)
                verdict = verify_tree(model, cache, tree, 3, cfg, make_generator(seed, "cpu"), compact=False)
                assert (verdict.accepted, verdict.tokens, verdict.next_token) == (accepted, tokens, next_token)
        p = probs(model(input_ids=torch.tensor([[1, 2, 4, 3]])).logits[0, -1], cfg).double()
    assert counts[p == 0].sum() == 0  # top-k removed tokens are never drawn
    assert p.max() < 0.5 and (p > 0).sum() == 8 and n * p[p > 0].min() >= 5  # spread, and chi-square valid
    expected = n * p[p > 0]
    stat = ((counts[p > 0] - expected) ** 2 / expected).sum()
    df = torch.tensor(float((p > 0).sum() - 1), dtype=torch.float64)
    p_value = float(torch.special.gammaincc(df / 2, stat / 2))  # chi-square survival function
    assert p_value > 1e-3, (counts, expected, p_value)


def test_sampled_tree_step_reproduces_autoregressive_sampling():
    """Lossless, draw for draw: with the same seed, one tree step emits the same tokens autoregressive
    sampling does (one pick_token per emitted token, from the same p). The tree holds every 2-token
    sequence, so two tokens are accepted and the third is the next token."""
    vocab = 11
    model = random_lm("qwen2", vocab=vocab, seed=6, logit_scale=40.0)
    cfg = SamplingConfig(temperature=1.0, top_p=0.95)
    tree = DraftTree(3)
    for a in range(vocab):
        tree.add_chain(ROOT, [a])
    for a in range(vocab):
        for b in range(vocab):
            tree.add_chain(a, [b])
    prefix = [1, 2, 4]
    with torch.no_grad():
        for seed in range(20):
            verdict = verify_tree(model, prefill(model, prefix), tree, 3, cfg, make_generator(seed, "cpu"))
            gen, cache, feed, ar = make_generator(seed, "cpu"), prefill(model, prefix), 3, []
            for _ in range(3):
                logits = compat.forward(model, input_ids=torch.tensor([[feed]]), cache=cache).logits[0, -1]
                feed = pick_token(logits, cfg, gen)
                ar.append(feed)
            assert verdict.tokens + [verdict.next_token] == ar


# ---- DraftTree and grow_tree ------------------------------------------------------------------------

class DictTable:
    """The table interface grow_tree needs: .leader_len and .query(leader) -> followers, MRU first."""

    def __init__(self, leader_len: int, entries: dict):
        self.leader_len, self.entries = leader_len, entries

    def query(self, leader):
        return list(self.entries.get(tuple(leader), []))


def test_draft_tree_helpers():
    tree = DraftTree(9, [2, 6, 5, 3, 5], [-1, -1, 0, 0, 2])
    assert len(tree) == 5 and tree.depths == [1, 1, 2, 2, 3] and tree.depth == 3
    assert tree.children() == [0, 1] and tree.children(0) == [2, 3] and tree.children(4) == []
    assert tree.path_to(4) == [0, 2, 4] and tree.path_to(ROOT) == [] and tree.path_tokens(4) == [2, 5, 5]
    assert tree.leaves() == [1, 3, 4] and tree.paths() == [[1], [0, 3], [0, 2, 4]]
    assert tree.add_chain(0, [5, 5, 7], merge=True) == [2, 4, 5] and len(tree) == 6
    assert tree.add_chain(0, [5, 5], merge=False) == [6, 7] and tree.depths[-2:] == [2, 3]
    assert DraftTree.chain(1, [4, 4]).parents == [-1, 0]
    with pytest.raises(ValueError, match="earlier node"):
        DraftTree(1, [4, 4], [1, -1])
    with pytest.raises(ValueError):
        DraftTree(1, [4], [-1, 0])


def test_grow_tree_breadth_first_and_leader_along_branch():
    table = DictTable(1, {(0,): [(1, 2, 3), (4, 5, 6)], (3,): [(7, 8, 9)], (6,): [(10, 11, 12)],
                          (9,): [(13, 14, 15)], (12,): []})
    tree = grow_tree([5, 0], [table], tdl=96, crt=16)
    assert tree.root == 0
    # level 0: both root followers; level 1: under 3 then under 6; level 2: under 9 only; then no leaf grows
    assert tree.tokens == list(range(1, 16))
    assert tree.parents == [-1, 0, 1, -1, 3, 4, 2, 6, 7, 5, 9, 10, 8, 12, 13]
    # LL = 2: the leader straddles the context and the path
    table2 = DictTable(2, {(5, 0): [(1,)], (0, 1): [(2,)], (1, 2): [(3,)]})
    assert grow_tree([5, 0], [table2]).tokens == [1, 2, 3]
    assert len(grow_tree([0], [table2])) == 0  # context shorter than LL: no query


def test_grow_tree_budget_and_crt():
    loop = DictTable(1, {(0,): [(0, 0, 0)] * 5})  # every leaf grows forever: only the budget stops it
    tree = grow_tree([0], [loop], tdl=10, crt=3, refed=1)
    # B = 10 - 1 = 9 draft nodes; level 0 may use 9 - 3 = 6 (two chains); level 1 adds one chain
    assert len(tree) == 9 and [tree.depths[i] for i in range(9)] == [1, 2, 3, 1, 2, 3, 4, 5, 6]
    assert len(grow_tree([0], [loop], tdl=10, crt=0)) == 9 and grow_tree([0], [loop], tdl=10, crt=0).depth == 3
    rng = random.Random(0)
    for _ in range(200):
        fl = rng.randint(1, 4)
        entries = {(a,): [tuple(rng.randrange(6) for _ in range(fl)) for _ in range(rng.randint(0, 5))]
                   for a in range(6)}
        tdl, crt, refed = rng.randint(0, 60), rng.randint(0, 20), rng.randint(0, 3)
        tree = grow_tree([rng.randrange(6)], [DictTable(1, entries)], tdl, crt, refed, merge=rng.random() < 0.5)
        assert len(tree) + refed <= max(tdl, refed)
        assert sum(d <= fl for d in tree.depths) <= max(0, tdl - refed - crt)  # level 0 respects CRT
    with pytest.raises(ValueError, match="tdl"):
        grow_tree([1], [loop], tdl=-1)
    with pytest.raises(ValueError, match="empty"):
        grow_tree([], [loop])


def test_grow_tree_tables_in_order_and_merge():
    dynamic = DictTable(1, {(0,): [(1, 2, 3), (1, 2, 4)]})
    frozen = DictTable(1, {(0,): [(1, 2, 3), (5, 6, 7)]})
    plain = grow_tree([0], [dynamic, frozen])
    assert plain.tokens == [1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 6, 7]  # dynamic first; duplicates kept
    merged = grow_tree([0], [dynamic, frozen], merge=True)
    assert merged.tokens == [1, 2, 3, 4, 5, 6, 7] and merged.parents == [-1, 0, 1, 1, -1, 4, 5]
    for node in [ROOT, *range(len(merged))]:  # a trie: siblings never repeat a token
        kids = [merged.tokens[c] for c in merged.children(node)]
        assert len(kids) == len(set(kids))
    # merging buys room: the same budget holds more distinct drafts
    assert len(grow_tree([0], [dynamic, frozen], tdl=9, crt=0, merge=True)) == 7
    assert len(grow_tree([0], [dynamic, frozen], tdl=9, crt=0)) == 6


def test_grow_tree_with_ngram_tables():
    text = [1, 2, 3, 4, 1, 2, 5, 6, 1, 2, 3, 7]
    table = ngram.NgramTable(1, 2, 100, 8)
    table.update(text)
    tree = grow_tree(text, [table], tdl=96, crt=16)
    assert tree.root == 7 and len(tree) == 0  # 7 was never a leader
    tree = grow_tree(text + [1], [table], tdl=96, crt=16)
    assert tree.tokens[:4] == [2, 3, 2, 5]  # followers of (1,), most recently used first
    frozen = ngram.FrozenNgramTable.from_table(table)
    assert grow_tree(text + [1], [frozen], tdl=96, crt=16) == grow_tree(text + [1], [table], tdl=96, crt=16)


def test_visible_mask_mod_reads_index_tensors_on_another_device():
    """Seen on an H100: CARD's drafter evaluates its mask with CUDA index tensors while the block of `visible`
    lives on the CPU; the numpy fast path must not take them (`q_idx.numpy()` fails off the CPU). The meta device
    stands in for CUDA here: the same mask_mod answers with a tensor on the index tensors' device."""
    from specdec_lib.mechanisms import masks

    sees = torch.tensor([[True, False], [True, True]])
    mod = masks.visible(sees, first_row=1, first_key=3)
    q_cpu, kv_cpu = torch.arange(4)[:, None], torch.arange(6)[None, :]
    on_cpu = mod(0, 0, q_cpu, kv_cpu)
    assert on_cpu[2, 3:5].tolist() == [True, True] and on_cpu[1, 3:5].tolist() == [True, False]
    on_meta = mod(0, 0, q_cpu.to("meta"), kv_cpu.to("meta"))
    assert on_meta.device.type == "meta" and tuple(on_meta.shape) == (4, 6)
