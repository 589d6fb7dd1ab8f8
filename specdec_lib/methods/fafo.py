"""FAFO, "Fumble Around and Find Out": draftless, lossless; guesses decoded on a compressed KV, verified on the full.

FAFO paper §4.2 (fumble decoding), §4.3 / Alg. 3-4 (find-out verification), Appendix E (the column-wise token
layout and the fused mask), Appendix F (the pool: at most n subsequences per prefix, LRU). ONE forward per step
through the target's own cache, a `FlexLayoutStore` (mechanisms/store/layout.py; notebook 08), holds two kinds of
rows (SideRows with `compressed=True` ride the verifying forward; no draft model):
- fumble rows: n guess streams of k tokens, column-wise (y_1^1 .. y_1^n, y_2^1 ..), a token seeing C(kv) (the
  store's fixed blocks) and its own stream's earlier tokens. Each stream's last row predicts its next token
  (greedy); the oldest token is discarded and the new subsequence is cached in the pool (`FumblePool`) under every
  suffix of the stream's last k discarded tokens (Alg. 2). The commit drops these rows' KV.
- find-out rows: up to n pool candidates for the longest suffix of the committed text that is a key, branches of
  a DraftTree seeing the FULL KV, verified by the loop's tree walk (greedy, or one draw from p per emitted token:
  the candidates are a deterministic function of the history, so sampling is lossless too).
Our choices where the paper is open: stream i's tokens sit at root + 1 + i + j (j = 0..k-1), as Lookahead's window
columns, never re-aligned; streams start as seeded random k-token windows of the prompt; a retrieval counts as use
for the LRU order; a stream's next token is its argmax also when the loop samples (it is only a guess).

Budgets (mechanisms/budget/; the class doc has the options): candidates="auto" budgets verified ROWS, so at long
context, where a full row reads every key, only the likeliest candidates' first tokens are verified; streams="auto"
runs the streams only while they pay. from_text=True also pools the text's own k-token runs;
`fafo(from_text=False, candidates=None)` is the paper's method as written, fused=False its "FAFO-2forward"
ablation (Table 1: the fumble rows in a forward of their own, before the verifying one).

Left out: batch size > 1; re-using the fumble rows' KV (every stream's k x n rows are re-fed each step, as
Lookahead re-feeds its window); a C per layer or head (one for all).
"""
from __future__ import annotations

import random
from collections import OrderedDict

import torch

from ..env import check_int
from ..mechanisms.budget import Budget, SideBudget, TreeBudget, is_auto, text_tree_yield
from ..mechanisms.budget.cost_curve import reach
from ..loop import LoopState, Proposal, Proposer, SideRows, register_proposer
from ..mechanisms.store import layout as flex_layout
from ..mechanisms import verify
from ..mechanisms.store.compression import Compression, Quest, StreamingLLM
from ..mechanisms.draft_tree import DraftTree


NODE_LADDER = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # candidates="auto": find-out rows (<= streams x guess_len)
AUTO_STREAMS = 10  # streams="auto": the paper's n, run only while the streams pay


class FumblePool:
    """Subsequences keyed by the prefixes they followed; at most `cap` per prefix, least recently used out.

    Over the library's other n-gram stores (Cacheback's NgramTable, mechanisms/ngram_table.py: keys of one fixed
    leader length; Lookahead's NgramPool: one-token keys; prompt lookup's NgramIndex: one position in the text per
    key), each entry sits under every suffix (1..k tokens) of what preceded it, a lookup gathers up to n
    candidates longest suffix first, and a retrieval renews an entry's place in the LRU order."""

    def __init__(self, cap: int):
        self.cap = cap
        self.table: dict[tuple, OrderedDict] = {}
        self.size = 0  # entries over every prefix (counted as they come and go: the table can be large)

    def add(self, discarded: list[int], subsequence: tuple) -> None:
        """Cache `subsequence` under each suffix of `discarded` (lengths 1 .. len(discarded))."""
        for m in range(1, len(discarded) + 1):
            entries = self.table.setdefault(tuple(discarded[-m:]), OrderedDict())
            if subsequence in entries:
                entries.move_to_end(subsequence)
                continue
            entries[subsequence] = None
            self.size += 1
            if len(entries) > self.cap:
                entries.popitem(last=False)
                self.size -= 1

    def add_text(self, tokens: list[int], k: int, start: int = 0) -> None:
        """Cache every k-token run of `tokens` from index `start` on (where k tokens follow) under the k tokens
        before it, as a stream's subsequence is cached under its discarded tokens."""
        for i in range(max(1, start), len(tokens) - k + 1):
            self.add(tokens[max(0, i - k):i], tuple(tokens[i:i + k]))

    def lookup(self, context: list[int], n: int, max_prefix: int, touch: bool = True) -> list[tuple[int, tuple]]:
        """Up to n (prefix length m, subsequence) pairs, longest matching suffix of `context` first; `touch`:
        count them as used (LRU order; a viewer looks without touching)."""
        out, seen = [], set()
        for m in range(min(max_prefix, len(context)), 0, -1):
            entries = self.table.get(tuple(context[-m:]))
            if not entries:
                continue
            for sub in reversed(list(entries)):  # most recent first
                if sub not in seen:
                    seen.add(sub)
                    out.append((m, sub))
                    if touch:
                        entries.move_to_end(sub)
                    if len(out) == n:
                        return out
        return out

    def __len__(self) -> int:
        return self.size


