"""What one forward, and one step of the decoding loop, cost on this device: the timings `"auto"` draft budgets
choose from (kept as curves by cost_curve.py, read by budget.py's choosers), and that notebooks 00 and 12 draw
(bench.costs serves them there).

- `forward_cost(model, rows, prefix)`: median milliseconds of ONE forward that feeds R new query rows (tokens)
  on top of a cached prefix of `prefix` tokens. On small batches the cost barely grows with R at first (the
  weights are read once per forward either way), which is what lets a target verify several drafted tokens
  for about the price of one.
- `verify_cost(model, rows, prefix)`: what the decoding loop pays for a step of R rows: the loop's own `verify`
  of a draft tree of R - 1 nodes (tree mask, forward with the lazy head, the walk) and its `commit`. On a CPU
  the mask and the masked attention add a share that grows with R (notebook 12, section 2, draws both curves).

Simplifications: batch size 1 (forward_cost takes `batch` for notebook 00's batch sweep); the prefix is random
token ids (cost does not depend on the ids); the cache is rolled back to the prefix before every timed call, so
each measurement sees the same state.
"""
from __future__ import annotations

import pandas as pd
import torch

from ... import compat
from ...env import median_ms, vocab_size
from ..kv_cache import new_cache, rollback

DEFAULT_ROWS = (1, 2, 4, 8, 16, 32, 64)  # query rows per timed forward (q is the draft distribution only)


def _time_steps(model, rows, prefix: int, repeats: int, warmup: int, name: str | None, seed: int,
                make_step, batch: int = 1) -> pd.DataFrame:
    """The timing both curves share: random ids, a prefix prefilled once, then for each R the median of
    `repeats` calls of make_step(cache, ids, R)() after `warmup` (env.median_ms), the cache rolled back to the
    prefix before every call. ids: (batch, prefix + max R) random token ids."""
    rows = sorted(int(r) for r in rows)
    if not rows or rows[0] < 1:
        raise ValueError(f"rows must be positive ints, got {rows}")
    if prefix < 1 or repeats < 1 or warmup < 0 or batch < 1:
        raise ValueError(f"need prefix >= 1, repeats >= 1, warmup >= 0, batch >= 1; got {prefix}, {repeats}, "
                         f"{warmup}, {batch}")
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and prefix + rows[-1] > limit:
        raise ValueError(f"prefix {prefix} + {rows[-1]} rows exceeds the model's context of {limit}")
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab_size(model), (batch, prefix + rows[-1]), generator=generator)
    ids = ids.to(device)  # (B, P + Rmax)
    records = []
    with torch.inference_mode(), compat.decode_attention(device):
        cache = new_cache(model, capacity=prefix + rows[-1], windowed=True)  # the loop's kind of cache
        compat.forward(model, input_ids=ids[:, :prefix], cache=cache, use_cache=True)
        for r in rows:
            times = []  # every timed ms, for min_ms
            median = median_ms(make_step(cache, ids, r), repeats, device, warmup=warmup,
                               setup=lambda: rollback(cache, prefix), samples=times)
            records.append(dict(model=name or type(model).__name__, device=str(device), prefix=prefix, batch=batch,
                                rows=r, median_ms=median, min_ms=min(times)))
    df = pd.DataFrame(records)
    df["ms_per_token"] = df["median_ms"] / df["rows"]
    df["relative"] = df["median_ms"] / df["median_ms"].iloc[0]
    return df


def forward_cost(model, rows=DEFAULT_ROWS, prefix: int = 256, repeats: int = 15, warmup: int = 3,
                 name: str | None = None, seed: int = 0, lazy_head: bool = False, batch: int = 1) -> pd.DataFrame:
    """Median ms of one forward with R query rows (tokens) over a cached prefix of `prefix` tokens, for `batch`
    sequences at once (B x R rows in all).

    The cache is prefilled once; before every timed forward it is rolled back to `prefix` tokens, so each
    measurement sees the same state. Returns one line per R: model, device, prefix, rows, median_ms, min_ms,
    ms_per_token (median_ms / rows), relative (median_ms / median_ms at the fewest rows).
    lazy_head=True times what the loop's verifying forward does (verify.RowLogits): the body on R rows and the
    LM head on the last row only (the walk reads 1 + accepted rows); models without a plain head run whole.
    """
    from ..verify import lazy_head_ok
    if lazy_head and batch != 1:
        raise ValueError("lazy_head times the loop's verify, one sequence: batch must be 1")
    lazy = lazy_head and lazy_head_ok(model)
    head = model.get_output_embeddings()

    def make_step(cache, ids, r):
        step = ids[:, prefix: prefix + r]  # (B, R)
        if lazy:
            body = model.model
            return lambda: head(compat.forward(body, input_ids=step, cache=cache,
                                               use_cache=True).last_hidden_state[0, -1])
        return lambda: compat.forward(model, input_ids=step, cache=cache, use_cache=True)
    return _time_steps(model, rows, prefix, repeats, warmup, name, seed, make_step, batch)


def verify_cost(model, rows=DEFAULT_ROWS, prefix: int = 256, repeats: int = 7, warmup: int = 2,
                name: str | None = None, seed: int = 0) -> pd.DataFrame:
    """Median ms of one step of the decoding loop with R rows: `verify` of a tree of R - 1 random draft nodes
    (branches of 4 from the root, like a small Cacheback tree) after a cached prefix, and `commit` of nothing
    (the cache is rolled back before each step anyway). Same columns as `forward_cost`."""
    from ..draft_tree import ROOT, DraftTree
    from ..verify import Proposal, commit, forward_spec, verify

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
