"""Lookahead decoding, what is particular to it: the window's mask against the reference's rule, the n-gram pool
(columns of the window, G per key, newest first), the warm-up and the shift, guesses accepted on repetitive text and
drafted from generated text, seeded sampling equal to autoregressive sampling, and bad settings. Greedy parity,
EOS, max_new_tokens and the sampling chi-square are the contract test's."""
from __future__ import annotations

import pytest
import torch

from specdec_lib import generate, loop
from specdec_lib.mechanisms import verify
from specdec_lib.mechanisms.draft_tree import DraftTree
from specdec_lib.methods.lookahead import Lookahead, NgramPool, window_sees

from helpers import SHIPPED_PROMPTS, autoregressive_samples, random_lm

pytestmark = pytest.mark.usefixtures("one_thread")


def reference_mask(width: int, levels: int) -> torch.Tensor:
    """lade/models/llama.py j_make_causal_mask_multilevel without guesses, as a bool mask over the forward's own
    rows [root, level 0 (width - 1 tokens), level 1 (width), ...]: block 0 = root + level 0 (`tiny_mask_size`
    rows), lower-triangular over block 0 for every block, and the diagonal of blocks 1..ll for block ll."""
    rows = levels * width
    mask = torch.zeros(rows, rows, dtype=torch.bool)
    hm = torch.tril(torch.ones(width, width, dtype=torch.bool))  # row c sees block-0 columns 0..c
    for ll in range(levels):
        mask[width * ll:width * (ll + 1), :width] |= hm
        for row in range(1, ll + 1):
            mask[width * ll:width * (ll + 1), width * row:width * (row + 1)] |= torch.eye(width, dtype=torch.bool)
    return mask


def test_window_mask_is_the_reference_rule():
    """Our window of W columns is the reference's of width W + 1 without the root's column in levels >= 1: the
    forward's mask over root + guesses + window rows equals the reference's mask there, guesses apart."""
    W, N, cached, root = 3, 4, 5, 7
    levels = [[10, 11, 12], [20, 21, 22], [30, 31, 32]]  # N - 1 levels of W columns
    side = loop.SideRows([t for lv in levels for t in lv], [1 + i + j for i in range(N - 1) for j in range(W)],
                         window_sees(N - 1, W))
    tree = DraftTree(root, [40, 41, 42, 43], [-1, 0, -1, 2])  # two guesses of two tokens
    inputs, keep = verify.build_forward(verify.Proposal(tree, side=side), [root], cached, backend="bool")
    mask = inputs["attention_mask"][0, 0]  # (1 + n + S, cached + 1 + n + S)
    n, S = len(tree), len(side)
    assert keep == 1 + n + S and mask[:, :cached].all()  # everyone sees the cached text
    own = mask[:, cached:]
    # the reference's window (root = block 0 column 0), its levels >= 1 without column 0
    ref_keep = [0] + list(range(1, W + 1)) + [ll * (W + 1) + c for ll in range(1, N - 1) for c in range(1, W + 1)]
    ref = reference_mask(W + 1, N - 1)[ref_keep][:, ref_keep]
    window_rows = [0] + list(range(1 + n, 1 + n + S))
    assert torch.equal(own[window_rows][:, window_rows], ref)
    # positions: ours at root + 1 + i + j, the reference's at root + ll + c for the same cells
    pos = inputs["position_ids"][0].tolist()
    ref_pos = [ll + c for ll in range(N - 1) for c in range(W + 1)]
    assert [pos[r] - cached for r in window_rows] == [ref_pos[k] for k in ref_keep]
    # guesses see the prefix, their ancestors and themselves, never the window, and the window never sees them
    assert torch.equal(own[:1 + n, :1 + n], verify.masks.ancestor_matrix(tree.parents))
    assert not own[:1 + n, 1 + n:].any() and not own[1 + n:, 1:1 + n].any()
    # the rule in words: (i, j) sees level 0 at columns <= j and its own column in levels <= i
    sees = window_sees(N - 1, W)
    for r in range(S):
        for c in range(S):
            (i, j), (i2, j2) = divmod(r, W), divmod(c, W)
            assert bool(sees[r, c]) == ((i2 == 0 and j2 <= j) or (j2 == j and i2 <= i))


def test_pool_is_capped_newest_first():
    pool = NgramPool(cap=2)
    pool.add(1, (2, 3)), pool.add(1, (4, 5)), pool.add(1, (2, 3))  # a repeat moves to the front
    assert pool.get(1) == [(2, 3), (4, 5)] and pool.size == 2
    pool.add(1, (6, 7))  # the oldest goes
    assert pool.get(1) == [(6, 7), (2, 3)] and pool.size == 2
    pool.add_text([9, 8, 7, 6], 3)
    assert pool.get(9) == [(8, 7)] and pool.get(8) == [(7, 6)] and pool.size == 4
    empty = NgramPool(cap=0)
    empty.add(1, (2,))
    assert empty.get(1) == [] and empty.size == 0


class _Verdict:
    def __init__(self, preds, vocab=100, emitted=(1,)):
        self.side_logits = torch.zeros(len(preds), vocab)  # (W, V): the last level's rows (logits_rows)
        self.side_logits[torch.arange(len(preds)), torch.tensor(preds)] = 1.0
        self.emitted = list(emitted)
        # a step with no guesses (nothing for the chooser) whose window ran (its rows stand in for the W x levels)
        self.proposal = loop.Proposal(DraftTree(0), side=loop.SideRows([0], [1], torch.ones(1, 1, dtype=torch.bool)))


