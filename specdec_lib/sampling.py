"""Turning logits into tokens: greedy, or seeded sampling with temperature, top-k and top-p.

Notation used across the package: p is the target's next-token distribution and q the draft's, both
*after* this module's warping (temperature, then top-k, then top-p: HF's order), so a lossless method
reproduces samples from the warped p exactly.

Simplifications: one sequence at a time (logits of shape (V,) or (..., V)); no repetition penalties.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .env import check_int


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 means greedy (argmax)
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)):
            raise TypeError(f"temperature must be a number, got {t!r}")
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {t}")
        if self.top_k is not None:
            check_int("top_k", self.top_k, 1)
        if self.top_p is not None:
            if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)):
                raise TypeError(f"top_p must be a number in (0, 1] or None, got {self.top_p!r}")
            if not 0 < self.top_p <= 1:  # NaN fails this too
                raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def warp_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Temperature, top-k, top-p applied to logits (..., V); removed tokens get -inf."""
    logits = logits.float() / cfg.temperature if cfg.temperature > 0 else logits.float()
    if cfg.top_k is not None and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p is not None and cfg.top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)  # (..., V)
        # Drop a token when the mass strictly before it already reaches top_p (the top token always stays).
        drop_sorted = (cumulative - sorted_logits.softmax(-1)) >= cfg.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The warped distribution (p for target logits, q for draft logits), float32 (..., V)."""
    return warp_logits(logits, cfg).softmax(-1)


def make_generator(seed: int | None, device) -> torch.Generator | None:
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed(int(seed))


def sample(dist: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token id drawn from a distribution of shape (V,)."""
    return int(torch.multinomial(dist, 1, generator=generator).item())


def pick_token(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> int:
    """Greedy argmax, or a sample from the warped distribution; logits of shape (V,)."""
    if cfg.greedy:
        return int(logits.argmax(-1).item())
    return sample(probs(logits, cfg), generator)
