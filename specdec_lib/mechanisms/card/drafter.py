"""CARD's drafters: who grows the tree (card/tree.py) while the target verifies, behind one interface.

CARD paper (Zhou et al., "A Cache-Assisted Parallel Speculative Decoding Framework via Query-and-Correct
Paradigm") §3: the drafter runs beside the target and never waits for it. Three drafters, one interface, so
methods/card.py holds the query-and-correct rule once:

    with drafter.query(ready, grow_after) as (tree, since):   # a tree the target may query now; no layer lands
        chain = tree.query(...)                              # in it meanwhile; since: layers since the last query
    hit = drafter.correct(committed)                         # hand over the correction; hit as the drafter's tree says
    drafter.close()                                          # stop (every exit); re-raises a drafter's failure
    drafter.layers, drafter.draft_busy, drafter.discarded    # for the stats and the timeline

`ready(tree, since) -> bool` is the target's readiness rule (None: any tree of the current correction).
- `SyncDrafter`: in the caller's thread, deterministic: `query` grows layers until the tree is ready, then
  (grow_after) `ratio` more, where they would run during the target's verify, so the correction sees them
  (without them a fully accepted chain's bonus could never be a hit);
- `ThreadDrafter`: a worker thread ("card-drafter") grows layers continuously, up to `draft_depth` ahead of the
  root, under a threading.Condition; only the worker runs draft forwards and touches the draft's KV: `correct`
  hands it the correction (an epoch bump), and a forward that raced a correction is rolled back. A CUDA draft
  runs on a stream of its own, synchronised after each forward (a layer is complete before it is queried);
- `DrafterProcess` (card/process.py): a forked child process, on the CPU.

Simplifications: one drafter per generate call; a thread drafter's failure is re-raised once (next query,
correction or close); `since` counts the layers applied in sync and thread mode (a beam restarted from its
leaves counts) and the draft forwards in process mode.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager, nullcontext

import torch

from .process import wait_exited
from .tree import CardTree

WORKER_NAME = "card-drafter"


def growable(tree, draft_depth: int) -> bool:
    """The drafter can add a layer: below draft_depth, or the root not fed yet (right after a correction)."""
    return tree.depth < draft_depth or not tree.root_fed


class SyncDrafter:
    """The drafter in the caller's thread (see the module doc)."""

    def __init__(self, draft, width: int, committed: list[int], draft_depth: int, ratio: int):
        self.tree = CardTree(draft, width, committed)
        self.draft_depth, self.ratio, self.since = draft_depth, ratio, 0
        self.draft_busy: list[tuple[float, float]] = []
        self.discarded = 0

    @property
    def layers(self) -> int:
        return self.tree.layers

    def _grow(self) -> None:
        self.tree.grow()
        self.since += 1

    @contextmanager
    def query(self, ready, grow_after: bool):
        while ready is not None and not ready(self.tree, self.since):  # the first step, or after a miss
            self._grow()
        yield self.tree, self.since
        self.since = 0
        for _ in range(self.ratio if grow_after else 0):  # the layers drafted while the target verifies
            if growable(self.tree, self.draft_depth):
                self._grow()

    def correct(self, committed: list[int]) -> bool:
        return self.tree.correct(committed)

    def close(self) -> None:
        pass


class ThreadDrafter:
    """The drafter in a worker thread (see the module doc); `threads`: the intra-op threads to set for the whole
    process while it runs (torch.set_num_threads is process-global), None to leave them."""

    def __init__(self, draft, width: int, committed: list[int], draft_depth: int, wait_s: float,
                 threads: int | None = None):
        self.tree = CardTree(draft, width, committed)
        self.draft_depth, self.wait_s = draft_depth, wait_s
        self.draft_busy: list[tuple[float, float]] = []
        self.cond = threading.Condition()
        self.stop, self.epoch, self.applied, self.pending = False, 0, 0, None
        self.since = self.discarded = 0
        self.error, self.reported = None, False
        # a CUDA draft issues its kernels on a stream of its own, beside the target's default stream
        self.stream = torch.cuda.Stream(self.tree.device) if self.tree.device.type == "cuda" else None
        self.threads = torch.get_num_threads()
        if threads is not None:
            torch.set_num_threads(threads)
        self.worker = threading.Thread(target=self._work, name=WORKER_NAME, daemon=True)
        self.worker.start()

    @property
    def layers(self) -> int:
        return self.tree.layers

    def _work(self) -> None:
        streamed = torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()
        try:  # grad mode and the current stream are per thread: the loop's inference_mode is not ours
            with torch.inference_mode(), streamed:
                while True:
                    with self.cond:
                        self.cond.wait_for(lambda: self.stop or self.pending is not None
                                           or growable(self.tree, self.draft_depth))
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
                            self.since += 1
                        elif job["kind"] != "expand":
                            self.tree.discard(job)  # a correction came in: this layer hangs off a stale root
                            self.discarded += 1
                        self.cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            with self.cond:
                self.error = exc
                self.cond.notify_all()

    def _raise_error(self) -> None:
        if self.error is not None and not self.reported:
            self.reported = True
            raise RuntimeError("the CARD drafter failed") from self.error

    @contextmanager
    def query(self, ready, grow_after: bool):
        with self.cond:  # held while the target reads the tree: the worker applies no layer meanwhile
            done = self.cond.wait_for(lambda: self.error is not None or (
                self.applied == self.epoch and (ready is None or ready(self.tree, self.since))), self.wait_s)
            self._raise_error()
            if not done:
                raise TimeoutError(f"the CARD drafter added no layer within {self.wait_s} s")
            yield self.tree, self.since
            self.since = 0

    def correct(self, committed: list[int]) -> bool:
        with self.cond:
            self._raise_error()
            hit = self.tree.match(committed)[1]  # the worker applies the correction itself
            self.pending, self.epoch = list(committed), self.epoch + 1
            self.cond.notify_all()
        return hit

    def close(self) -> None:
        if self.worker is None:
            return
        with self.cond:
            self.stop = True
            self.cond.notify_all()
        self.worker.join(self.wait_s)
        alive, worker, self.worker = self.worker.is_alive(), self.worker, None
        if not alive:
            wait_exited(worker)  # a fork right after this (process mode next) must not copy a lock it holds
        torch.set_num_threads(self.threads)
        if alive:
            raise RuntimeError(f"the CARD drafter did not stop within {self.wait_s} s")
        self._raise_error()
