"""EAGLE-2: a feature-level head drafts a dynamic tree, the target verifies it in one forward (a loop proposer).

Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty" (the head: models/
eagle_head.py) and "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees" (the tree). One step,
the root c_T at position T (committed, not yet in the target's cache), the head's cache holding rows 0..T-2:

1. catch up: feed the head (f_t, embed(c_{t+1})) for the root and last step's accepted tokens (the whole prompt
   on step 2), features the last verify forward computed; its last row predicts f^_T, which the target's LM head
   reads: the root's `topk` children (depth 1), each scored by its log-prob.
2. expand: per depth d, the `topk` nodes with the best cumulative log-prob (an estimate of the chance the target
   accepts the path) each get a head row (f^ of their parent's row, embed(token)) at position T + d - 1 under a
   tree mask, each giving `topk` children; a node below the `budget`-th best score is not expanded.
3. rerank: the `budget` best nodes (a tree: a child never scores above its parent), verified in ONE target
   forward with the tree mask (verify.py). Steps 2-3 are mechanisms/dynamic_tree.py.
4. observe: the verify forward's rows hold the target's hidden states of the root and accepted nodes
   (verify.RowLogits.hidden): the next catch-up's features, with no extra target pass. The head's cache drops the
   tree rows (HeadKV.crop). Step 1, with no features yet, is a plain step keeping the prompt's (Proposal.features).
The drafts are a deterministic function of the committed text, so the tree walk is lossless under greedy decoding
and sampling alike (verify.walk_tree). budget="auto": the head's calibrated confidence picks each step's depth and
size on this machine's cost curve, or a plain step where drafting does not pay (mechanisms/budget/confidence.py;
the class doc says how a head forward is priced).

Left out: EAGLE's recursive rejection sampling (sampling verifies the greedy top-k tree by the walk: lossless, a
little lower acceptance); a head forward's price depending on its rows; batch size > 1. The head reads normed
features; the families it runs on and its full-width attention: models/eagle_head.py.
"""
from __future__ import annotations

import time

import torch

from ..env import check_int, median_ms
from ..models.eagle_head import EagleHead, HeadKV, decode_problem, head_for
from ..loop import LoopState, Proposal, Proposer, register_proposer
from ..mechanisms.budget import Budget
from ..mechanisms.budget.confidence import ConfidenceBudget
from ..mechanisms.budget.cost_curve import estimated_ms, estimating
from ..mechanisms import dynamic_tree, verify
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
        with torch.inference_mode():
            ids = torch.zeros(prefix + rows, dtype=torch.long, device=device)
            feats = torch.zeros(prefix + rows, d, dtype=dtype, device=device)  # (P + R, d)
            causal = torch.ones(prefix, prefix, dtype=torch.bool, device=device).tril()  # (P, P)
            head.decode(feats[:prefix], embed(ids[:prefix]), list(range(prefix)), causal, kv)
            sees = torch.ones(rows, prefix + rows, dtype=torch.bool, device=device)  # (R, P + R)

            def depth():  # one drafted depth: the head's rows, then the target's LM head over them
                out = head.decode(feats[prefix:], embed(ids[prefix:]), list(range(prefix, prefix + rows)), sees, kv)
                head.logits(target, out)[0].float().topk(8, dim=-1)
            # the head's cache cut back to the prefix before each call, outside the timed region
            _HEAD_MS[key] = median_ms(depth, repeats, device, warmup=0, setup=lambda: kv.crop(prefix))
    return _HEAD_MS[key]


@register_proposer("eagle")
class Eagle(Proposer):
    """EAGLE-2: a head reading the target's last hidden state drafts a dynamic tree (top-k expansion, rerank).

    budget: tree nodes verified per step (an int, or "auto" from the cost curve); topk: children per expanded
    node and nodes expanded per depth; depth: draft depth; head: an EagleHead (default: the one trained for the
    target, eagle_head.head_for); costs, head_ms: the target's cost curve and one head forward's ms, read under
    "auto" (None: measured here).

    Under "auto" a head forward's price starts at its time measured once per head and target (head_forward_ms),
    then, under greedy decoding, moves to what drafting took per forward (the Python work of growing and ranking
    the tree included); under sampling, or injected, it stays put: a seed's draws never follow the machine's
    speed."""

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
        family = getattr(req.target.config, "model_type", type(req.target).__name__)

        def refuse(why: str) -> ValueError:
            return ValueError(f"'eagle' cannot decode with a {family} target: {why}: use 'draft_model' with a small "
                              f"{family} draft, or 'cacheback' (no draft) instead")
        if verify.output_head(req.target) is None:  # refused before the head is looked for
            known = sorted(verify.PLAIN_HEAD_MODELS | verify.SOFTCAPPED_HEAD_MODELS)
            raise refuse(f"its head drafts features that the target's output layer reads, and {family}'s logits "
                         f"are not a function of its final hidden state this library knows (those of {known} are)")
        # a head is one decoder layer of its target's family (EagleHead.for_target: its last layer), which the
        # written-out decode must know (eagle_head.layer_layout)
        problem = decode_problem(self.head.layer if self.head is not None else req.target.model.layers[-1])
        if problem:
            raise refuse(problem)
        head = self.head if self.head is not None else head_for(req.target)
        try:
            head.check_decodable()  # its final norm too (read once per head)
        except ValueError as error:
            raise refuse(str(error)) from None
        if head.config.hidden_size != req.target.config.hidden_size:
            raise ValueError(f"the head's width {head.config.hidden_size} is not the target's "
                             f"{req.target.config.hidden_size}")
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

    def _draft(self, committed: list[int], max_depth: int) -> list[dynamic_tree.Node]:
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
        return self.budget.grow((logp[0].tolist(), toks[0].tolist()), forward, min(self.depth, max_depth), self.topk)

    def propose(self, state: LoopState, max_depth: int) -> Proposal:
        root = state.committed[-1]
        if not self.pending or max_depth < 1:  # step 1 (no features yet), or nothing more can be emitted
            return Proposal(DraftTree(root), features=True)
        if self.budget.choose(len(state.committed)) == 0:  # "auto": drafting does not pay here (probes later)
            return Proposal(DraftTree(root), info=self.budget.info(0), features=True)
        start, before, catch_up = time.perf_counter(), self.head_forwards, len(self.pending)
        nodes = self._draft(state.committed, max_depth)  # its .tolist() calls wait for a GPU's kernels
        forwards = self.head_forwards - before
        # under "auto" the head's price learns from the clock under greedy decoding, on steps whose catch-up is a
        # usual one (a step's root and accepted tokens, not the prompt or the rows of a run of plain steps)
        if catch_up <= self.topk:
            self.budget.record_draft(1e3 * (time.perf_counter() - start), forwards)
        # the step's drafting at the head's price (no clock: see the class doc); the verdict teaches the
        # calibration (each verified node's head probability), the expected saving whether drafting pays
        tree, size, carry = self.budget.keep(root, nodes, forwards)
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
