"""Autoregressive decoding: the one loop with the empty proposer (one target forward per token).

The baseline every method must reproduce token for token (greedy) or in distribution (sampling). Its first
step's forward is the prompt's prefill and yields the first token, so accept_lengths are all 1s and MAT is 1.
With a seed, its samples are one seeded draw per token from the warped p: a method whose drafts are a
deterministic function of the history (tables, prompt lookup) draws the same tokens under the same seed.

Simplifications: none beyond the loop's (batch size 1; stop at max_new_tokens or the first EOS).
"""
from __future__ import annotations

from ..loop import Proposer, register_proposer


@register_proposer("autoregressive")
class Autoregressive(Proposer):
    """One target forward per token, with a DynamicCache (the baseline every method must reproduce)."""
