"""Draft-model speculative decoding: a small draft proposes gamma tokens, the target checks them in one forward.

Leviathan, Kalman & Matias 2023 ("Fast Inference from Transformers via Speculative Decoding") and Chen et al.
2023 ("Accelerating Large Language Model Decoding with Speculative Sampling"). This module is the proposer:
`propose` drafts g = min(gamma, tokens left - 1) tokens one draft forward each (x_i = argmax q_i, or x_i ~ q_i
with q kept), `observe` rolls the draft's cache back. The target's ONE forward over the drafts, the verdict
(greedy: accept while x_i = argmax p_i; sampling: verify.speculative_chain accepts x_i with probability
min(1, p_i(x_i) / q_i(x_i)), draws from norm(max(p_i - q_i, 0)) at the first rejection, the bonus from p_{g+1};
every token has probability exactly p, Appendix A.1) and the commit are the loop's.
KV caches follow the four scenarios of Clay's note "Implementation Notes on Integrating Speculative Decoding with
KV Cache": (1) first step: the draft prefills the prompt as its first draft forward, the target's prefill is its
first verification (accept_lengths[0] counts the accepted drafts + 1); (2) k < g accepted: both caches roll back
to the committed text but its last token, which each model is fed next; (3) all g accepted: the draft never fed
its last draft, so it is fed [last draft, bonus]; (4) EOS or max_new_tokens inside the run: `Request.trim`.

A tree (topk > 1, beyond the two papers, as SpecInfer and EAGLE-2 draft): each draft forward expands the k
likeliest frontier nodes at once under a tree mask, and the target verifies the best nodes in one forward
(mechanisms/dynamic_tree.py, the draft model in EAGLE's head's place). k rows cost a draft forward little more
than one (the weights are read once), so a tree drafts k x the tokens for about a chain's forwards. The tree is a
deterministic function of the committed text: the loop's tree walk keeps sampling exact (verify.walk_tree, no q).
gamma="auto" picks the budget from this machine's costs (mechanisms/budget/; the class doc says how).

Left out: batch size > 1; a draft on another device or tokenizer; a chain's confidence-based early stop (HF's
assistant_confidence_threshold); adaptive schedules other than HF's "heuristic"; compacting a tree's accepted
draft rows (they are re-fed next step: the catch-up is one forward anyway).
"""
from __future__ import annotations

import time

import torch

from .. import compat
from ..env import check_int
from ..loop import LoopState, Proposal, Proposer, register_proposer
from ..mechanisms import dynamic_tree, kv_cache, masks
from ..mechanisms.budget import Budget, ChainBudget, ConfidenceBudget
from ..mechanisms.draft_tree import DraftTree
from ..mechanisms.kv_cache import TrackedCache
from ..sampling import probs, sample


AUTO_MAX_GAMMA = 16  # gamma="auto" picks 1..16 drafts per step
TREE_LADDER = (0, 1, 2, 4, 6, 8, 12, 16, 24, 32)  # a tree's gamma="auto" (nodes verified) picks among these
TREE_DEPTH = 8  # a tree's deepest draft, unless depth= says
DRAFT_MS_RATE = 0.2  # gamma="auto": how fast the draft-forward and rollback estimates move to what they took


