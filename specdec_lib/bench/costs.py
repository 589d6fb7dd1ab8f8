"""Why speculative decoding can pay: what one forward costs, and the expected-speedup arithmetic.

- `forward_cost(model, rows, prefix)` and `verify_cost(model, rows, prefix)`: what one forward of R rows and
  one loop step of R rows cost here (mechanisms/budget/step_cost.py, where the auto budgets read them; served here for
  the notebooks);
- `expected_tokens_per_step(alpha, gamma)`: with per-token acceptance alpha (i.i.d., Leviathan et al. 2023)
  and a chain of gamma drafted tokens, the tokens one target forward yields, the next token included:
      E[tokens] = 1 + alpha + ... + alpha^gamma = (1 - alpha^(gamma+1)) / (1 - alpha)   (gamma + 1 at alpha = 1)
- `expected_speedup(alpha, gamma, cost_ratio, verify_overhead)`: wall-clock speedup over autoregressive:
      speedup = E[tokens] / (gamma * c + verify_overhead)
  with c = cost_ratio = (draft forward) / (target forward), both for one token, and verify_overhead = the cost
  of the target forward that verifies gamma + 1 tokens, relative to a one-token target forward (1 = free
  verification, Leviathan's assumption; read the real value off `forward_cost`, see `verify_overhead`).
- `measured_agreement(target, draft, input_ids)`: greedy top-1 agreement of draft and target along a text,
  a stand-in for alpha under greedy decoding.
- `formula_against_measured(measured, alpha)`: E[tokens](gamma) at alpha on every gamma up to a little past the
  measured ones (the curve), and the measured MAT points with the formula's value beside them (notebook 03's
  gamma sweep drawn over the formula: `viz.expected_tokens_figure`).
- `batch_cost(model, batches, rows)`: forward_cost for B sequences at once, with the roofline's arithmetic: a
  forward reads the weights once and does about 2 x params FLOPs per row, so the FLOPs per byte of weights grow
  with B x R, and the achieved GFLOP/s grow with them until the arithmetic, not the reading, is the limit.

Simplifications: batch size 1 (but in `batch_cost`); the roofline counts matmul FLOPs as 2 x params per row
(attention over the prefix and the KV reads left out); acceptance is modelled as independent of position (real
acceptance falls along a chain, and varies by context).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..mechanisms.budget.cost_curve import CostCurve
from ..mechanisms.budget.step_cost import DEFAULT_ROWS, forward_cost, verify_cost

__all__ = ["DEFAULT_ROWS", "batch_cost", "expected_speedup", "expected_tokens_per_step", "formula_against_measured",
           "forward_cost", "measured_agreement", "verify_cost", "verify_overhead"]


def verify_overhead(costs: pd.DataFrame, model: str, gamma: int) -> float:
    """Cost of a (gamma + 1)-token forward relative to a 1-token one, from a `forward_cost` table (read as the
    auto budgets read a curve, cost_curve.CostCurve: floored at the one-row price, so it is at least 1)."""
    rows = costs[costs["model"] == model]
    if rows.empty:
        raise ValueError(f"no rows for model {model!r}; models: {sorted(costs['model'].unique())}")
    curve = CostCurve(rows["rows"].tolist(), rows["median_ms"].tolist())
    return curve(gamma + 1) / curve(1)


def expected_tokens_per_step(alpha, gamma):
    """E[tokens per target forward] = (1 - alpha^(gamma+1)) / (1 - alpha); gamma + 1 at alpha = 1.

    alpha may be a float or an array (numpy broadcasting with gamma)."""
    a = np.asarray(alpha, dtype=float)
    g = np.asarray(gamma, dtype=float)
    if np.any((a < 0) | (a > 1)):
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if np.any(g < 0):
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    near_one = np.isclose(a, 1.0)
    safe = np.where(near_one, 0.5, a)  # avoids 0/0; those entries are replaced below
    out = np.where(near_one, g + 1, (1 - safe ** (g + 1)) / (1 - safe))
    return float(out) if out.ndim == 0 else out


def expected_speedup(alpha, gamma, cost_ratio, verify_overhead: float = 1.0):
    """Leviathan et al.: speedup = E[tokens] / (gamma * c + verify_overhead), c = draft/target cost."""
    c = np.asarray(cost_ratio, dtype=float)
    v = np.asarray(verify_overhead, dtype=float)
    if np.any(c < 0) or np.any(v <= 0):
        raise ValueError(f"cost_ratio must be >= 0 and verify_overhead > 0, got {cost_ratio}, {verify_overhead}")
    out = np.asarray(expected_tokens_per_step(alpha, gamma)) / (np.asarray(gamma, dtype=float) * c + v)
    return float(out) if out.ndim == 0 else out


def formula_against_measured(measured: pd.DataFrame, alpha: float, max_gamma: int | None = None
                             ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Leviathan's E[tokens](gamma) at `alpha` beside measured MAT.

    measured: one row per measured point, columns `gamma` and `mat` (and e.g. `method`), such as a gamma sweep's
    summaries. Returns (curve, points): curve has `gamma` = 0..max_gamma (default: the largest measured gamma + 2)
    and `expected_tokens`; points is `measured`'s rows with `expected_tokens` at their gamma and `ratio` = mat over
    it (above 1: the run gained more per target forward than i.i.d. acceptance at alpha predicts)."""
    missing = {"gamma", "mat"} - set(measured.columns)
    if missing:
        raise ValueError(f"measured needs the columns {sorted(missing)}")
    if not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    top = int(measured["gamma"].max()) + 2 if max_gamma is None else int(max_gamma)
    curve = pd.DataFrame({"gamma": np.arange(0, top + 1)})
    curve["expected_tokens"] = expected_tokens_per_step(float(alpha), curve["gamma"].to_numpy())
    points = measured.reset_index(drop=True).copy()
    points["expected_tokens"] = expected_tokens_per_step(float(alpha), points["gamma"].to_numpy(dtype=float))
    points["ratio"] = points["mat"] / points["expected_tokens"]
    return curve, points


