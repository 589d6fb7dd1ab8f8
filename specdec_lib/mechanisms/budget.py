"""Draft budgets chosen from this machine's own cost curve (`"auto"` budgets; issue 14).

A method's draft budget (Cacheback's TDL, a draft model's gamma, prompt lookup's num_tokens) trades tokens
per target forward against the forward's price. Papers pick it on their GPU, where extra rows are nearly
free; on a CPU a 97-row forward costs 2.7x a one-row one, and the paper's TDL loses to a small tree. So we
pick the budget, step by step, that maximises the expected throughput

    budget* = argmax_b  E[tokens per step | b] / (draft_ms(b) + t(rows(b)))

with t the target's forward cost measured on this device (`CostCurve`) and E[tokens] from the method's own
running acceptance statistics. The choice depends only on the history (committed tokens and verdicts) and
on the curve, never on the random stream: the budget changes what is drafted, never what is emitted
(lossless), and a test that injects a curve (`CostCurve.from_points`) gets the same choices every time.

Two estimators of E[tokens | b]:
- `ChainBudget` (a chain of g drafts: draft model, prompt lookup): P(accept depth d | depth d reached) per
  depth, counted online and shrunk toward the pooled rate (depths never tried get the pooled rate), so
      E[tokens | g] = 1 + sum_{d=1..g} prod_{j<=d} a_j        (Leviathan's formula without the i.i.d. a);
  a verified chain of g shows exactly what any shorter chain would have yielded; deeper depths are explored
  by optimism (a bonus on a_d shrinking as 1 / sqrt(times depth d was reached), UCB-like, no coin).
- `TreeBudget` (a tree grown to a size budget: Cacheback's TDL): a ladder of candidates, each with running
  (decayed) means of the tokens it yields and its tree's rows. A step's verdict tells, for every tree the
  proposer can regrow for a smaller candidate, exactly what that tree would have yielded (the emitted path is
  fixed: the longest prefix of it inside the smaller tree, + 1); a larger tree's yield is unknown, so every
  `probe_every` steps a larger candidate is verified instead (the best by an optimistic, UCB-like estimate:
  a deterministic probe, no coin).

Simplifications: t is measured once at one prefix length (256 tokens; cost grows slowly with the prefix on
small models) and cached on disk per device + model + dtype (`cost_cache_dir`); the draft time of the
n-gram drafters is taken as zero (tens of microseconds against milliseconds of forward); a draft model's is
gamma x its own one-row forward; acceptance is modelled per depth only (not per context).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..checks import check_int

AUTO = "auto"
MEASURE_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
_MEMO: dict[str, "CostCurve"] = {}  # curves measured or read in this process, by cache key


def is_auto(value) -> bool:
    return isinstance(value, str) and value == AUTO


def cost_cache_dir() -> Path:
    """Where measured curves are kept: $SPECDEC_CACHE/costs, else ~/.cache/specdec_lib/costs."""
    root = os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec_lib"
    return Path(root) / "costs"


def _device_name(device) -> str:
    import torch

    from ..models import cpu_model_name

    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"{device.type}:{cpu_model_name()}:{torch.get_num_threads()} threads"  # cost depends on the threads


def model_key(model) -> dict:
    """What a curve is valid for: device name, model identity (name_or_path, parameter count, config hash),
    dtype, and the torch version."""
    import torch
    param = next(model.parameters())
    config = json.dumps(model.config.to_dict(), sort_keys=True, default=str)
    return dict(device=_device_name(param.device), model=str(getattr(model.config, "name_or_path", "") or ""),
                params=int(sum(p.numel() for p in model.parameters())),
                config=hashlib.sha256(config.encode()).hexdigest()[:16], dtype=str(param.dtype),
                torch=torch.__version__)


class CostCurve:
    """t(rows): ms of one target forward of `rows` query rows, linear between measured points, extended
    beyond the last one with the last slope (and flat below the first)."""

    def __init__(self, rows: Sequence[float], ms: Sequence[float], key: dict | None = None):
        order = np.argsort(np.asarray(rows, dtype=float))
        self.rows = np.asarray(rows, dtype=float)[order]
        self.ms = np.asarray(ms, dtype=float)[order]
        if len(self.rows) < 1 or len(set(self.rows)) != len(self.rows) or self.rows[0] < 1:
            raise ValueError(f"need distinct row counts >= 1, got {list(rows)}")
        if not np.all(np.isfinite(self.ms)) or np.any(self.ms <= 0):
            raise ValueError(f"costs must be positive finite ms, got {list(ms)}")
        self.key = key

    @classmethod
    def from_points(cls, points) -> "CostCurve":
        """From {rows: ms} or [(rows, ms), ...] (tests inject curves this way)."""
        pairs = sorted(dict(points).items())
        return cls([r for r, _ in pairs], [m for _, m in pairs])

    def __call__(self, rows: float) -> float:
        r, m = self.rows, self.ms
        if rows <= r[-1] or len(r) == 1:
            return float(np.interp(rows, r, m))
        slope = (m[-1] - m[-2]) / (r[-1] - r[-2])
        return float(m[-1] + max(slope, 0.0) * (rows - r[-1]))

    def __repr__(self) -> str:
        points = ", ".join(f"{int(r)}: {m:.2f}" for r, m in zip(self.rows, self.ms))
        return f"CostCurve({{{points}}} ms)"

    @classmethod
    def measure(cls, model, rows: Sequence[int] = MEASURE_ROWS, prefix: int = 256, repeats: int = 7,
                cache: bool = True) -> "CostCurve":
        """The curve of `model` here (bench.costs.forward_cost, lazy head as the loop verifies), read from the
        on-disk cache when this device + model + dtype was measured before (cache=False: measure anew)."""
        key = model_key(model)
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
        path = cost_cache_dir() / f"curve_{digest}.json"
        if cache and digest in _MEMO and _MEMO[digest].key == key:
            return _MEMO[digest]
        if cache and path.exists():
            data = json.loads(path.read_text())
            if data.get("key") == key:
                curve = _MEMO[digest] = cls(data["rows"], data["ms"], key)
                curve.path = path
                return curve
        from ..bench.costs import forward_cost  # timing lives in bench/, not in the mechanisms
        limit = getattr(model.config, "max_position_embeddings", None) or prefix + max(rows)
        rows = [r for r in rows if r <= limit - 1] or [1]
        prefix = max(1, min(prefix, limit - max(rows)))
        table = forward_cost(model, rows, prefix=prefix, repeats=repeats, warmup=2, lazy_head=True)
        # more rows never cost less: a dip is timing noise, and a chooser would read it as free rows
        ms = np.maximum.accumulate(table["median_ms"].to_numpy())
        curve = _MEMO[digest] = cls(table["rows"].tolist(), ms.tolist(), key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(key=key, prefix=prefix, rows=curve.rows.tolist(), ms=curve.ms.tolist())))
        tmp.replace(path)  # atomic: a concurrent reader sees the whole file or none
        curve.path = path
        return curve


def resolve_curve(costs, model) -> CostCurve:
    """A method's `costs=` option: None (measure `model` here, cached), a CostCurve, or {rows: ms}."""
    if costs is None:
        return CostCurve.measure(model)
    if isinstance(costs, CostCurve):
        return costs
    if isinstance(costs, dict):
        return CostCurve.from_points(costs)
    raise TypeError(f"costs must be None (measure here), a CostCurve or {{rows: ms}}, got {type(costs).__name__}")


