"""CARD: parallel query-and-correct (Zhou et al., "A Cache-Assisted Parallel Speculative Decoding Framework
via Query-and-Correct Paradigm", §2): the target's side. The drafter's width-K tree, the query (greedy descent,
or a chain drawn from q: why that is lossless) and the correction are mechanisms/card/tree.py; the drafters that
grow it beside the target (`mode` "sync", "thread", "process") are mechanisms/card/drafter.py and process.py.

    start:   a drafter of `mode` from the prompt (the first layer feeds it to the draft)
    propose: wait until the tree is ready, query ONE chain from it; the loop verifies it as a chain
    observe: hand the drafter the correction (hit: prune to the subtree; miss: reset from the correct token)

Ready: `ratio` layers since the last query and a tree at least `ratio` deep (on the first step and after a miss
the target waits for the drafter), or a tree the drafter cannot grow (at `draft_depth`). A chain is at most
draft_depth - 1 deep, so a fully accepted chain's bonus can be a hit; `finish` closes the drafter on every exit.

Budgets: `query` caps the chain ("auto": budget.ChainBudget, drafting counted as free: the drafter works anyway).
width="auto" drafts with AUTO_WIDTH only while a drafted step, MEASURED from propose to observe (drafter layers,
tree bookkeeping, what the drafter beside it slows the target: nothing a curve of target forwards prices), yields
more per unit of time than a plain step; else the target decodes plainly and probes the drafter now and then
(budget.SideBudget). K itself is never chosen: the hit rate another K would have had cannot be read off a step.

Beyond the paper: `tree=N` verifies the drafter's N best nodes in one tree forward instead of one chain (its
runner-up children are already grown; the tree is a deterministic function of the drafter's, so the loop's walk
stays exactly lossless). Ablation `correction=False` (sync mode; Table 2's "+ Cache (query but don't correct)").
Simplifications: the paper's two processes on two GPUs are two processes on one CPU, threads, or one process
(sync), or a GPU target beside a CPU drafter (`draft_device="cpu"`) or a second stream (thread mode, draft on the
GPU); a tree's size is fixed; batch size 1.
"""
from __future__ import annotations

import copy
import time
import weakref

import torch

from ..env import check_int
from ..loop import LoopState, Proposal, Proposer, register_proposer
from ..mechanisms.budget import Budget, ChainBudget, SideBudget, is_auto
from ..mechanisms.budget.cost_curve import reach
from ..mechanisms.card.drafter import WORKER_NAME, SyncDrafter, ThreadDrafter, growable
from ..mechanisms.card.process import DrafterProcess
from ..mechanisms.draft_tree import ROOT, DraftTree

__all__ = ["Card", "MODES", "WORKER_NAME", "draft_on"]

MODES = ("sync", "thread", "process")
WAIT_S = 120.0  # the longest propose waits for the drafter / finish waits for the worker to stop
DRAFT_DEVICES = (None, "cpu")
AUTO_WIDTH = 8  # width="auto": this width while drafting pays, else plain steps
PROBE_STEPS, PROBE_EVERY = 2, 64  # width="auto": drafted steps judged at first and per probe; plain steps per probe
PLAIN_KEEP = 5  # width="auto": a plain step is priced at the fastest of the last PLAIN_KEEP timed ones
REFERENCE_EVERY = 32  # width="auto": drafted steps in a row before a plain one is timed again
PLAIN_FIRST = 2  # width="auto" on a measured curve: plain steps timed before the first drafted one
_DRAFT_COPIES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # draft -> its CPU copy


def draft_on(draft, device: str | None):
    """The draft itself (device None, or already there), else its float32 copy on `device`, made once per draft."""
    if device is None or next(draft.parameters()).device.type == device:
        return draft
    if draft not in _DRAFT_COPIES:
        _DRAFT_COPIES[draft] = copy.deepcopy(draft).to(device=device, dtype=torch.float32).eval()
    return _DRAFT_COPIES[draft]


