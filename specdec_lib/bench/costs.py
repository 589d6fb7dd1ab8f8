"""Why speculative decoding can pay: what one forward costs, and the expected-speedup arithmetic.

- `forward_cost(model, rows, prefix)`, `verify_cost(model, rows, prefix)`: one forward / one loop step of R rows
  here (mechanisms/budget/step_cost.py, where the auto budgets read them; served here for the notebooks);
- `expected_tokens_per_step(alpha, gamma)`: with per-token acceptance alpha (i.i.d., Leviathan et al. 2023)
  and a chain of gamma drafted tokens, the tokens one target forward yields, the next token included:
      E[tokens] = 1 + alpha + ... + alpha^gamma = (1 - alpha^(gamma+1)) / (1 - alpha)   (gamma + 1 at alpha = 1)
- `expected_speedup(alpha, gamma, cost_ratio, verify_overhead)`: speedup = E[tokens] / (gamma * c + v) over
  autoregressive, c = cost_ratio = (draft forward) / (target forward), one token each, v = verify_overhead =
  the (gamma + 1)-token target forward over a one-token one (1: free verification, Leviathan's assumption; read
  the real value off `forward_cost` with `verify_overhead`);
- `speedup_against_model(summary, inputs)`: per method, that speedup at its measured alpha, c, v beside the
  speedup `bench.summarize` measured (`viz.speedup_model_figure`);
- `tree_break_even(costs, rates, width)`: tokens per ms of a chain and of a tree of R rows from a cost curve and
  per-depth acceptance, and the R from which the tree pays (its doc: the tree model; `viz.break_even_figure`);
- `measured_agreement(target, draft, input_ids)`: greedy top-1 agreement of draft and target along a text;
- `formula_against_measured(measured, alpha)`: E[tokens](gamma) at alpha beside measured MAT points
  (`viz.expected_tokens_figure`: notebook 04's gamma sweep drawn over the formula);
- `batch_cost(model, batches, rows)`: forward_cost for B sequences at once, with the roofline's arithmetic: about
  2 x params FLOPs per row against the weights read once, so FLOPs per byte grow with B x R until compute binds.

Simplifications: batch size 1 (but in `batch_cost`); the roofline counts matmul FLOPs as 2 x params per row
(attention over the prefix and the KV reads left out); acceptance is modelled as independent of position (real
acceptance falls along a chain, and varies by context).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from ..mechanisms.budget.cost_curve import CostCurve
from ..mechanisms.budget.step_cost import DEFAULT_ROWS, forward_cost, verify_cost

__all__ = ["DEFAULT_ROWS", "BreakEven", "batch_cost", "expected_speedup", "expected_tokens_per_step",
           "formula_against_measured", "forward_cost", "measured_agreement", "speedup_against_model",
           "tree_break_even", "verify_cost", "verify_overhead"]


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


def speedup_against_model(summary: pd.DataFrame, inputs, baseline: str | None = None,
                          speed: str = "tokens_per_s") -> pd.DataFrame:
    """The expected-speedup model against a benchmark: one row per row of `inputs`.

    summary: `bench.summarize(bench.run_bench(...))` (columns method, `speed`, mat). inputs: a DataFrame or dicts
    with method (a summary's method label), alpha, gamma, cost_ratio (c) and verify_overhead (v; 1.0 when absent),
    as measured for that method (e.g. alpha = `acceptance.pooled_acceptance`, c = the draft's one-row forward over
    the target's, v = `verify_overhead`). baseline: the method the model's speedup is over, its plain decoding:
    "autoregressive" when the summary has it, else "hf". Returns the inputs with expected_tokens, the measured
    `mat`, predicted_speedup (`expected_speedup`), measured_speedup (`speed` over the baseline's), ratio (measured
    over predicted: below 1, overheads the model leaves out) and baseline."""
    inputs = pd.DataFrame(inputs).reset_index(drop=True)
    missing = {"method", "alpha", "gamma", "cost_ratio"} - set(inputs.columns)
    if missing:
        raise ValueError(f"inputs need the columns {sorted(missing)}")
    if {"method", speed} - set(summary.columns):
        raise ValueError(f"summary needs the columns method and {speed!r}")
    speeds = summary.set_index("method")[speed]
    if baseline is None:
        baseline = "autoregressive" if "autoregressive" in speeds.index else "hf"
    unknown = [m for m in [baseline, *inputs["method"]] if m not in speeds.index]
    if unknown:
        raise ValueError(f"no summary row for {unknown}; methods: {list(speeds.index)}")
    out = inputs.copy()
    if "verify_overhead" not in out:
        out["verify_overhead"] = 1.0
    out["expected_tokens"] = expected_tokens_per_step(out["alpha"].to_numpy(float), out["gamma"].to_numpy(float))
    if "mat" in summary:
        out["mat"] = summary.set_index("method")["mat"].reindex(out["method"]).to_numpy()
    out["predicted_speedup"] = expected_speedup(out["alpha"].to_numpy(float), out["gamma"].to_numpy(float),
                                                out["cost_ratio"].to_numpy(float),
                                                out["verify_overhead"].to_numpy(float))
    out["measured_speedup"] = speeds.reindex(out["method"]).to_numpy() / speeds[baseline]
    out["ratio"] = out["measured_speedup"] / out["predicted_speedup"]
    out["baseline"] = baseline
    return out


@dataclass(frozen=True)
class BreakEven:
    """`tree_break_even`'s answer: `table` (one row per R), the R from which the tree pays (None: never in the
    table's range), and the best chain it must beat (its rows and tokens per ms)."""
    table: pd.DataFrame
    break_even: int | None
    best_chain_rows: int
    best_chain_tokens_per_ms: float
    width: int


def _cost_function(costs, model: str | None) -> Callable[[float], float]:
    if callable(costs):
        return costs
    rows = costs
    if "model" in costs:
        names = list(dict.fromkeys(costs["model"]))
        if model is None and len(names) > 1:
            raise ValueError(f"the cost table holds several models {names}: pass model=")
        rows = costs[costs["model"] == (model or names[0])]
        if rows.empty:
            raise ValueError(f"no rows for model {model!r}; models: {names}")
    return CostCurve(rows["rows"].tolist(), rows["median_ms"].tolist())


def tree_break_even(costs, rates: Sequence[float], width: int = 4, max_rows: int | None = None,
                    draft_ms: float = 0.0, model: str | None = None) -> BreakEven:
    """Tokens per ms of a chain and of a tree against R, the rows the target verifies (the root + R - 1 drafts),
    and the smallest R whose tree beats the best chain (the chain at its best R: a plain step, R = 1, included).

    costs: a `forward_cost` table (rows, median_ms; `model` picks one model), read as the budgets read it
    (cost_curve.CostCurve: linear between points, the last slope beyond), or a function rows -> ms. rates: a_d,
    the chance that depth d's top draft is accepted once depth d - 1 was (`acceptance_by_depth(...)["rate"]`, cut
    at the first NaN); no shape is drawn deeper than len(rates). draft_ms: what drafting one depth costs (0: a
    table's drafts; a draft model's forward, whose top-`width` candidates come from that one forward).

    The chain: R - 1 drafts, E = 1 + sum_d prod_{j<=d} a_j (Leviathan's, with a rate per depth). The tree of
    `width` k: the draft's top chain (the spine), and at each depth its k - 1 next candidates beside the spine's
    node, as leaves; R - 1 nodes fill the depths k at a time (the last maybe fewer). Each of the m_d candidates at
    depth d is assumed accepted with probability a_d independently, so depth d accepts with 1 - (1 - a_d)^m_d; the
    walk goes deeper only through the spine: E = 1 + sum_d (prod_{j<d} a_j)(1 - (1 - a_d)^m_d). Independence
    flatters the tree (a draft's second choice is right less often than its first), so the break-even it finds is
    a lower bound. Time of a step: t(R) + depth x draft_ms. Table columns: rows, chain_tokens, chain_ms,
    chain_tokens_per_ms (NaN past 1 + len(rates) rows), tree_depth, tree_tokens, tree_ms, tree_tokens_per_ms."""
    t = _cost_function(costs, model)
    a = []
    for rate in rates:
        if rate is None or not np.isfinite(rate):
            break
        if not 0.0 <= float(rate) <= 1.0:
            raise ValueError(f"rates must lie in [0, 1], got {list(rates)}")
        a.append(float(rate))
    if not a:
        raise ValueError(f"no finite rate for depth 1 in {list(rates)}")
    if int(width) != width or width < 2:
        raise ValueError(f"width must be an int >= 2 (width 1 is the chain), got {width}")
    if draft_ms < 0:
        raise ValueError(f"draft_ms must be >= 0, got {draft_ms}")
    deepest = len(a)
    top = 1 + width * deepest if max_rows is None else int(max_rows)
    reach = np.concatenate([[1.0], np.cumprod(a)])  # reach[d]: depths 1..d all accepted on the spine
    rows = []
    for r in range(1, top + 1):
        nodes, row = r - 1, dict(rows=r)
        if nodes <= deepest:
            row.update(chain_tokens=float(reach[:nodes + 1].sum()), chain_ms=t(r) + nodes * draft_ms)
            row["chain_tokens_per_ms"] = row["chain_tokens"] / row["chain_ms"]
        depth = -(-nodes // width)  # ceil
        if depth <= deepest:
            per_depth = [min(width, nodes - width * d) for d in range(depth)]  # m_d, d = 1..depth
            tokens = 1.0 + sum(reach[d] * (1 - (1 - a[d]) ** m) for d, m in enumerate(per_depth))
            row.update(tree_depth=depth, tree_tokens=tokens, tree_ms=t(r) + depth * draft_ms)
            row["tree_tokens_per_ms"] = tokens / row["tree_ms"]
        rows.append(row)
    columns = ["rows", "chain_tokens", "chain_ms", "chain_tokens_per_ms", "tree_depth", "tree_tokens", "tree_ms",
               "tree_tokens_per_ms"]
    table = pd.DataFrame(rows).reindex(columns=columns)
    chains = table.dropna(subset=["chain_tokens_per_ms"])
    best = chains.loc[chains["chain_tokens_per_ms"].idxmax()]
    bar = float(best["chain_tokens_per_ms"])
    wins = table[table["tree_tokens_per_ms"] > bar * (1 + 1e-12)]  # strictly: a tie does not pay for the change
    return BreakEven(table, int(wins["rows"].iloc[0]) if len(wins) else None, int(best["rows"]), bar, int(width))
