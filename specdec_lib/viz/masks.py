"""Attention masks (notebooks 02 and 05): which query row may attend to which key column, as a heatmap.

- `mask_figure(mask, labels)`: a boolean mask (R, K), or a (1, 1, R, K) one as `mechanisms.masks` builds it,
  drawn with z = 1 where a row may attend; token labels on the axes when it is small enough to read.
- `mask_labels(tree, decode)`: the row labels of a tree mask, "root" then each node's token, in the order
  `mechanisms.masks` lays the rows out (the root first, then the nodes in index order).

The masks themselves are computed by `specdec_lib.mechanisms.masks` (`dense_tree_mask`, `tree_attention_mask`);
this module only draws what it is given.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import plotly.graph_objects as go

from .common import token_text


def mask_labels(tree, decode: Callable | None = None) -> list[str]:
    """["root", token of node 0, token of node 1, ...]: one label per row of the tree's mask."""
    return ["root"] + [token_text([t], decode) for t in tree.tokens]


def mask_figure(mask_bool, labels: Sequence[str] | None = None, col_labels: Sequence[str] | None = None,
                max_labels: int = 40, title: str | None = None) -> go.Figure:
    """A boolean attention mask (R, K) (a (1, 1, R, K) one is squeezed) as a heatmap: z = 1 where a row
    (query) may attend to a column (key). Tick labels are drawn only when there are at most `max_labels`;
    `labels` name the rows, and the columns too when the mask is square (a tree mask with no prefix)."""
    mask = np.asarray(mask_bool.detach().cpu() if hasattr(mask_bool, "detach") else mask_bool, dtype=bool)
    while mask.ndim > 2:
        mask = mask[0]
    rows, cols = mask.shape
    if col_labels is None and labels is not None and rows == cols:
        col_labels = labels
    # gaps separate the cells while they are big enough to count; past 64 they would hide the cells
    fig = go.Figure(go.Heatmap(z=mask.astype(int).tolist(), x=list(range(cols)), y=list(range(rows)), zmin=0,
                               zmax=1, colorscale=[[0, "rgb(245,245,245)"], [1, "rgb(49,130,189)"]], showscale=False,
                               xgap=1 if cols <= 64 else 0, ygap=1 if rows <= 64 else 0,
                               hovertemplate="query row %{y} -> key %{x}: %{z}<extra></extra>"))
    yaxis = dict(title="query row (0 = root)", autorange="reversed")
    xaxis = dict(title="key column", side="top")
    if labels is not None and rows <= max_labels:
        yaxis.update(tickmode="array", tickvals=list(range(rows)), ticktext=[f"{i}: {t}" for i, t in enumerate(labels)])
    if col_labels is not None and cols <= max_labels:
        xaxis.update(tickmode="array", tickvals=list(range(cols)), ticktext=list(col_labels), tickangle=-60)
    side = min(900, max(300, 140 + 16 * rows))
    fig.update_layout(title=title or f"Tree attention mask ({rows} x {cols}): blue = may attend",
                      xaxis=xaxis, yaxis=yaxis, template="plotly_white", height=side,
                      width=min(1100, max(360, 200 + 16 * cols)), margin=dict(t=110))
    return fig
