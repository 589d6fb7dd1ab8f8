"""Draft trees and Cacheback's breadth-first tree growth (Cacheback paper, section 3.2; tables from 3.1/3.3).

A `DraftTree` is the proposal one target forward verifies, the one tree type of every drafter (CARD's
card.tree.ScoredTree adds scores and the draft's logits). Its *root* is the last committed token, not yet in the
target's KV cache (it is fed with the tree, so its row gives the first verdict) and stored apart from the nodes.
Node i has `tokens[i]`, `parents[i]` (-1 = a child of the root) and `depths[i]` (root 0, its children 1). Nodes
are kept in insertion order, which is topological (a parent's index is smaller than its child's): the tree
layout, the mask and the KV compaction rely on that.

`grow_tree(context, tables, tdl, crt, refed)` grows "breadth first": level 0 queries every table with the last
LL tokens of the context and hangs each follower under the root as a whole chain; level L >= 1 does the same for
every leaf made at level L-1 (a leader may straddle the context and the path). Per leaf the tables are queried in
the order given (dynamic, then frozen: section 3.3), each table's followers MRU first with its own `leader_len`;
growth stops when a level makes no new leaf or the budget is reached.

TDL and CRT, as we read the paper and its reference code: TDL counts the draft nodes plus the `refed` tokens the
forward feeds that the cache lacks, so at most B = TDL - refed nodes; level 0 may use B - CRT of them, the CRT
reserve going to levels >= 1. With our KV compaction only the root is re-fed (refed = 1; the reference crops its
cache and re-feeds every accepted token, refed = k + 1).

Simplifications: followers are added whole (the first that does not fit ends the level; level 0 then goes on to
level 1 with the reserve); only a chain's LAST node is expanded at the next level; `merge=False` (the reference's
way) keeps duplicate siblings, `merge=True` makes the tree a trie (a chain pays only for its new nodes, one
already present costs nothing and makes no leaf); a table is anything with `.leader_len` and
`.query(leader_tuple) -> list of follower tuples`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..env import check_int

ROOT = -1  # the parent index of the root's children


@dataclass
class DraftTree:
    root: int
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] | None = None  # computed from parents when not given
    # lookup index (not part of equality or repr): children lists, and the first child of a node carrying a
    # token, so merging and the verify walk look a child up in O(1). Built lazily: growth without merging
    # only appends to the three lists (the drafting hot path), and the index is rebuilt once when read.
    _kids: dict[int, list[int]] | None = field(default=None, repr=False, compare=False)
    _first: dict[tuple[int, int], int] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        # private int copies: add_chain grows them, and numpy/tensor scalars would hash by identity
        self.root, self.tokens, self.parents = int(self.root), [int(t) for t in self.tokens], \
            [int(p) for p in self.parents]
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.parents)} parents")
        depths = []
        for i, p in enumerate(self.parents):
            if not ROOT <= p < i:  # parents come first: insertion order is topological
                raise ValueError(f"node {i} has parent {p}; parents must be -1 or an earlier node")
            depths.append(1 if p == ROOT else depths[p] + 1)
        if self.depths is not None and list(self.depths) != depths:
            raise ValueError("depths do not match parents")
        self.depths = depths
        self._kids = self._first = None

    def _index(self) -> None:
        """(Re)build the children lists and the first-child-by-token map, O(n), when stale."""
        if self._kids is not None:
            return
        kids: dict[int, list[int]] = {ROOT: []}
        first: dict[tuple[int, int], int] = {}
        for i, (p, tok) in enumerate(zip(self.parents, self.tokens)):
            kids[p].append(i)
            kids[i] = []
            first.setdefault((p, tok), i)
        self._kids, self._first = kids, first

    @classmethod
    def chain(cls, root: int, tokens: Sequence[int]) -> "DraftTree":
        """A single branch (what prompt lookup or a draft model proposes)."""
        tree = cls(int(root))
        tree.add_chain(ROOT, tokens)
        return tree

    @classmethod
    def trie(cls, root: int, chains: Sequence[Sequence[int]], length: int, nodes: int | None = None) -> "DraftTree":
        """Chains (Lookahead's n-gram guesses, FAFO's candidates) cut to `length` tokens each, hung under the
        root, shared prefixes merged; `nodes`: at most that many nodes (a budget of verified rows), chains taken
        in order and the one that reaches the budget cut to fit (its first tokens are its likeliest)."""
        tree = cls(int(root))
        for tokens in chains:
            tokens = tokens[:length]
            if nodes is not None:
                room = nodes - len(tree)
                if room <= 0:
                    break
                new = tree.chain_cost(ROOT, tokens, merge=True)  # the chain's tokens past its shared prefix
                tokens = tokens[:len(tokens) - max(0, new - room)]
            tree.add_chain(ROOT, tokens, merge=True)
        return tree

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self, i: int = ROOT) -> list[int]:
        """Node indices whose parent is i (i = -1: the root), in insertion order."""
        self._index()
        return self._kids[i]

    def child_with(self, i: int, token: int) -> int | None:
        """The first child of i (-1: the root) carrying `token`, or None."""
        self._index()
        return self._first.get((i, token))

    def path_to(self, i: int) -> list[int]:
        """Node indices from the depth-1 ancestor down to i (empty for the root)."""
        path = []
        while i != ROOT:
            path.append(i)
            i = self.parents[i]
        return path[::-1]

    def path_tokens(self, i: int) -> list[int]:
        return [self.tokens[j] for j in self.path_to(i)]

    def leaves(self) -> list[int]:
        self._index()
        return [i for i in range(len(self)) if not self._kids[i]]

    def paths(self) -> list[list[int]]:
        """Every root-to-leaf path (node indices), leaves in index order."""
        return [self.path_to(leaf) for leaf in self.leaves()]

    @property
    def depth(self) -> int:
        """The deepest node's depth (0: no nodes): the step records' `depth`."""
        return max(self.depths, default=0)

    def chain_cost(self, parent: int, tokens: Sequence[int], merge: bool = False) -> int:
        """How many new nodes add_chain(parent, tokens, merge) would create."""
        if not merge:
            return len(tokens)
        self._index()
        node = parent
        for n, tok in enumerate(tokens):
            node = self._first.get((node, tok))
            if node is None:
                return len(tokens) - n
        return 0

    def add_chain(self, parent: int, tokens: Sequence[int], merge: bool = False) -> list[int]:
        """Hang `tokens` under `parent` as a chain; return the chain's node indices (reused or new).

        merge=True reuses an existing child with the same token (the first one) while one exists."""
        if not ROOT <= parent < len(self):
            raise ValueError(f"parent {parent} is not a node of a tree of {len(self)} nodes")
        tokens = [int(t) for t in tokens]
        if not merge:  # bulk append; the index goes stale and is rebuilt when next read
            return self._append_chain(parent, tokens)
        return self._merge_chain(parent, tokens)

    def _merge_chain(self, parent: int, tokens: Sequence[int]) -> list[int]:
        """add_chain(parent, tokens, merge=True) for trusted ints: reuse equal children, keep the index."""
        self._index()
        node, out = parent, []
        for tok in tokens:
            found = self._first.get((node, tok))
            if found is None:
                found = len(self.tokens)
                self.tokens.append(tok)
                self.parents.append(node)
                self.depths.append(1 if node == ROOT else self.depths[node] + 1)
                self._kids[node].append(found)
                self._kids[found] = []
                self._first[(node, tok)] = found
            out.append(found)
            node = found
        return out

    def _append_chain(self, parent: int, tokens: Sequence[int]) -> list[int]:
        """New nodes for `tokens` (trusted ints) under `parent`, no merging: three list extends."""
        start, k = len(self.tokens), len(tokens)
        if k == 0:
            return []
        depth = 0 if parent == ROOT else self.depths[parent]
        self.tokens.extend(tokens)
        self.parents.append(parent)
        self.parents.extend(range(start, start + k - 1))
        self.depths.extend(range(depth + 1, depth + k + 1))
        self._kids = self._first = None
        return list(range(start, start + k))


def _leader(context: Sequence[int], tree: DraftTree, node: int, length: int) -> tuple[int, ...] | None:
    """The last `length` tokens of context + path_to(node), or None when the sequence is shorter."""
    tail: list[int] = []
    while node != ROOT and len(tail) < length:  # walk up at most `length` nodes: O(LL), not O(depth)
        tail.append(tree.tokens[node])
        node = tree.parents[node]
    need = length - len(tail)
    if need > len(context):
        return None
    head = list(context[len(context) - need:]) if need else []
    return tuple(head + tail[::-1])


def grow_tree(context_tokens: Sequence[int], tables: Sequence, tdl: int = 96, crt: int = 16, refed: int = 1,
              merge: bool = False) -> DraftTree:
    """Cacheback's draft tree for the committed `context_tokens` (root = the last one); see the module doc."""
    for name, value in (("tdl", tdl), ("crt", crt), ("refed", refed)):
        check_int(name, value, 0)
    if len(context_tokens) == 0:
        raise ValueError("context_tokens is empty: the root is its last token")
    context = [int(t) for t in context_tokens]
    tree = DraftTree(context[-1])
    budget = tdl - refed  # draft nodes this forward may carry
    frontier, level = [ROOT], 0
    while frontier:
        limit = budget - crt if level == 0 else budget  # CRT reserved for levels >= 1
        new_leaves, cut = [], False
        for node in frontier:
            for table in tables:
                leader = _leader(context, tree, node, table.leader_len)
                if leader is None:
                    continue
                for follower in table.query(leader):
                    cost = tree.chain_cost(node, follower, merge) if merge else len(follower)
                    if cost == 0:
                        continue  # merge: already in the tree, no new leaf
                    if len(tree) + cost > limit:
                        cut = True
                        break
                    # table followers are tuples of ints: the unchecked internal appends
                    chain = tree._merge_chain(node, follower) if merge else tree._append_chain(node, follower)
                    new_leaves.append(chain[-1])
                if cut:
                    break
            if cut:
                break
        if cut and level > 0:
            break  # the whole budget is used
        frontier, level = new_leaves, level + 1
    return tree