@register_proposer("fafo")
class Fafo(Proposer):
    """FAFO: guess streams decoded on a compressed KV ride the verifying forward (draftless).

    streams: n, or "auto": AUTO_STREAMS streams run only while they pay (budget.SideBudget, as Lookahead's
    window="auto": a second pool fed by the text alone gives each step the tree it would have verified without
    them); off, they wait as they are (a step is the text's candidates only, or plain) until a probe. Their number
    stays fixed: a stream pays now (k fumble rows) for candidates of LATER steps, so what another count would have
    yielded cannot be read off one step, and n fixes the fumble rows' layout. guess_len: k. candidates: find-out
    candidates verified per step (None: n), or "auto": a node count from NODE_LADDER (budget.TreeBudget, as
    Cacheback's tdl="auto"), the last candidate cut to fit, the neighbouring counts' tries regrown from the same
    candidates; the fumble rows, which read C(kv) only, priced at its length (cheap rows, also when fused=False).
    compression ("streaming": StreamingLLM with `sinks`; "quest": Quest with `page`; or a Compression), kv_budget:
    C(kv). block, attention: the store's. seed: the streams' start. from_text: pool the text's k-token runs too
    (as Lookahead's from_text; notebook 07 compares). costs: the cost curve the "auto" knobs read."""

    no_sliding = ("its KV store (one FlexAttention layout for every layer, read through a compression) has no "
                  "sliding window: use 'lookahead' (the same Jacobi-style guess rows, through the loop's cache) or "
                  "'cacheback' instead")

    def __init__(self, streams: int | str = "auto", guess_len: int = 6, compression="streaming", kv_budget: int = 128,
                 sinks: int = 4, page: int = 16, block: int = flex_layout.BLOCK, attention: str = "auto",
                 fused: bool = True, seed: int = 0, candidates: int | str | None = "auto", costs=None,
                 from_text: bool = True):
        self.streams_auto = is_auto(streams)
        streams = AUTO_STREAMS if self.streams_auto else check_int("streams", streams, 1)
        self.budget = Budget("candidates", streams if candidates is None else candidates, 0,
                             shared=self.streams_auto, costs=costs)
        self.cap = self.budget.value
        check_int("guess_len", guess_len, 1)
        check_int("kv_budget", kv_budget, 1)
        check_int("block", block, 1)
        if isinstance(compression, Compression):
            self.compression = compression
        elif compression == "streaming":
            check_int("sinks", sinks, 0)
            if kv_budget <= sinks:
                raise ValueError(f"kv_budget={kv_budget} must exceed sinks={sinks} (StreamingLLM keeps recent tokens "
                                 f"too)")
            self.compression = StreamingLLM(sinks, kv_budget - sinks)
        elif compression == "quest":
            self.compression = Quest(kv_budget, page)
        else:
            raise ValueError(f"compression must be 'streaming', 'quest' or a Compression, got {compression!r}")
        if attention != "auto" and attention not in flex_layout.ATTENTION_MODES:
            raise ValueError(f"attention must be 'auto' or one of {sorted(flex_layout.ATTENTION_MODES)}")
        if not isinstance(fused, bool):
            raise TypeError(f"fused must be True or False, got {fused!r}")
        if not isinstance(from_text, bool):
            raise TypeError(f"from_text must be True or False, got {from_text!r}")
        self.from_text = from_text
        self.n, self.k, self.block, self.attention, self.seed = streams, guess_len, block, attention, seed
        self.fused = fused
        # the side rows' visibility is the same every step: row j * n + i is token j of stream i (column-wise)
        rows = torch.arange(streams * guess_len)
        stream, token = rows % streams, rows // streams
        self.sees = (stream[:, None] == stream[None, :]) & (token[None, :] <= token[:, None])  # (S, S)
        self.depths = (1 + stream + token).tolist()
        self.last_rows = list(range((guess_len - 1) * streams, guess_len * streams))  # each stream's last token

    def start(self, state: LoopState) -> None:
        prompt, rng = state.committed, random.Random(self.seed)
        self.streams = []
        for _ in range(self.n):  # k-token windows of the prompt (repeated when the prompt is shorter)
            start = rng.randrange(max(1, len(prompt) - self.k + 1))
            window = (prompt[start:] * self.k)[:self.k]
            self.streams.append(window)
        self.discarded = [[] for _ in range(self.n)]  # per stream, its last k discarded tokens
        self.pool = FumblePool(self.n)
        self.side = self.text_pool = None
        if self.streams_auto:  # the pool without the streams' subsequences: what a step without them would find
            costs = self.budget.curve(state.request.target, reach(state.request))
            # a stream's guesses are found by later steps only (keyed by what it discarded, about k steps on),
            # so the warm-up that judges the streams first is longer than k by a margin: 2k + 4 steps
            self.side = SideBudget(costs, context=len(prompt), cheap_context=self.compression.kv_budget,
                                   horizon=state.request.max_new_tokens, warmup=max(12, 2 * self.k + 4),
                                   side_rows=(0, self.n * self.k))  # the fumble rows read C(kv) only
            self.text_pool = FumblePool(self.n)
        for pool in (self.pool, self.text_pool) if self.from_text else ():
            if pool is not None:
                pool.add_text(prompt, self.k)
        self.found = self.proposed = self.fumble_forwards = 0
        self._previous = None
        most = self.n * self.k  # a trie of n candidates of k tokens holds at most n x k nodes
        ladder = sorted({c for c in NODE_LADDER if c < most} | {most})
        # the fumble rows read C(kv) only: priced at its length (budget.TreeBudget); every smaller candidate's trie
        # is regrown each step (window: a few small tries), so none is estimated unseen, at the verified yield
        self.budget.start(state.request, lambda curve: TreeBudget(
            curve, ladder, context=len(prompt), cheap_rows=self.n * self.k, cheap_context=self.compression.kv_budget,
            window=len(ladder)), guard=self.streams_auto)  # fixed streams run every step: no step would be plain
        if self.side is not None:
            self.side.affords = self.budget.affords  # the streams' probes share the guard's one allowance

    def target_cache(self, state: LoopState):
        req = state.request
        rows = 1 + 2 * self.n * self.k  # root + candidates + fumble rows
        capacity = -(-(req.prompt_length + req.max_new_tokens + rows) // self.block) * self.block
        self._previous = flex_layout.attach(req.target)  # undone in finish()
        self.store = flex_layout.FlexLayoutStore(req.target, capacity, self.compression, block=self.block,
                                                 attention=self.attention)
        return self.store

    def finish(self, state: LoopState) -> None:
        if self._previous is not None:
            state.request.target.set_attn_implementation(self._previous)

    def propose(self, state: LoopState, max_depth: int) -> Proposal:
        # the prompt's step is plain: the store prefills the prompt with SDPA's causal kernel alone (store/
        # attention.py); fumble or find-out rows beside it would send every prompt row through the mixed plan
        prefill = self.store.length < len(state.committed) - 1
        # the guard (budget/guard.py) stops the streams too while drafted steps lose to plain ones
        streams = not prefill and self.budget.may_draft() and (self.side is None or
                                                               self.side.choose(len(state.committed)))
        self.budget.price_cheap_rows(self.n * self.k if streams else 0)  # paid only when the streams run
        candidates = self.pool.lookup(state.committed, self.n, self.k) if max_depth > 0 and not prefill else []
        extra, carry = {}, {}
        root, nodes, found = state.committed[-1], None, [sub for _, sub in candidates]
        if candidates and self.budget.auto:  # none found: nothing to choose (or learn)
            nodes = self.budget.choose(len(state.committed))  # the fumble rows: its cheap_rows
            carry = self.budget.carry(lambda other: DraftTree.trie(root, found, max_depth, nodes=other))
            extra = self.budget.info(nodes)
        elif candidates:
            candidates, found, extra = candidates[:self.cap], found[:self.cap], self.budget.info(self.cap)
        tree = DraftTree.trie(root, found, max_depth, nodes=nodes)
        self.proposed += bool(candidates)
        # match_len: the longest suffix of the committed text that keyed a candidate (0: none found)
        info = dict(candidates=len(candidates), match_len=max((m for m, _ in candidates), default=0),
                    pool=len(self.pool), **extra)
        if not streams:
            return Proposal(tree, info=info, carry=carry)
        if self.side is not None:  # the step without the streams: the text's own candidates, as many rows
            text = self.text_pool.lookup(state.committed, self.n, self.k) if max_depth > 0 else []
            text = [sub for _, sub in text][:len(text) if self.budget.auto else self.cap]
            carry["text_tree"] = DraftTree.trie(root, text, max_depth, nodes=nodes)
        tokens = [self.streams[i][j] for j in range(self.k) for i in range(self.n)]  # column-wise
        if not self.fused:
            carry["predicted"] = self._fumble_pass(state, tokens)
            return Proposal(tree, info=info, carry=carry)
        side = SideRows(tokens, self.depths, self.sees, compressed=True, logits_rows=self.last_rows)
        return Proposal(tree, side=side, info=info, carry=carry)

    def _fumble_pass(self, state: LoopState, tokens: list[int]) -> list[int] | None:
        """FAFO-2forward (the paper's Table 1 ablation): the fumble rows in a forward of their own, before the
        verifying one; the root rides along (as in the fused forward) and every row is dropped after."""
        store, cached = self.store, self.store.length
        if cached != len(state.committed) - 1:  # the first step: the prompt is not prefilled yet
            return None
        side = SideRows(tokens, self.depths, self.sees, compressed=True, logits_rows=self.last_rows)
        rows = verify.forward_proposal(state.request.target, store, Proposal(DraftTree(state.committed[-1]),
                                                                             side=side), [state.committed[-1]])
        store.rollback(cached)
        self.fumble_forwards += 1
        return verify.side_row_logits(rows, 1, side).argmax(-1).tolist()  # (n,)

    def observe(self, state: LoopState, verdict) -> None:
        self.found += bool(verdict.accepted)
        if self.from_text:  # the k-token runs the emitted tokens complete
            committed = state.committed
            for pool in (self.pool, self.text_pool):
                if pool is not None:
                    pool.add_text(committed, self.k, len(committed) - len(verdict.emitted) - self.k + 1)
        self.budget.record(verdict)
        proposal = verdict.proposal
        if self.fused:
            if proposal.side is None:  # the streams did not run: they wait as they are
                return
            predicted = verdict.side_logits.argmax(-1).tolist()  # (n,): each stream's next token
        else:
            predicted = proposal.carry.get("predicted")
            if predicted is None:  # the first step, or the streams did not run
                return
        if self.side is not None:
            text_tree, rows = proposal.carry["text_tree"], 1 + len(proposal.tree)
            self.side.record(len(verdict.emitted), self.side.price(rows, self.n * self.k),
                             text_tree_yield(text_tree, verdict.emitted), self.side.price(1 + len(text_tree)))
        for i, token in enumerate(predicted):
            self.discarded[i] = (self.discarded[i] + [self.streams[i][0]])[-self.k:]
            self.streams[i] = self.streams[i][1:] + [token]
            self.pool.add(self.discarded[i], tuple(self.streams[i]))

    def stats(self) -> dict:
        return dict(config=dict(streams="auto" if self.streams_auto else self.n, guess_len=self.k,
                                compression=repr(self.compression),
                                block=self.block, fused=self.fused, candidates=self.cap,
                                from_text=self.from_text), **self.budget.stats(),
                    **(self.side.stats() if self.side is not None else {}),
                    pool_size=len(self.pool), steps_with_candidates=self.proposed,
                    steps_with_accepted_candidates=self.found, fumble_forwards=self.fumble_forwards)