def _started(window, ngram, guesses, prompt=(1, 2, 3, 4)):
    proposer = Lookahead(window=window, ngram=ngram, guesses=guesses, from_text=False)
    state = loop.LoopState(request=None, committed=list(prompt))
    proposer.start(state)
    return proposer, state


def test_warm_up_then_the_pool_fills_from_the_columns():
    W, N = 3, 4
    proposer, state = _started(W, N, guesses=2)
    assert [len(lv) for lv in proposer.levels] == [W + N - 2]  # one level, wider by the warm-up's drops
    assert set(proposer.levels[0]) <= {1, 2, 3, 4}  # drawn from the prompt
    for step, preds in enumerate(([50, 51, 52, 53, 54], [60, 61, 62, 63])):  # warm-up: levels grow, columns shrink
        before = [lv[:] for lv in proposer.levels]
        proposer.observe(state, _Verdict(preds))
        assert proposer.levels == [lv[1:] for lv in before] + [preds[1:]]
        assert proposer.pool.size == 0
    assert [len(lv) for lv in proposer.levels] == [W] * (N - 1)
    proposer.levels = [[7, 7, 8], [20, 21, 22], [30, 31, 32]]
    proposer.observe(state, _Verdict([90, 91, 92]))
    # column j = (level 0..N-2 of column j, prediction j), keyed by its first token; later columns are newer
    assert proposer.pool.get(7) == [(21, 31, 91), (20, 30, 90)] and proposer.pool.get(8) == [(22, 32, 92)]
    assert proposer.levels == [[20, 21, 22], [30, 31, 32], [90, 91, 92]]  # shifted: level 0 dropped
    proposer.levels = [[7, 8, 9], [23, 24, 25], [33, 34, 35]]
    proposer.observe(state, _Verdict([93, 94, 95]))
    assert proposer.pool.get(7) == [(23, 33, 93), (21, 31, 91)]  # capped at G = 2, newest first
    # the guesses under the root: pool n-grams as a tree, cut to the budget
    state.committed.append(7)
    proposal = proposer.propose(state, max_depth=2)
    assert len(proposal.tree) == 4 and proposal.tree.depth == 2  # two guesses of N - 1 = 3, cut to 2
    assert {tuple(proposal.tree.path_tokens(leaf)) for leaf in proposal.tree.leaves()} == {(23, 33), (21, 31)}
    assert proposal.info == dict(guesses=2, levels=N - 1, pool=proposer.pool.size, draft_size=2)
    assert proposal.side.depths == [1 + i + j for i in range(N - 1) for j in range(W)]
    assert proposal.side.logits_rows == list(range((N - 2) * W, (N - 1) * W))  # the last level's rows


def test_accepts_guesses_on_repetitive_text_shipped_pair(tiny_pair):
    text = "def add(a, b):\n    return a + b\n\n" * 4 + "def sub(a, b):\n"
    ids = tiny_pair.encode(text)
    reference = generate("hf", tiny_pair.target, ids, 48).new_tokens
    result = generate("lookahead", tiny_pair.target, ids, 48, window=7, guesses=7, debug=True)
    assert result.new_tokens == reference
    assert result.mat > 1.2 and result.stats["accepted"] > 0
    steps = result.stats["steps"]
    assert {"guesses", "levels", "pool"} <= set(steps[0]) and any(s["guesses"] for s in steps)
    assert result.stats["config"] == dict(window=7, ngram=5, guesses=7, from_text=True, seed=0)


def test_drafts_from_the_window_on_generated_text():
    """A prompt of distinct tokens, then a greedy loop the prompt never shows: with the text's n-grams left out of
    the pool, everything accepted came from the Jacobi window's columns; without any pool, nothing is."""
    target = random_lm("llama", vocab=97, layers=2, seed=11, logit_scale=20.0)
    prompt = torch.randperm(97, generator=torch.Generator().manual_seed(5))[:16][None]
    out = generate("hf", target, prompt, 60).new_tokens
    window_only = generate("lookahead", target, prompt, 60, window=7, guesses=7, from_text=False, debug=True)
    assert window_only.new_tokens == out
    assert window_only.stats["window_ngrams"] > 0 and window_only.mat > 2.0
    small = generate("lookahead", target, prompt, 60, window=4, ngram=3, guesses=4, from_text=False)
    assert small.new_tokens == out and small.mat > 1.5
    no_guesses = generate("lookahead", target, prompt, 60, guesses=0)
    assert no_guesses.new_tokens == out and no_guesses.mat == 1.0


@pytest.mark.parametrize("ngram", [2, 5])
def test_seeded_sampling_equals_autoregressive(tiny_pair, ngram):
    """Guesses are a deterministic function of the history (the window reads argmax, never the generator), so
    one seeded draw per emitted token gives exactly autoregressive sampling's tokens."""
    ids = tiny_pair.encode(SHIPPED_PROMPTS[1])
    for kwargs, tokens in autoregressive_samples(tiny_pair.target, ids, 24, seeds=range(2)):
        assert generate("lookahead", tiny_pair.target, ids, 24, ngram=ngram, **kwargs).new_tokens == tokens


@pytest.mark.parametrize("bad, error", [(dict(window=0), ValueError), (dict(ngram=1), ValueError),
                                        (dict(guesses=-1), ValueError), (dict(window=True), TypeError),
                                        (dict(ngram=2.0), TypeError), (dict(from_text=1), TypeError)])
def test_bad_settings_raise(bad, error):
    with pytest.raises(error):
        Lookahead(**bad)
    target = random_lm("llama", vocab=11, layers=1, hidden=16)
    with pytest.raises(error):
        generate("lookahead", target, torch.tensor([[1, 2, 3]]), 4, **bad)
