"""Cacheback decoding end to end: LRU n-gram tables -> draft tree -> one tree forward -> KV compaction.

Paper: Ma, Gim, Zhong, "Cacheback: Speculative Decoding With Nothing But Cache" (seed file
cacheback-lru-ngram-drafting.txt): §3.1 the LRU table (ngram_table.NgramTable), §3.2 breadth-first tree
growth under TDL/CRT (draft_tree.grow_tree), one-forward tree verification and the sliding-window table
update after every step, §3.3 the dual tables (dynamic first, then the frozen corpus table; the dynamic one
cleared per generation and seeded with the prompt). Defaults are the paper's (§4): LL=1, FL=3, LC=2^20,
FC=128, TDL=96, CRT=16.

One step, committed = prompt + output so far, the cache holding all of it but the last token (the root):
    draft:   tree = grow_tree(committed[-LL:], [dynamic, frozen], TDL, CRT, refed=1, merge)
    verify:  ONE target forward of root + tree (tree_verify), walk it (greedy, or one seeded draw per
             emitted token: exactly lossless, since the drafts are a deterministic function of the history)
    commit:  keep the accepted path's KV entries in place (kv_cache.compact): nothing is re-fed, so TDL
             only pays for the root (refed=1; the reference crops and re-feeds every accepted token)
    update:  dynamic.update_new over the newly emitted tokens (bonus included)

Prefill: the first step has an empty cache. We fold the prompt into the first verification: ONE forward of
prompt[:-1] (causal) + root + tree (tree mask), positions 0.. for the prompt, then prompt_len - 1 + depth,
logits kept for the q = 1 + n tree rows only. So every target forward yields tokens, target_forwards ==
len(accept_lengths) and sum(accept_lengths) == len(new_tokens), as for "autoregressive" (whose prefill also
yields the first token). Backends that do not take a dense float mask (flex_attention) get a separate
prefill forward instead, counted in stats["prefill_forwards"] (0 when folded), not in accept_lengths.

Frozen tables: frozen=True takes the shipped one for (LL, FL), or one counted earlier for this tokenizer;
frozen="build" counts it now from the standard-library corpus (ngram_table.ensure_frozen_table, cached on
disk); a path or a table is used as given. dynamic=False drafts from the frozen table alone (Table 1).
The verifying forward projects only the tree rows the walk reads through the LM head (lazy_head=True,
tree_verify.RowLogits): on a CPU that is a sixth of the tiny target's work per row.

Simplifications: batch size 1; the vocabulary check without a tokenizer compares sizes only (pass
tokenizer= for the hash check); the last step's tree is cut to the depth that can still be
emitted (max_new_tokens), and EOS inside an accepted run cuts the output (Request.trim) and the cache.
`decode_with_trees` is the loop shared with prompt_lookup (any proposer of DraftTrees).
"""
from __future__ import annotations

import numbers
import statistics
import time
import warnings
from pathlib import Path

import torch

from . import kv_cache
from .decoding import GenerationResult, Request, register
from .draft_tree import DraftTree, grow_tree
from .models import vocab_size
from .ngram_table import FrozenNgramTable, NgramTable, cached_table_path, ensure_frozen_table, frozen_table_path
from .tree_attention import tree_attention_mask, tree_inputs
from .tree_verify import attention_backend, commit, forward_rows, verify_tree, walk_tree


class NoFrozenTableWarning(UserWarning):
    """frozen=True but no usable frozen table: Cacheback runs with the dynamic table alone."""


_WARNED = False  # the no-frozen-table warning is given once per process
_FROZEN: dict = {}  # (path, mtime, lc, fc) -> FrozenNgramTable, loaded once per process


def _cap_depth(tree: DraftTree, max_depth: int) -> DraftTree:
    """The tree without nodes deeper than max_depth (insertion order, hence topology, is kept)."""
    if tree.max_depth <= max_depth:
        return tree
    keep = [i for i, d in enumerate(tree.depths) if d <= max_depth]
    new = {old: n for n, old in enumerate(keep)}
    return DraftTree(tree.root, [tree.tokens[i] for i in keep], [new.get(tree.parents[i], -1) for i in keep])