def check_budget(name: str, value, minimum: int = 1):
    """An int >= minimum, or "auto" (any other string: a TypeError, like any other non-int)."""
    if isinstance(value, str):
        if value != AUTO:
            raise TypeError(f"{name} must be an int >= {minimum} or 'auto', got {value!r}")
        return value
    return check_int(name, value, minimum)


class ChainBudget:
    """Chain length g from per-depth acceptance (see the module doc). draft_ms(g): the drafting time of g."""

    def __init__(self, curve: CostCurve, max_len: int = 16, draft_ms: Callable[[int], float] | None = None,
                 prior: float = 0.5, strength: float = 2.0, explore: float = 0.25):
        self.curve, self.max_len = curve, check_int("max_len", max_len, 1)
        self.draft_ms = draft_ms or (lambda g: 0.0)
        self.prior, self.strength, self.explore = prior, strength, explore
        self.reached = np.zeros(max_len + 1)  # index d: steps whose chain had a node at depth d reaching it
        self.accepted = np.zeros(max_len + 1)

    def rates(self, optimistic: bool = False) -> np.ndarray:
        """a_d for d = 1..max_len, shrunk toward the pooled rate (itself shrunk toward `prior`); optimistic:
        plus explore / sqrt(1 + times reached), so depths seldom reached get tried (the pooled rate leans on
        depth 1, where acceptance is lowest, and would keep chains short)."""
        pooled = (self.accepted.sum() + self.prior * self.strength) / (self.reached.sum() + self.strength)
        rates = (self.accepted + pooled * self.strength) / (self.reached + self.strength)
        if optimistic:
            rates = np.minimum(1.0, rates + self.explore / np.sqrt(1.0 + self.reached))
        return rates[1:]

    def expected_tokens(self, optimistic: bool = False) -> np.ndarray:
        """E[tokens | g] for g = 0..max_len (index g)."""
        return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(self.rates(optimistic)))])

    def choose(self, limit: int | None = None) -> int:
        """argmax_g E[tokens | g] / (draft_ms(g) + t(g + 1)), g in 1..min(max_len, limit); ties: the smallest."""
        top = self.max_len if limit is None else max(1, min(self.max_len, limit))
        tokens = self.expected_tokens(optimistic=True)
        speed = [tokens[g] / (self.draft_ms(g) + self.curve(g + 1)) for g in range(1, top + 1)]
        return 1 + int(np.argmax(speed))

    def record(self, drafted: int, accepted: int) -> None:
        """One verified chain: depths 1..accepted accepted, depth accepted + 1 reached and rejected (if drafted)."""
        drafted = min(drafted, self.max_len)
        reached = min(accepted + 1, drafted)
        self.reached[1:reached + 1] += 1
        self.accepted[1:min(accepted, drafted) + 1] += 1


