"""FAFO's guess streams and pool, Lookahead's window (notebook 07): the streams step by step, the pool explorer.

- `streams_figure(history, decode)`: the n guess streams over decoding steps, with a slider: one row per
  stream, its k tokens left (oldest) to right (newest); the token the step just appended is highlighted, the
  one it discarded is gone. `history[t]` is a list of streams (lists of token ids), e.g. copies of
  `Fafo.streams` taken after each step. A plotly slider: it works in a saved HTML file too.
- `pool_figure(pool, context, n, k, decode)`: the candidates the pool returns for a context (its longest
  matching suffix first), one row per candidate, with the prefix length it matched.
- `pool_explorer(pool, encode, decode, n, k)`: type a context, see the candidates (an ipywidgets box with
  `.update()` and `.state`; ipywidgets is imported only there).
- `lookahead_window_figure(step, decode)`: one Lookahead step (`methods.lookahead.window_steps`): the window's
  levels by position with the target's predictions, each n-gram pooled (a diagonal) in one colour, and the
  guesses verified.

The pool and streams are `methods.fafo`'s (`FumblePool.lookup`, called with touch=False: drawing never changes
the LRU order); nothing here decodes.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from plotly.subplots import make_subplots

from .common import ACCEPTED, BONUS, CORRECTION, DRAFTED, cell_grid, render, role_legend, token_text


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


WINDOW_ROLES = {"root": "rgb(236,236,236)", "window": "rgb(198,219,239)", "prediction": "rgb(107,174,214)",
                "guess": DRAFTED, "accepted": ACCEPTED, "correction": CORRECTION, "bonus": BONUS}
NGRAM_COLORS = ("#fbb4ae", "#b3cde3", "#ccebc5", "#decbe4", "#fed9a6", "#ffffcc", "#e5d8bd", "#fddaec", "#f2f2f2")


def lookahead_window_figure(step, decode=None, title: str | None = None) -> go.Figure:
    """One Lookahead step (a `methods.lookahead.WindowStep`) by position (x: 0 the root, the last committed token).

    Top: the 2-D window, level i column j at position 1 + i + j (level 0 first), and below its last level the
    target's prediction at each of its rows (one position further: the next level). Each n-gram pooled this step
    (column j read top to bottom, then its prediction: a diagonal here, keyed by its first token) has its cells in
    one colour, role "n-gram j" (none during warm-up: roles "window" and "prediction"). Bottom: the guesses verified
    in the same forward (the pool's n-grams under the root), the accepted tokens green, and the target's own token
    (a correction, or the bonus when a whole guess was accepted). Cell roles in each heatmap's customdata."""
    levels, preds, grams = step.levels, step.predictions, list(step.ngrams)
    colors = dict(WINDOW_ROLES, **{f"n-gram {j}": NGRAM_COLORS[j % len(NGRAM_COLORS)] for j in range(len(grams))})
    window = {(0, "root"): (token_text([step.root], decode), "root", f"the root: id {step.root}")}
    for i, level in enumerate(levels):
        for j, token in enumerate(level):
            role = f"n-gram {j}" if grams else "window"
            window[1 + i + j, f"level {i}"] = (token_text([token], decode), role,
                                               f"level {i}, column {j}: id {token} at position {1 + i + j}")
    for j, token in enumerate(preds):
        window[1 + len(levels) + j, "prediction"] = (
            token_text([token], decode), f"n-gram {j}" if grams else "prediction",
            f"the target's argmax after level {len(levels) - 1}, column {j}: id {token} at {1 + len(levels) + j}")
    rows = ["root"] + [f"level {i}" for i in range(len(levels))] + ["prediction"]
    guesses = {(0, "root"): window[0, "root"]}
    accepted = list(step.accepted)
    guess_rows = [f"guess {g}" for g in range(len(step.guesses))]
    for g, guess in enumerate(step.guesses):
        taken = accepted and guess[:len(accepted)] == accepted
        for d, token in enumerate(guess):
            role = "accepted" if taken and d < len(accepted) else "guess"
            guesses[1 + d, f"guess {g}"] = (token_text([token], decode), role, f"guess {g}, depth {1 + d}: id {token}"
                                            f"{' (accepted)' if role == 'accepted' else ''}")
    own = "bonus" if step.full else "correction"  # as token_kinds: nothing verified is a bonus too
    for d, token in enumerate(accepted):
        guesses[1 + d, "emitted"] = (token_text([token], decode), "accepted", f"accepted: id {token}")
    guesses[1 + len(accepted), "emitted"] = (token_text([step.next_token], decode), own,
                                             f"the target's own token ({own}): id {step.next_token}")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        row_heights=[len(rows), len(guess_rows) + 2],
                        subplot_titles=(f"the window: {len(levels)} levels x {len(levels[0]) if levels else 0} "
                                        f"columns, {len(grams)} n-grams pooled (one colour each)",
                                        f"{len(step.guesses)} guesses verified, {len(accepted)} tokens accepted"))
    fig.add_trace(cell_grid(window, colors, rows=rows), row=1, col=1)
    fig.add_trace(cell_grid(guesses, colors, rows=["root"] + guess_rows + ["emitted"]), row=2, col=1)
    for j, gram in enumerate(grams):  # the legend spells each n-gram: key, then the (N-1)-gram pooled under it
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", marker=dict(symbol="square", size=12,
                                                                                 color=colors[f"n-gram {j}"]),
                                 name=f"n-gram {j}: {token_text(gram[:1], decode)} -> "
                                      f"{token_text(list(gram[1:]), decode)}"), row=1, col=1)
    used = {role for cells in (window, guesses) for _, role, _ in cells.values() if not role.startswith("n-gram")}
    for trace in role_legend(WINDOW_ROLES, shown=used):
        fig.add_trace(trace, row=1, col=1)
    fig.update_yaxes(autorange="reversed", showgrid=False)
    fig.update_xaxes(dtick=1, showgrid=False, zeroline=False)
    fig.update_xaxes(title_text="position (0: the root, the last committed token)", row=2, col=1)
    fig.update_layout(template="plotly_white", plot_bgcolor="white",
                      height=160 + 34 * (len(rows) + len(guess_rows) + 2),
                      title=title or f"Lookahead, step {step.step}: the window, its n-grams and the guesses")
    return fig
