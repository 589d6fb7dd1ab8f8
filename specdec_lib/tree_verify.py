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

`tree_logits(..., lazy=True)` returns a RowLogits instead of the (q, V) tensor: the final hidden states, sent
through the LM head one row at a time as the walk reads them (1 + k rows of q), for models whose logits are
exactly lm_head(hidden) (PLAIN_HEAD_MODELS); the decoding loops use it.

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
    logits: torch.Tensor  # (1 + n, V): row 0 = root, row i + 1 = node i (a RowLogits when lazy)


def attention_backend(model) -> str:
    return getattr(model.config, "_attn_implementation", None) or "sdpa"


# Model types whose causal-LM head is exactly `lm_head(final hidden state)` (no soft-capping or logit
# scale): for them the walk may compute only the rows it reads (RowLogits).
PLAIN_HEAD_MODELS = {"llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2"}


class RowLogits:
    """Logits of a tree forward computed row by row on demand: `rows[r]` -> (V,), cached.

    The walk reads 1 + k of the q rows (k accepted), so projecting all q final hidden states through the
    LM head (q x hidden x V multiply-adds, a sixth of the tiny target's work per row) is mostly wasted on a
    CPU. `full()` gives the (q, V) tensor (what `tree_logits(lazy=False)` returns)."""

    def __init__(self, hidden: torch.Tensor, head):
        self.hidden, self.head, self._rows = hidden, head, {}  # hidden (q, H)
        self.shape = (hidden.shape[0], head.out_features)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, row: int) -> torch.Tensor:
        if row not in self._rows:
            self._rows[row] = self.head(self.hidden[row])  # (V,)
        return self._rows[row]

    def full(self) -> torch.Tensor:
        return self.head(self.hidden)  # (q, V)


def lazy_head_ok(target) -> bool:
    """True when logits are lm_head(hidden) for this model, so RowLogits gives exactly its logits."""
    return (getattr(target.config, "model_type", None) in PLAIN_HEAD_MODELS
            and isinstance(target.get_output_embeddings(), torch.nn.Linear) and hasattr(target, "model"))


def forward_rows(target, lazy: bool, keep: int, **inputs):
    """The target's last `keep` rows: RowLogits when lazy (and lazy_head_ok), else logits (keep, V)."""
    if lazy and lazy_head_ok(target):
        hidden = target.model(**inputs).last_hidden_state[0, -keep:]  # (keep, H), after the final norm
        return RowLogits(hidden, target.get_output_embeddings())
    return target(**inputs, logits_to_keep=keep).logits[0]  # (keep, V)


def tree_logits(target, cache, tree: DraftTree, prefix_len: int, lazy: bool = False):
    """One forward of root + tree against a cache holding `prefix_len` tokens; logits (1 + n, V).

    The cache grows by 1 + n entries (row order); commit() then keeps the accepted ones. lazy=True returns
    a RowLogits (rows computed when read) for models with a plain LM head, the (1 + n, V) tensor otherwise."""
    if kv_cache.cache_length(cache) != prefix_len:
        raise ValueError(f"the cache holds {kv_cache.cache_length(cache)} tokens, expected prefix_len="
                         f"{prefix_len} (the root must not be in the cache yet)")
    device = next(target.parameters()).device
    ids, pos, _ = tree_inputs(tree, prefix_len, device=device)  # (1, q) each
    dtype = next(target.parameters()).dtype  # an additive mask is added to scores in the model's dtype
    mask = tree_attention_mask(tree, prefix_len, dtype=dtype, backend=attention_backend(target), device=device)
    return forward_rows(target, lazy, ids.shape[1], input_ids=ids, attention_mask=mask, position_ids=pos,
                        past_key_values=cache, use_cache=True)  # (q, V)


def walk_tree(tree: DraftTree, logits, sampling: SamplingConfig = SamplingConfig(),
              generator: torch.Generator | None = None) -> tuple[list[int], list[int], int]:
    """The accepted path and bonus token from a tree's logits (1 + n, V) or RowLogits; see the module doc."""
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
                generator: torch.Generator | None = None, compact: bool = True, lazy: bool = False) -> TreeVerdict:
    """One tree forward, the walk, and (compact=True) the cache commit. Returns a TreeVerdict, a tuple
    (accepted node indices, accepted tokens, bonus token, logits (1 + n, V); a RowLogits when lazy)."""
    logits = tree_logits(target, cache, tree, prefix_len, lazy)
    accepted, tokens, bonus = walk_tree(tree, logits, sampling, generator)
    if compact:
        commit(cache, prefix_len, accepted)
    return TreeVerdict(accepted, tokens, bonus, logits)
