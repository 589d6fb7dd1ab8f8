"""EAGLE-2: a feature-level head drafts a dynamic tree, the target verifies it in one forward (a loop proposer).

Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty" (the head: eagle_head.py)
and "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees" (the tree). One step, the root
c_T at position T (committed, not yet in the target's cache), the head's cache holding rows 0..T-2:

1. catch up: feed the head the rows whose features the last verify forward computed: (f_t, embed(c_{t+1})) for
   the root and accepted tokens of the last step (the whole prompt on step 2). Its last row predicts f^_T, read
   by the target's LM head: the root's children (depth 1), the top `topk` tokens, each scored by its log-prob.
2. expand (EAGLE-2's "expansion"): for depth d = 1 .. depth-1, the `topk` nodes of depth d with the best
   *cumulative* log-prob (the product of the head's probabilities along the path: an estimate of the chance the
   target accepts the path) each get a head row (f^ of their parent's row, embed(token)) at position T + d - 1,
   seeing the committed rows and their own ancestors' rows (a tree mask); each row gives `topk` children.
   A node whose score is below the `budget`-th best so far is not expanded (its children could not be kept),
   so an unsure head stops drafting early.
3. rerank: of every node drafted, keep the `budget` with the best cumulative log-prob. A child never scores
   above its parent, so the kept set is a tree (parents come along on ties); ordered by depth, it is the
   DraftTree the loop verifies, in ONE target forward with the tree mask (verify.py).
4. observe: the verify forward's rows hold the target's final hidden state of the root and of every accepted
   node (verify.RowLogits.hidden): they are the next step's catch-up features, so no extra target pass is paid.
   The head's cache drops this step's tree rows (compat.crop) and keeps the exact ones.

Step 1 has no features yet: it is a plain step whose forward keeps the prompt's hidden states (Proposal.features).

The drafts are a deterministic function of the committed text (top-k, no coin), so the tree walk is lossless
under greedy decoding and under sampling alike (verify.walk_tree draws each emitted token from the target's p).

Budget: `budget` (tree nodes verified) is an int or "auto": chosen each step on this machine's cost curve by
TreeBudget (mechanisms/budget.py) from the ladder BUDGET_LADDER; the same ranked list answers what any other
budget would have yielded (its top b), so the counterfactuals cost nothing, and every smaller budget's are
recorded each step (TreeBudget's window: none is left unseen). Budget 0 is a plain step (no head
forward, and no counterfactual: the chooser's probe drafts again), taken where no tree pays.

The drafting is priced too: a budget b pays what drafting b' takes, b' the next rung above b (the chooser also
drafts that one, to learn its yield). Before b' has been drafted that is min(depth, b') head forwards (an upper
bound: a tree of b' nodes spans at most b' depths; the catch-up forward drafts depth 1, each further depth one
forward), one head forward (a row, and the target's LM head over its prediction) timed here once per head and
target (`head_ms=` injects it, and then the forwards are priced at it instead of timed); each step that drafts
b' then moves its estimate towards the ms that step's drafting really took, as measured (a bushy tree spans
fewer depths, an unsure head stops early, and the Python work of growing, ranking and cutting the trees is paid
too: on the tiny pair it is as much as the forwards), and the chooser is repriced. Under sampling the step's
forwards at the head's price stand in for the clock: a seed's draws then never follow the machine's speed.

Simplifications: one head forward's time is measured once (its rows vary little); the head reads normed features
(eagle_head.py); sampling verifies the greedy top-k tree by the walk,
not with EAGLE's recursive rejection sampling (lossless, a little lower acceptance); batch size 1.
"""
from __future__ import annotations

import time

import torch

from .. import compat
from ..checks import check_int
from ..eagle_head import EagleHead, head_for
from ..loop import LoopState, Proposal, Proposer, register_proposer
from ..mechanisms.budget import Budget, TreeBudget
from ..mechanisms.draft_tree import ROOT, DraftTree