def _prefill_tree_logits(target, cache, pending: list[int], tree: DraftTree, lazy: bool = True):
    """First step: ONE forward of pending (causal) + root + tree (tree mask) into an empty cache; (1 + n, V)."""
    device, dtype = next(target.parameters()).device, next(target.parameters()).dtype
    m, q = len(pending), len(tree) + 1
    tree_ids, tree_pos, _ = tree_inputs(tree, m, device=device)  # (1, q), positions m + depth
    ids = torch.cat([torch.tensor([pending], dtype=torch.long, device=device), tree_ids], dim=1)  # (1, m + q)
    pos = torch.cat([torch.arange(m, device=device)[None], tree_pos], dim=1)
    tree_rows = tree_attention_mask(tree, m, dtype=dtype, backend=attention_backend(target), device=device)
    hidden = torch.finfo(dtype).min  # prompt rows: causal among themselves, blind to the tree
    prompt_rows = torch.full((1, 1, m, m + q), hidden, dtype=dtype, device=device).triu_(1)
    prompt_rows[..., m:] = hidden
    mask = torch.cat([prompt_rows, tree_rows], dim=2)  # (1, 1, m + q, m + q)
    return forward_rows(target, lazy, q, input_ids=ids, attention_mask=mask, position_ids=pos,
                        past_key_values=cache, use_cache=True)  # (q, V), or RowLogits when lazy


def decode_with_trees(req: Request, propose, after_step=None, debug: bool = False,
                      lazy_head: bool = True) -> GenerationResult:
    """The tree-speculation loop: propose(committed, max_depth) -> (DraftTree, info dict), verify, commit.

    after_step(committed, n_new) runs after each step (table updates); its time goes to steps[i]["update_us"].
    lazy_head: the LM head only for the rows the walk reads (tree_verify.RowLogits), where the model allows."""
    target, cfg, gen = req.target, req.sampling, req.generator
    cache = kv_cache.new_cache(target)
    committed = req.input_ids[0].tolist()
    fold = attention_backend(target) in ("sdpa", "eager")
    prefill_forwards = 0
    tokens: list[int] = []
    lengths, steps = [], []
    while not req.is_done(tokens):
        t0 = time.perf_counter()
        tree, info = propose(committed, req.max_new_tokens - len(tokens) - 1)
        tree = _cap_depth(tree, req.max_new_tokens - len(tokens) - 1)  # never verify what cannot be emitted
        t1 = time.perf_counter()
        prefix_len = len(committed) - 1
        if kv_cache.cache_length(cache) == prefix_len:
            accepted, drafted, bonus, _ = verify_tree(target, cache, tree, prefix_len, cfg, gen, lazy=lazy_head)
        elif fold:  # first step: prompt[:-1] rides along with the first tree
            logits = _prefill_tree_logits(target, cache, committed[:-1], tree, lazy_head)
            accepted, drafted, bonus = walk_tree(tree, logits, cfg, gen)
            commit(cache, prefix_len, accepted)
        else:
            target(input_ids=req.input_ids[:, :-1], past_key_values=cache, use_cache=True, logits_to_keep=1)
            prefill_forwards += 1
            accepted, drafted, bonus, _ = verify_tree(target, cache, tree, prefix_len, cfg, gen, lazy=lazy_head)
        t2 = time.perf_counter()  # walk_tree reads tokens with .item(): the device is synchronised
        emitted = req.trim(tokens + drafted + [bonus])[len(tokens):]  # EOS cut (depth is capped)
        tokens += emitted
        committed += emitted
        if len(emitted) < len(drafted) + 1:  # cut: drop the KV of tokens that were not emitted
            kv_cache.rollback(cache, len(committed) - 1)
        if after_step is not None:
            after_step(committed, len(emitted))
        t3 = time.perf_counter()
        lengths.append(len(emitted))
        full = not tree.children(accepted[-1] if accepted else -1)  # the walk ran off a leaf: a bonus token
        steps.append(dict(tree_size=len(tree), depth=tree.max_depth, accepted=len(drafted), emitted=len(emitted),
                          full=full,
                          draft_us=(t1 - t0) * 1e6, verify_ms=(t2 - t1) * 1e3, update_us=(t3 - t2) * 1e6, **info))
        if debug:
            length = kv_cache.cache_length(cache)
            if length != len(committed) - 1 or committed[req.prompt_length:] != tokens:
                raise AssertionError(f"after step {len(steps)} the cache holds {length} entries, committed "
                                     f"{len(committed)} tokens (expected {len(committed) - 1})")
    drafted = sum(s["tree_size"] for s in steps)
    accepted = sum(s["accepted"] for s in steps)
    stats = dict(steps=steps, prefill_forwards=prefill_forwards, drafted=drafted, accepted=accepted,
                 acceptance_rate=accepted / drafted if drafted else float("nan"),
                 draft_us_median=statistics.median(s["draft_us"] for s in steps) if steps else float("nan"))
    return GenerationResult(tokens, lengths, len(lengths), stats=stats)


