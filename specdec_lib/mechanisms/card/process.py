"""CARD's drafter in its own process, as in the paper (Zhou et al., CARD §3: two processes on two GPUs, tensors over
NCCL); here two on one CPU, one intra-op thread each. Why a process: a small model's forward is mostly Python holding
the GIL, so a drafter thread slows the target's verify and a process barely does (notebook 09 measures both).

    parent (the target, `DrafterProcess`)            child (`_drafter_main`, owns the draft's CardTree and KV)
    wait(ready) <- ("tree", epoch, layers, ...)      loop: a command waiting? apply it; else grow one layer and
    correct(committed) -> ("correct", epoch, ids)          publish the tree (its shape + the forward's interval)
    close() -> ("stop",) ... <- ("done", ...)        idle at draft_depth until a command comes

- The tree's shape (tokens, parents, depths, scores) goes through a pipe after every change; the draft's logits,
  needed only to draw sampled chains, through one shared-memory buffer (rows, V): row 0 the root's, row 1 + i
  node i's, written when the node is fed and rewritten only at a correction; the parent reads rows only between a
  tree of the current epoch arriving and its next correction, so no row it reads is being written.
- `epoch` counts corrections: the parent queries only a tree of its own epoch. Greedy runs do not wait for the
  child: on a hit the parent prunes its own copy as the child will (`ScoredTree.reindexed`) and queries it at
  once, until the child's tree of the new epoch arrives; sampled runs wait (the child re-indexes the logits).
- Errors: the child's exception (its traceback) is raised by the parent's next call; a silent death is detected.
  The child ignores SIGINT: the parent handles it, and its `close()` stops, then terminates, the child.

Simplifications: `fork` start method (Linux; the draft model is inherited, not pickled); a CPU draft only (CUDA
cannot be used in a forked child; beside a GPU target, card's `draft_device="cpu"` hands this class a CPU copy);
a fresh process per generate call; busy intervals from `time.perf_counter` (one clock for both processes). A fork
copies locks as they are: one held by a thread that is exiting after torch ops (MKL frees its buffers under a lock)
spins the child's first matmul forever, so a thread we start is waited out (`wait_exited`); yours, wait out too.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
import traceback
import warnings
from contextlib import contextmanager

import torch

from ...env import vocab_size
from .tree import CardTree, ScoredTree

PROCESS_NAME = "card-drafter"
POLL_S = 0.5  # the idle child checks this often that its parent is still there


class TreeCopy(ScoredTree):
    """The parent's copy of the child's tree: the shape from the pipe, the logits from the shared buffer."""

    def __init__(self, message: dict, committed: list[int], logits_buffer):
        self.epoch, self.layers = message["epoch"], message["layers"]
        self._set_nodes(committed, message["tokens"], message["parents"], message["depths"], message["scores"])
        self.root_fed, self.fed_count = message["root_fed"], message["fed"]
        # greedy runs share no logits: query reads only whether the root is fed, and the shape
        self.root_logits = None if not self.root_fed else (logits_buffer[0] if logits_buffer is not None else True)
        self.logits = logits_buffer[1:1 + self.fed_count] if logits_buffer is not None else None

    @property
    def fed(self) -> int:
        return self.fed_count


def wait_exited(thread: threading.Thread, timeout_s: float = 5.0) -> None:
    """Return once `thread`'s OS thread is gone (`join` returns before its native exit handlers have run, MKL's
    among them) or after `timeout_s`. Linux (/proc); elsewhere at once."""
    path = f"/proc/self/task/{thread.native_id}"
    deadline = time.monotonic() + timeout_s
    while thread.native_id is not None and os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.001)


def _publish(conn, tree: CardTree, epoch: int, buffer, written: int, busy=None) -> int:
    """Send the tree's shape; write the logits rows not written yet; return how many node rows are written."""
    if buffer is not None:
        if tree.fed >= buffer.shape[0]:
            raise RuntimeError(f"the drafter's tree has {tree.fed} fed nodes, more than the logits buffer's "
                               f"{buffer.shape[0] - 1} rows (buffer_rows)")
        if written == 0 and tree.root_logits is not None:
            buffer[0].copy_(tree.root_logits)
        if tree.fed > written:
            buffer[1 + written:1 + tree.fed].copy_(torch.stack(tree.logits[written:]))  # (new fed, V)
        written = tree.fed
    conn.send(("tree", dict(epoch=epoch, layers=tree.layers, tokens=tree.tokens, parents=tree.parents,
                            depths=tree.depths, scores=tree.scores, fed=tree.fed,
                            root_fed=tree.root_logits is not None, busy=busy)))
    return written


