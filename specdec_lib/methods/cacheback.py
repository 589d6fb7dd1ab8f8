"""Cacheback decoding end to end: LRU n-gram tables -> draft tree -> one tree forward -> KV compaction.

Paper: Ma, Gim, Zhong, "Cacheback: Speculative Decoding With Nothing But Cache": §3.1 the LRU table
(ngram_table.NgramTable), §3.2 breadth-first tree growth under TDL/CRT (draft_tree.grow_tree), one-forward tree
verification and the sliding-window table update after every step, §3.3 the dual tables (dynamic first, cleared
per generation and seeded with the prompt; then the frozen corpus table, resolved by tables.resolve_frozen: see
the class docstring). Defaults are the paper's (§4): LL=1, FL=3, LC=2^20, FC=128; TDL "auto" (tdl=96: the paper's).

One step, committed = prompt + output so far, the cache holding all of it but the last token (the root):
    draft:   tree = grow_tree(committed[-LL:], [dynamic, frozen], TDL, CRT, refed=1, merge)
    verify:  ONE target forward of root + tree, walked by the loop (greedy, or one seeded draw per emitted token:
             exactly lossless, the drafts being a deterministic function of the history); only the rows the walk
             reads go through the LM head (lazy_head=True, verify.RowLogits: a large share of a small model's row)
    commit:  the accepted path's KV stays in place (kv_cache.compact): nothing is re-fed (the reference crops, re-feeds)
    update:  dynamic.update_new over the newly emitted tokens (the next token included)
This module is the proposer (`propose`, `observe`); verify, commit, prefill and step records are loop.py's.

tdl="auto" (mechanisms/budget/): each step the TDL of TDL_LADDER that maximises expected tokens / t(1 + tree
size), t the target's cost curve read at the current context (each full-context row reads every key, so the tree
shrinks as the context grows); TDL 2 drafts nothing (a plain step). The neighbouring TDLs' trees are regrown (table
lookups, cheap next to a forward) to learn their yields from the emitted path; every 16th step probes the next
larger TDL. CRT, when not given, scales with TDL as in the paper (`scaled_crt`).

Simplifications: batch size 1; without a tokenizer the vocabulary check compares sizes only; the loop cuts the last
steps' trees to what can still be emitted, and an EOS inside an accepted run cuts the output and the cache.
"""
from __future__ import annotations

from ..env import check_int
from ..loop import LoopState, Proposal, Proposer, register_proposer
from ..mechanisms.budget import Budget, TreeBudget
from ..mechanisms.draft_tree import grow_tree
from ..mechanisms.ngram_table import NgramTable
from ..tables import resolve_frozen


TDL_LADDER = (2, 4, 8, 12, 16, 24, 32, 48, 64, 96)  # tdl="auto" picks among these (2: a plain step)


def holds_chain(tdl: int, crt: int, fl: int, refed: int = 1) -> bool:
    """Whether a tree of TDL rows (`refed` of them re-fed) with CRT reserved for levels >= 1 has room for one
    FL-token chain at level 0: grow_tree hangs whole chains only, so a TDL without it drafts nothing."""
    return tdl - refed - crt >= fl


def scaled_crt(tdl: int, fl: int = 3) -> int:
    """CRT when not given: the paper's ratio CRT/TDL = 16/96, rounded, but at least FL (a smaller reserve holds
    no follower, so the tree would never grow past level 0), and at most TDL - 2; 0 for a TDL too small to hold a
    level-0 chain beside that reserve (level 0 alone: TDL 4 drafts one FL-token chain instead of nothing)."""
    crt = max(0, min(tdl - 2, max(fl, round(tdl / 6))))
    return crt if holds_chain(tdl, crt, fl) else 0


