"""CARD's draft-side cache: a beam-like tree of width K that the drafter grows one forward per layer.

CARD paper (Zhou et al., "A Cache-Assisted Parallel Speculative Decoding Framework via Query-and-Correct
Paradigm") §2.2 (cache construction), §2.3 (the drafter's tree mask) and §2.4 (cache correction).

The tree is a DraftTree (root = committed[-1]): `ScoredTree` adds what the target reads (scores, logits, query,
match), `CardTree` the draft model, its KV and the layer machinery.
- primary cache C(l): the K frontier nodes of layer l. One layer = ONE draft forward of the frontier over the
  drafter's own KV with tree attention (a row sees the committed text, its ancestors and itself, at position
  root + depth). Each fed node offers its top-K children scored by cumulative log-probability (eq. 3-4 in log
  space); these K x K form the secondary cache B(l) (`level2`) and the global top-K become the next frontier
  (eq. 6-9). The first layer after a reset feeds the committed tokens the drafter lacks and expands the root.
- `query`: ONE chain for the target (`query_tree`: its best nodes instead, an extension; card's `tree=`).
  Greedy: descend to the child with the best cumulative score until a leaf (lossless whatever the chain: the
  loop's walk accepts only the target's argmax). Sampling: the chain is DRAWN from q token by token, q = the
  draft's warped probabilities from the logits cached at each node; it stops at a drawn token whose node is
  missing or not fed. Every token is a draw from exactly the q handed to the loop and the stopping rule depends
  on the drafts only, so speculative sampling keeps the output exactly p.
- `correct(committed)`: walk the new committed tokens down the tree. Hit (they, the target's last token
  included, are a path in the tree): that node becomes the root, only its subtree and its KV are kept
  (kv_cache.compact). Miss: keep the KV of the matched fed path only and restart from the correct token.

Simplifications: scores are the draft's raw (unwarped) log-probabilities; a node's KV stays in the cache once
fed (node i at offset i after the committed text); a pruned tree whose frontier is gone restarts the beam from
its fed leaves; batch size 1; a sliding-window draft keeps every position (its window is the masks').
"""
from __future__ import annotations

import torch

from ... import compat
from .. import dynamic_tree, kv_cache, masks
from ..draft_tree import ROOT, DraftTree
from ...sampling import probs, sample


