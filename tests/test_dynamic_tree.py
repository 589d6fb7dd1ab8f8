"""EAGLE-2's dynamic tree (mechanisms/dynamic_tree.py), the part both of its drafters share: what is expanded,
what each expanded row sees, and what is kept. The drafters themselves are tested on real models in
test_eagle.py and test_draft_model.py (greedy parity, sampling)."""
from __future__ import annotations

import math

import torch

from specdec_lib.mechanisms import dynamic_tree
from specdec_lib.mechanisms.draft_tree import ROOT


def test_the_tree_keeps_the_best_nodes_and_their_parents():
    # (cumulative log-prob, depth, token, parent)
    nodes = [(-0.1, 1, 5, ROOT), (-2.0, 1, 6, ROOT), (-0.3, 2, 7, 0), (-0.3, 2, 8, 0), (-0.35, 3, 9, 2)]
    tree = dynamic_tree.to_tree(11, nodes, dynamic_tree.kept(nodes, 3))
    assert tree.tokens == [5, 7, 8] and tree.parents == [ROOT, 0, 0]
    tree = dynamic_tree.to_tree(11, nodes, dynamic_tree.kept(nodes, 4))
    assert tree.tokens == [5, 7, 8, 9] and tree.parents == [ROOT, 0, 0, 1]
    # a tie ranks a child level with its parent: the parent comes along
    tied = [(-0.5, 1, 5, ROOT), (-0.5, 2, 6, 0)]
    assert dynamic_tree.to_tree(1, tied, dynamic_tree.kept(tied, 1)).tokens in ([5], [5, 6])


def _drafter(p_best: float, vocab: int = 10):
    """A forward whose every row puts p_best on token (parent's token + 1) % vocab and spreads the rest evenly:
    (log-probs, tokens) of its top-k, and a log of what it was asked (expanded nodes, their masks, depth)."""
    calls = []

    def forward(expand, nodes, sees, d):
        calls.append(([nodes[i][2] for i in expand], sees.clone(), d))
        rows = []
        for i in expand:
            probs = torch.full((vocab,), (1 - p_best) / (vocab - 1))
            probs[(nodes[i][2] + 1) % vocab] = p_best
            rows.append(probs.log())
        return dynamic_tree.top_children(torch.stack(rows), 2)
    return forward, calls


def test_grow_expands_the_best_and_each_row_sees_its_ancestors():
    forward, calls = _drafter(0.9)
    first = ([math.log(0.9), math.log(0.1 / 9)], [3, 0])  # the root's children: 3 (likely), 0
    nodes = dynamic_tree.grow(first, forward, depth=3, topk=2, keep=16)
    # depth 1 expands both children (2 rows); depth 2 the two best of their four children
    assert [c[2] for c in calls] == [1, 2] and [len(c[0]) for c in calls] == [2, 2]
    assert calls[0][0] == [3, 0]
    assert calls[1][0] == [4, 1]  # the likeliest child of each (3 -> 4, 0 -> 1)
    # tree rows so far: [3, 0] then [4, 1]; the row of 4 sees 3's row and its own, 1 sees 0's and its own
    assert calls[1][1].tolist() == [[True, False, True, False], [False, True, False, True]]
    # every node's score is its parent's plus its own log-prob, its depth its parent's + 1
    for score, depth, _, parent, q in nodes:
        base = 0.0 if parent == ROOT else nodes[parent][0]
        assert math.isclose(score, base + math.log(q)) and depth == (1 if parent == ROOT else nodes[parent][1] + 1)
    assert max(n[1] for n in nodes) == 3


def test_grow_stops_where_nothing_could_be_kept():
    """With keep=2 nothing below the second-best score is expanded: the sure chain 3 -> 4 -> 5 is drafted, the
    unlikely sibling 0 never is, and a depth whose frontier cannot enter the best two is not drafted at all."""
    forward, calls = _drafter(0.99)
    first = ([math.log(0.99), math.log(0.01 / 9)], [3, 0])
    nodes = dynamic_tree.grow(first, forward, depth=6, topk=2, keep=2)
    assert all(0 not in c[0] for c in calls)
    order = dynamic_tree.kept(nodes, 2)
    assert [nodes[i][2] for i in order] == [3, 4]
    assert len(calls) <= 2