def _drafter_main(conn, draft, width, committed, draft_depth, buffer, parent_pid) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # One intra-op thread, always: OpenMP (libgomp) is not fork-safe, and once the parent has run a parallel region
    # (a float32 copy of a bf16 draft will do) a child's first multi-threaded op deadlocks (seen beside a GPU target,
    # reproduced on a small CPU). DataLoader workers take one thread for this reason.
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            tree, epoch, written = CardTree(draft, width, committed), 0, 0
            while True:
                can_grow = tree.depth < draft_depth or tree.root_logits is None
                if conn.poll(0 if can_grow else POLL_S):
                    command = conn.recv()
                    if command[0] == "stop":
                        conn.send(("done", dict(layers=tree.layers)))
                        return
                    _, epoch, ids = command  # "correct"
                    tree.correct(ids)
                    written = _publish(conn, tree, epoch, buffer, 0)  # rows re-indexed: rewrite all
                    continue
                if not can_grow:
                    if os.getppid() != parent_pid:  # the parent is gone: nobody will send "stop"
                        return
                    continue
                job = tree.plan()
                t0 = time.perf_counter()
                logits = tree.forward(job)
                t1 = time.perf_counter()
                tree.apply(job, logits)
                written = _publish(conn, tree, epoch, buffer, written,
                                   busy=None if job["kind"] == "expand" else (t0, t1))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        try:
            conn.send(("error", traceback.format_exc()))
        except (BrokenPipeError, OSError):
            pass


def buffer_rows(width: int, draft_depth: int) -> int:
    """Node rows the logits buffer holds: each layer adds at most `width` nodes; a tree keeps at most
    draft_depth layers ahead of its root plus the layer being fed (doubled for beams restarted from leaves)."""
    return 2 * width * (draft_depth + 1)