BUDGET_LADDER = (0, 1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # budget="auto" picks among these
DRAFT_MS_RATE = 0.2  # budget="auto": how fast a rung's drafting-ms estimate moves to what drafting it took
_HEAD_MS: dict[tuple, float] = {}  # one head forward's ms, timed once per (head, target) in this process


def head_forward_ms(head: EagleHead, target, prefix: int = 64, repeats: int = 7) -> float:
    """Median ms of one 1-row head forward after `prefix` cached rows, with the target's LM head over its
    prediction (what each drafted depth costs); timed once per (head, target) in this process."""
    key = (id(head), id(target))
    if key not in _HEAD_MS:
        device = next(target.parameters()).device
        d, dtype = head.config.hidden_size, target.get_input_embeddings().weight.dtype
        embed = target.get_input_embeddings()
        cache = compat.new_dynamic_cache(head.config)
        times = []
        with torch.inference_mode():
            ids = torch.zeros(1, prefix + 1, dtype=torch.long, device=device)
            feats = torch.zeros(1, prefix + 1, d, dtype=dtype, device=device)  # (1, P + 1, d)
            pos = torch.arange(prefix + 1, device=device)[None]  # (1, P + 1)
            causal = torch.ones(prefix, prefix, dtype=torch.bool, device=device).tril()[None, None]
            head(feats[:, :prefix], embed(ids[:, :prefix]), pos[:, :prefix], causal, cache)
            one = torch.ones(1, 1, 1, prefix + 1, dtype=torch.bool, device=device)  # (1, 1, 1, P + 1)
            for _ in range(repeats):
                start = time.perf_counter()
                out = head(feats[:, prefix:], embed(ids[:, prefix:]), pos[:, prefix:], one, cache)
                head.logits(target, out[0])[0].float().log_softmax(-1).topk(8)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(1e3 * (time.perf_counter() - start))
                compat.crop(cache, prefix)
        _HEAD_MS[key] = float(sorted(times)[len(times) // 2])
    return _HEAD_MS[key]


@register_proposer("eagle")
class Eagle(Proposer):
    """EAGLE-2: a head reading the target's last hidden state drafts a dynamic tree (top-k expansion, rerank).

    budget: tree nodes verified per step (an int, or "auto" from the cost curve); topk: children per expanded
    node and nodes expanded per depth; depth: draft depth; head: an EagleHead (default: the one trained for the
    target, eagle_head.head_for); costs, head_ms: the target's cost curve and one head forward's ms, read under
    "auto" (None: measured here)."""

    def __init__(self, budget: int | str = "auto", topk: int = 8, depth: int = 6, head: EagleHead | None = None,
                 costs=None, head_ms: float | None = None):
        self.budget = Budget("budget", budget, 1, costs=costs, head_ms=head_ms)
        if head_ms is not None and (isinstance(head_ms, bool) or not isinstance(head_ms, (int, float))
                                    or head_ms < 0):
            raise ValueError(f"head_ms must be a number of ms >= 0, got {head_ms!r}")
        self.head_ms = head_ms
        self.topk, self.depth = check_int("topk", topk, 1), check_int("depth", depth, 1)
        if head is not None and not isinstance(head, EagleHead):
            raise TypeError(f"head must be an EagleHead, got {type(head).__name__}")
        self.head = head

    def start(self, state: LoopState) -> None:
        req = state.request
        self.target = req.target
        head = self.head if self.head is not None else head_for(req.target)
        if head.config.hidden_size != req.target.config.hidden_size:
            raise ValueError(f"the head's width {head.config.hidden_size} is not the target's "
                             f"{req.target.config.hidden_size}")
        self.h = head
        self.embed = req.target.get_input_embeddings()
        self.device = next(req.target.parameters()).device
        # the head's cache; rows 0..exact-1 hold true features
        self.cache, self.exact = compat.new_dynamic_cache(head.config), 0
        self.pending: list[torch.Tensor] = []  # features (d,) of positions exact.. not yet fed to the head
        # never a plain step before any evidence (`first`): the chooser falls to 0 after probe_every steps, or once
        # those lost trial_share of the plain time of max_new_tokens
        self.head_price = self.draft_ms = None
        if self.budget.auto:  # a budget b pays the head forwards of the next rung above it (the module doc)
            ms = self.head_price = self.head_ms if self.head_ms is not None else head_forward_ms(head, req.target)
            above = {b: BUDGET_LADDER[min(i + 1, len(BUDGET_LADDER) - 1)] for i, b in enumerate(BUDGET_LADDER)}
            # per drafted rung, its ms: the prior min(depth, b) head forwards, then as measured
            self.spent = {b: ms * min(self.depth, b) for b in BUDGET_LADDER}
            self.draft_ms = lambda b: self.spent[above[b]] if b else 0.0  # noqa: E731
        # every smaller budget's tree is a prefix of the one ranked list: all of them are regrown each step
        # (window), so no smaller budget is ever unseen (an unseen one is estimated at the verified yield's
        # level, which a tree of 1 or 2 nodes cannot reach)
        self.budget.start(req, lambda curve: TreeBudget(curve, BUDGET_LADDER, context=len(state.committed), first=1,
                                                        window=len(BUDGET_LADDER), draft_ms=self.draft_ms,
                                                        horizon=req.max_new_tokens))
        self.head_forwards = self.head_rows = 0

    def _head(self, feats: torch.Tensor, tokens: list[int], positions: list[int], sees: torch.Tensor):
        """One head forward: rows (feats (R, d), tokens) at `positions`; every row sees the committed rows
        (0..exact-1), and the rows after them (this step's earlier tree rows, then the new ones) where sees[i]
        (R, cached - exact + R); returns the predicted features (R, d)."""
        R, cached = len(tokens), int(self.cache.get_seq_length())
        mask = torch.zeros(R, cached + R, dtype=torch.bool, device=self.device)  # (R, K)
        mask[:, :self.exact] = True
        mask[:, self.exact:] = sees
        ids = torch.tensor([tokens], device=self.device)  # (1, R)
        pos = torch.tensor([positions], device=self.device)  # (1, R)
        out = self.h(feats[None].to(self.embed.weight.dtype), self.embed(ids), pos, mask[None, None], self.cache)
        self.head_forwards, self.head_rows = self.head_forwards + 1, self.head_rows + R
        return out[0]  # (R, d)

    def _children(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs (R, topk), tokens (R, topk)) of the best children of each row's predicted feature."""
        logits, ids = self.h.logits(self.target, hidden)  # (R, K or V)
        logp = torch.log_softmax(logits.float(), dim=-1)
        top, idx = logp.topk(min(self.topk, logp.shape[-1]), dim=-1)  # (R, topk)
        return top, (ids[idx] if ids is not None else idx)

    def _draft(self, committed: list[int], max_depth: int, keep: int) -> list[tuple[float, int, int, int]]:
        """Every node drafted this step: (cumulative log-prob, depth, token, parent's index in the list); only
        what can enter the best `keep` is expanded."""
        T = len(committed) - 1  # the root's position
        if self.cache.get_seq_length() > self.exact:  # last step's tree rows
            compat.crop(self.cache, self.exact)
        n = len(self.pending)  # catch up: positions exact .. T-1, features known, next tokens committed
        if self.exact + n != T:
            raise AssertionError(f"the head knows features up to {self.exact + n}, the root sits at {T}")
        feats = torch.stack(self.pending)  # (n, d)
        positions = list(range(self.exact, self.exact + n))
        out = self._head(feats, committed[self.exact + 1:T + 1], positions,
                         torch.ones(n, n, dtype=torch.bool, device=self.device).tril())
        self.exact += n
        self.pending = []
        nodes: list[tuple[float, int, int, int]] = []  # (score, depth, token, parent) in drafting order
        logp, toks = self._children(out[-1:])
        frontier = []
        for lp, tok in zip(logp[0].tolist(), toks[0].tolist()):
            nodes.append((lp, 1, tok, ROOT))
            frontier.append(len(nodes) - 1)
        parent_feat = {ROOT: out[-1]}
        ancestors_rows: dict[int, list[int]] = {ROOT: []}
        tree_rows = 0
        for d in range(1, min(self.depth, max_depth)):
            # a child never scores above its parent: a frontier node below the keep-th best score so far can
            # add nothing to the kept tree, and when no node is above it, deeper depths are not drafted at all
            floor = sorted((n[0] for n in nodes), reverse=True)[keep - 1] if len(nodes) >= keep else float("-inf")
            expand = [i for i in sorted(frontier, key=lambda i: -nodes[i][0])[:self.topk] if nodes[i][0] > floor]
            if not expand:
                break
            feats = torch.stack([parent_feat[nodes[i][3]] for i in expand])  # (E, d): the parent's prediction
            rows = [tree_rows + j for j in range(len(expand))]
            seen = []
            for i, r in zip(expand, rows):
                ancestors_rows[i] = ancestors_rows[nodes[i][3]] + [r]
                seen.append(ancestors_rows[i])
            total = tree_rows + len(expand)
            sees = torch.zeros(len(expand), total, dtype=torch.bool, device=self.device)
            for j, rs in enumerate(seen):
                sees[j, rs] = True
            # rows of earlier depths are already in the head's cache: the mask covers all tree rows
            out = self._head(feats, [nodes[i][2] for i in expand], [T + d - 1] * len(expand), sees)
            tree_rows = total
            logp, toks = self._children(out)
            frontier = []
            for j, i in enumerate(expand):
                parent_feat[i] = out[j]
                base = nodes[i][0]
                for lp, tok in zip(logp[j].tolist(), toks[j].tolist()):
                    nodes.append((base + lp, d + 1, tok, i))
                    frontier.append(len(nodes) - 1)
        return nodes

    @staticmethod
    def _rank(nodes) -> list[int]:
        """The nodes' indices, best cumulative log-prob first (ties: the shallower first)."""
        return sorted(range(len(nodes)), key=lambda i: (-nodes[i][0], nodes[i][1]))

    @staticmethod
    def _tree(root: int, nodes, budget: int, ranked: list[int] | None = None) -> DraftTree:
        """The `budget` best nodes by cumulative log-prob, closed under parents, ordered by depth (`ranked`: the
        nodes' `_rank`, when already computed for another budget)."""
        best = (ranked if ranked is not None else Eagle._rank(nodes))[:budget]
        keep = set(best)
        for i in best:  # ties can rank a child above its parent: bring parents along
            p = nodes[i][3]
            while p != ROOT and p not in keep:
                keep.add(p)
                p = nodes[p][3]
        order = sorted(keep, key=lambda i: (nodes[i][1], i))
        index = {old: new for new, old in enumerate(order)}
        return DraftTree(root, [nodes[i][2] for i in order], [index.get(nodes[i][3], ROOT) for i in order])

    def propose(self, state: LoopState, max_depth: int) -> Proposal:
        root = state.committed[-1]
        if not self.pending or max_depth < 1:  # step 1 (no features yet), or nothing more can be emitted
            return Proposal(DraftTree(root), features=True)
        budget = self.budget.choose(len(state.committed))
        if budget == 0:  # a plain step: no head forward, so no counterfactual either (the chooser probes later)
            return Proposal(DraftTree(root), info=self.budget.info(0), features=True)
        most = max([budget, *self.budget.others])  # one ranked list answers every candidate
        start, before = time.perf_counter(), self.head_forwards
        nodes = self._draft(state.committed, max_depth, most)  # its .tolist() calls wait for a GPU's kernels
        ranked = self._rank(nodes)  # one ranking answers every budget
        carry = self.budget.carry(lambda b: self._tree(root, nodes, b, ranked))
        tree = self._tree(root, nodes, budget, ranked)
        if self.head_price is not None and max_depth >= self.depth:  # `most` is a rung of the ladder
            # what drafting `most` really took (a step cut short by max_new_tokens would under-count it); with
            # head_ms injected, or under sampling, its forwards at the head's price (no clock: a test's choices
            # are the same every run, and a seed's draws do not follow the machine's speed, as the budgets')
            clock = self.head_ms is None and state.request.sampling.greedy
            took = (1e3 * (time.perf_counter() - start) if clock
                    else self.head_price * (self.head_forwards - before))
            self.spent[most] += DRAFT_MS_RATE * (took - self.spent[most])
            self.budget.chooser.reprice(self.draft_ms)
        return Proposal(tree, info=self.budget.info(budget), carry=carry, features=True)

    def observe(self, state: LoopState, verdict) -> None:
        rows = verdict.logits  # RowLogits: row 0 the root, row i + 1 node i
        self.budget.record(verdict)
        kept = len(verdict.emitted) - 1  # accepted nodes that were committed (an EOS / length cut drops some)
        feats = [rows.hidden[0]] + [rows.hidden[i + 1] for i in verdict.accepted[:kept]]
        if rows.context is not None and len(rows.context):  # step 1: the prompt's rows before the root
            feats = list(rows.context) + feats
        self.pending.extend(feats)

    def stats(self) -> dict:
        return dict(config=dict(budget=self.budget.value, topk=self.topk, depth=self.depth), **self.budget.stats(),
                    **({"head_ms": round(self.head_price, 3),
                        "draft_ms_est": {b: round(ms, 2) for b, ms in self.spent.items() if b}}
                       if self.head_price is not None else {}),
                    head_forwards=self.head_forwards, head_rows=self.head_rows)