def measured_agreement(target, draft, input_ids) -> float:
    """Fraction of positions where draft and target pick the same greedy next token (one forward each)."""
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.shape[0] != 1 or ids.shape[1] < 1:
        raise ValueError(f"input_ids must have shape (1, P) with P >= 1, got {tuple(ids.shape)}")
    with torch.inference_mode():
        t = target(input_ids=ids.to(next(target.parameters()).device)).logits[0].argmax(-1)  # (P,)
        d = draft(input_ids=ids.to(next(draft.parameters()).device)).logits[0].argmax(-1)  # (P,)
    return float((t.cpu() == d.cpu()).float().mean())


def batch_cost(model, batches=(1, 2, 4, 8), rows=(1, 2, 4, 8, 16), prefix: int = 256, repeats: int = 7,
               name: str | None = None) -> pd.DataFrame:
    """`forward_cost` for each batch size B (B sequences, R new rows each, B x R `tokens` in one forward), with
    ms per token, the cost relative to one row of one sequence, and the roofline's two numbers: `flop_per_byte`
    (2 x params x tokens FLOPs over the weights' bytes, read once per forward) and the achieved `gflops`."""
    params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    df = pd.concat([forward_cost(model, rows, prefix=prefix, repeats=repeats, warmup=2, name=name, batch=b)
                    for b in sorted(set(int(b) for b in batches))], ignore_index=True)
    df["tokens"] = df["batch"] * df["rows"]
    df["ms_per_token"] = df["median_ms"] / df["tokens"]
    df["relative"] = df["median_ms"] / df["median_ms"].iloc[0]  # over B = 1, R = 1 (the smallest of each)
    df["flop_per_byte"] = 2 * params * df["tokens"] / weight_bytes
    df["gflops"] = 2 * params * df["tokens"] / (df["median_ms"] * 1e6)  # FLOP per ms / 1e6 = GFLOP/s
    return df
