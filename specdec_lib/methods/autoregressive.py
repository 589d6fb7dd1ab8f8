"""Autoregressive decoding: the one loop with the empty proposer (one target forward per token).

The baseline every method must reproduce token for token (greedy) or in distribution (sampling). Its first
step's forward is the prompt's prefill and yields the first token, so accept_lengths are all 1s and MAT is 1.
With a seed, its samples are one seeded draw per token from the warped p: a method whose drafts are a
deterministic function of the history (tables, prompt lookup) draws the same tokens under the same seed.

`greedy_through_store` runs the same proposer with the target reading a given store.layout.FlexLayoutStore
(notebook 08 decodes through the block layout it builds): lossless with full rows, and with compressed=True
every decoded row sees only what the store's compression keeps (StreamingLLM / Quest attention, not lossless).

Simplifications: none beyond the loop's (batch size 1; stop at max_new_tokens or the first EOS).
"""
from __future__ import annotations

import torch

from ..decoding import Request, _as_input_ids
from ..env import check_int
from ..loop import LoopState, Proposal, Proposer, decode, register_proposer
from ..mechanisms.draft_tree import DraftTree
from ..sampling import SamplingConfig


@register_proposer("autoregressive")
class Autoregressive(Proposer):
    """One target forward per token, with a DynamicCache (the baseline every method must reproduce)."""


class ThroughStore(Proposer):
    """One target forward per token, the target reading `store` (a flex_layout.FlexLayoutStore it is attached
    to); compressed=True: every row after the prompt's sees C(kv) only."""

    def __init__(self, store, compressed: bool = False):
        if not hasattr(store, "prepare"):
            raise TypeError(f"store must be a flex_layout.FlexLayoutStore, got {type(store).__name__}")
        self.store, self.compressed = store, bool(compressed)

    def target_cache(self, state: LoopState):
        return self.store

    def propose(self, state: LoopState, max_depth: int) -> Proposal:
        # the first step's root rides the prompt's prefill, which sees the full KV (C is of the past only)
        return Proposal(DraftTree(state.committed[-1]), compressed_root=self.compressed and bool(state.tokens))

    def stats(self) -> dict:
        return dict(config=dict(compressed=self.compressed, compression=repr(self.store.compression)))


def greedy_through_store(target, store, prompt_ids, max_new_tokens: int, compressed: bool = False) -> list[int]:
    """Greedy tokens of `target` (attached to `store`: flex_layout.attach) decoding through the store's layout,
    the loop's plain steps; the store must be empty and hold prompt + max_new_tokens - 1 entries."""
    check_int("max_new_tokens", max_new_tokens, 1)
    ids = _as_input_ids(prompt_ids, store.slot_pos.device)  # (1, P); an empty prompt is refused
    if store.length:
        raise ValueError(f"the store already holds {store.length} entries: give an empty one")
    request = Request(target, ids, max_new_tokens, SamplingConfig(), None, None)
    with torch.inference_mode():
        return decode(request, ThroughStore(store, compressed)).new_tokens