@register_proposer("draft_model", needs_draft=True)
class DraftModel(Proposer):
    """Draft-model speculative decoding: a chain of gamma drafts (topk=1, the papers'), or the draft's dynamic
    tree (topk > 1); one-forward verification, draft-cache rollback.

    gamma: drafted tokens verified per step (a chain's length, a tree's nodes), an int >= 1, or "auto" (from the
    measured costs; costs=/draft_costs= inject them). adaptive: HF's heuristic schedule for a chain's gamma (+2
    after a full acceptance, -1 otherwise, blind to costs; not with "auto"). topk: 1, or the children per expanded
    node and nodes expanded per depth of a tree; depth: a tree's deepest draft.

    gamma="auto", a chain (budget.ChainBudget): each step the g in 0..AUTO_MAX_GAMMA (0: a plain step; a draft is
    probed again later) maximising E[tokens | g] / (g x t_draft(1) + t_target(g + 1)), E from the per-depth
    acceptance counted online, t_draft and t_target the two models' forward costs measured here once (cached per
    device + model + dtype). A draft forward in the loop costs more than its curve's (cache bookkeeping, the
    rollback, Python), so under greedy decoding t_draft(1) and the rollback move to what this generation's draft
    forwards took (DRAFT_MS_RATE); under sampling, or when injected, they stay put (a seed must reproduce its
    tokens, whatever the machine's speed). A tree: EAGLE-2's confidence budget (budget.ConfidenceBudget: the
    draft's probabilities, calibrated against the verdicts, decide how deep to draft and which TREE_LADDER size to
    verify, a draft forward priced as timed here)."""

    def __init__(self, gamma: int | str = "auto", adaptive: bool = False, costs=None, draft_costs=None,
                 topk: int = 1, depth: int | None = None):
        self.budget = Budget("gamma", gamma, 1, costs=costs, draft_costs=draft_costs)
        self.timed = draft_costs is None  # injected draft costs are not corrected by timings
        self.gamma = self.budget.value
        if not isinstance(adaptive, bool):
            raise TypeError(f"adaptive must be True or False, got {adaptive!r}")
        if adaptive and self.budget.auto:
            raise ValueError("gamma='auto' and adaptive=True are two schedules for one gamma: pick one (adaptive=True "
                             "starts from an int gamma, e.g. gamma=4)")
        self.topk = check_int("topk", topk, 1)
        if self.topk == 1 and depth is not None:
            raise ValueError("depth is read only for a tree (topk > 1): a chain's depth is gamma")
        if self.topk > 1 and adaptive:
            raise ValueError("adaptive=True is HF's schedule for a chain's gamma: use it with topk=1")
        self.depth = TREE_DEPTH if depth is None and self.topk > 1 else depth
        if self.depth is not None:
            check_int("depth", self.depth, 1)
        self.adaptive = adaptive
        # as set: the adaptive schedule moves self.gamma
        self.config = dict(gamma=self.gamma, adaptive=adaptive, topk=self.topk, depth=self.depth)

    @property
    def tree(self) -> bool:
        return self.topk > 1

    def start(self, state: LoopState) -> None:
        self.draft = TrackedCache(state.request.draft)
        self.sampling, self.generator = state.request.sampling, state.request.generator
        self.eos = state.request.eos_token_id
        self.draft_forwards = 0
        req = state.request  # g draft forwards of one row each, then the target's g + 1 rows
        # per drafted step: g forwards + the rollback (`observe`), both re-estimated from this generation's timings
        self.forward_ms = self.budget.curve(req.draft, name="draft_costs").at(0)(1) if self.budget.auto else 0.0
        self.rollback_ms = 0.0
        if self.tree:  # the draft's tree rows: its attention backend's mask, in its dtype, per attention kind
            self.backend = getattr(req.draft.config, "_attn_implementation", None) or "sdpa"
            self.dtype = next(req.draft.parameters()).dtype
            self.layers = compat.attention_layers(req.draft.config)
            learn = self.timed and req.sampling.greedy  # no clock under sampling: a seed's draws are fixed
            self.budget.start(req, lambda curve: ConfidenceBudget(curve, TREE_LADDER, self.forward_ms,
                                                                  len(state.committed), learn_head=learn))
        else:
            self.budget.start(req, lambda curve: ChainBudget(curve, max_len=AUTO_MAX_GAMMA, draft_ms=self.drafting_ms))

    def drafting_ms(self, g: int) -> float:
        """What drafting g tokens is expected to cost this step (ms): g draft forwards and the rollback."""
        return g * self.forward_ms + self.rollback_ms if g else 0.0

    def _learn(self, name: str, ms: float) -> None:
        # not under sampling: the draws would follow the machine's speed, and a seed must reproduce its tokens
        if self.timed and self.budget.auto and self.sampling.greedy:
            setattr(self, name, getattr(self, name) + DRAFT_MS_RATE * (ms - getattr(self, name)))

    def propose(self, state: LoopState, max_depth: int) -> Proposal:
        if self.tree:
            return self._propose_tree(state, max_depth)
        gamma = self.gamma if self.adaptive else self.budget.choose(len(state.committed), max_depth)
        g = min(gamma, max_depth)  # the step adds g + 1 tokens at most
        drafts, q_rows = [], []
        feed = state.committed[len(self.draft.tokens):]  # 1 token, 2 after a full acceptance, the prompt on step 1
        for _ in range(g):
            start, fed = time.perf_counter(), len(feed)
            logits = self.draft.feed(feed)[-1]  # (V,)
            self.draft_forwards += 1
            if self.sampling.greedy:
                x = int(logits.argmax())  # reads the logits: the forward has finished (a GPU too)
            else:
                q_rows.append(probs(logits, self.sampling))  # q_i, (V,)
                x = sample(q_rows[-1], self.generator)
            if fed <= 2:  # a catch-up after plain steps (or the prompt) is not a drafting forward's cost
                self._learn("forward_ms", 1e3 * (time.perf_counter() - start))
            drafts.append(x)
            feed = [x]
            if x == self.eos:  # nothing after an EOS can be emitted
                break
        q = torch.stack(q_rows) if q_rows else None  # (g, V)
        return Proposal(DraftTree.chain(state.committed[-1], drafts), q=q, info=self.budget.info(g))

    # ---- the tree (topk > 1) ------------------------------------------------------------------------------

    def _propose_tree(self, state: LoopState, max_depth: int) -> Proposal:
        """The draft's dynamic tree (module doc, "A tree"): catch up, grow, keep the best, drop the tree rows."""
        committed, root = state.committed, state.committed[-1]
        # "auto": 0 when drafting does not pay here (a plain step: the draft catches up later); fixed: gamma
        if max_depth < 1 or self.budget.choose(len(committed)) == 0:
            return Proposal(DraftTree(root), info=self.budget.info(0))
        start, before = time.perf_counter(), self.draft_forwards
        feed = committed[len(self.draft.tokens):]  # the root and last step's accepted tokens (the prompt on step 1)
        logp, toks = dynamic_tree.top_children(self.draft.feed(feed), self.topk)  # (1, topk) each: the root's
        self.draft_forwards += 1
        nodes = self.budget.grow((logp[0].tolist(), toks[0].tolist()), self._tree_forward(),
                                 min(self.depth, max_depth), self.topk)
        kv_cache.rollback(self.draft.cache, len(self.draft.tokens))  # the tree rows go; the committed text stays
        forwards = self.draft_forwards - before
        if len(feed) <= self.depth + 1:  # a usual catch-up (not the prompt, not plain steps')
            self.budget.record_draft(1e3 * (time.perf_counter() - start), forwards)
        # under "auto" the verdict teaches the calibration (each verified node's draft probability), the expected
        # saving whether drafting pays
        tree, size, carry = self.budget.keep(root, nodes, forwards)
        return Proposal(tree, info=self.budget.info(size), carry=carry)

    def _tree_forward(self):
        """dynamic_tree.grow's forward: one draft forward of a depth's expanded nodes after the committed text."""
        c, device = len(self.draft.tokens), self.draft.device  # the cache holds committed[:c], the root last
        fed = []  # the logical positions of the tree rows in the cache, in cache order (a sliding window reads them)

        def forward(expand, nodes, sees, d):
            rows, kv = sees.shape  # a row sees the committed text, its ancestors' rows and its own
            fed.extend([c - 1 + d] * rows)  # a depth-d node sits d after the root
            mod = masks.or_masks(masks.prefix(c), masks.visible(sees, 0, c, device))
            window = masks.window(fed[-rows:], self.layers.window, c, fed, device) if self.layers.sliding else None
            mask = masks.render_layers(mod, rows, c + kv, self.layers, window, self.backend, self.dtype,
                                       device)  # (1, 1, E, c + kv) (one per attention kind with sliding layers)
            ids = torch.tensor([[nodes[i][2] for i in expand]], device=device)  # (1, E)
            pos = torch.full((1, rows), c - 1 + d, device=device)
            logits = compat.forward(self.draft.model, input_ids=ids, position_ids=pos, attention_mask=mask,
                                    cache=self.draft.cache, use_cache=True).logits[0]  # (E, V)
            self.draft_forwards += 1
            return dynamic_tree.top_children(logits, self.topk)
        return forward

    def observe(self, state: LoopState, verdict) -> None:
        drafted = len(verdict.proposal.tree)
        start = time.perf_counter()
        self.draft.commit(state.committed)
        if drafted and not self.tree:
            self._learn("rollback_ms", 1e3 * (time.perf_counter() - start))
        if state.debug:
            self.draft.check(state.committed, "draft")
        self.budget.record(verdict)
        if self.adaptive and drafted:  # HF's "heuristic" schedule
            self.gamma = self.gamma + 2 if len(verdict.accepted) == drafted else max(1, self.gamma - 1)

    def stats(self) -> dict:
        return dict(config=dict(self.config), **self.budget.stats(),
                    draft_forwards=self.draft_forwards)
