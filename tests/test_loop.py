"""The one decoding loop's own pieces: mask_mod composition, the forward layout, side rows (the extension point
for Lookahead/FAFO), the commit, and a proposer defined outside the library.

Tolerance: random float64 models under sdpa compute attention in float64, so rows that see the same keys at the
same positions agree to ~1e-15; 1e-9 is used."""
from __future__ import annotations

import pytest
import torch

from specdec_lib import METHODS, Proposal, Proposer, SideRows, generate, register_proposer
from specdec_lib.mechanisms import masks
from specdec_lib.mechanisms.draft_tree import DraftTree
from specdec_lib.mechanisms.verify import build_forward

from helpers import random_lm, repeating_prompt

pytestmark = pytest.mark.usefixtures("one_thread")


def test_mask_pieces_compose_into_the_first_step_layout():
    """Prompt rows causal, then root + tree: the composed mask_mod equals the mask drawn by hand."""
    tree = DraftTree(9, [2, 6, 5], [-1, -1, 0])  # root -> n0 -> n2, root -> n1
    inputs, keep = build_forward(Proposal(tree), [4, 7, 9], cached=0, backend="bool")
    assert inputs["input_ids"].tolist() == [[4, 7, 9, 2, 6, 5]] and keep == 4
    assert inputs["position_ids"].tolist() == [[0, 1, 2, 3, 3, 4]]  # the root at 2, nodes at 2 + depth
    expected = torch.tensor([[1, 0, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0, 0],
                             [1, 1, 1, 0, 0, 0],  # root
                             [1, 1, 1, 1, 0, 0],  # n0
                             [1, 1, 1, 0, 1, 0],  # n1
                             [1, 1, 1, 1, 0, 1]], dtype=torch.bool)  # n2
    assert torch.equal(inputs["attention_mask"][0, 0], expected)
    plain, _ = build_forward(Proposal(DraftTree(9)), [4, 7, 9], cached=0)
    assert "attention_mask" not in plain and "position_ids" not in plain  # a plain causal step: transformers'
    # own positions (cached..) and causal mask are exactly these
    # a chain is causal rows: no mask of ours, on the first step (the prompt's prefill, the chain included) too
    chain, keep = build_forward(Proposal(DraftTree.chain(9, [2, 6])), [4, 7, 9], cached=0, backend="bool")
    assert chain.keys() == {"input_ids"} and chain["input_ids"].tolist() == [[4, 7, 9, 2, 6]] and keep == 3
    later, _ = build_forward(Proposal(tree), [9], cached=5, backend="sdpa", dtype=torch.float64)
    mask = later["attention_mask"][0, 0]  # (4, 9): every row sees the 5 cached keys
    assert mask.shape == (4, 9) and (mask[:, :5] == 0).all()
    assert torch.equal(mask[:, 5:] == 0, masks.ancestor_matrix(tree.parents))


def test_full_prefix_claims_hold():
    """dense() skips the columns a piece says every row sees: those claims must be true of the mask_mod itself."""
    tree = DraftTree(9, [2, 6, 5, 3], [-1, -1, 0, 2])
    side = masks.visible(torch.tril(torch.ones(3, 3, dtype=torch.bool)), 8, 11)
    mods = [masks.causal(3), masks.prefix(4), masks.tree(tree.parents, 2, 3),
            masks.by_rows([(0, masks.causal(3)), (2, masks.tree(tree.parents, 2, 3)), (7, side)]),
            masks.and_masks(masks.causal(3), masks.prefix(5)), masks.or_masks(masks.prefix(2), side)]
    q_idx, kv_idx = torch.arange(10)[:, None], torch.arange(14)[None, :]
    for mod in mods:
        brute = torch.tensor([[bool(mod(0, 0, torch.tensor(q), torch.tensor(k))) for k in range(14)]
                              for q in range(10)])  # one (row, key) at a time: the general (vmap-like) path
        assert torch.equal(masks.dense(mod, 10, 14), brute)
        assert torch.equal(torch.broadcast_to(mod(0, 0, q_idx, kv_idx), (10, 14)), brute)  # the grid fast path
        assert brute[:, :masks.full_prefix(mod)].all()
    assert [masks.full_prefix(m) for m in mods] == [4, 4, 5, 0, 4, 2]
    rooted = masks.tree(tree.parents, 0, 3)  # root at row 0: renders from its stated `rest` (no grid evaluated)
    brute = torch.tensor([[bool(rooted(0, 0, torch.tensor(q), torch.tensor(k))) for k in range(8)] for q in range(5)])
    assert torch.equal(masks.dense(rooted, 5, 8), brute) and masks.full_prefix(rooted) == 3


def test_by_rows_and_or_masks_are_pure_functions():
    mod = masks.by_rows([(0, masks.causal(2)), (3, masks.prefix(1))])
    grid = masks.dense(mod, 5, 7)
    assert torch.equal(grid[:3], masks.dense(masks.causal(2), 3, 7))
    assert torch.equal(grid[3:], torch.tensor([[1, 0, 0, 0, 0, 0, 0]] * 2, dtype=torch.bool))
    both = masks.and_masks(masks.causal(0), masks.prefix(2))
    assert bool(both(0, 0, 3, 1)) and not bool(both(0, 0, 3, 2)) and not bool(both(0, 0, 0, 1))
    either = masks.or_masks(masks.prefix(1), masks.visible(torch.eye(2, dtype=torch.bool), 0, 3))
    assert torch.equal(masks.dense(either, 2, 5), torch.tensor([[1, 0, 0, 1, 0], [1, 0, 0, 0, 1]], dtype=torch.bool))


