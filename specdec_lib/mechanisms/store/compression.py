"""KV compression functions C: which cached entries the compressed ("fumble") rows of a forward may see.

FAFO paper §4.1-4.2 (a compression function C over the KV cache, "LM-Infinite/StreamingLLM ... Quest ... and
more") and §5 ("FAFO-Stream", "FAFO-Quest"). The store (`layout.FlexLayoutStore`) asks C, between steps, which of its
committed entries to keep in the fixed region; C answers with a boolean per entry.

One small interface, so a third C (e.g. SnapKV-style: score entries by the attention an observation window
gives them) is one class: subclass `Compression`, set `kv_budget` (tokens), implement `select(view)`.
`view` is a `CacheView`: the logical positions of the committed entries (in physical slot order), their keys
(all layers, already rotated) and the last query each layer saw (None before the first forward).

- `StreamingLLM(sinks, recent)`: the first `sinks` positions (attention sinks, 4 in the paper) and the
  `recent` newest ones. Positions stay logical: keys keep the rotation of their original position (as FAFO
  uses it), not StreamingLLM's re-rotation inside the window.
- `Quest(kv_budget, page=16)`: pages of `page` consecutive positions; per page the elementwise min and max of the
  keys; a page's score for query q is sum_d max(q_d * min_d, q_d * max_d) (an upper bound of q . k over the
  page); the top pages fit in `kv_budget` tokens; the newest page is always kept (the text being written).

Simplifications: one selection for every layer and head (the store keeps one physical layout for all layers),
so Quest sums its page scores over layers and heads, where the paper selects per head; Quest uses the query of
the forward's last row; page bounds are recomputed from the keys at each selection (O(entries)), where Quest
maintains them incrementally.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...env import check_int


@dataclass
class CacheView:
    """What a compression function may read about the committed entries (L of them, physical slot order)."""
    positions: torch.Tensor  # (L,) logical positions
    keys: torch.Tensor  # (layers, kv_heads, L, head_dim), rotated at their positions
    queries: torch.Tensor | None = None  # (layers, heads, head_dim): each layer's last query row, or None


class Compression:
    """A compression function C. `kv_budget`: the most entries it keeps (the store sizes its fixed region by it)."""
    kv_budget: int
    needs_queries = False  # True: the store records each layer's last query for select()

    def select(self, view: CacheView) -> torch.Tensor:
        """Bool (L,): which committed entries C keeps; at most `kv_budget` of them."""
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class StreamingLLM(Compression):
    """Attention sinks + a window of recent tokens (Xiao et al. 2024): keeps positions < sinks and the `recent`
    newest positions."""

    def __init__(self, sinks: int = 4, recent: int = 252):
        check_int("sinks", sinks, 0)
        check_int("recent", recent, 1)
        self.sinks, self.recent = sinks, recent
        self.kv_budget = sinks + recent

    def select(self, view: CacheView) -> torch.Tensor:
        pos = view.positions  # (L,)
        if pos.numel() == 0:
            return torch.zeros(0, dtype=torch.bool, device=pos.device)
        newest = int(pos.max())
        return (pos < self.sinks) | (pos > newest - self.recent)


class Quest(Compression):
    """Query-aware page selection (Tang et al. 2024): the pages whose key bounds promise the largest q . k."""
    needs_queries = True

    def __init__(self, kv_budget: int = 256, page: int = 16):
        check_int("page", page, 1)
        check_int("kv_budget", kv_budget, page)
        self.kv_budget, self.page = kv_budget, page

    def page_scores(self, view: CacheView) -> torch.Tensor:
        """(pages,) upper bounds of q . k per page, summed over layers and heads; pages by position // page."""
        page_of = view.positions // self.page  # (L,)
        pages = int(page_of.max()) + 1
        layers, kv_heads, _, dim = view.keys.shape
        index = page_of[None, None, :, None].expand_as(view.keys)  # (layers, kv_heads, L, dim)
        shape = (layers, kv_heads, pages, dim)
        kmin = view.keys.new_full(shape, float("inf")).scatter_reduce(2, index, view.keys, "amin")
        kmax = view.keys.new_full(shape, float("-inf")).scatter_reduce(2, index, view.keys, "amax")
        q = view.queries  # (layers, heads, dim); heads = kv_heads * group (grouped-query attention)
        q = q.reshape(layers, kv_heads, -1, dim).to(view.keys.dtype)  # (layers, kv_heads, group, dim)
        # max(q * min, q * max) per dim, summed: (layers, kv_heads, group, pages)
        bound = torch.maximum(q[:, :, :, None] * kmin[:, :, None], q[:, :, :, None] * kmax[:, :, None]).sum(-1)
        bound = torch.nan_to_num(bound, nan=0.0, posinf=0.0, neginf=0.0)  # empty pages (no entry) score 0
        return bound.sum(dim=(0, 1, 2))  # (pages,)

    def select(self, view: CacheView) -> torch.Tensor:
        pos = view.positions
        if pos.numel() <= self.kv_budget:
            return torch.ones_like(pos, dtype=torch.bool)
        page_of = pos // self.page
        newest = int(page_of.max())
        if view.queries is None:  # no forward seen yet: the newest pages
            scores = torch.arange(newest + 1, dtype=torch.float64, device=pos.device)
        else:
            scores = self.page_scores(view).double()
        scores[newest] = float("inf")  # the page being written is always kept
        keep = torch.zeros(newest + 1, dtype=torch.bool, device=pos.device)
        keep[scores.argsort(descending=True)[: self.kv_budget // self.page]] = True
        return keep[page_of]
