"""Prompt lookup decoding, our own: copy what followed the last n tokens earlier in prompt + output.

Saxena 2023 (github.com/apoorvumang/prompt-lookup-decoding); HF ships it as `prompt_lookup_num_tokens`
(our peer "hf_prompt_lookup"). One step, committed = prompt + output so far:
    match:   for n = max_ngram down to min_ngram, look up the last n tokens of committed at an earlier
             position (one whose n-gram is followed by at least one token); the first n that matches wins;
    propose: the num_tokens tokens that followed it, as a chain (DraftTree.chain), cut after an EOS and at
             what can still be emitted; no match: an empty chain (one plain autoregressive step);
    verify:  the chain is a tree: cacheback.decode_with_trees verifies it in one forward and commits by KV
             compaction (the same loop, prefill folded into the first forward, greedy or lossless sampling).

Which match: by default the MOST RECENT one (match="recent"); match="earliest" takes the first one. The
original and HF both take the earliest (left-to-right scan), and both cut the copy at the end of the text.
We take the latest because recent text predicts better (Cacheback's MRU reasoning), and a latest match near
the end is copied with overlap, like LZ77: a continuation that runs past the end goes on with the copy
itself (text repeating with period p keeps repeating), so it still proposes num_tokens tokens.
Defaults: max_ngram=3 and num_tokens=10 (the original's; HF's max n is 2).

Lookup cost: an index {n-gram: position} per n, extended with the new tokens after each step, so a step
costs O(new tokens * max_ngram), not a scan of the whole text (the original and HF scan with unfold).

Simplifications: batch size 1; one candidate (no tree of several matches).
"""
from __future__ import annotations

import numbers

from .cacheback import decode_with_trees
from .decoding import GenerationResult, Request, register
from .draft_tree import DraftTree


class NgramIndex:
    """Start positions of the n-grams (min_n <= n <= max_n) of a growing sequence that have a next token."""

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


@register("prompt_lookup")
def prompt_lookup(req: Request, num_tokens: int = 10, max_ngram: int = 3, min_ngram: int = 1,
                  match: str = "recent", debug: bool = False) -> GenerationResult:
    """Prompt lookup decoding (our own: latest n-gram match, chain verified as a tree, KV compaction)."""
    for name, value in dict(num_tokens=num_tokens, max_ngram=max_ngram, min_ngram=min_ngram).items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if min_ngram > max_ngram:
        raise ValueError(f"min_ngram ({min_ngram}) must be <= max_ngram ({max_ngram})")
    if match not in ("recent", "earliest"):
        raise ValueError(f"match must be 'recent' or 'earliest', got {match!r}")
    index = NgramIndex(min_ngram, max_ngram, earliest=match == "earliest")
    index.extend(req.input_ids[0].tolist())

    def propose(committed, max_depth):
        n, start = index.lookup(committed)
        drafts = continuation(committed, start, min(num_tokens, max_depth), req.eos_token_id) if n else []
        return DraftTree.chain(committed[-1], drafts), dict(ngram=n)

    def after_step(committed, n_new):
        index.extend(committed)

    result = decode_with_trees(req, propose, after_step, debug)
    result.stats["config"] = dict(num_tokens=num_tokens, max_ngram=max_ngram, min_ngram=min_ngram, match=match)
    return result