class ScoredTree(DraftTree):
    """What the target reads of the drafter's tree: a DraftTree (root = committed[-1]; node i has tokens[i],
    parents[i], depths[i]) whose node i also has scores[i] (cumulative log-probability) and, once fed, logits[i]
    (the draft's next-token logits after it, (V,)); root_logits (None until the root is fed) and committed.
    `CardTree` builds one; a process drafter's published copy (card/process.py) is another."""

    scores: list[float]
    committed: list[int]

    def _set_nodes(self, committed: list[int], tokens: list[int], parents: list[int], depths: list[int],
                   scores: list[float]) -> None:
        """Replace the whole tree (trusted lists: topological, depths from parents); the children index is
        rebuilt when next read."""
        self.committed, self.root = committed, int(committed[-1])
        self.tokens, self.parents, self.depths, self.scores = tokens, parents, depths, scores
        self._kids = self._first = None

    @property
    def fed(self) -> int:
        """Nodes whose KV is in the cache (a prefix of the node list)."""
        return len(self.logits)

    def query(self, max_len: int, sampling, generator, start: int = ROOT) -> tuple[list[int], torch.Tensor | None]:
        """(chain tokens, q per chain token or None): see the module doc (greedy descent / drawn from q).
        `start`: the node to descend from (the root, or a fed node: card's no-correction ablation)."""
        chain, q_rows, node = [], [], start
        if self.root_logits is None:
            return [], None
        while len(chain) < max_len:
            if sampling.greedy:
                kids = self.children(node)
                if not kids:
                    break
                node = max(kids, key=lambda c: self.scores[c])
                chain.append(self.tokens[node])
                continue
            row = self.root_logits if node == ROOT else self.logits[node]
            q_rows.append(probs(row, sampling))  # (V,)
            x = sample(q_rows[-1], generator)
            chain.append(x)
            node = self.child_with(node, x)
            if node is None or node >= self.fed:  # no logits after x: the chain ends with it
                break
        return chain, (torch.stack(q_rows) if q_rows else None)

    def query_tree(self, size: int, max_depth: int) -> DraftTree:
        """The `size` best nodes by cumulative score, at most `max_depth` deep, closed under parents (an extension
        beyond the paper's one chain: card's `tree=`); a deterministic function of the tree, for greedy decoding
        and sampling alike (the loop's tree walk verifies it)."""
        if self.root_logits is None:
            return DraftTree(self.root)
        nodes = [(self.scores[i], self.depths[i], self.tokens[i], self.parents[i], None)
                 for i in range(len(self.tokens))]
        ranked = [i for i in dynamic_tree.rank(nodes) if nodes[i][1] <= max_depth]
        return dynamic_tree.to_tree(self.root, nodes, dynamic_tree.kept(nodes, size, ranked))

    def match(self, committed: list[int]) -> tuple[list[int], bool]:
        """(tree nodes spelling the longest prefix of the new committed tokens, True when all of them)."""
        new, path, node = committed[len(self.committed):], [], ROOT
        for tok in new:
            node = self.child_with(node, tok)
            if node is None:
                break
            path.append(node)
        return path, len(path) == len(new) and len(new) > 0


    def subtree(self, root: int) -> list[int]:
        """The nodes under `root` (itself excluded), in index order (children come after their parent)."""
        inside, sub = {root}, []
        for i in range(root + 1, len(self.tokens)):
            if self.parents[i] in inside:
                inside.add(i)
                sub.append(i)
        return sub


    def reindexed(self, root: int) -> tuple[list[int], dict]:
        """The subtree under `root` as a tree of its own (root -> ROOT, depths from it, scores rebased on it):
        (its nodes' old indices, dict of tokens, parents, depths, scores). correct() keeps this; a process
        drafter's parent computes the same from its copy without waiting for the child."""
        sub, new_index, base = self.subtree(root), {root: ROOT}, self.scores[root]
        out = dict(tokens=[], parents=[], depths=[], scores=[])
        for i in sub:
            new_index[i] = len(out["tokens"])
            parent = new_index[self.parents[i]]
            out["tokens"].append(self.tokens[i])
            out["parents"].append(parent)
            out["depths"].append(1 if parent == ROOT else out["depths"][parent] + 1)
            out["scores"].append(self.scores[i] - base)
        return sub, out