@register_proposer("card", needs_draft=True)
class Card(Proposer):
    """CARD (query-and-correct): a width-K draft tree grown in parallel, one chain verified per step.

    width: K, or "auto": AUTO_WIDTH while drafting pays. Every drafted step records what it yielded and what it
    took (propose to observe, plus the last correction) against one token per plain step's time: the fastest of
    this generation's last PLAIN_KEEP plain steps (the loop's Python work and the verdict included; one slow step
    among the few timed would otherwise price every later one too high, and weak drafting would run on against it).
    On a measured curve the first PLAIN_FIRST steps after the prompt's are plain and timed before anything drafts
    (a curve measured while the machine was busier prices a plain step too high, and weak drafting would look as
    if it paid), and a plain step is timed again after REFERENCE_EVERY drafted steps in a row. On an injected or
    estimated curve (taken as given) its t(1) stands in until a plain step is timed.
    When drafting loses the drafter is left as it is; every PROBE_EVERY plain steps it is
    corrected to the committed text (a miss: it restarts there) and tried for PROBE_STEPS steps. The ablation
    (correction=False) always drafts: it never corrects the drafter, so it could not restart it.
    ratio: layers per query (sync mode grows them right after the query, where they would run beside the target's
    verify). mode: "sync", "thread" or "process". draft_depth: the drafter's depth limit ahead of the root.
    query: the chain's cap (None: draft_depth - 1; "auto": from the cost curve, `costs=` injects one).
    tree: the target verifies the drafter's N best nodes by cumulative score (card.tree.ScoredTree.query_tree, at
    most draft_depth - 1 deep) with the tree mask, as EAGLE and draft_model's tree do; the correction is the same.
    correction=False (sync mode only): the target queries the tree but never corrects the drafter, which keeps
    growing from the old root; the target descends from the node spelling the committed text (`anchor`), and after
    a miss verifies nothing but its own next token until the drafter, at draft_depth, restarts from the text.
    draft_device="cpu" (thread or process mode): the paper's second GPU, on a machine with one GPU, as the CPU
    cores beside it: the drafter works on a float32 copy of the draft (`draft_on`, made once per draft model), and
    a sampled chain's q rows travel to the target's device.

    Threads: beside a CPU target the drafter gets one intra-op thread, and the target one too in thread mode
    (torch.set_num_threads is process-global: set in start, restored when the drafter closes) or the rest in
    process mode (at least one); a GPU target keeps the CPU threads it had, and a CPU drafter thread gets as many.
    A drafter process always runs one thread (a forked child's OpenMP deadlocks otherwise: mechanisms/card/process).

    Per-step info: card_nodes (tree size at the query), card_layers (layers since the previous query), hit (in
    process mode as the parent's copy of the tree says), draft_size (the query's cap). stats(): hit rate, draft
    layers, config, and in thread and process modes the busy intervals (perf_counter start/end of each draft
    forward and of each target step = propose's return to observe's call) for a Gantt / overlap figure
    (bench/timeline.py); thread mode also counts the layers discarded by a correction."""

    def __init__(self, width: int | str = "auto", ratio: int = 2, mode: str = "sync", draft_depth: int = 12,
                 correction: bool = True, query: int | str | None = None, costs=None,
                 draft_device: str | None = None, tree: int | None = None):
        if draft_device not in DRAFT_DEVICES:
            raise ValueError(f"draft_device must be one of {DRAFT_DEVICES} (None: the draft's own device), "
                             f"got {draft_device!r}")
        if draft_device is not None and mode == "sync":
            raise ValueError("draft_device='cpu' moves the drafter beside the target: use mode='thread' or 'process'")
        self.draft_device = draft_device
        self.width_auto = is_auto(width)
        self.width = AUTO_WIDTH if self.width_auto else check_int("width", width, 1)
        self.budget = Budget("query", query, 1, optional=True, shared=self.width_auto, costs=costs)
        self.query = self.budget.value
        self.ratio = check_int("ratio", ratio, 1)
        self.draft_depth = check_int("draft_depth", draft_depth, 1)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        if not isinstance(correction, bool):
            raise TypeError(f"correction must be True or False, got {correction!r}")
        if not correction and mode != "sync":
            raise ValueError("correction=False (the Table 2 ablation) runs in mode='sync' only")
        self.correction = correction
        self.tree = None if tree is None else check_int("tree", tree, 1)
        if self.tree is not None and query is not None:
            raise ValueError("tree= and query= are two budgets for one verify (nodes of a tree, a chain's length): "
                             "pick one")
        if self.tree is not None and not correction:
            raise ValueError("tree= verifies the drafter's tree from its root: the ablation (correction=False) "
                             "queries chains from a moving anchor")
        self.drafter = None

    # ---- lifecycle --------------------------------------------------------------------------------------

    def start(self, state: LoopState) -> None:
        req = state.request
        self.sampling, self.generator = req.sampling, req.generator
        self.hits, self.misses = 0, 0
        self.target_busy: list[tuple[float, float]] = []
        self._t_query = None
        self.anchor = ROOT  # where queries start: the node spelling committed[-1] (None: the text left the tree)
        # the target's curve, read (or measured once) before the drafter starts
        self.budget.start(req, lambda curve: ChainBudget(curve, max_len=max(1, self.draft_depth - 1)))
        self.target_device = req.input_ids.device
        draft, committed = draft_on(req.draft, self.draft_device), state.committed
        self.side, self.drafting, self.plain_steps, self._prefill = None, True, 0, True
        # drafted steps (measured) against plain ones (timed here): the module doc; the ablation never
        # corrects the drafter, so it cannot restart it: it always drafts
        if self.width_auto and self.correction:
            # a drafted step's verdict is clear after a few steps (no window to fill first), and each probe restarts
            # the drafter (its catch-up and first layers are paid again): short warm-up and probes, rare probes
            self.side = SideBudget(self.budget.curve(req.target, reach(req)), context=len(committed),
                                   warmup=PROBE_STEPS, probe_len=PROBE_STEPS, probe_every=PROBE_EVERY,
                                   horizon=req.max_new_tokens)
            self.side.affords = self.budget.affords  # the drafter's probes share the guard's one allowance
            self._t_propose, self._correct_ms, self._plain_times, self._drafted_run = None, 0.0, [], 0
        # plain steps still to time before drafting (none where the curve is injected or estimated: taken as given)
        self._untimed = PLAIN_FIRST if self.side is not None and self.budget.measured else 0
        # On a CPU both sides share the cores: one intra-op thread each. A GPU target needs few CPU threads:
        # it keeps what it has and a CPU drafter gets as many.
        cpu_target, threads = self.target_device.type == "cpu", torch.get_num_threads()
        if self.mode == "sync":
            self.drafter = SyncDrafter(draft, self.width, committed, self.draft_depth, self.ratio)
        elif self.mode == "thread":
            self.drafter = ThreadDrafter(draft, self.width, committed, self.draft_depth, WAIT_S,
                                         threads=1 if cpu_target else None)
        else:
            self.drafter = DrafterProcess(draft, self.width, committed, self.draft_depth,
                                          share_logits=not self.sampling.greedy, wait_s=WAIT_S,
                                          parent_threads=max(1, threads - 1) if cpu_target else None)

    def finish(self, state: LoopState) -> None:
        if self.drafter is not None:
            self.drafter.close()  # every exit: EOS, max_new_tokens, or an exception on either side

    # ---- the loop's hooks -------------------------------------------------------------------------------

    def _ready(self, tree, since_query: int) -> bool:
        """The target may query: `ratio` layers since the last query and a tree at least `ratio` deep (after a
        miss the target waits for the drafter), or a tree the drafter cannot grow (at draft_depth)."""
        deep_enough = tree.depth >= min(self.ratio, self.draft_depth)
        return not growable(tree, self.draft_depth) or (since_query >= self.ratio and deep_enough)

    def propose(self, state: LoopState, max_depth: int) -> Proposal:
        self._t_propose = time.perf_counter()
        # sync mode under width="auto": the prompt's step is plain, so the drafter's prefill of the prompt runs in
        # the first drafted step, where the warm-up's allowance counts it (it is what trying the draft costs)
        first = self._prefill and self.side is not None and self.mode == "sync"
        # time a plain step again (on a measured curve: an injected one is taken as given)
        reference = self.side is not None and self.budget.measured and self._drafted_run >= REFERENCE_EVERY
        if first or self._untimed or reference or (self.side is not None and
                                                   not self.side.choose(len(state.committed))):
            self.drafting = False  # a plain step; the drafter waits as it is
            self.plain_steps += 1
            info = dict(draft_size=0, card_nodes=0, card_layers=0, hit=None)
            return Proposal(DraftTree.chain(state.committed[-1], []), info=info, carry=dict(plain=True))
        if not self.drafting:  # back from plain steps: the drafter restarts from the committed text
            self.drafter.correct(state.committed)
            self.drafting = True
        # sync mode drafts only when a chain can still be emitted; the concurrent drafters are there anyway
        ready = self._ready if max_depth > 0 or self.mode != "sync" else None
        with self.drafter.query(ready, grow_after=max_depth > 0) as (tree, since):
            proposal = self._query(tree, since, state, max_depth)
        self._t_query = time.perf_counter()
        return proposal

    def _query(self, tree, since: int, state: LoopState, max_depth: int) -> Proposal:
        # at most draft_depth - 1 deep: the drafter's deepest layer then still holds the children of the chain's
        # last node, so a fully accepted chain's bonus token can be a hit (at draft_depth the drafter idles);
        # max_depth: the loop's cap, the deepest draft that can still be emitted
        limit = min(max_depth, max(1, self.draft_depth - 1))
        if limit > 0:
            query = self.budget.choose(len(state.committed), limit)
            limit = limit if query is None else min(limit, query)
        if self.tree is not None:  # the drafter's best nodes (an extension: the module doc)
            info = dict(draft_size=self.tree, card_nodes=len(tree), card_layers=since, hit=None)
            return Proposal(tree.query_tree(self.tree, limit), info=info)
        if not self.correction and self.anchor is None:  # a stale tree: nothing to query
            chain, q = [], None
        else:
            chain, q = tree.query(limit, self.sampling, self.generator, start=self.anchor)
        if q is not None and q.device != self.target_device:  # a CPU drafter beside a GPU target
            q = q.to(self.target_device)
        info = dict(**self.budget.info(limit), card_nodes=len(tree), card_layers=since, hit=None)
        return Proposal(DraftTree.chain(state.committed[-1], chain), q=q, info=info)

    def observe(self, state: LoopState, verdict) -> None:
        prefill, self._prefill = self._prefill, False  # the first step's time is the prompt's prefill: not a step's
        if verdict.proposal.carry.get("plain"):  # a plain step, as measured: what drafted steps are judged against
            if prefill:
                return
            took = 1e3 * (time.perf_counter() - self._t_propose)
            self._untimed, self._drafted_run = max(0, self._untimed - 1), 0
            self._plain_times = (self._plain_times + [took])[-PLAIN_KEEP:]
            return
        now = time.perf_counter()
        if self.side is not None and not prefill:  # this drafted step, as measured, against a plain one (1 token)
            took = 1e3 * (now - self._t_propose) + self._correct_ms
            plain_ms = self._plain_ms if self._plain_ms is not None else self.side.price(1)
            self.side.record(len(verdict.emitted), took, 1.0, plain_ms)
            self._drafted_run += 1
        self.target_busy.append((self._t_query, now))
        hit = self.drafter.correct(state.committed) if self.correction else self._follow(state.committed)
        self._correct_ms = 1e3 * (time.perf_counter() - now)
        verdict.proposal.info["hit"] = hit
        self.budget.record(verdict)
        self.hits += hit
        self.misses += not hit

    @property
    def _plain_ms(self) -> float | None:
        """ms of a plain step: the fastest of the last PLAIN_KEEP timed (None before one is)."""
        return min(self._plain_times) if self.side is not None and self._plain_times else None

    def _follow(self, committed: list[int]) -> bool:
        """No correction: only move the anchor along the tree; restart the drafter when it has nothing left."""
        tree = self.drafter.tree
        path, hit = tree.match(committed)
        self.anchor = path[-1] if hit and path[-1] < tree.fed else None  # a query needs the node's logits
        if not growable(tree, self.draft_depth):  # the drafter is done with its tree: it starts over from the text
            hit = tree.correct(committed)
            self.anchor = ROOT
        return hit

    def stats(self) -> dict:
        config = dict(width="auto" if self.width_auto else self.width, ratio=self.ratio, mode=self.mode,
                      draft_depth=self.draft_depth, correction=self.correction, query=self.query,
                      draft_device=self.draft_device, tree=self.tree)
        out = dict(config=config, **self.budget.stats(), draft_layers=self.drafter.layers,
                   plain_steps=self.plain_steps, **(self.side.stats() if self.side is not None else {}),
                   plain_step_ms=None if self._plain_ms is None else round(self._plain_ms, 3),
                   hits=self.hits, misses=self.misses,
                   hit_rate=self.hits / (self.hits + self.misses) if self.hits + self.misses else float("nan"))
        if self.mode != "sync":
            out.update(draft_busy=list(self.drafter.draft_busy), target_busy=list(self.target_busy))
        if self.mode == "thread":
            out.update(discarded_layers=self.drafter.discarded)
        return out