class ChainWithSideCopy(Proposer):
    """Proposes a chain, and the same chain again as causal side rows: their logits must equal the chain's."""

    def __init__(self, k: int = 3):
        self.k, self.checked = k, 0

    def propose(self, state, max_depth):
        committed = state.committed
        drafts = [committed[-4 + i] for i in range(min(self.k, max_depth, 3))]  # any tokens will do
        tree = DraftTree.chain(committed[-1], drafts)
        n = len(drafts)
        side = SideRows(list(drafts), [d + 1 for d in range(n)], torch.tril(torch.ones(n, n, dtype=torch.bool)))
        return Proposal(tree, side=side if n else None)

    def observe(self, state, verdict):
        if verdict.side_logits is None:
            return
        rows = verdict.logits
        tree_rows = torch.stack([rows[i + 1] for i in range(len(verdict.proposal.tree))])  # the nodes' rows
        torch.testing.assert_close(verdict.side_logits, tree_rows, atol=1e-9, rtol=0)
        self.checked += 1


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_side_rows_ride_the_forward_and_change_nothing(kind):
    target = random_lm(kind, seed=4, logit_scale=20.0)
    ids = repeating_prompt(24, 4)
    proposers = []

    @register_proposer("_side_copy")
    class Recorded(ChainWithSideCopy):
        def __init__(self, k: int = 3):
            super().__init__(k)
            proposers.append(self)

    try:
        for lazy in (True, False):
            result = generate("_side_copy", target, ids, 30, debug=True, lazy_head=lazy)
            assert result.new_tokens == generate("hf", target, ids, 30).new_tokens
            drafting = sum(s["tree_size"] > 0 for s in result.stats["steps"])  # the last step has no room to draft
            assert proposers[-1].checked == drafting > 20  # every drafting step compared its side rows
    finally:
        del METHODS["_side_copy"]


def test_side_rows_prefix_mod_hides_committed_keys():
    """A side row whose prefix_mod hides every committed key sees only itself: the root token with no context."""
    target = random_lm("llama", seed=4, logit_scale=20.0)
    seen = {}

    class RootOnly(Proposer):
        def propose(self, state, max_depth):
            side = SideRows([state.committed[-1]], [0], torch.ones(1, 1, dtype=torch.bool),
                            prefix_mod=lambda kv_idx: kv_idx < 0)  # no committed key
            return Proposal(DraftTree(state.committed[-1]), side=side)

        def observe(self, state, verdict):
            seen.setdefault("logits", verdict.side_logits[0])
            seen.setdefault("root", verdict.proposal.tree.root)

    register_proposer("_root_only")(RootOnly)
    try:
        generate("_root_only", target, [5, 6, 7, 8], 1)
    finally:
        del METHODS["_root_only"]
    # the same token alone at the root's position
    alone = target(input_ids=torch.tensor([[seen["root"]]]), position_ids=torch.tensor([[3]])).logits[0, -1]
    torch.testing.assert_close(seen["logits"], alone, atol=1e-9, rtol=0)


def test_side_rows_validate_their_shape():
    with pytest.raises(ValueError, match="square"):
        SideRows([1, 2], [1, 2], torch.ones(1, 1, dtype=torch.bool))


def test_q_needs_a_chain():
    target = random_lm("llama", seed=4)

    class TwoBranchesWithQ(Proposer):
        def propose(self, state, max_depth):
            tree = DraftTree(state.committed[-1], [1, 2], [-1, -1])
            return Proposal(tree, q=torch.full((2, 97), 1 / 97))

    register_proposer("_two_q")(TwoBranchesWithQ)
    try:
        with pytest.raises(ValueError, match="q-based verification takes a chain"):
            generate("_two_q", target, [5, 6, 7], 4, temperature=1.0, seed=0)
    finally:
        del METHODS["_two_q"]


def test_a_masked_first_step_feeds_a_short_prompt_with_its_rows(tiny_pair64, tiny_pair, monkeypatch):
    """A first step with a tree or side rows feeds a prompt of up to PREFILL_ROWS tokens in its own masked forward
    (one forward), a longer one in a causal prefill first; a chain's first step is one causal forward whatever
    the prompt: the same tokens every way, hf's."""
    from specdec_lib.mechanisms import verify

    target = tiny_pair64[0]
    ids = tiny_pair.encode("def parse(line):\n    key, value = line.split('=')\n    return key\n" * 2)  # lookup drafts
    reference = generate("hf", target, ids, 24).new_tokens
    calls = []
    prefill = verify.prefill
    monkeypatch.setattr(verify, "prefill", lambda *a, **k: calls.append(len(a[2])) or prefill(*a, **k))
    # a fixed window: its rows run from the first step (window="auto" may skip its warm-up where rows are dear)
    for method, settings in (("lookahead", dict(window=7)), ("prompt_lookup", dict(num_tokens=4))):
        for limit in (verify.PREFILL_ROWS, 4):
            monkeypatch.setattr(verify, "PREFILL_ROWS", limit)
            calls.clear()
            result = generate(method, target, ids, 24, debug=True, **settings)
            assert result.new_tokens == reference, (method, limit)
            # lookahead's side rows: prompt[:-1] apart only past the limit; a chain never (causal rows)
            fed_apart = [ids.shape[1] - 1] if method == "lookahead" and limit < ids.shape[1] else []
            assert calls == fed_apart, (method, limit, calls)
            assert method != "prompt_lookup" or result.stats["steps"][0]["tree_size"] > 0  # it drafted on step 1
