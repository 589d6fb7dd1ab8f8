"""Prompt lookup decoding, our own: copy what followed the last n tokens earlier in prompt + output.

Saxena 2023 (github.com/apoorvumang/prompt-lookup-decoding); HF ships it as `prompt_lookup_num_tokens`
(our peer "hf_prompt_lookup"). One step, committed = prompt + output so far:
    match:   for n = max_ngram down to min_ngram, look up the last n tokens of committed at an earlier
             position (one whose n-gram is followed by at least one token); the first n that matches wins;
    propose: the num_tokens tokens that followed it, as a chain (DraftTree.chain), cut after an EOS and at
             what can still be emitted; no match: an empty chain (one plain autoregressive step);
    verify:  the chain is a tree: the one decoding loop (loop.py) verifies it in one forward and commits by KV
             compaction (prefill folded into the first forward, greedy or lossless sampling).

Which match: by default the MOST RECENT one (match="recent"); match="earliest" takes the first one. The
original and HF both take the earliest (left-to-right scan), and both cut the copy at the end of the text.
We take the latest because recent text predicts better (Cacheback's MRU reasoning), and a latest match near
the end is copied with overlap, like LZ77 (text repeating with period p keeps repeating past the end).
Defaults: max_ngram=3 (the original's; HF's max n is 2) and num_tokens="auto" (the original fixes 10).
Lookup: an index {n-gram: position} per n (`NgramIndex`), extended with each step's new tokens: O(new tokens *
max_ngram) a step, not a scan of the whole text (the original and HF scan with unfold).
num_tokens="auto" (mechanisms/budget/): at each match the chain length g in 0..32 (0: no draft, where none pays)
maximising E[tokens | g] / t(g + 1), E from P(accept depth d | depth d reached) over this generation's matched
steps, t the target's cost curve (cached per device + model + dtype). A copy costs nothing to make, so a plain
step at a match learns too: the chain it would have drafted is read against the tokens emitted after it (the
target's own, whatever was drafted), and drafting resumes as soon as the text repeats again.

Simplifications: batch size 1; one candidate (no tree of several matches).
"""
from __future__ import annotations

from ..env import check_int
from ..loop import LoopState, Proposal, Proposer, register_proposer
from ..mechanisms.budget import Budget, ChainBudget
from ..mechanisms.draft_tree import DraftTree


class NgramIndex:
    """Start positions of the n-grams (min_n <= n <= max_n) of a growing sequence that have a next token.

    Over the other n-gram stores: a text position, not stored followers, so a match copies any length; no eviction."""

    def __init__(self, min_n: int, max_n: int, earliest: bool = False):
        self.sizes = range(max_n, min_n - 1, -1)  # longest first
        self.earliest = earliest
        self.maps = {n: {} for n in self.sizes}
        self.indexed = {n: 0 for n in self.sizes}  # n-grams starting before this are in maps[n]

    def extend(self, seq: list[int]) -> None:
        """Index every n-gram of seq that ends before its last token (so a match has a continuation)."""
        for n in self.sizes:
            positions, end = self.maps[n], len(seq) - n  # starts s < end: s + n <= len(seq) - 1
            for s in range(self.indexed[n], end):
                key = tuple(seq[s:s + n])
                if self.earliest:
                    positions.setdefault(key, s)
                else:
                    positions[key] = s
            self.indexed[n] = max(self.indexed[n], end)

    def lookup(self, seq: list[int]) -> tuple[int, int]:
        """(n, start of the continuation) for the longest matching suffix, or (0, -1)."""
        for n in self.sizes:
            if len(seq) > n:
                s = self.maps[n].get(tuple(seq[-n:]))
                if s is not None:
                    return n, s + n
        return 0, -1


def continuation(seq: list[int], start: int, count: int, eos: int | None = None) -> list[int]:
    """count tokens copied from seq[start:], the copy overlapping itself past the end (LZ77); cut after EOS."""
    out: list[int] = []
    for j in range(count):
        i = start + j
        tok = seq[i] if i < len(seq) else out[i - len(seq)]
        out.append(tok)
        if tok == eos:
            break
    return out


AUTO_MAX_TOKENS = 32  # num_tokens="auto" picks 1..32 tokens per step
READ_AFTER = 8  # "auto": a plain step's chain, equal so far to the text emitted after it, is counted after 8 tokens


@register_proposer("prompt_lookup")
class PromptLookup(Proposer):
    """Prompt lookup decoding (our own: latest n-gram match, chain verified as a tree, KV compaction)."""

    def __init__(self, num_tokens: int | str = "auto", max_ngram: int = 3, min_ngram: int = 1, match: str = "recent",
                 costs=None):
        self.budget = Budget("num_tokens", num_tokens, 1, costs=costs)
        self.num_tokens = self.budget.value
        self.max_ngram, self.min_ngram = (check_int(name, value, 1) for name, value in (
            ("max_ngram", max_ngram), ("min_ngram", min_ngram)))
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram ({min_ngram}) must be <= max_ngram ({max_ngram})")
        if match not in ("recent", "earliest"):
            raise ValueError(f"match must be 'recent' or 'earliest', got {match!r}")
        self.match = match

    def start(self, state: LoopState) -> None:
        self.eos = state.request.eos_token_id
        self.index = NgramIndex(self.min_ngram, self.max_ngram, earliest=self.match == "earliest")
        self.index.extend(state.committed)
        self.budget.start(state.request, lambda curve: ChainBudget(curve, max_len=AUTO_MAX_TOKENS))
        self.unverified: list[tuple[int, list[int]]] = []  # (position of a plain step's token, its chain)

    def propose(self, state: LoopState, max_depth: int) -> Proposal:
        committed = state.committed
        n, start = self.index.lookup(committed)
        if not n:  # no match: no draft, no draft size
            return Proposal(DraftTree.chain(committed[-1], []), info=dict(ngram=n))
        count = min(self.budget.choose(len(committed), max_depth), max_depth)
        if count == 0 and self.budget.auto:  # a plain step at a match: what it would have drafted, read later
            self.unverified.append((len(committed), continuation(committed, start, AUTO_MAX_TOKENS, self.eos)))
        drafts = continuation(committed, start, count, self.eos)
        info = dict(ngram=n, **self.budget.info(count))
        return Proposal(DraftTree.chain(committed[-1], drafts), info=info)

    def observe(self, state: LoopState, verdict) -> None:
        self.budget.record(verdict)  # steps with a draft only
        self.index.extend(state.committed)  # indexes only the n-grams it has not seen
        self._read_unverified(state.committed)

    def _read_unverified(self, committed: list[int]) -> None:
        """Plain steps' chains against the tokens emitted from their step on: the verdict at the first difference;
        with none after READ_AFTER tokens, those depths accepted and the deeper ones unknown (as a chain that long,
        fully accepted), so that a repeat is seen a few steps after it starts. The generation's end drops the rest."""
        waiting = []
        for at, chain in self.unverified:
            emitted = committed[at:at + len(chain)]
            accepted = next((i for i, (a, b) in enumerate(zip(chain, emitted)) if a != b), len(emitted))
            if accepted < len(emitted):
                self.budget.record_unverified(len(chain), accepted)
            elif len(emitted) >= min(len(chain), READ_AFTER):
                self.budget.record_unverified(len(emitted), len(emitted))
            else:
                waiting.append((at, chain))
        self.unverified = waiting

    def stats(self) -> dict:
        return dict(config=dict(num_tokens=self.num_tokens, max_ngram=self.max_ngram, min_ngram=self.min_ngram,
                                match=self.match), **self.budget.stats())
