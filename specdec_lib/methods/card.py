"""CARD: parallel query-and-correct (Zhou et al., "A Cache-Assisted Parallel Speculative Decoding Framework
via Query-and-Correct Paradigm", §2): a drafter grows a beam-like tree of width K (mechanisms/card_tree.py)
while the target queries ONE chain from it per step and sends back the correction.

    start:   the tree from the prompt (the first layer feeds it to the draft)
    propose: query the tree: greedy descent by cumulative score, or a chain drawn from q when sampling
             (card_tree's module doc says why that is lossless); the loop verifies it as a chain
    observe: correct the tree: hit (the target's token is a child of the last accepted node) -> prune to that
             subtree; miss -> reset from the correct token

Modes (`mode`):
- "sync": deterministic fixed interleaving in the caller's thread: per target step the drafter adds exactly
  `ratio` layers (one draft forward each), run inside propose right AFTER the query, i.e. where they would run
  concurrently with the target's verify, so that the correction sees them (a chain descends to a leaf: with
  the layers drafted before the query only, a fully accepted chain's bonus could never be a hit). Before a
  query the tree must be `ratio` deep: on the first step and after a miss the target waits for the drafter;
- "thread": a worker thread ("card-drafter") adds layers continuously (up to `max_depth`) under a
  threading.Condition while the target verifies; propose waits for the same readiness as sync mode (`ratio`
  layers since the last query and a tree `ratio` deep, or the tree at max_depth). Only the worker runs draft
  forwards and touches the draft's KV: observe hands it the correction (an epoch bump), and a forward that
  raced a correction is rolled back. On one machine
  this SIMULATES the paper's two GPUs: the two threads share the CPU, each with ONE intra-op thread -
  torch.set_num_threads is process-global, so start sets 1 for the whole process and finish restores the old
  value (torch kernels release the GIL, so the two overlap on the CPU's cores as far as the kernels go).
  A worker exception is recorded and re-raised in the next propose/observe, or in finish; finish stops the
  worker and joins it (with a timeout) on every exit: EOS, max_new_tokens, or an exception on either side.
  On small models the forwards are mostly Python work under the GIL, so the two threads slow each other down
  (the target's verify takes markedly longer; notebook 07 measures it); "process" is the real concurrency on a
  CPU;
- "process": the drafter in a forked child process (mechanisms/card_process.py), as the paper's two processes:
  the same readiness rule, over the tree copy the child publishes after every layer; corrections go to the
  child, which applies them between two forwards (a layer in flight is kept and then corrected); in greedy
  runs the target prunes its copy itself on a hit and need not wait for the child. The draft
  gets one intra-op thread, the target the rest (at least one). CPU only (fork); Linux.

Ablation (`correction=False`, sync mode only; the paper's Table 2 "+ Cache (query but don't correct)"): the
target queries the tree but never corrects the drafter. The drafter keeps growing its tree from the old root;
the target descends from the node that spells the committed text (`anchor`), and when the committed text has
left the tree (a miss) it has nothing to verify but its own next token until the drafter, at max_depth with
nothing left to draft, restarts from the committed text.

A GPU target (`draft_device`): the paper's second GPU is, on one machine with one GPU, either the same GPU on a
second CUDA stream or the CPU cores beside it.
- thread mode with the draft on CUDA: the worker issues every draft kernel on its own CUDA stream (the target's
  verify runs on the default stream), and synchronises that stream after each forward, so a layer is complete
  before the target can query it and the draft's busy interval is the GPU's;
- `draft_device="cpu"`: the drafter works on a float32 copy of the draft on the CPU (made once per draft model),
  in thread mode or in process mode (a forked child that never touches CUDA, as a DataLoader worker); the
  target keeps the CPU threads it had, since a GPU target needs few of them, and the drafter gets the rest (one
  at least); a sampled chain's q rows travel to the target's device.

Draft budget: `query` caps the chain the target verifies per step (None: max_depth - 1, as above);
`query="auto"` picks it each step like draft_model's gamma="auto" (mechanisms/budget.ChainBudget: per-depth
acceptance against this machine's cost curve; drafting counts as free, since the drafter works whether or not
the target reads its deeper layers, and a shorter query keeps them: a fully accepted chain's bonus still hits the
tree). The width K stays fixed: it shapes the layers the drafter has already grown when the target's verdict
arrives, and the hit rate a different K would have had cannot be read off the step (its tree would differ).

Per-step info: card_nodes (tree size at the query), card_layers (layers since the previous query), hit (in
process mode as the parent's copy of the tree says), draft_size (the query's cap: chosen with query="auto").
stats(): hit rate, draft layers, config, and in thread and process modes the busy intervals (perf_counter
start/end of each draft forward and of each target step = propose's return to observe's call) for a Gantt /
overlap figure (bench/timeline.py); thread mode also counts the layers discarded by a correction.

Simplifications: the paper's two processes on two GPUs are two processes on one CPU, or one process (threads,
or none), or a GPU target beside a CPU drafter or a second stream; the target
verifies one chain (no tree attention on the target side, as the paper); scores use the draft's raw
probabilities; the drafter stops at `max_depth` layers ahead of the root.
"""
from __future__ import annotations