class TreeBudget:
    """A ladder of tree-size candidates with counterfactual yields (see the module doc).

    A candidate's yield estimate is its decayed mean shrunk (one pseudo-step) toward the best mean of the
    smaller candidates (a bigger budget mostly yields at least as much); the verified candidate is the best
    estimated speed, except every `probe_every` steps: then the larger candidate with the best optimistic speed
    (mean + explore / sqrt(1 + weight): seldom or long-ago seen candidates come back, discounted-UCB-like)."""

    def __init__(self, curve: CostCurve, candidates: Sequence[int], probe_every: int = 8, window: int = 2,
                 decay: float = 0.95, explore: float = 1.0, draft_ms: Callable[[int], float] | None = None):
        self.curve, self.candidates = curve, sorted(set(int(c) for c in candidates))
        if not self.candidates:
            raise ValueError("no candidate budgets")
        self.probe_every, self.window, self.decay = check_int("probe_every", probe_every, 1), window, decay
        self.explore = explore
        self.draft_ms = draft_ms or (lambda b: 0.0)
        n = len(self.candidates)
        self.weight, self.tokens, self.rows = np.zeros(n), np.zeros(n), np.zeros(n)
        self.steps = 0

    def estimates(self) -> tuple[np.ndarray, np.ndarray]:
        """(tokens per step, ms per step) of each candidate."""
        means, prior = [], 1.0
        for i, b in enumerate(self.candidates):
            mean = (self.tokens[i] + prior) / (self.weight[i] + 1.0)
            means.append(mean)
            if self.weight[i] > 0:
                prior = max(prior, self.tokens[i] / self.weight[i])
        rows = [self.rows[i] / self.weight[i] if self.weight[i] > 0 else b + 1 for i, b in enumerate(self.candidates)]
        cost = np.array([self.draft_ms(b) + self.curve(r) for b, r in zip(self.candidates, rows)])
        return np.array(means), cost

    def speeds(self) -> np.ndarray:
        """Estimated tokens per ms of each candidate."""
        tokens, cost = self.estimates()
        return tokens / cost

    def best(self) -> int:
        """Index of the best candidate (before any data: the largest, so the first step sees every rung)."""
        return len(self.candidates) - 1 if not self.weight.any() else int(np.argmax(self.speeds()))

    def choose(self) -> tuple[int, list[int]]:
        """(budget to verify this step, smaller candidates whose trees to regrow for counterfactuals)."""
        self.steps += 1
        k = self.best()
        if self.steps % self.probe_every == 0 and k + 1 < len(self.candidates):
            tokens, cost = self.estimates()
            optimistic = (tokens + self.explore / np.sqrt(1.0 + self.weight)) / cost
            k = k + 1 + int(np.argmax(optimistic[k + 1:]))  # a larger tree's yield is only seen by verifying it
        return self.candidates[k], self.candidates[max(0, k - self.window):k]

    def record(self, results: dict[int, tuple[int, int]]) -> None:
        """{candidate: (tokens it yields, its forward's rows)} for this step (decayed running sums)."""
        self.weight *= self.decay
        self.tokens *= self.decay
        self.rows *= self.decay
        for b, (tokens, rows) in results.items():
            i = self.candidates.index(b)
            self.weight[i] += 1
            self.tokens[i] += tokens
            self.rows[i] += rows


def path_yield(tree, emitted: Sequence[int]) -> int:
    """Tokens the step would have emitted with `tree`: the longest prefix of the emitted path (its drafts) that
    is a path of the tree, + 1 (the target's own token after it). Exact for any tree whose drafts are a
    function of the history: the target's tokens along the path do not depend on the tree."""
    nodes, n = [-1], 0  # every node spelling the path so far (without merging, siblings may repeat a token)
    for tok in emitted[:-1]:
        nodes = [c for node in nodes for c in tree.children(node) if tree.tokens[c] == tok]
        if not nodes:
            break
        n += 1
    return n + 1
