"""Draft-model speculative decoding: a small draft proposes gamma tokens, the target checks them in one forward.

Leviathan, Kalman & Matias 2023 ("Fast Inference from Transformers via Speculative Decoding") and Chen et al.
2023 ("Accelerating Large Language Model Decoding with Speculative Sampling"). The KV-cache handling follows
the four scenarios of Clay's note "Implementation Notes on Integrating Speculative Decoding with KV Cache":

1. first step: both caches are empty. The draft prefills the prompt as its first draft forward, and the
   target's first forward is prompt + drafts: prefill and first verification are one forward (as in HF's
   assisted generation), so accept_lengths[0] counts the accepted drafts + 1.
2. k < gamma drafts accepted: both caches are rolled back to the committed tokens minus the last one (the
   target's own token, which nobody has fed yet); next step each model's input starts with that one token.
3. all gamma accepted: the draft never fed its last draft, so it is two tokens behind: its next input is
   [last draft, bonus token] (the target's is still one token).
4. EOS inside the accepted run, or max_new_tokens reached: the step's tokens are cut by `Request.trim`.
   No step drafts more than can be emitted: gamma_eff = min(gamma, remaining - 1), since the step adds
   gamma_eff + 1 tokens at most.

Notation (package docstring): p target, q draft, both warped by temperature/top-k/top-p (sampling.probs).
One step, committed = prompt + output so far, g = gamma_eff:
    draft:  feed committed[d:] (1 or 2 tokens; the prompt on step 1), then its own drafts one at a time:
            x_1..x_g, x_i = argmax q_i or x_i ~ q_i                       (g draft forwards)
    target: ONE forward of committed[t:] + [x_1..x_g]; its last g + 1 rows are p_1..p_{g+1}
    verify: greedy: accept x_i while x_i == argmax p_i, then add argmax p_{k+1};
            sampling: accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection draw
            from norm(max(p_i - q_i, 0)); when all g are accepted draw the bonus from p_{g+1}.
    commit: the loop compacts the target's cache; `observe` rolls the draft's back (`TrackedCache.commit`).
The draft and the verdict are the proposer's and verify.py's: this module is `propose` (draft g tokens, with
q when sampling) and `observe` (draft-cache rollback, the adaptive schedule). The target's side (one forward,
greedy walk or the speculative-sampling rule verify.speculative_chain, the commit) is the one loop's. The rule
emits every token with probability exactly p (Leviathan et al., Appendix A.1): the contract test checks it
against an exact enumeration, with a negative control.

Draft budget from this machine (mechanisms/budget.py): gamma="auto" picks, each step, the gamma in
0..16 (0: a plain step, where no draft pays; a draft is probed again every 16 such steps) maximising
E[tokens | gamma] / (gamma x t_draft(1) + t_target(gamma + 1)), E from the per-depth acceptance
counted online, t_draft and t_target the two models' forward costs measured here once (cached per device +
model + dtype; `costs=` / `draft_costs=` inject them). A draft forward in the loop costs more than the curve's
(its cache's bookkeeping, the rollback, Python: on SmolLM2's draft on a CPU ~5-7 ms against 4.3, enough to make
g = 2 look 5 % faster than plain when it was slower), so t_draft(1) is corrected online to what this
generation's one- and two-token draft forwards took (an average moving at DRAFT_MS_RATE), plus the rollback's
time per drafted step, under greedy decoding (under sampling a seed must reproduce its tokens, so the choices may
not follow the machine's speed); injected draft_costs are taken as given (tests, what-ifs). adaptive=True is HF's
heuristic instead (+2 after a full acceptance, -1 otherwise, blind to costs); the two exclude each other.

A tree (topk > 1; an extension beyond the two papers, as SpecInfer and EAGLE-2 draft): one chain spends every
draft forward on the draft's argmax, and a weak draft's second choice is often the target's token. With topk = k,
each draft forward expands the k likeliest frontier nodes at once (their rows see the committed text, their
ancestors' rows and their own: a tree mask over the draft's DynamicCache), each giving its k likeliest children,
and the target verifies the best nodes in ONE forward with the tree mask (EAGLE-2's expansion and rerank,
mechanisms/dynamic_tree.py, here with the draft model in the head's place):
    draft:  feed committed[d:] (the root and last step's accepted tokens: one forward, the root's children),
            then one forward per further depth (at most `depth`); scores: cumulative draft log-probs
    target: ONE forward of the root + the kept nodes (gamma of them, or "auto") with the tree mask
    commit: the draft's cache is cut back to the committed text (its tree rows are dropped, nothing re-rotated):
            next step's catch-up feeds the accepted tokens
A forward of k rows costs a draft little more than one row (the weights are read once: SmolLM2's draft, 4 rows
at 1.3x one on a 2-core CPU without AVX2), so a tree drafts k x the tokens for about the chain's forwards. gamma is then the number of nodes verified; "auto" is EAGLE's confidence budget
(mechanisms/confidence.py: the draft's probabilities, calibrated against the target's verdicts, decide how deep
to draft and how many nodes to verify, a draft forward priced as measured here). The tree is a deterministic
function of the committed text (top-k, no coin), so under sampling the loop's tree walk keeps the output exactly
p (verify.walk_tree; no q, no speculative-sampling rule, a little lower acceptance than the rule would give).

Simplifications: batch size 1; draft and target on one device and sharing a tokenizer; no confidence-based
early stop of a chain (HF's assistant_confidence_threshold; a tree stops where its confidence says); a chain
stops drafting at EOS (nothing after it can be emitted; a tree may draft past one: the loop's EOS cut drops
what follows it); the adaptive schedule is HF's "heuristic" one; a tree's draft rows of accepted nodes are
re-fed next step rather than compacted (kv_cache.compact would keep them: the catch-up is one forward anyway).
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
    measured costs; costs=/draft_costs= inject them). adaptive: HF's heuristic schedule (a chain's). topk: 1, or
    the children per expanded node and nodes expanded per depth of a tree; depth: a tree's deepest draft."""

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
        if self.tree:  # the draft's tree rows: its attention backend's mask, in its dtype
            self.backend = getattr(req.draft.config, "_attn_implementation", None) or "sdpa"
            self.dtype = next(req.draft.parameters()).dtype
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
        judge = self.budget.chooser  # a ConfidenceBudget under "auto", else None
        if max_depth < 1 or (judge is not None and not judge.drafting(len(committed))):
            return Proposal(DraftTree(root), info=self.budget.info(0))  # a plain step: the draft catches up later
        start, before = time.perf_counter(), self.draft_forwards
        feed = committed[len(self.draft.tokens):]  # the root and last step's accepted tokens (the prompt on step 1)
        logp, toks = dynamic_tree.top_children(self.draft.feed(feed), self.topk)  # (1, topk) each: the root's
        self.draft_forwards += 1
        nodes = dynamic_tree.grow((logp[0].tolist(), toks[0].tolist()), self._tree_forward(),
                                  min(self.depth, max_depth), self.topk, 0 if judge else self.gamma, judge)
        kv_cache.rollback(self.draft.cache, len(self.draft.tokens))  # the tree rows go; the committed text stays
        if judge is None:
            order = dynamic_tree.kept(nodes, self.gamma)
            return Proposal(dynamic_tree.to_tree(root, nodes, order), info=self.budget.info(self.gamma))
        forwards = self.draft_forwards - before
        if judge.learn_head and len(feed) <= self.depth + 1:  # a usual catch-up (not the prompt, not plain steps')
            judge.record_draft(1e3 * (time.perf_counter() - start), forwards)
        # the verdict teaches the calibration (each verified node's draft probability), the expected saving
        # whether drafting pays
        tree, size, carry = dynamic_tree.judged(root, nodes, judge, judge.head_ms * forwards)
        return Proposal(tree, info=self.budget.info(size), carry=carry)

    def _tree_forward(self):
        """dynamic_tree.grow's forward: one draft forward of a depth's expanded nodes after the committed text."""
        c, device = len(self.draft.tokens), self.draft.device  # the cache holds committed[:c], the root last

        def forward(expand, nodes, sees, d):
            rows, kv = sees.shape  # a row sees the committed text, its ancestors' rows and its own
            mod = masks.or_masks(masks.prefix(c), masks.visible(sees, 0, c, device))
            mask = masks.render(mod, rows, c + kv, self.backend, self.dtype, device)  # (1, 1, E, c + kv)
            ids = torch.tensor([[nodes[i][2] for i in expand]], device=device)  # (1, E)
            pos = torch.full((1, rows), c - 1 + d, device=device)  # a depth-d node sits d after the root
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