class DrafterProcess:
    """The parent's handle on the drafter process, with card/drafter.py's interface: `query(ready, grow_after)`,
    `correct(committed)`, `close()`, `layers`, `draft_busy`. The child runs one intra-op thread (`_drafter_main`);
    parent_threads: the parent's while the child runs (None: left as they are)."""

    discarded = 0  # a layer in flight when a correction comes is kept and corrected, never discarded

    def __init__(self, draft, width: int, committed: list[int], draft_depth: int, share_logits: bool,
                 wait_s: float = 120.0, parent_threads: int | None = None):
        device = next(draft.parameters()).device
        if device.type != "cpu":
            raise ValueError(f"card mode='process' runs the draft in a forked CPU process; the draft is on {device}"
                             " (CUDA cannot be used after fork): pass draft_device='cpu', or use mode='thread'")
        if "fork" not in multiprocessing.get_all_start_methods():
            raise RuntimeError("card mode='process' needs the 'fork' start method (Linux); use mode='thread'")
        vocab = vocab_size(draft)  # the full vocabulary, also for a head that scores a subset of it
        self.buffer = (torch.zeros(1 + buffer_rows(width, draft_depth), vocab).share_memory_()  # (rows, V)
                       if share_logits else None)
        self.committed, self.epoch, self.wait_s = list(committed), 0, wait_s
        self.latest, self.ahead, self.draft_busy, self.done, self.failed = None, None, [], None, False
        self.layers_at_query = 0
        context = multiprocessing.get_context("fork")
        self.conn, child_conn = context.Pipe()
        self.process = context.Process(
            target=_drafter_main, name=PROCESS_NAME, daemon=True,
            args=(child_conn, draft, width, list(committed), draft_depth, self.buffer, os.getpid()))
        with warnings.catch_warnings():  # Python >= 3.12 warns about fork in a process with threads (Jupyter)
            warnings.simplefilter("ignore", DeprecationWarning)
            self.process.start()
        child_conn.close()
        self.threads = torch.get_num_threads()
        if parent_threads is not None:
            torch.set_num_threads(parent_threads)

    @property
    def layers(self) -> int:
        """Draft forwards so far (the child's own count once it has stopped)."""
        if self.done is not None:
            return self.done["layers"]
        return self.latest["layers"] if self.latest is not None else 0

    @contextmanager
    def query(self, ready, grow_after: bool):
        """The newest tree for which ready(tree, layers since the last query) holds (None: any tree of the current
        correction), waiting for the child; the parent's copy, so the child keeps drafting meanwhile."""
        tree = self.wait(lambda t: ready is None or ready(t, t.layers - self.layers_at_query))
        since, self.layers_at_query = tree.layers - self.layers_at_query, tree.layers
        yield tree, since

    def _receive(self, timeout: float) -> bool:
        """Handle one message if one comes within `timeout` s; False when none came. The first failure (the
        child's error, or its death) is raised once; later calls after it only say nothing came."""
        if self.failed:
            return False
        try:
            if not self.conn.poll(timeout):
                if self.process.is_alive():
                    return False
                if not self.conn.poll(0):  # it may have sent its error just before exiting
                    raise RuntimeError(f"the CARD drafter process died (exit code {self.process.exitcode})")
            kind, body = self.conn.recv()
        except (EOFError, ConnectionResetError) as err:
            self.failed = True
            raise RuntimeError(f"the CARD drafter process died (exit code {self.process.exitcode})") from err
        except RuntimeError:
            self.failed = True
            raise
        if kind == "error":
            self.failed = True
            raise RuntimeError(f"the CARD drafter failed:\n{body}")
        if kind == "done":
            self.done = body
            return True
        if body["busy"] is not None:
            self.draft_busy.append(body["busy"])
        self.latest = body
        return True

    def wait(self, ready) -> TreeCopy:
        """The newest tree of the current epoch for which `ready(tree)` holds (waiting for the drafter)."""
        deadline = time.monotonic() + self.wait_s
        while True:
            while self._receive(0):  # drain: only the newest tree matters
                pass
            tree = self._current()
            if tree is not None and ready(tree):
                return tree
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the CARD drafter process added no layer within {self.wait_s} s")
            self._receive(min(left, 1.0))

    def _send(self, message) -> None:
        try:
            self.conn.send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError) as err:  # the child is gone: its error, if any
            while self._receive(0.1):
                pass
            self.failed = True
            raise RuntimeError(f"the CARD drafter process died (exit code {self.process.exitcode})") from err

    def _current(self) -> TreeCopy | None:
        """The child's newest tree when it is of the current epoch, else the parent's pruned copy (or None)."""
        if self.latest is not None and self.latest["epoch"] == self.epoch:
            return TreeCopy(self.latest, self.committed, self.buffer)
        return self.ahead

    def correct(self, committed: list[int]) -> bool:
        """Send the correction; return hit (as the parent's newest copy says) and keep the pruned copy."""
        while self._receive(0):
            pass
        tree = self._current()
        path, hit = tree.match(committed) if tree is not None else ([], False)
        self.epoch += 1
        self.committed = list(committed)
        self._send(("correct", self.epoch, self.committed))
        self.ahead = None
        if hit and self.buffer is None and tree.root_fed and path[-1] < tree.fed:
            sub, shape = tree.reindexed(path[-1])
            self.ahead = TreeCopy(dict(epoch=self.epoch, layers=tree.layers, fed=sum(i < tree.fed for i in sub),
                                       root_fed=True, **shape), self.committed, None)
        return hit

    def close(self) -> None:
        """Stop the child (it applies the corrections sent before), wait for it, terminate it if it hangs; the
        parent's threads are restored. Once."""
        if self.conn.closed:
            return
        try:
            if self.process.is_alive() and not self.failed:
                self._send(("stop",))
                deadline = time.monotonic() + self.wait_s
                while self.done is None and time.monotonic() < deadline:
                    self._receive(min(1.0, deadline - time.monotonic()))
        finally:
            torch.set_num_threads(self.threads)
            self.process.join(5.0)
            if self.process.is_alive():
                self.process.terminate()
                self.process.join(5.0)
            self.conn.close()