@register_proposer("cacheback")
class Cacheback(Proposer):
    """Cacheback decoding (LRU n-gram tables, draft tree, one-forward tree verification, KV compaction).

    merge: trie merging of equal sibling chains. frozen: True (the table of `tokenizer`, built once when missing;
    without a tokenizer the shipped table if it fits, else dynamic only,
    warned once), False, "build" (count one from the corpus now, cached; needs tokenizer=), a path or a table.
    dynamic=False: the frozen table alone (Table 1's "only frozen"; then a frozen table is required).
    tokenizer: checks (and, with frozen="build", counts) the frozen table with the target's tokenizer.
    tdl: an int >= 2, or "auto" (chosen each step from the cost curve; costs= injects the curve; the first step
    takes the largest TDL whose forward is nearly free). crt: None (round(TDL / 6), at least FL; 0 where the TDL
    holds one level-0 chain at most) or an int (with tdl="auto": used for every TDL that admits it)."""

    def __init__(self, ll: int = 1, fl: int = 3, lc: int = 2**20, fc: int = 128, tdl: int | str = "auto",
                 crt: int | None = None, merge: bool = False, frozen=True, dynamic: bool = True, tokenizer=None,
                 costs=None):
        ll, fl, lc, fc = (check_int(name, value, 1) for name, value in dict(ll=ll, fl=fl, lc=lc, fc=fc).items())
        self.budget = Budget("tdl", tdl, 1, plain=TDL_LADDER[0], costs=costs)
        tdl = self.budget.value
        crt = None if crt is None else check_int("crt", crt)
        if self.budget.auto:
            self.ladder = [(t, scaled_crt(t, fl) if crt is None else crt) for t in TDL_LADDER
                           if crt is None or 0 <= crt <= t - 2]
            if not self.ladder:
                raise ValueError(f"crt={crt} leaves no TDL of the auto ladder {TDL_LADDER} (need 0 <= crt <= tdl - 2)")
        else:
            crt = scaled_crt(tdl, fl) if crt is None else crt
            if tdl < 2 or not 0 <= crt <= tdl - 2:
                raise ValueError(f"need tdl >= 2 and 0 <= crt <= tdl - 2 (TDL counts the re-fed root, so TDL - 1 "
                                 f"draft slots, and CRT of them are kept from level 0, which needs one), got "
                                 f"tdl={tdl}, crt={crt}")
        for name, value in dict(merge=merge, dynamic=dynamic).items():
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, got {value!r}")
        if not dynamic and frozen is False:
            raise ValueError("dynamic=False and frozen=False leave no table to draft from")
        self.config = dict(ll=ll, fl=fl, lc=lc, fc=fc, tdl=tdl, crt=crt, merge=merge, dynamic=dynamic)
        self.frozen_spec, self.tokenizer = frozen, tokenizer

    def start(self, state: LoopState) -> None:
        c = self.config
        frozen = resolve_frozen(self.frozen_spec, state.request.target, c["ll"], c["fl"], c["lc"], c["fc"],
                                self.tokenizer)
        if not c["dynamic"] and frozen is None:
            raise ValueError(f"dynamic=False needs a frozen table, and none was found for LL={c['ll']}, "
                             f"FL={c['fl']}: pass frozen=\"build\" with tokenizer=, or a table")
        self.frozen, self.dynamic = frozen, None
        self.tables = [] if frozen is None else [frozen]
        if c["dynamic"]:  # a fresh table per generation, seeded with the prompt (§3.3), queried first
            self.dynamic = NgramTable(c["ll"], c["fl"], c["lc"], c["fc"])
            self.dynamic.update(state.committed)
            self.tables.insert(0, self.dynamic)
        self.tail = max(t.leader_len for t in self.tables)  # grow_tree reads at most this many context tokens
        self.window = c["ll"] + c["fl"] - 1
        # the curve is read (or measured once per device + model + dtype) before any step
        self.crts = dict(self.ladder) if self.budget.auto else {c["tdl"]: c["crt"]}
        drafting = [t for t, crt in self.crts.items() if holds_chain(t, crt, c["fl"])]
        self.budget.start(state.request, lambda curve: TreeBudget(
            curve, list(self.crts), context=len(state.committed), first=drafting[0] if drafting else None,
            horizon=state.request.max_new_tokens))

    def _grow(self, context, tdl: int, crt: int):
        return grow_tree(context, self.tables, tdl, crt, refed=1, merge=self.config["merge"])

    def propose(self, state: LoopState, max_depth: int) -> Proposal:
        context = state.committed[-self.tail:]
        tdl = self.budget.choose(len(state.committed))
        carry = self.budget.carry(lambda other: self._grow(context, other, self.crts[other]))
        return Proposal(self._grow(context, tdl, self.crts[tdl]), info=self.budget.info(tdl), carry=carry)

    def observe(self, state: LoopState, verdict) -> None:
        self.budget.record(verdict)  # before the table update: the neighbouring trees this step could have grown
        if self.dynamic is not None:  # the windows completed by the new tokens (§3.2, Figure 2)
            n_new = len(verdict.emitted)
            self.dynamic.update_new(state.committed[-(n_new + self.window):], n_new)

    def stats(self) -> dict:
        return dict(config=dict(self.config), **self.budget.stats(),
                    frozen=None if self.frozen is None else (self.frozen.meta.get("path") or "in memory"),
                    dynamic_leaders=len(self.dynamic) if self.dynamic is not None else 0)
