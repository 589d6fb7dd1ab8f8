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
   DraftTree the loop verifies, in ONE target forward with the tree mask (verify.py). Steps 2-3 are
   mechanisms/dynamic_tree.py (a draft model grows the same tree: draft_model with topk > 1).
4. observe: the verify forward's rows hold the target's final hidden state of the root and of every accepted
   node (verify.RowLogits.hidden): they are the next step's catch-up features, so no extra target pass is paid.
   The head's cache drops this step's tree rows (a length cut: HeadKV.crop) and keeps the exact ones.

Step 1 has no features yet: it is a plain step whose forward keeps the prompt's hidden states (Proposal.features).

The drafts are a deterministic function of the committed text (top-k, no coin), so the tree walk is lossless
under greedy decoding and under sampling alike (verify.walk_tree draws each emitted token from the target's p).

Budget: `budget` (tree nodes verified per step) is an int, honoured exactly (steps 2-3 above), or "auto": then
the head's own confidence decides each step how deep to draft and how many nodes to verify, on this machine's
cost curve (ConfidenceBudget, mechanisms/confidence.py): the head's probabilities, calibrated against the
target's verdicts, give each node its chance to be accepted (its *value*; nodes are ranked by it), a further
depth is drafted when its expected tokens pay the head forward it costs, the size kept is the BUDGET_LADDER
rung that saves the most over a plain step, and where drafting stops paying (every step's catch-up forward
included) the method decodes plainly, probing again now and then. A head forward's price starts at its time
measured here once per head and target (`head_ms=` injects it), then moves to what drafting took per forward
(the Python work of growing and ranking the tree is paid too: on the tiny pair as much as the forwards); under
sampling, or injected, it stays put: a seed's draws never follow the machine's speed.

Simplifications: a head forward's price is one number (its rows vary little); the head reads normed features
(eagle_head.py); sampling verifies the greedy top-k tree by the walk,
not with EAGLE's recursive rejection sampling (lossless, a little lower acceptance); batch size 1.
"""
from __future__ import annotations

import time

import torch

from ..env import check_int
from ..models.eagle_head import EagleHead, HeadKV, head_for
from ..loop import LoopState, Proposal, Proposer, register_proposer
from ..mechanisms.budget import Budget
from ..mechanisms.budget.confidence import ConfidenceBudget
from ..mechanisms.budget.cost_curve import estimated_ms, estimating
from ..mechanisms import dynamic_tree
from ..mechanisms.draft_tree import ROOT, DraftTree

BUDGET_LADDER = (0, 1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # budget="auto" picks among these
_HEAD_MS: dict[tuple, float] = {}  # one head forward's ms, timed once per (head, target, setting) here


def head_forward_ms(head: EagleHead, target, prefix: int = 64, repeats: int = 7, rows: int = 1) -> float:
    """Median ms of one head forward of `rows` rows after `prefix` cached rows, with the target's LM head over its
    predictions (what each drafted depth costs); timed once per (head, target, setting) in this process."""
    if estimating():  # the tests: the head's weights and the target's LM head it reads, priced as cost_curve does
        lm_head = target.get_output_embeddings().weight.numel()
        return estimated_ms(sum(p.numel() for p in head.parameters()) + lm_head, rows)
    key = (id(head), id(target), prefix, repeats, rows)
    if key not in _HEAD_MS:
        device = next(target.parameters()).device
        d, dtype = head.config.hidden_size, head.fc.weight.dtype  # the head's dtype (a head may run below the target's)
        embed = lambda ids: target.get_input_embeddings()(ids).to(dtype)  # noqa: E731
        kv = HeadKV(head)
        times = []
        with torch.inference_mode():
            ids = torch.zeros(prefix + rows, dtype=torch.long, device=device)
            feats = torch.zeros(prefix + rows, d, dtype=dtype, device=device)  # (P + R, d)
            causal = torch.ones(prefix, prefix, dtype=torch.bool, device=device).tril()  # (P, P)
            head.decode(feats[:prefix], embed(ids[:prefix]), list(range(prefix)), causal, kv)
            sees = torch.ones(rows, prefix + rows, dtype=torch.bool, device=device)  # (R, P + R)
            for _ in range(repeats):
                start = time.perf_counter()
                out = head.decode(feats[prefix:], embed(ids[prefix:]), list(range(prefix, prefix + rows)), sees, kv)
                head.logits(target, out)[0].float().topk(8, dim=-1)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(1e3 * (time.perf_counter() - start))
                kv.crop(prefix)
        _HEAD_MS[key] = float(sorted(times)[len(times) // 2])
    return _HEAD_MS[key]


@register_proposer("eagle")
class Eagle(Proposer):
    """EAGLE-2: a head reading the target's last hidden state drafts a dynamic tree (top-k expansion, rerank).

    budget: tree nodes verified per step (an int, or "auto" from the cost curve); topk: children per expanded
    node and nodes expanded per depth; depth: draft depth; head: an EagleHead (default: the one trained for the
    target, eagle_head.head_for); costs, head_ms: the target's cost curve and one head forward's ms, read under
    "auto" (None: measured here)."""

    def __init__(self, budget: int | str = "auto", topk: int = 4, depth: int = 8, head: EagleHead | None = None,
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
        head.check_decodable()
        self.h = head
        self.embed = req.target.get_input_embeddings()
        self.device = next(req.target.parameters()).device
        # the head's cache; rows 0..exact-1 hold true features
        self.cache, self.exact = HeadKV(head, 2 * len(state.committed) + 64), 0
        self.pending: list[torch.Tensor] = []  # features (d,) of positions exact.. not yet fed to the head
        if self.budget.auto:  # the head's confidence decides depth and size (the module doc)
            ms = self.head_ms if self.head_ms is not None else head_forward_ms(head, req.target)
            learn = self.head_ms is None and req.sampling.greedy  # no clock under sampling: a seed's draws are fixed
            self.budget.start(req, lambda curve: ConfidenceBudget(curve, BUDGET_LADDER, ms, len(state.committed),
                                                                  learn_head=learn))
        self.head_forwards = self.head_rows = 0

    def _head(self, feats: torch.Tensor, tokens: list[int], positions: list[int], sees: torch.Tensor):
        """One head forward: rows (feats (R, d), tokens) at `positions`; every row sees the committed rows
        (0..exact-1), and the rows after them (this step's earlier tree rows, then the new ones) where sees[i]
        (R, cached - exact + R); returns the predicted features (R, d)."""
        R = len(tokens)
        mask = torch.ones(R, self.cache.length + R, dtype=torch.bool, device=self.device)  # (R, K)
        mask[:, self.exact:] = sees
        ids = torch.tensor(tokens, device=self.device)  # (R,)
        dtype = self.h.fc.weight.dtype  # the head's own (a head given in bfloat16 may run below the target)
        out = self.h.decode(feats.to(dtype), self.embed(ids).to(dtype), positions, mask, self.cache)
        self.head_forwards, self.head_rows = self.head_forwards + 1, self.head_rows + R
        return out  # (R, d)

    def _children(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs (R, topk), tokens (R, topk)) of the best children of each row's predicted feature."""
        logits, ids = self.h.logits(self.target, hidden)  # (R, K or V)
        top, idx = dynamic_tree.top_children(logits, self.topk)  # (R, topk)
        return top, (ids[idx] if ids is not None else idx)

    def _draft(self, committed: list[int], max_depth: int, keep: int,
               judge: ConfidenceBudget | None = None) -> list[dynamic_tree.Node]:
        """Every node drafted this step (dynamic_tree.grow: (score, depth, token, parent, q)), the head's rows
        after catching it up with the committed text."""
        T = len(committed) - 1  # the root's position
        self.cache.crop(self.exact)  # drop last step's tree rows
        n = len(self.pending)  # catch up: positions exact .. T-1, features known, next tokens committed
        if self.exact + n != T:
            raise AssertionError(f"the head knows features up to {self.exact + n}, the root sits at {T}")
        feats = torch.stack(self.pending)  # (n, d)
        positions = list(range(self.exact, self.exact + n))
        out = self._head(feats, committed[self.exact + 1:T + 1], positions,
                         torch.ones(n, n, dtype=torch.bool, device=self.device).tril())
        self.exact += n
        self.pending = []
        parent_feat = {ROOT: out[-1]}  # a node's predicted feature: its children's rows read it

        def forward(expand, nodes, sees, d):
            # a depth-d node's row sits at T + d - 1 (EAGLE's shift) and reads its parent's predicted feature;
            # rows of earlier depths are already in the head's cache: the mask covers all tree rows
            feats = torch.stack([parent_feat[nodes[i][3]] for i in expand])  # (E, d)
            out = self._head(feats, [nodes[i][2] for i in expand], [T + d - 1] * len(expand), sees.to(self.device))
            for j, i in enumerate(expand):
                parent_feat[i] = out[j]
            return self._children(out)

        logp, toks = self._children(out[-1:])
        return dynamic_tree.grow((logp[0].tolist(), toks[0].tolist()), forward, min(self.depth, max_depth),
                                 self.topk, keep, judge)

    def propose(self, state: LoopState, max_depth: int) -> Proposal:
        root = state.committed[-1]
        if not self.pending or max_depth < 1:  # step 1 (no features yet), or nothing more can be emitted
            return Proposal(DraftTree(root), features=True)
        judge = self.budget.chooser  # a ConfidenceBudget under "auto", else None
        if judge is None:
            nodes = self._draft(state.committed, max_depth, self.budget.value)
            order = dynamic_tree.kept(nodes, self.budget.value)
            return Proposal(dynamic_tree.to_tree(root, nodes, order), info=self.budget.info(self.budget.value),
                            features=True)
        if not judge.drafting(len(state.committed)):  # drafting does not pay here: a plain step (probes later)
            return Proposal(DraftTree(root), info=self.budget.info(0), features=True)
        start, before, catch_up = time.perf_counter(), self.head_forwards, len(self.pending)
        nodes = self._draft(state.committed, max_depth, 0, judge)  # its .tolist() calls wait for a GPU's kernels
        forwards = self.head_forwards - before
        # the head's price learns from the clock under greedy decoding, on steps whose catch-up is a usual one
        # (a step's root and accepted tokens, not the prompt or the rows of a run of plain steps)
        if judge.learn_head and catch_up <= self.topk:
            judge.record_draft(1e3 * (time.perf_counter() - start), forwards)
        # the step's drafting at the head's price (no clock: see the module doc); the verdict teaches the
        # calibration (each verified node's head probability), the expected saving whether drafting pays
        tree, size, carry = dynamic_tree.judged(root, nodes, judge, judge.head_ms * forwards)
        return Proposal(tree, info=self.budget.info(size), carry=carry, features=True)

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
                    head_forwards=self.head_forwards, head_rows=self.head_rows)
