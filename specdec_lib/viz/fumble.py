"""FAFO's guess streams and pool (notebook 06): the streams step by step, the pool explorer.

- `streams_figure(history, decode)`: the n guess streams over decoding steps, with a slider: one row per
  stream, its k tokens left (oldest) to right (newest); the token the step just appended is highlighted, the
  one it discarded is gone. `history[t]` is a list of streams (lists of token ids), e.g. copies of
  `Fafo.streams` taken after each step. A plotly slider: it works in a saved HTML file too.
- `pool_figure(pool, context, n, k, decode)`: the candidates the pool returns for a context (its longest
  matching suffix first), one row per candidate, with the prefix length it matched.
- `pool_explorer(pool, encode, decode, n, k)`: type a context, see the candidates (an ipywidgets box with
  `.update()` and `.state`; ipywidgets is imported only there).

The pool and streams are `methods.fafo`'s (`FumblePool.lookup`, called with touch=False: drawing never changes
the LRU order); nothing here decodes.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from .common import ACCEPTED, DRAFTED, render, token_text


def _stream_traces(streams, previous, decode):
    z = np.zeros((len(streams), len(streams[0])))
    for i, stream in enumerate(streams):
        if previous is not None and previous[i][1:] == stream[:-1]:
            z[i, -1] = 1  # appended this step
    text = [[token_text([t], decode) for t in stream] for stream in streams]
    return go.Heatmap(z=z.tolist(), text=text, texttemplate="%{text}", textfont=dict(size=13), zmin=0, zmax=1,
                      showscale=False,
                      colorscale=[[0, DRAFTED], [1, ACCEPTED]], xgap=2, ygap=2, hoverinfo="text")


def streams_figure(history, decode=None, labels=None, title: str = "FAFO's guess streams") -> go.Figure:
    """The streams over steps (a slider); green = the token this step appended."""
    if not history:
        raise ValueError("no steps to draw")
    labels = labels or [f"step {t}" for t in range(len(history))]
    frames = [go.Frame(data=[_stream_traces(h, history[t - 1] if t else None, decode)], name=label)
              for t, (h, label) in enumerate(zip(history, labels))]
    fig = go.Figure(data=frames[0].data, frames=frames)
    steps = [dict(method="animate", label=label, args=[[label], dict(mode="immediate", frame=dict(duration=0,
                  redraw=True), transition=dict(duration=0))]) for label in labels]
    n, k = len(history[0]), len(history[0][0])
    fig.update_layout(title=f"{title}: {n} streams x {k} tokens (oldest left; green: appended this step)",
                      height=160 + 34 * n, width=900, sliders=[dict(active=0, steps=steps, pad=dict(t=40))],
                      margin=dict(l=70, r=20, t=60, b=40))
    fig.update_xaxes(title="token of the stream (oldest to newest)", dtick=1)
    fig.update_yaxes(title="stream", autorange="reversed", dtick=1)
    return fig


def pool_figure(pool, context, n: int, k: int, decode=None, title: str | None = None) -> go.Figure:
    """The candidates `pool.lookup(context, n, k)` returns, one row each, labelled with the prefix it matched."""
    found = pool.lookup(list(context), n, k, touch=False)
    rows = [f"m={m}: " + token_text(list(context)[-m:], decode) for m, _ in found]
    text = [[token_text([t], decode) for t in sub] for _, sub in found]
    width = max((len(sub) for _, sub in found), default=1)
    z = [[len(found) - r] * width for r in range(len(found))]  # longer prefixes darker
    fig = go.Figure(go.Heatmap(z=z, text=[t + [""] * (width - len(t)) for t in text], texttemplate="%{text}",
                               y=[f"{i}. {r}" for i, r in enumerate(rows)], showscale=False, xgap=2, ygap=2,
                               colorscale="Blues", hoverinfo="text"))
    fig.update_layout(title=title or f"{len(found)} candidates for the context ending "
                                     f"{token_text(list(context)[-k:], decode)!r} (pool of {len(pool)})",
                      height=140 + 30 * max(1, len(found)), width=900, margin=dict(l=260, r=20, t=50, b=30))
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title="candidate token", dtick=1)
    return fig


def pool_explorer(pool, encode, decode, n: int, k: int, context: str = ""):
    """Type a context; the pool's candidates for it are drawn. `.state`: context ids, candidates, figure."""
    import ipywidgets as widgets

    box_text = widgets.Textarea(value=context, description="context", rows=3, layout=widgets.Layout(width="95%"))
    status, view = widgets.HTML(), widgets.Output()
    state: dict = {}

    def update(_=None):
        ids = list(encode(box_text.value))
        found = pool.lookup(ids, n, k, touch=False) if ids else []
        fig = pool_figure(pool, ids or [0], n, k, decode)
        longest = max((m for m, _ in found), default=0)
        status.value = (f"{len(ids)} context tokens; {len(found)} candidates, longest matching suffix "
                        f"{longest} of at most {k} tokens")
        state.update(context=ids, candidates=found, figure=fig)
        render(view, fig)

    box_text.observe(update, names="value")
    box = widgets.VBox([box_text, status, view])
    box.update, box.state = update, state
    update()
    return box
