"""Is a sampling method lossless? Compare its samples with the exact distribution of short continuations.

A method is lossless when its output is distributed exactly as sampling from the target alone (p, warped by
temperature/top-k/top-p). For a small vocabulary V and a short length L the exact distribution of the
V^L continuations is computable by enumeration, with the target only:
    P(x_1..x_L) = p(x_1 | prompt) * p(x_2 | prompt, x_1) * ... * p(x_L | prompt, x_1..x_{L-1}).
Sampling the method over n seeds gives counts; a chi-square goodness-of-fit test compares the two.

    exact = exact_sequence_distribution(target, ids, 3, SamplingConfig(1.0))
    counts = empirical_distribution("draft_model", target, ids, 3, 4000, draft=draft, temperature=1.0)
    chi_square_test(exact, counts)            # -> ChiSquare(statistic, dof, p_value, passed)
    total_variation(exact, counts)            # a number for display: 0.5 * sum |observed freq - exact|
    lossless_check(...)                       # all of the above in one call (a LosslessReport)

False-failure rate: `passed` is p_value >= alpha, so a lossless method fails with probability about alpha
(1e-3 by default; the chi-square law is an approximation, which is why rare cells are pooled until every
expected count is >= 5). A continuation with exact probability 0 that is observed fails the test outright
(a top-k/top-p leak). With fixed seeds (seed0..seed0 + n - 1) a test is deterministic: it fails always or
never for given code, models and library versions. Power: a wrong rule is caught when its distortion is large
against the sampling noise (~ sqrt(P / n) per cell), so use peaked models (scale the LM head: random-init
LMs are nearly uniform, where p and q hardly differ) and a few thousand seeds.

Simplifications: no EOS (every continuation has exactly L tokens); the target's forwards here run without a
cache on a batch of V^l prefixes per level, so the enumeration is for small V^L only (<= `max_sequences`).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Mapping, NamedTuple

import torch

from ..decoding import generate
from ..env import vocab_size
from ..sampling import SamplingConfig, probs


@torch.inference_mode()
def exact_sequence_distribution(target, input_ids, length: int, sampling: SamplingConfig,
                                max_sequences: int = 200_000) -> dict[tuple[int, ...], float]:
    """{continuation: probability} over every continuation of `length` tokens with nonzero probability.

    Level by level: all V^l prefixes of length l go through the target as one batch (V^l, P + l), and the
    mass of each prefix is multiplied by the warped p of its last row. Probabilities sum to 1 (float64)."""
    if sampling.greedy:
        raise ValueError("the exact distribution is for sampling (temperature > 0); greedy is a parity test")
    vocab = vocab_size(target)
    if vocab ** length > max_sequences:
        raise ValueError(f"{vocab}^{length} continuations is more than max_sequences={max_sequences}")
    device = next(target.parameters()).device
    ids = torch.as_tensor(input_ids, device=device).reshape(1, -1)  # (1, P)
    prefixes = torch.empty((1, 0), dtype=torch.long, device=device)  # (V^l, l)
    mass = torch.ones(1, dtype=torch.float64, device=device)  # (V^l,)
    for _ in range(length):
        batch = torch.cat([ids.expand(prefixes.shape[0], -1), prefixes], dim=1)  # (V^l, P + l), no padding
        logits = target(input_ids=batch, logits_to_keep=1).logits[:, -1]  # (V^l, V)
        p = probs(logits, sampling).double()  # the same warping the methods use
        mass = (mass[:, None] * p).reshape(-1)  # (V^(l+1),), prefix-major
        nxt = torch.arange(vocab, device=device).repeat(prefixes.shape[0])[:, None]  # (V^(l+1), 1)
        prefixes = torch.cat([prefixes.repeat_interleave(vocab, dim=0), nxt], dim=1)
    mass = mass / mass.sum()  # float32 softmax rows sum to 1 within ~1e-7: make it exact
    return {tuple(seq): m for seq, m in zip(prefixes.tolist(), mass.tolist()) if m > 0}


def empirical_distribution(method: str, target, input_ids, length: int, n_samples: int, draft=None,
                           seed0: int = 0, temperature: float = 1.0, top_k: int | None = None,
                           top_p: float | None = None, **config) -> Counter:
    """Counts of the continuations `generate(method, ...)` gives with seeds seed0 .. seed0 + n_samples - 1."""
    counts: Counter = Counter()
    for seed in range(seed0, seed0 + n_samples):
        result = generate(method, target, input_ids, length, draft=draft, temperature=temperature, seed=seed,
                          top_k=top_k, top_p=top_p, eos_token_id=None, **config)
        counts[tuple(result.new_tokens)] += 1
    return counts


class ChiSquare(NamedTuple):
    statistic: float
    dof: int
    p_value: float
    passed: bool


def chi_square_test(exact: Mapping[tuple, float], counts: Mapping[tuple, int], alpha: float = 1e-3,
                    min_expected: float = 5.0) -> ChiSquare:
    """Pearson's chi-square goodness of fit of `counts` to `exact`; passed = p_value >= alpha.

    Cells are sorted by expected count; the rarest go into one pooled cell until it and every other cell
    expect >= min_expected. Any observation of a continuation absent from `exact` (probability 0) fails
    outright (statistic inf, p-value 0). p-value: the chi-square survival function,
    Q(dof / 2, statistic / 2), the regularised upper incomplete gamma (torch.special.gammaincc)."""
    n = sum(counts.values())
    if n == 0:
        raise ValueError("no samples")
    if any(c > 0 and exact.get(key, 0.0) <= 0 for key, c in counts.items()):
        return ChiSquare(math.inf, 0, 0.0, False)
    cells = sorted(((n * prob, counts.get(key, 0)) for key, prob in exact.items() if prob > 0), reverse=True)
    bins: list[list[float]] = []  # [expected, observed]; the rare tail pooled into the last bin
    pooled = [0.0, 0]
    for expected, observed in cells:
        if expected >= min_expected:
            bins.append([expected, observed])
        else:
            pooled[0] += expected
            pooled[1] += observed
    while pooled[0] > 0 and pooled[0] < min_expected and bins:  # the pool itself too small: merge upwards
        expected, observed = bins.pop()
        pooled[0] += expected
        pooled[1] += observed
    if pooled[0] > 0:
        bins.append(pooled)
    dof = len(bins) - 1
    if dof < 1:
        raise ValueError(f"{n} samples give fewer than 2 cells with expected count >= {min_expected}")
    statistic = sum((o - e) ** 2 / e for e, o in bins)
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                            torch.tensor(statistic / 2, dtype=torch.float64)))
    return ChiSquare(statistic, dof, p_value, p_value >= alpha)


def total_variation(exact: Mapping[tuple, float], counts: Mapping[tuple, int]) -> float:
    """0.5 * sum over continuations of |observed frequency - exact probability| (for display: even a
    lossless method shows ~ 0.5 * sum sqrt(2 P / (pi n)) from sampling noise alone)."""
    n = sum(counts.values())
    keys = set(exact) | set(counts)
    return 0.5 * sum(abs(counts.get(k, 0) / n - exact.get(k, 0.0)) for k in keys)


@dataclass
class LosslessReport:
    method: str
    n_samples: int
    chi_square: ChiSquare
    tv: float
    exact: dict
    counts: Counter

    @property
    def passed(self) -> bool:
        return self.chi_square.passed

    def __str__(self) -> str:
        c = self.chi_square
        return (f"{self.method}: chi2={c.statistic:.1f} dof={c.dof} p={c.p_value:.3g} "
                f"{'PASS' if c.passed else 'FAIL'} TV={self.tv:.4f} (n={self.n_samples})")


def lossless_check(method: str, target, input_ids, length: int = 3, n_samples: int = 4000, draft=None,
                   temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                   alpha: float = 1e-3, seed0: int = 0, **config) -> LosslessReport:
    """Exact enumeration + `n_samples` seeded runs of `method` + chi-square: the reusable lossless test."""
    sampling = SamplingConfig(temperature, top_k, top_p)
    exact = exact_sequence_distribution(target, input_ids, length, sampling)
    counts = empirical_distribution(method, target, input_ids, length, n_samples, draft=draft, seed0=seed0,
                                    temperature=temperature, top_k=top_k, top_p=top_p, **config)
    return LosslessReport(method, n_samples, chi_square_test(exact, counts, alpha), total_variation(exact, counts),
                          exact, counts)