import copy
import threading
import time
import weakref
from contextlib import nullcontext

import torch

from ..checks import check_int
from ..loop import LoopState, Proposal, Proposer, register_proposer
from ..mechanisms.budget import ChainBudget, check_budget, check_costs, chooser_stats, is_auto, resolve_curve
from ..mechanisms.card_process import DrafterProcess
from ..mechanisms.card_tree import CardTree
from ..mechanisms.draft_tree import ROOT, DraftTree

WORKER_NAME = "card-drafter"
MODES = ("sync", "thread", "process")
WAIT_S = 120.0  # the longest propose waits for the drafter / finish waits for the worker to stop
DRAFT_DEVICES = (None, "cpu")
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
    """CARD (query-and-correct): a width-K draft tree grown in parallel, one chain verified per step."""

    def __init__(self, width: int = 8, ratio: int = 2, mode: str = "sync", max_depth: int = 12,
                 correction: bool = True, query: int | str | None = None, costs=None,
                 draft_device: str | None = None):
        if draft_device not in DRAFT_DEVICES:
            raise ValueError(f"draft_device must be one of {DRAFT_DEVICES} (None: the draft's own device), "
                             f"got {draft_device!r}")
        if draft_device is not None and mode == "sync":
            raise ValueError("draft_device='cpu' moves the drafter beside the target: use mode='thread' or 'process'")
        self.draft_device = draft_device
        self.width = check_int("width", width, 1)
        self.query = None if query is None else check_budget("query", query, 1)
        check_costs("query", query, costs=costs)
        self.costs = costs
        self.ratio = check_int("ratio", ratio, 1)
        self.max_depth = check_int("max_depth", max_depth, 1)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        if not isinstance(correction, bool):
            raise TypeError(f"correction must be True or False, got {correction!r}")
        if not correction and mode != "sync":
            raise ValueError("correction=False (the Table 2 ablation) runs in mode='sync' only")
        self.correction = correction
        self.worker = self.drafter = None

    # ---- lifecycle --------------------------------------------------------------------------------------

    def start(self, state: LoopState) -> None:
        req = state.request
        self.sampling, self.generator = req.sampling, req.generator
        self.since_query, self.hits, self.misses = 0, 0, 0
        self.draft_busy: list[tuple[float, float]] = []
        self.target_busy: list[tuple[float, float]] = []
        self._t_query = None
        self.error, self.reported = None, False
        self.anchor = ROOT  # where queries start: the node spelling committed[-1] (None: the text left the tree)
        self.chooser = None
        if is_auto(self.query):  # the target's curve, read (or measured once) before the drafter starts
            self.chooser = ChainBudget(resolve_curve(self.costs, req.target), max_len=max(1, self.max_depth - 1))
        self.target_device = req.input_ids.device
        draft = draft_on(req.draft, self.draft_device)
        # On a CPU both sides share the cores: one intra-op thread each. A GPU target needs few CPU threads:
        # it keeps what it has and a CPU drafter gets as many.
        cpu_target = self.target_device.type == "cpu"
        self.threads = torch.get_num_threads()
        if self.mode == "process":
            self.drafter = DrafterProcess(draft, self.width, state.committed, self.max_depth,
                                          share_logits=not self.sampling.greedy,
                                          threads=1 if cpu_target else self.threads, wait_s=WAIT_S)
            self.tree, self.layers_at_query = None, 0
            if cpu_target:
                torch.set_num_threads(max(1, self.threads - 1))  # the draft's process has its own one
            return
        self.tree = CardTree(draft, self.width, state.committed)
        if self.mode == "sync":
            return
        self.cond = threading.Condition()
        self.stop, self.epoch, self.applied, self.pending, self.discarded = False, 0, 0, None, 0
        # a CUDA drafter issues its kernels on a stream of its own, beside the target's default stream
        self.stream = torch.cuda.Stream(self.tree.device) if self.tree.device.type == "cuda" else None
        if cpu_target:
            torch.set_num_threads(1)  # process-global: drafter and target get one intra-op thread each
        self.worker = threading.Thread(target=self._work, name=WORKER_NAME, daemon=True)
        self.worker.start()

    def finish(self, state: LoopState) -> None:
        if self.mode == "process":
            self._close_drafter()
            return
        if self.worker is None:
            return
        with self.cond:
            self.stop = True
            self.cond.notify_all()
        self.worker.join(WAIT_S)
        alive, self.worker = self.worker.is_alive(), None
        torch.set_num_threads(self.threads)
        if alive:
            raise RuntimeError(f"the CARD drafter did not stop within {WAIT_S} s")
        self._raise_worker_error()

    def _close_drafter(self) -> None:
        """Process mode: stop the child and keep what it reported (its busy intervals and layer count)."""
        if self.drafter is None:
            return
        drafter, self.drafter = self.drafter, None
        try:
            drafter.close()
        finally:
            torch.set_num_threads(self.threads)
            self.draft_busy, self.draft_layers = list(drafter.draft_busy), (drafter.done or {}).get("layers")

    def _raise_worker_error(self) -> None:
        if self.error is not None and not self.reported:
            self.reported = True
            raise RuntimeError("the CARD drafter failed") from self.error

    # ---- the worker (thread mode) -----------------------------------------------------------------------

    def _work(self) -> None:
        streamed = torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()
        try:  # grad mode and the current stream are per thread: the loop's inference_mode is not ours
            with torch.inference_mode(), streamed:
                while True:
                    with self.cond:
                        self.cond.wait_for(lambda: self.stop or self.pending is not None or self._can_grow())
                        if self.stop:
                            return
                        if self.pending is not None:
                            self.tree.correct(self.pending)
                            self.pending, self.applied = None, self.epoch
                            self.cond.notify_all()
                            continue
                        job, epoch = self.tree.plan(), self.epoch
                    t0 = time.perf_counter()
                    logits = self.tree.forward(job)  # outside the lock: the target verifies meanwhile
                    if self.stream is not None:
                        self.stream.synchronize()  # the layer is complete before the target may query it
                    t1 = time.perf_counter()
                    with self.cond:
                        if job["kind"] != "expand":
                            self.draft_busy.append((t0, t1))
                        if epoch == self.epoch and self.pending is None:
                            self.tree.apply(job, logits)
                            self.since_query += 1
                        elif job["kind"] != "expand":
                            self.tree.discard(job)  # a correction came in: this layer hangs off a stale root
                            self.discarded += 1
                        self.cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            with self.cond:
                self.error = exc
                self.cond.notify_all()

    def _can_grow(self) -> bool:
        return self._growable(self.tree.depth, self.tree.root_logits is not None)

    def _growable(self, depth: int, root_fed: bool) -> bool:
        """The drafter can add a layer: below max_depth, or the root not fed yet (right after a correction)."""
        return depth < self.max_depth or not root_fed

    # ---- the loop's hooks -------------------------------------------------------------------------------

    def _may_query(self, depth: int, root_fed: bool, since_query: int) -> bool:
        """The target may query: `ratio` layers since the last query and a tree at least `ratio` deep (after a
        miss the target waits for the drafter), or the tree is at max_depth (the drafter cannot grow it)."""
        deep_enough = depth >= min(self.ratio, self.max_depth)
        return not self._growable(depth, root_fed) or (since_query >= self.ratio and deep_enough)

    def _ready(self) -> bool:
        return self._may_query(self.tree.depth, self.tree.root_logits is not None, self.since_query)

    def propose(self, state: LoopState, budget: int) -> Proposal:
        if self.mode == "process":
            self.tree = self.drafter.wait(self._ready_copy)
            self.since_query = self.tree.layers - self.layers_at_query
            self.layers_at_query = self.tree.layers
            return self._query(state, budget)
        if self.mode == "sync":
            while budget > 0 and not self._ready():  # the first step, or after a miss: the target waits
                self._grow()
            proposal = self._query(state, budget)
            for _ in range(self.ratio if budget > 0 else 0):  # the layers the drafter adds while the target verifies
                if self._can_grow():
                    self._grow()
            self._t_query = time.perf_counter()
            return proposal
        with self.cond:
            ready = self.cond.wait_for(lambda: self.error is not None or (
                self.applied == self.epoch and self._ready()), WAIT_S)
            self._raise_worker_error()
            if not ready:
                raise TimeoutError(f"the CARD drafter added no layer within {WAIT_S} s")
            return self._query(state, budget)

    def _ready_copy(self, tree) -> bool:
        """_ready for the process drafter's published tree."""
        return self._may_query(tree.depth, tree.root_fed, tree.layers - self.layers_at_query)

    def _grow(self) -> None:
        self.tree.grow()
        self.since_query += 1

    def _query(self, state: LoopState, budget: int) -> Proposal:
        # at most max_depth - 1 deep: the drafter's deepest layer then still holds the children of the chain's
        # last node, so a fully accepted chain's bonus token can be a hit (at max_depth the drafter idles)
        limit = min(budget, max(1, self.max_depth - 1))
        if self.chooser is not None and limit > 0:
            limit = self.chooser.choose(limit)
        elif isinstance(self.query, int):
            limit = min(limit, self.query)
        info = dict(draft_size=limit)
        if not self.correction and self.anchor is None:  # a stale tree: nothing to query
            chain, q = [], None
        else:
            chain, q = self.tree.query(limit, self.sampling, self.generator, start=self.anchor)
        if q is not None and q.device != self.target_device:  # a CPU drafter beside a GPU target
            q = q.to(self.target_device)
        info.update(card_nodes=len(self.tree), card_layers=self.since_query, hit=None)
        self.since_query = 0
        self._t_query = time.perf_counter()
        return Proposal(DraftTree.chain(state.committed[-1], chain), q=q, info=info)

    def observe(self, state: LoopState, verdict) -> None:
        self.target_busy.append((self._t_query, time.perf_counter()))
        if self.mode == "process":
            hit = self.drafter.correct(state.committed)  # no wait: the next propose waits if it must
        elif not self.correction:
            hit = self._follow(state.committed)
        elif self.mode == "sync":
            hit = self.tree.correct(state.committed)
        else:
            with self.cond:
                self._raise_worker_error()
                hit = self.tree.match(state.committed)[1]  # the worker applies the correction itself
                self.pending, self.epoch = list(state.committed), self.epoch + 1
                self.cond.notify_all()
        verdict.proposal.info["hit"] = hit
        if self.chooser is not None and len(verdict.proposal.tree):
            self.chooser.record(len(verdict.proposal.tree), len(verdict.accepted))
        self.hits += hit
        self.misses += not hit

    def _follow(self, committed: list[int]) -> bool:
        """No correction: only move the anchor along the tree; restart the drafter when it has nothing left."""
        path, hit = self.tree.match(committed)
        self.anchor = path[-1] if hit and path[-1] < self.tree.fed else None  # a query needs the node's logits
        if not self._can_grow():  # the drafter is done with its tree: it starts over from the committed text
            hit = self.tree.correct(committed)
            self.anchor = ROOT
        return hit

    def stats(self) -> dict:
        config = dict(width=self.width, ratio=self.ratio, mode=self.mode, max_depth=self.max_depth,
                      correction=self.correction, query=self.query, draft_device=self.draft_device)
        out = dict(config=config, **chooser_stats(self.chooser),
                   draft_layers=self.tree.layers if self.mode != "process" else self.draft_layers,
                   hits=self.hits, misses=self.misses,
                   hit_rate=self.hits / (self.hits + self.misses) if self.hits + self.misses else float("nan"))
        if self.mode != "sync":
            out.update(draft_busy=list(self.draft_busy), target_busy=list(self.target_busy))
        if self.mode == "thread":
            out.update(discarded_layers=self.discarded)
        return out