def _check_config(ll, fl, lc, fc, tdl, crt) -> None:
    for name, value in dict(ll=ll, fl=fl, lc=lc, fc=fc, tdl=tdl, crt=crt).items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"{name} must be an int, got {value!r}")
    for name, value in dict(ll=ll, fl=fl, lc=lc, fc=fc, tdl=tdl).items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if tdl < 2 or not 0 <= crt <= tdl - 2:
        raise ValueError(f"need tdl >= 2 and 0 <= crt <= tdl - 2 (TDL counts the re-fed root, so TDL - 1 draft "
                         f"slots, and CRT of them are kept from level 0, which needs one), got tdl={tdl}, crt={crt}")


def _load_frozen(path: Path, lc: int, fc: int, tokenizer=None) -> FrozenNgramTable:
    """Load once per process; keep the top lc leaders and top fc followers when smaller than the file's."""
    key = (str(path.resolve()), path.stat().st_mtime_ns, lc, fc, id(tokenizer) if tokenizer is not None else None)
    if key not in _FROZEN:
        table = FrozenNgramTable.load(path, tokenizer=tokenizer)
        if lc < table.leader_capacity or fc < table.follower_capacity:
            table = FrozenNgramTable(table.leader_len, table.follower_len, min(lc, table.leader_capacity),
                                     min(fc, table.follower_capacity), meta=table.meta, _trusted=True,
                                     entries=[(leader, fs[:fc]) for leader, fs in table.items()[:lc]])
        _FROZEN[key] = table
    return _FROZEN[key]


def forget_frozen_tables() -> None:
    """Drop the frozen tables this process has loaded (a large-LL table holds hundreds of MB)."""
    _FROZEN.clear()


def _mismatch(table, vocab: int) -> str | None:
    built = table.meta.get("vocab_size")
    if built is not None and built != vocab:
        return (f"it was built for a vocabulary of {built} tokens ({table.meta.get('tokenizer')}), "
                f"the target has {vocab}")
    return None


