"""Lookahead decoding as a proposer of the one loop: Jacobi window rows and n-gram guesses in ONE target forward.

Lookahead (Fu, Bailis, Stoica, Zhang 2024, "Break the Sequential Dependency of LLM Inference Using Lookahead
Decoding", §3.1 lookahead branch, §3.2 verification branch, §3.3 both in one step); reference:
hao-ai-lab/LookaheadDecoding (lade/decoding.py, lade/models/llama.py). N=5 as Spec-Bench, W and G "auto" (7, 7).
One step (root = the last committed token, P = its position):
    guesses:   up to G (N-1)-grams from the pool under the root, as a DraftTree trie; the loop's walk verifies
               them (greedy or sampling, lossless: the guesses are a deterministic function of the history);
    window:    N-1 levels x W columns as verify.SideRows; level i, column j sits at P + 1 + i + j and sees the
               committed text, level 0 at columns <= j and its own column in levels 1..i (`window_sees`); the
               guesses and the window never see each other; only the last level's rows reach the LM head;
    observe:   the argmax at each last-level row (also when sampling) closes one n-gram per column, pooled under
               its first token; level 0 is dropped and the predictions become the last level.
The window's KV is dropped by the loop's commit; an accepted guess's KV stays in place (no re-feed). With
debug=True each step record holds its window: `window_steps(result)` reads one `WindowStep` per step.

Against the reference: every level has W real tokens at P + 1 + i + j (the reference's width W + 1 without the
root's column); warm-up as the reference (W + N - 2 prompt tokens drawn by a seeded RNG) but guesses ride already
during it; after k accepted tokens the window is kept (ALWAYS_FWD_ONE=1); the pool also takes the text's n-grams
(POOL_FROM_PROMPT, `from_text`); a repeated n-gram moves to the front (the reference keeps it at the back).
guesses="auto": each step the g of GUESS_LADDER that maximises expected tokens / t(1 + guess nodes + window rows),
t the target's cost curve (mechanisms/budget/). window="auto": AUTO_WINDOW columns that run only while they pay
against a text-only pool's tree (budget.SideBudget), else the window waits and is tried again later (no window
and no guesses: a plain step); N is fixed.
Simplifications: batch size 1; the reference's EOS filter of the window is not done (an EOS there is a guess).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from ..env import check_int
from ..loop import LoopState, Proposal, Proposer, SideRows, register_proposer
from ..mechanisms.budget import Budget, SideBudget, TreeBudget, is_auto, text_tree_yield
from ..mechanisms.budget.cost_curve import reach
from ..mechanisms.draft_tree import DraftTree

GUESS_LADDER = (0, 1, 2, 3, 4, 5, 7, 10, 14)  # guesses="auto" picks among these (the pool keeps the largest)
AUTO_WINDOW = 7  # window="auto": this many columns, run only while they pay


def window_sees(levels: int, columns: int) -> torch.Tensor:
    """bool (S, S), S = levels * columns, rows level-major: row (i, j) sees (i', j') iff i' == 0 and j' <= j
    (the first level's earlier columns and its own), or j' == j and i' <= i (its own column, itself included)."""
    level = torch.arange(levels).repeat_interleave(columns)  # (S,)
    col = torch.arange(columns).repeat(levels)  # (S,)
    first_row = (level[None, :] == 0) & (col[None, :] <= col[:, None])  # (S, S)
    own_col = (col[None, :] == col[:, None]) & (level[None, :] <= level[:, None])  # (S, S)
    return first_row | own_col


class NgramPool:
    """token -> (N-1)-grams that followed it, newest first, at most `cap` per token.

    Over the other n-gram stores: n-grams the target predicted in its Jacobi window (full KV), not yet in the text."""

    def __init__(self, cap: int):
        self.cap, self.grams, self.size = cap, {}, 0  # size: n-grams held, over all keys

    def add(self, key: int, gram: tuple) -> None:
        if self.cap == 0:
            return
        grams = self.grams.setdefault(key, [])
        if gram in grams:
            grams.remove(gram)  # a repeat moves to the front
            self.size -= 1
        grams.insert(0, gram)
        self.size += 1
        if len(grams) > self.cap:
            grams.pop()  # the oldest
            self.size -= 1

    def add_text(self, seq: list[int], n: int, first: int = 0) -> None:
        """The n-grams of seq starting at first.. (keyed by their first token), in text order."""
        for s in range(first, len(seq) - n + 1):
            self.add(seq[s], tuple(seq[s + 1:s + n]))

    def get(self, key: int) -> list[tuple]:
        return self.grams.get(key, [])


@register_proposer("lookahead")
class Lookahead(Proposer):
    """Lookahead decoding (Jacobi window rows + n-gram pool guesses in one forward, tree-verified; Fu et al. 2024).

    window W: columns of the Jacobi window, or "auto" (AUTO_WINDOW columns run only while they pay); ngram N:
    n-gram size (N-1 window levels, guesses of N-1 tokens); guesses G: n-grams kept per key (and proposed per
    step), or "auto" (from the cost curve); from_text: pool the text's n-grams too; seed: the window's initial
    draw from the prompt; costs: the cost curve the "auto" knobs read (measured here if None)."""

    def __init__(self, window: int | str = "auto", ngram: int = 5, guesses: int | str = "auto",
                 from_text: bool = True, seed: int = 0, costs=None):
        self.window_auto = is_auto(window)
        self.W = AUTO_WINDOW if self.window_auto else check_int("window", window, 1)
        self.N = check_int("ngram", ngram, 2)
        self.budget = Budget("guesses", guesses, 0, shared=self.window_auto, costs=costs)
        self.G = self.budget.value
        if not isinstance(from_text, bool):
            raise TypeError(f"from_text must be True or False, got {from_text!r}")
        self.from_text, self.seed = from_text, check_int("seed", seed)

    def start(self, state: LoopState) -> None:
        prompt = state.committed
        rng = random.Random(self.seed)  # own RNG: the window never touches the request's generator
        # level 0 is wider by the N-2 columns the warm-up steps drop; one level until the window fills
        self.levels = [[rng.choice(prompt) for _ in range(self.W + self.N - 2)]]
        self.budget.start(state.request, lambda curve: TreeBudget(curve, GUESS_LADDER, context=len(prompt)),
                          guard=self.window_auto)  # a fixed window runs every step: no step would be plain
        # the pool keeps the most the ladder may propose; the chooser picks how many
        cap = GUESS_LADDER[-1] if self.budget.auto else self.G
        self.pool = NgramPool(cap)
        self.side = self.text_pool = None
        if self.window_auto:  # the pool without the window's n-grams: what a step without it would guess
            costs = self.budget.curve(state.request.target, reach(state.request))
            window_rows = (self.N - 1) * self.W  # the filled window's rows, every step it runs
            self.side, self.text_pool = SideBudget(costs, context=len(prompt), horizon=state.request.max_new_tokens,
                                                   side_rows=(window_rows, 0)), NgramPool(cap)
            self.side.affords = self.budget.affords  # the window's probes share the guard's one allowance
        for pool in (self.pool, self.text_pool) if self.from_text else ():
            if pool is not None:
                pool.add_text(prompt, self.N)
        self.window_grams = self.guesses_proposed = 0

    def propose(self, state: LoopState, max_depth: int) -> Proposal:
        root = state.committed[-1]
        length = min(self.N - 1, max_depth)  # deeper guess tokens could not be emitted
        # the guard (budget/guard.py) stops the window too while drafted steps lose to plain ones
        window = self.budget.may_draft() and (self.side is None or self.side.choose(len(state.committed)))
        guesses = self.pool.get(root) if length > 0 else []
        levels, cols = len(self.levels), len(self.levels[0])
        window_rows = levels * cols if window else 0
        info, carry, g = {}, {}, None
        if guesses:  # no guesses: nothing to choose (or learn)
            g = self.budget.choose(len(state.committed))
            found = guesses  # the window rows are paid whatever g is
            carry = self.budget.carry(lambda other: DraftTree.trie(root, found[:other], length), window_rows)
            info, guesses = self.budget.info(g), guesses[:g]
        tree = DraftTree.trie(root, guesses, length)
        self.guesses_proposed += len(guesses)
        info = dict(guesses=len(guesses), levels=levels if window else 0, pool=self.pool.size, **info)
        if not window:
            return Proposal(tree, info=info, carry=carry)
        if self.side is not None:  # the step without the window: the text's own guesses, as many
            text = self.text_pool.get(root)[:len(guesses) if g is None else g] if length > 0 else []
            carry["text_tree"] = DraftTree.trie(root, text, length)
        tokens = [t for level in self.levels for t in level]  # level-major, levels * cols
        depths = [1 + i + j for i in range(levels) for j in range(cols)]  # level i, column j at root + 1 + i + j
        last = list(range((levels - 1) * cols, levels * cols))  # only the newest level's predictions are read
        side = SideRows(tokens, depths, window_sees(levels, cols), logits_rows=last)
        return Proposal(tree, side=side, info=info, carry=carry)

    def observe(self, state: LoopState, verdict) -> None:
        self.budget.record(verdict)
        if verdict.proposal.side is not None:  # else the window did not run: its levels wait as they are
            self._shift_window(verdict, state.debug)
        if self.from_text:  # the n-grams the emitted tokens complete
            n_new, committed = len(verdict.emitted), state.committed
            for pool in (self.pool, self.text_pool):
                if pool is not None:
                    pool.add_text(committed, self.N, max(0, len(committed) - n_new - self.N + 1))

    def _shift_window(self, verdict, debug: bool = False) -> None:
        """The window's step: pool its n-grams, shift its levels, and tell the window's budget what it cost (with
        `debug`, the step record's "window": its levels, the predictions and the n-grams pooled: `window_steps`)."""
        proposal, levels, cols = verdict.proposal, len(self.levels), len(self.levels[0])
        if self.side is not None:
            text_tree = proposal.carry["text_tree"]
            self.side.record(len(verdict.emitted), self.side.price(1 + len(proposal.tree) + levels * cols),
                             text_tree_yield(text_tree, verdict.emitted), self.side.price(1 + len(text_tree)))
        # side_logits (cols, V): the last level's rows (logits_rows); argmax even when sampling: the window only
        # generates guesses
        preds = verdict.side_logits.argmax(dim=-1).tolist()
        grams, ran = [], self.levels  # the levels this step's window rows held (replaced below, not mutated)
        if levels < self.N - 1:  # warm-up: the root moved on by one, so every level loses its column 0
            self.levels = [level[1:] for level in self.levels] + [preds[1:]]
        else:
            for j in range(cols):  # column j is the n-gram (level 0..N-2 tokens, prediction) at P+1+j..
                gram = [level[j] for level in self.levels] + [preds[j]]
                self.pool.add(gram[0], tuple(gram[1:]))
                grams.append(tuple(gram))
            self.window_grams += cols
            self.levels = self.levels[1:] + [preds]  # drop level 0; the predictions are the new last level
        if debug:  # the loop copies the proposal's info into the step record after `observe`
            proposal.info["window"] = dict(levels=[list(level) for level in ran], predictions=preds, ngrams=grams)

    def stats(self) -> dict:
        return dict(config=dict(window="auto" if self.window_auto else self.W, ngram=self.N, guesses=self.G,
                                from_text=self.from_text, seed=self.seed), **self.budget.stats(),
                    **(self.side.stats() if self.side is not None else {}),
                    pool_keys=len(self.pool.grams), pool_ngrams=self.pool.size, window_ngrams=self.window_grams,
                    guesses_proposed=self.guesses_proposed)


@dataclass(frozen=True)
class WindowStep:
    """One Lookahead step whose window ran, from a debug run's step record (positions relative to the root, the
    last committed token before the step: level i, column j sits at root + 1 + i + j)."""
    step: int  # index in result.stats["steps"]
    root: int
    levels: list[list[int]]  # the window's guess tokens, level 0 first (N - 1 levels of W; fewer during warm-up)
    predictions: list[int]  # the target's argmax at each last-level row: the next level, column j at level len(levels)
    ngrams: list[tuple[int, ...]]  # pooled this step (a column, top to bottom, + its prediction); none in warm-up
    guesses: list[list[int]]  # the n-grams verified: the trie's branches under the root
    accepted: list[int]  # the guess tokens the target accepted (a path of the trie)
    next_token: int  # the target's own token after them
    full: bool  # the accepted tokens are a whole guess: next_token is a bonus (else a correction)
    emitted: list[int]  # what the step added to the output (accepted + next token, unless EOS cut it)


def window_steps(result) -> list[WindowStep]:
    """The `WindowStep` of every step whose window ran, from a GenerationResult of generate("lookahead", ...,
    debug=True) (its step records hold "window" and the loop's tree keys)."""
    steps, out, done = result.stats["steps"], [], 0
    if steps and "drafted" not in steps[0]:
        raise ValueError("these step records hold no windows: run generate('lookahead', ..., debug=True)")
    for i, s in enumerate(steps):
        emitted = list(result.new_tokens[done:done + s["emitted"]])
        done += s["emitted"]
        if "window" not in s:
            continue
        tree = DraftTree(s["root"], s["drafted"], s["parents"])
        out.append(WindowStep(i, s["root"], s["window"]["levels"], s["window"]["predictions"],
                              [tuple(g) for g in s["window"]["ngrams"]], [tree.path_tokens(leaf) for leaf in
                                                                          tree.leaves()],
                              [tree.tokens[n] for n in s["accepted_nodes"]], s["next_token"], bool(s["full"]),
                              emitted))
    return out
