"""EAGLE-2's dynamic draft tree, whoever drafts it: expand the likeliest nodes depth by depth, keep the best.

Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees", section 4 (expansion
and reranking). Two proposers grow it: EAGLE's feature head (methods/eagle.py) and a draft model (methods/
draft_model.py with topk > 1). Each hands `grow` the root's children (from the forward that caught the drafter up
with the committed text) and one forward per further depth; the tree logic is here, once.

A node is a tuple (score, depth, token, parent, q): `parent` is an index into the node list (ROOT for the
root's children), `q` the drafter's probability of `token` after its parent, `score` the cumulative log-prob
along the path (an estimate of the log of the chance the target accepts the path) or, with a `judge` (a
ConfidenceBudget: the "auto" budget, budget/confidence.py), the log of the node's calibrated value.

- expand: at depth d, the `topk` frontier nodes with the best score get a drafter row each (one forward for all
  of them: they see the committed text, their ancestors' rows and themselves, `sees`), and each row gives
  `topk` children. Without a judge, a node below the `keep`-th best score so far is not expanded (its children
  could not be kept: a child never scores above its parent), so an unsure drafter stops early; with one, the
  judge says how many of the best are worth a forward.
- rerank (`kept`, `to_tree`): of every node drafted, the `budget` best by score, closed under parents (ties can
  rank a child above its parent), ordered by depth: the DraftTree the loop verifies in ONE target forward.
  `judged` does it for the "auto" budget: the judge picks the size from the nodes' values.

Simplifications: the frontier at each depth is the last depth's children only (EAGLE-2's); ties are broken by
depth, then drafting order.
"""
from __future__ import annotations

import math
from typing import Callable, Protocol, Sequence

import torch

from .draft_tree import ROOT, DraftTree

Node = tuple  # (score, depth, token, parent, q)
# forward(expand, nodes, sees, d): one drafter forward of the `expand` nodes (indices into nodes, all of depth d),
# row j seeing the tree rows where sees[j] (E, rows so far + E); returns (log-probs (E, topk), tokens (E, topk))
Forward = Callable[[list, list, torch.Tensor, int], tuple]


class Judge(Protocol):
    """What shapes a tree by calibrated confidence (budget/confidence.ConfidenceBudget, the "auto" budget)."""
    expected: float  # the last `size`'s expected saving (ms), for the proposal's carry

    def value(self, q: float) -> float: ...  # a node's calibrated acceptance, its drafter probability q
    def expand(self, values: Sequence[float]) -> int: ...  # how many of the frontier's best to expand
    def saw_children(self, best: float) -> None: ...  # an expanded node's best child's value
    def size(self, values: Sequence[float], draft_ms: float = 0.0) -> int: ...  # nodes to verify


def top_children(logits: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs (R, k), tokens (R, k)) of the `topk` likeliest next tokens of each row of logits (R, V)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.topk(min(topk, logp.shape[-1]), dim=-1)


def grow(first: tuple, forward: Forward, depth: int, topk: int, keep: int = 0,
         judge: Judge | None = None) -> list[Node]:
    """Every node drafted this step (see the module doc). `first`: (log-probs, tokens) lists of the root's
    children; `depth`: the deepest node drafted; `keep`: the size that will be verified (read without a judge)."""
    nodes: list[Node] = []
    frontier: list[int] = []

    def add_children(parent: int, base: float, logp: list[float], toks: list[int]) -> None:
        best = 0.0
        for lp, tok in zip(logp, toks):
            q = math.exp(lp)
            if judge is None:
                score = base + lp
            else:
                v = judge.value(q)
                best = max(best, v)
                score = base + math.log(max(v, 1e-30))
            nodes.append((score, 1 if parent == ROOT else nodes[parent][1] + 1, tok, parent, q))
            frontier.append(len(nodes) - 1)
        if judge is not None and parent != ROOT:
            judge.saw_children(best)

    add_children(ROOT, 0.0, *first)
    ancestors_rows: dict[int, list[int]] = {ROOT: []}  # a node's row and its ancestors' rows (tree rows fed)
    tree_rows = 0
    for d in range(1, depth):
        best = sorted(frontier, key=lambda i: -nodes[i][0])[:topk]
        if judge is None:
            floor = sorted((n[0] for n in nodes), reverse=True)[keep - 1] if len(nodes) >= keep else -math.inf
            expand = [i for i in best if nodes[i][0] > floor]
        else:  # what pays one more forward (its nodes' values are exp(score))
            expand = best[:judge.expand([math.exp(nodes[i][0]) for i in best])]
        if not expand:
            break
        total = tree_rows + len(expand)
        sees = torch.zeros(len(expand), total, dtype=torch.bool)  # (E, tree rows): ancestors' rows and its own
        for j, i in enumerate(expand):
            ancestors_rows[i] = ancestors_rows[nodes[i][3]] + [tree_rows + j]
            sees[j, ancestors_rows[i]] = True
        logp, toks = forward(expand, nodes, sees, d)
        tree_rows = total
        frontier = []
        for j, i in enumerate(expand):
            add_children(i, nodes[i][0], logp[j].tolist(), toks[j].tolist())
    return nodes


def rank(nodes: list[Node]) -> list[int]:
    """The nodes' indices, best score first (ties: the shallower first)."""
    return sorted(range(len(nodes)), key=lambda i: (-nodes[i][0], nodes[i][1]))


def kept(nodes: list[Node], budget: int, ranked: list[int] | None = None) -> list[int]:
    """The `budget` best nodes by score, closed under parents, ordered by depth (`ranked`: `rank(nodes)`)."""
    best = (ranked if ranked is not None else rank(nodes))[:budget]
    keep = set(best)
    for i in best:  # ties can rank a child above its parent: bring parents along
        p = nodes[i][3]
        while p != ROOT and p not in keep:
            keep.add(p)
            p = nodes[p][3]
    return sorted(keep, key=lambda i: (nodes[i][1], i))


def to_tree(root: int, nodes: list[Node], order: list[int]) -> DraftTree:
    """The DraftTree of the nodes `order` (as `kept` returns them) under the committed token `root`."""
    index = {old: new for new, old in enumerate(order)}
    return DraftTree(root, [nodes[i][2] for i in order], [index.get(nodes[i][3], ROOT) for i in order])


def judged(root: int, nodes: list[Node], judge: Judge, draft_ms: float) -> tuple[DraftTree, int, dict]:
    """The "auto" budget's tree: (the tree, its size as the judge picked it from the nodes' values, the proposal's
    carry: each verified node's drafter probability, for the calibration, and the step's expected saving).
    `draft_ms`: what this step's drafting cost, at the judge's price per forward."""
    ranked = rank(nodes)
    size = judge.size([math.exp(nodes[i][0]) for i in ranked], draft_ms)
    order = kept(nodes, size, ranked)
    return to_tree(root, nodes, order), size, dict(probs=[nodes[i][4] for i in order], saving=judge.expected)