def resolve_frozen(frozen, target, ll: int, fl: int, lc: int, fc: int, tokenizer=None):
    """The frozen table to use, or None.

    True: the shipped table for (LL, FL) if it fits, else (with `tokenizer`) one built earlier by
    `ensure_frozen_table` in the cache, else warn once and return None. "build": `ensure_frozen_table`
    (needs `tokenizer`; builds from the standard-library corpus and caches when missing). A path or a
    FrozenNgramTable: that table, which must fit the target's vocabulary."""
    global _WARNED
    vocab = vocab_size(target)
    if frozen is False or frozen is None:
        return None
    if isinstance(frozen, str) and frozen == "build":
        if tokenizer is None:
            raise ValueError('frozen="build" needs tokenizer= (the table is counted from text with it)')
        frozen = ensure_frozen_table(tokenizer, ll, fl, max(lc, 2**20), max(fc, 128))
    if frozen is True:
        path = frozen_table_path(ll, fl)
        if not path.is_file() and tokenizer is not None:  # built on demand earlier (ensure_frozen_table)
            path = cached_table_path(tokenizer, ll, fl, max(lc, 2**20), max(fc, 128))
        reason = None
        if not path.is_file():
            reason = f"no table for LL={ll}, FL={fl} at {path}"
        else:
            try:
                table = _load_frozen(path, lc, fc, tokenizer)
                reason = _mismatch(table, vocab)
            except ValueError as err:  # another tokenizer (hash check)
                reason = str(err)
        if reason is None:
            return table
        if not _WARNED:
            _WARNED = True
            warnings.warn(f"cacheback: no usable frozen table ({reason}); running with the dynamic table alone "
                          f"(warned once per process; frozen=\"build\" with tokenizer= builds one)",
                          NoFrozenTableWarning, stacklevel=4)
        return None
    if isinstance(frozen, (str, Path)):
        frozen = _load_frozen(Path(frozen), lc, fc, tokenizer)
    if not isinstance(frozen, FrozenNgramTable):
        raise TypeError(f"frozen must be True, False, \"build\", a path or a FrozenNgramTable, "
                        f"got {type(frozen).__name__}")
    reason = _mismatch(frozen, vocab)
    if reason is not None:
        raise ValueError(f"this frozen table does not fit the target: {reason}")
    return frozen


@register("cacheback")
def cacheback(req: Request, ll: int = 1, fl: int = 3, lc: int = 2**20, fc: int = 128, tdl: int = 96, crt: int = 16,
              merge: bool = False, frozen=True, dynamic: bool = True, tokenizer=None, lazy_head: bool = True,
              debug: bool = False) -> GenerationResult:
    """Cacheback decoding (LRU n-gram tables, draft tree, one-forward tree verification, KV compaction).

    merge: trie merging of equal sibling chains. frozen: True (the shipped or cached table, else dynamic only,
    warned once), False, "build" (count one from the corpus now, cached; needs tokenizer=), a path or a table.
    dynamic=False: the frozen table alone (Table 1's "only frozen"; then a frozen table is required).
    lazy_head=False: project every tree row through the LM head (the plain forward), for comparison."""
    _check_config(ll, fl, lc, fc, tdl, crt)
    if not isinstance(dynamic, bool):
        raise TypeError(f"dynamic must be True or False, got {dynamic!r}")
    if not dynamic and frozen is False:
        raise ValueError("dynamic=False and frozen=False leave no table to draft from")
    frozen_table = resolve_frozen(frozen, req.target, ll, fl, lc, fc, tokenizer)
    if not dynamic and frozen_table is None:
        raise ValueError(f"dynamic=False needs a frozen table, and none was found for LL={ll}, FL={fl}: pass "
                         f'frozen="build" with tokenizer=, or a table')
    tables = [] if frozen_table is None else [frozen_table]
    if dynamic:  # a fresh table per generation, seeded with the prompt (§3.3), queried first
        table = NgramTable(ll, fl, lc, fc)
        table.update(req.input_ids[0].tolist())
        tables.insert(0, table)
    tail = max(t.leader_len for t in tables)  # grow_tree reads at most this many context tokens
    window = ll + fl - 1

    def propose(committed, max_depth):
        return grow_tree(committed[-tail:], tables, tdl, crt, refed=1, merge=merge), {}

    def after_step(committed, n_new):  # the windows completed by the new tokens (§3.2, Figure 2)
        table.update_new(committed[-(n_new + window):], n_new)

    result = decode_with_trees(req, propose, after_step if dynamic else None, debug, lazy_head)
    result.stats.update(config=dict(ll=ll, fl=fl, lc=lc, fc=fc, tdl=tdl, crt=crt, merge=merge, dynamic=dynamic),
                        frozen=None if frozen_table is None else (frozen_table.meta.get("path") or "in memory"),
                        dynamic_leaders=len(table) if dynamic else 0)
    return result
