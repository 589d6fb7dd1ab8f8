"""Why speculative decoding can pay: what one forward costs, and the expected-speedup arithmetic.

- `forward_cost(model, rows, prefix)`: median milliseconds of ONE forward that feeds R new query rows (tokens)
  on top of a cached prefix of `prefix` tokens. On small batches the cost barely grows with R at first (the
  weights are read once per forward either way), which is what lets a target verify several drafted tokens
  for about the price of one.
- `verify_cost(model, rows, prefix)`: the same, but what the decoding loop pays for a step of R rows: the
  loop's own `verify` of a draft tree of R - 1 nodes (tree mask, forward with the lazy head, the walk) and its
  `commit`. On a CPU the mask and the masked attention add a share that grows with R (notebook 08, section 2,
  draws both curves): the curve `budget="auto"` chooses budgets from.
- `expected_tokens_per_step(alpha, gamma)`: with per-token acceptance alpha (i.i.d., Leviathan et al. 2023)
  and a chain of gamma drafted tokens, the tokens one target forward yields, bonus token included:
      E[tokens] = 1 + alpha + ... + alpha^gamma = (1 - alpha^(gamma+1)) / (1 - alpha)   (gamma + 1 at alpha = 1)
- `expected_speedup(alpha, gamma, cost_ratio, verify_overhead)`: wall-clock speedup over autoregressive:
      speedup = E[tokens] / (gamma * c + verify_overhead)
  with c = cost_ratio = (draft forward) / (target forward), both for one token, and verify_overhead = the cost
  of the target forward that verifies gamma + 1 tokens, relative to a one-token target forward (1 = free
  verification, Leviathan's assumption; read the real value off `forward_cost`, see `verify_overhead`).
- `measured_agreement(target, draft, input_ids)`: greedy top-1 agreement of draft and target along a text,
  a stand-in for alpha under greedy decoding.

Simplifications: batch size 1; the prefix is random token ids (cost does not depend on the ids); acceptance
is modelled as independent of position (real acceptance falls along a chain, and varies by context).
"""
from __future__ import annotations

import statistics
import time

import numpy as np
import pandas as pd
import torch

from .. import compat
from ..mechanisms.kv_cache import new_cache, rollback
from ..models import synchronize, vocab_size

DEFAULT_ROWS = (1, 2, 4, 8, 16, 32, 64)  # query rows per timed forward (q is the draft distribution only)


def _time_steps(model, rows, prefix: int, repeats: int, warmup: int, name: str | None, seed: int,
                make_step) -> pd.DataFrame:
    """The timing both curves share: random ids, a prefix prefilled once, then for each R the median of
    `repeats` calls of make_step(cache, ids, R)() after `warmup`, the cache rolled back to the prefix after
    every call. ids: (1, prefix + max R) random token ids."""
    rows = sorted(int(r) for r in rows)
    if not rows or rows[0] < 1:
        raise ValueError(f"rows must be positive ints, got {rows}")
    if prefix < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"need prefix >= 1, repeats >= 1, warmup >= 0; got {prefix}, {repeats}, {warmup}")
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and prefix + rows[-1] > limit:
        raise ValueError(f"prefix {prefix} + {rows[-1]} rows exceeds the model's context of {limit}")
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab_size(model), (1, prefix + rows[-1]), generator=generator)
    ids = ids.to(device)  # (1, P + Rmax)
    records = []
    with torch.inference_mode():
        cache = new_cache(model)
        compat.forward(model, input_ids=ids[:, :prefix], cache=cache, use_cache=True)
        for r in rows:
            step = make_step(cache, ids, r)
            times = []
            for i in range(warmup + repeats):
                synchronize(device)
                start = time.perf_counter()
                step()
                synchronize(device)
                if i >= warmup:
                    times.append((time.perf_counter() - start) * 1000)
                rollback(cache, prefix)
            records.append(dict(model=name or type(model).__name__, device=str(device), prefix=prefix, rows=r,
                                median_ms=statistics.median(times), min_ms=min(times)))
    df = pd.DataFrame(records)
    df["ms_per_token"] = df["median_ms"] / df["rows"]
    df["relative"] = df["median_ms"] / df["median_ms"].iloc[0]
    return df


def forward_cost(model, rows=DEFAULT_ROWS, prefix: int = 256, repeats: int = 15, warmup: int = 3,
                 name: str | None = None, seed: int = 0, lazy_head: bool = False) -> pd.DataFrame:
    """Median ms of one forward with R query rows (tokens) over a cached prefix of `prefix` tokens.

    The cache is prefilled once; after every timed forward it is rolled back to `prefix` tokens, so each
    measurement sees the same state. Returns one line per R: model, device, prefix, rows, median_ms, min_ms,
    ms_per_token (median_ms / rows), relative (median_ms / median_ms at the fewest rows).
    lazy_head=True times what the loop's verifying forward does (verify.RowLogits): the body on R rows and the
    LM head on the last row only (the walk reads 1 + accepted rows); models without a plain head run whole.
    """
    from ..mechanisms.verify import lazy_head_ok
    lazy = lazy_head and lazy_head_ok(model)
    head = model.get_output_embeddings()

    def make_step(cache, ids, r):
        step = ids[:, prefix: prefix + r]  # (1, R)
        if lazy:
            body = model.model
            return lambda: head(compat.forward(body, input_ids=step, cache=cache,
                                               use_cache=True).last_hidden_state[0, -1])
        return lambda: compat.forward(model, input_ids=step, cache=cache, use_cache=True)
    return _time_steps(model, rows, prefix, repeats, warmup, name, seed, make_step)


def verify_overhead(costs: pd.DataFrame, model: str, gamma: int) -> float:
    """Cost of a (gamma + 1)-token forward relative to a 1-token one, from a `forward_cost` table
    (linear interpolation in rows between measured points)."""
    rows = costs[costs["model"] == model].sort_values("rows")
    if rows.empty:
        raise ValueError(f"no rows for model {model!r}; models: {sorted(costs['model'].unique())}")
    one = float(np.interp(1, rows["rows"], rows["median_ms"]))
    return float(np.interp(gamma + 1, rows["rows"], rows["median_ms"])) / one


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


def verify_cost(model, rows=DEFAULT_ROWS, prefix: int = 256, repeats: int = 7, warmup: int = 2,
                name: str | None = None, seed: int = 0) -> pd.DataFrame:
    """Median ms of one step of the decoding loop with R rows: `verify` of a tree of R - 1 random draft nodes
    (branches of 4 from the root, like a small Cacheback tree) after a cached prefix, and `commit` of nothing
    (the cache is rolled back after each step anyway). Same columns as `forward_cost`."""
    from ..mechanisms.draft_tree import ROOT, DraftTree
    from ..mechanisms.verify import Proposal, commit, forward_spec, verify

    spec = forward_spec(model)

    def make_step(cache, ids, r):
        committed = ids[0, :prefix + 1].tolist()  # the cache holds all but the last (the root)
        nodes = ids[0, prefix + 1:prefix + r].tolist()
        parents = [ROOT if i % 4 == 0 else i - 1 for i in range(len(nodes))]  # branches of 4 from the root
        proposal = Proposal(DraftTree(committed[-1], nodes, parents))

        def step():
            verdict = verify(model, cache, proposal, committed, spec=spec)
            commit(cache, verdict.prefix_len, [])
        return step
    return _time_steps(model, rows, prefix, repeats, warmup, name, seed, make_step)