class CardTree(ScoredTree):
    """The drafter's tree (a ScoredTree) with the draft model, its KV cache and the layer machinery."""

    def __init__(self, draft, width: int, committed: list[int]):
        self.draft, self.width = draft, width
        self.device = next(draft.parameters()).device
        self.backend = getattr(draft.config, "_attn_implementation", None) or "sdpa"
        self.dtype = next(draft.parameters()).dtype
        self.kinds = compat.attention_layers(draft.config)  # a sliding-window draft's masks hide what its window does
        self.cache = kv_cache.new_cache(draft, capacity=kv_cache.GROWING)
        self.ctx = []  # the committed tokens the cache holds
        self.layers = 0  # draft forwards in total
        self.root_logits = None  # the draft's logits after the root, once the root is fed
        self._clear(committed)

    def _clear(self, committed: list[int]) -> None:
        self._set_nodes(list(committed), [], [], [], [])  # root = committed[-1]
        self.logits = []
        self.root_logits = None if len(self.ctx) < len(self.committed) else self.root_logits
        self.frontier: list[int] = []  # nodes of the last layer, not fed yet
        self.level2: list[tuple[int, float, int]] = []  # B: (token, score, parent) of the last layer

    # ---- one layer: plan (what to feed), forward (the only code that writes the cache), apply ----------

    def plan(self) -> dict:
        if self.root_logits is None:  # after a reset: feed the committed tokens the drafter lacks
            return dict(kind="root", ids=self.committed[len(self.ctx):], start=kv_cache.cache_length(self.cache))
        rows = self.frontier
        start = kv_cache.cache_length(self.cache)
        if not rows:
            return dict(kind="expand", start=start)
        c, n = len(self.ctx), len(self.tokens)
        anc = masks.ancestor_matrix(self.parents)[1:, 1:]  # (n, n) node rows x node columns
        sees = anc[self.fed:n, :n]  # the frontier is the unfed suffix: rows fed..n-1 see keys c..c+n-1
        mod = masks.or_masks(masks.prefix(c), masks.visible(sees, 0, c, self.device))  # the block where it is read
        root_pos = len(self.committed) - 1
        window = None
        if self.kinds.sliding:  # node i's key sits at offset i after the committed text, at root + its depth
            keys_pos = [root_pos + depth for depth in self.depths[:n]]
            window = masks.window([keys_pos[i] for i in rows], self.kinds.window, c, keys_pos, self.device)
        return dict(kind="frontier", rows=list(rows), start=start,
                    ids=torch.tensor([[self.tokens[i] for i in rows]], device=self.device),
                    pos=torch.tensor([[root_pos + self.depths[i] for i in rows]], device=self.device),
                    mask=masks.render_layers(mod, len(rows), c + n, self.kinds, window, self.backend, self.dtype,
                                             self.device))

    def forward(self, job: dict):
        if job["kind"] == "expand":
            return None
        if job["kind"] == "root":
            ids = torch.tensor([job["ids"]], device=self.device)
            return compat.forward(self.draft, input_ids=ids, cache=self.cache, use_cache=True,
                                  logits_to_keep=1).logits[0]
        return compat.forward(self.draft, input_ids=job["ids"], position_ids=job["pos"], attention_mask=job["mask"],
                              cache=self.cache, use_cache=True).logits[0]  # (K, V)

    def discard(self, job: dict) -> None:
        """Undo a forward whose tree changed meanwhile (thread mode: a correction came in)."""
        kv_cache.rollback(self.cache, job["start"])

    def apply(self, job: dict, logits) -> None:
        if job["kind"] == "root":
            self.ctx = list(self.committed)
            self.root_logits = logits[-1]
            parents = [ROOT]
        elif job["kind"] == "frontier":
            self.logits.extend(logits)
            parents = job["rows"]
        else:  # no frontier left after pruning: restart the beam from the fed leaves (the root if none)
            has_kids = set(self.parents)
            parents = [i for i in range(self.fed) if i not in has_kids] or [ROOT]
        if job["kind"] != "expand":
            self.layers += 1
        self._expand(parents)

    def _expand(self, parents: list[int]) -> None:
        k, cand = self.width, []
        for p in parents:
            row = self.root_logits if p == ROOT else self.logits[p]
            logp = torch.log_softmax(row.float(), -1)
            top = torch.topk(logp, min(k, logp.shape[-1]))
            base = 0.0 if p == ROOT else self.scores[p]
            have = {self.tokens[c] for c in self.children(p)}
            cand += [(int(t), base + float(v), p) for v, t in zip(top.values, top.indices) if int(t) not in have]
        self.level2 = cand
        best = sorted(cand, key=lambda c: -c[1])[:k]  # stable: ties keep parent order, then rank
        self.frontier = []
        for token, score, p in best:
            self.frontier += self.add_chain(p, [token])  # a new child: `have` left out the tokens p has
            self.scores.append(score)

    @property
    def root_fed(self) -> bool:
        return self.root_logits is not None

    def grow(self) -> None:
        """One layer, in the caller's thread (sync mode)."""
        job = self.plan()
        self.apply(job, self.forward(job))

    # ---- the correction (the target's side, query and match, is ScoredTree's) ------------------------

    def correct(self, committed: list[int]) -> bool:
        """Prune to the subtree under the new root (hit) or restart from the correct token (miss)."""
        path, hit = self.match(committed)
        kept_path = [i for i in path if i < self.fed]  # a node's KV exists once it was fed
        if self.root_logits is None:  # the root was never fed: nothing in the tree, nothing after ctx
            self._clear(committed)
            return False
        keep = hit and path[-1] < self.fed  # the new root is fed: keep its subtree
        sub, shape = self.reindexed(path[-1]) if keep else ([], None)
        kv_cache.compact(self.cache, len(self.ctx), kept_path + [i for i in sub if i < self.fed])
        old_logits = self.logits
        self.ctx = self.ctx + [self.tokens[i] for i in kept_path]
        self._clear(committed)
        if not keep:  # the next layer feeds committed[len(ctx):], the root last
            self.root_logits = None
            return hit
        self.root_logits = old_logits[path[-1]]
        self._set_nodes(self.committed, shape["tokens"], shape["parents"], shape["depths"], shape["scores"])
        self.logits = [old_logits[i] for i in sub if i < len(old_logits)]  # fed nodes stay a prefix
        self.frontier = [k for k, i in enumerate(sub) if i >= len(old_logits)]
        return hit
