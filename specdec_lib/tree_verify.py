"""Verifying a draft tree in ONE target forward, then committing the accepted path to the KV cache.

Cacheback paper, section 3.2 ("tree attention ... validate all branches of the tree in parallel as one
input"; "a decoding step generates one token in the worst case ... one plus the longest branch length in
the best case"). The state between steps: the target's DynamicCache holds `prefix_len` committed tokens;
the last committed token (the tree's root) is NOT in the cache yet.

One step:
1. `tree_attention.tree_inputs` / `tree_attention_mask`: root + n nodes as q = 1 + n query rows,
   positions prefix_len + depth, each row seeing the prefix and its ancestors; one forward gives logits
   (q, V), row r = the next-token logits after the root-to-row path.
2. `walk_tree`: from the root, pick the target's token for the current row (argmax when greedy, else a
   seeded sample from the warped p, via sampling.pick_token); if a child of the current node carries that
   token, accept it and continue; otherwise the picked token is the bonus token. Without trie merging,
   siblings often repeat a token (followers of one leader share their first tokens), and the chain that
   continues may hang under any of them: so the walk follows the SET of all nodes whose paths spell the
   accepted tokens (they share one prefix, hence one next-token distribution, read from the set's first
   row), and commits the path of the first node of the deepest set. Every emitted token is drawn from p given exactly the
   tokens before it, with one draw per token like autoregressive decoding, so for deterministic drafts
   (tables, prompt lookup) the output is distributed exactly as autoregressive sampling: lossless.
3. `commit`: keep prefix + root + accepted nodes' KV entries in path order (kv_cache.compact). The cache
   then holds prefix_len + 1 + k tokens and the bonus token is the next root. Nothing is re-fed (the
   reference implementation crops to the prefix and re-feeds the accepted tokens next step).

Simplifications: batch size 1; full-attention caches; the draft's own probabilities (q) are not used, so
this is not speculative sampling for stochastic drafts (a draft model's sampled tree would need the
q-based residual rule; see the draft-model notebook).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from . import kv_cache
from .draft_tree import ROOT, DraftTree
from .sampling import SamplingConfig, pick_token
from .tree_attention import tree_attention_mask, tree_inputs


class TreeVerdict(NamedTuple):
    accepted: list[int]  # accepted node indices, root-to-leaf order (may be empty)
    tokens: list[int]  # their tokens
    bonus: int  # the target's token after the accepted path (the next root)
    logits: torch.Tensor  # (1 + n, V): row 0 = root, row i + 1 = node i


def attention_backend(model) -> str:
    return getattr(model.config, "_attn_implementation", None) or "sdpa"


def tree_logits(target, cache, tree: DraftTree, prefix_len: int) -> torch.Tensor:
    """One forward of root + tree against a cache holding `prefix_len` tokens; logits (1 + n, V).

    The cache grows by 1 + n entries (row order); commit() then keeps the accepted ones."""
    if kv_cache.cache_length(cache) != prefix_len:
        raise ValueError(f"the cache holds {kv_cache.cache_length(cache)} tokens, expected prefix_len="
                         f"{prefix_len} (the root must not be in the cache yet)")
    device = next(target.parameters()).device
    ids, pos, _ = tree_inputs(tree, prefix_len, device=device)  # (1, q) each
    dtype = next(target.parameters()).dtype  # an additive mask is added to scores in the model's dtype
    mask = tree_attention_mask(tree, prefix_len, dtype=dtype, backend=attention_backend(target), device=device)
    out = target(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
    return out.logits[0]  # (q, V)


def walk_tree(tree: DraftTree, logits: torch.Tensor, sampling: SamplingConfig = SamplingConfig(),
              generator: torch.Generator | None = None) -> tuple[list[int], list[int], int]:
    """The accepted path and bonus token from a tree's logits (1 + n, V); see the module doc."""
    nodes = [ROOT]  # every node whose path spells the tokens accepted so far
    while True:
        token = pick_token(logits[nodes[0] + 1], sampling, generator)  # row i + 1 holds node i's logits
        matching = [c for node in nodes for c in tree.children(node) if tree.tokens[c] == token]
        if not matching:
            accepted = tree.path_to(nodes[0])  # a real root-to-node chain (empty at the root)
            return accepted, [tree.tokens[i] for i in accepted], token
        nodes = matching


def commit(cache, prefix_len: int, accepted: list[int]) -> None:
    """Keep prefix + root + accepted nodes (offset 0 is the root, node i sits at offset i + 1)."""
    kv_cache.compact(cache, prefix_len, [0] + [i + 1 for i in accepted])


def verify_tree(target, cache, tree: DraftTree, prefix_len: int, sampling: SamplingConfig = SamplingConfig(),
                generator: torch.Generator | None = None, compact: bool = True) -> TreeVerdict:
    """One tree forward, the walk, and (compact=True) the cache commit. Returns a TreeVerdict, a tuple
    (accepted node indices, accepted tokens, bonus token, logits (1 + n, V))."""
    logits = tree_logits(target, cache, tree, prefix_len)
    accepted, tokens, bonus = walk_tree(tree, logits, sampling, generator)
    if compact:
        commit(cache, prefix_len, accepted)
    return TreeVerdict(accepted, tokens, bonus, logits)
