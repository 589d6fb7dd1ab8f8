"""Figures and explorers for the Cacheback notebooks: n-gram tables, draft trees and tree masks.

Like `viz`, every figure function takes results (a table, a `DraftTree`, a mask, a data frame) and returns a
plotly `go.Figure`; nothing here calls `show()` or runs a model. Notebooks compute, then draw.

- `token_text(tokens, decode)`: tokens as readable text (spaces as "·", newlines as "↵"), or ids.
- `table_figure(table, ...)`: leaders MRU first (top), each with its followers MRU first (left to right),
  cells shaded by recency; works for `NgramTable`, `FrozenNgramTable` or a list of (leader, followers).
- `tree_figure(tree, decode, accepted, bonus)`: the draft tree laid out by depth (x) and breadth (y), edges to
  parents, token labels; the accepted path (and the bonus token) highlighted.
- `mask_figure(mask, labels)`: a boolean attention mask as a heatmap (1 = may attend), token labels when small.
- `cost_figure(df, x, y, color)`: one line per `color` group (timings against a parameter).
- `table_explorer(tokenizer, LL, FL, LC, FC)`: type or pick a text, watch the LRU table it builds.
- `tree_explorer(pair, prompts, tables_factory)`: sliders for TDL, CRT, LL, FL and a prompt picker; the tree
  and its mask are regrown and redrawn (growing a tree is a table lookup, no model runs unless the caller
  passes `accept_fn`).

Explorers return an ipywidgets box (ipywidgets is imported only there) carrying `.update()` (the callback the
widgets call) and `.state` (the last table/tree and figures), so they can be driven and checked without a
browser. They re-render static figures into an `Output` (no plotly FigureWidget, which needs anywidget).
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np
import plotly.graph_objects as go

MRU_COLOR, LRU_COLOR = (107, 174, 214), (239, 245, 251)  # cell shading: most recent dark, least recent light


def token_text(tokens, decode: Callable | None = None) -> str:
    """Tokens as a short readable string: decoded with visible whitespace, or the ids when no `decode`."""
    tokens = tokens.tolist() if hasattr(tokens, "tolist") else tokens  # arrays, tensors, numpy scalars
    tokens = [int(t) for t in (tokens if isinstance(tokens, (list, tuple)) else [tokens])]
    if decode is None:
        return " ".join(map(str, tokens))
    return decode(tokens).replace(" ", "·").replace("\n", "↵").replace("\t", "⇥")


def _shade(rank: int, n: int) -> str:
    """rank 0 (MRU) .. n - 1 (LRU) -> an rgb string between MRU_COLOR and LRU_COLOR."""
    t = 0.0 if n <= 1 else rank / (n - 1)
    return "rgb({},{},{})".format(*(round(a + (b - a) * t) for a, b in zip(MRU_COLOR, LRU_COLOR)))


def _table_items(table, leaders=None) -> list[tuple[tuple, list[tuple]]]:
    """[(leader, followers MRU first)] from a library table, or a list of such pairs as given."""
    if hasattr(table, "leaders") and hasattr(table, "followers"):
        chosen = table.leaders() if leaders is None else [tuple(map(int, l)) for l in leaders]
        return [(leader, table.followers(leader)) for leader in chosen]
    items = [(tuple(l), list(fs)) for l, fs in (table.items() if hasattr(table, "items") else table)]
    if leaders is not None:
        wanted = dict(items)
        items = [(tuple(l), wanted.get(tuple(l), [])) for l in leaders]
    return items


def table_figure(table, leaders=None, max_leaders: int = 12, max_followers: int = 8,
                 decode: Callable | None = None, title: str | None = None) -> go.Figure:
    """The table as a plotly Table: one row per leader, MRU first; followers MRU first, left to right.

    (A frozen table's order is by frequency: most frequent in place of MRU.)
    `leaders`: show these leaders, in this order (default: the table's own recency order). At most
    `max_leaders` rows and `max_followers` follower columns are drawn (the title says what was left out)."""
    items = _table_items(table, leaders)
    total = len(items)
    items = items[:max_leaders]
    width = min(max_followers, max((len(fs) for _, fs in items), default=0))
    header = ["leader rank", "leader"] + [f"follower {j + 1}" + (" (MRU)" if j == 0 else "") for j in range(width)]
    rank_col = [str(i + 1) for i in range(len(items))]
    leader_col = [token_text(leader, decode) for leader, _ in items]
    columns = [rank_col, leader_col]
    fills = [["white"] * len(items), [_shade(i, len(items)) for i in range(len(items))]]
    for j in range(width):
        columns.append([token_text(fs[j], decode) if j < len(fs) else "" for _, fs in items])
        fills.append([_shade(j, len(fs)) if j < len(fs) else "white" for _, fs in items])
    fig = go.Figure(go.Table(
        columnwidth=[40, 90] + [90] * width,
        header=dict(values=header, fill_color="rgb(240,240,240)", align="left", font=dict(size=12)),
        cells=dict(values=columns, fill_color=fills, align="left", font=dict(size=12),
                   height=24)))
    shown = f"{len(items)} of {total} leaders" if total > len(items) else f"{total} leaders"
    more = max((len(fs) for _, fs in items), default=0)
    cut = f", first {width} of up to {more} followers" if more > width else ""
    fig.update_layout(title=title or f"Leaders, most recent first ({shown}{cut}); followers most recent first",
                      height=min(900, 120 + 26 * max(len(items), 1)), margin=dict(l=10, r=10, t=50, b=10))
    return fig


def tree_layout(parents: Sequence[int]) -> tuple[list[float], list[float]]:
    """(x, y) for the root (index 0) and every node (index i + 1): x = depth, y = breadth.

    Leaves get consecutive y slots in depth-first order (children in insertion order), a parent sits at the
    middle of its first and last child, so a chain (one follower) is a straight horizontal line."""
    n = len(parents)
    kids: dict[int, list[int]] = {-1: []}
    for i in range(n):
        kids[i] = []
    for i, p in enumerate(parents):
        kids[int(p)].append(i)
    x, y = [0.0] * (n + 1), [0.0] * (n + 1)
    depth = [0] * n
    for i, p in enumerate(parents):
        depth[i] = 1 if p == -1 else depth[p] + 1
        x[i + 1] = float(depth[i])
    slot = 0
    stack = [(-1, False)]  # iterative post-order: deep trees do not hit the recursion limit
    while stack:
        node, done = stack.pop()
        children = kids[node]
        if not children:
            y[node + 1] = float(slot)
            slot += 1
        elif done:
            y[node + 1] = (y[children[0] + 1] + y[children[-1] + 1]) / 2
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(children))
    return x, y


def tree_figure(tree, decode: Callable | None = None, accepted: Sequence[int] | None = None,
                bonus: int | None = None, title: str | None = None, labels: bool | None = None) -> go.Figure:
    """A draft tree: root at depth 0 on the left, nodes at x = depth, edges to their parents.

    Traces, in order: "edges", "nodes" (one point per node plus the root: customdata = node index, -1 for
    the root), and, when `accepted` (node indices, root to leaf) is given, "accepted path" (exactly those
    nodes, same customdata) over a thick "accepted edges" line from the root; `bonus` adds the target's bonus
    token one level after the path. `labels` (default: when the tree has at most 160 nodes) writes the
    tokens on the nodes."""
    parents, tokens = list(tree.parents), list(tree.tokens)
    n = len(tokens)
    xs, ys = tree_layout(parents)
    texts = [token_text([tree.root], decode)] + [token_text([t], decode) for t in tokens]
    edge_x, edge_y = [], []
    for i, p in enumerate(parents):
        edge_x += [xs[p + 1], xs[i + 1], None]
        edge_y += [ys[p + 1], ys[i + 1], None]
    show_labels = n <= 160 if labels is None else labels
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=edge_x, y=edge_y, mode="lines", line=dict(color="rgb(180,180,180)", width=1),
                             hoverinfo="skip", name="edges", showlegend=False))
    depth = [0] + list(tree.depths)
    fig.add_trace(go.Scatter(
        x=xs, y=ys, mode="markers+text" if show_labels else "markers", text=texts, textposition="middle right",
        textfont=dict(size=11), customdata=[-1] + list(range(n)),
        marker=dict(size=[14] + [9] * n, color=["black"] + ["rgb(120,160,200)"] * n),
        hovertext=[f"root (last committed token)<br>id {tree.root}: {texts[0]}"] +
                  [f"node {i}, depth {depth[i + 1]}, parent {parents[i]}<br>id {tokens[i]}: {texts[i + 1]}"
                   for i in range(n)],
        hoverinfo="text", name="nodes"))
    if accepted is not None:
        path = [int(i) for i in accepted]
        px, py = [xs[0]] + [xs[i + 1] for i in path], [ys[0]] + [ys[i + 1] for i in path]
        fig.add_trace(go.Scatter(x=px, y=py, mode="lines", line=dict(color="crimson", width=4), hoverinfo="skip",
                                 name="accepted edges", showlegend=False))
        fig.add_trace(go.Scatter(x=px[1:], y=py[1:], mode="markers", customdata=path, name="accepted path",
                                 marker=dict(size=13, color="crimson", line=dict(color="white", width=1)),
                                 hovertext=[f"accepted node {i}: {texts[i + 1]}" for i in path], hoverinfo="text"))
        if bonus is not None:
            bx, by = px[-1] + 1, py[-1]
            fig.add_trace(go.Scatter(x=[px[-1], bx], y=[py[-1], by], mode="lines", hoverinfo="skip",
                                     line=dict(color="darkorange", width=2, dash="dot"), showlegend=False))
            fig.add_trace(go.Scatter(x=[bx], y=[by], mode="markers+text", name="bonus token",
                                     text=[token_text([bonus], decode)], textposition="middle right",
                                     marker=dict(size=13, symbol="diamond", color="darkorange"),
                                     hovertext=[f"bonus token (the target's own) id {bonus}"], hoverinfo="text"))
    leaves = max(1, int(max(ys)) + 1) if ys else 1
    depth_max = max(depth) if depth else 0
    if title is None:
        title = f"Draft tree: {n} nodes, depth {depth_max}, {len(tree.leaves()) if n else 0} leaves"
        if accepted is not None:
            title += f"; accepted {len(accepted)} + bonus" if bonus is not None else f"; accepted {len(accepted)}"
    fig.update_layout(title=title, template="plotly_white", height=min(1400, max(320, 90 + 20 * leaves)),
                      xaxis=dict(title="depth (0 = root)", dtick=1, range=[-0.5, depth_max + 2.2]),
                      yaxis=dict(visible=False, autorange="reversed"), showlegend=accepted is not None,
                      legend=dict(orientation="h", y=-0.08), margin=dict(l=20, r=20, t=50, b=40))
    return fig


def mask_figure(mask_bool, labels: Sequence[str] | None = None, col_labels: Sequence[str] | None = None,
                max_labels: int = 40, title: str | None = None) -> go.Figure:
    """A boolean attention mask (q, k) (a (1, 1, q, k) one is squeezed) as a heatmap: z = 1 where a row
    (query) may attend to a column (key). Tick labels are drawn only when there are at most `max_labels`."""
    mask = np.asarray(mask_bool.detach().cpu() if hasattr(mask_bool, "detach") else mask_bool, dtype=bool)
    while mask.ndim > 2:
        mask = mask[0]
    rows, cols = mask.shape
    if col_labels is None and labels is not None and rows == cols:
        col_labels = labels
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


def cost_figure(df, x: str, y: str, color: str | None = None, title: str | None = None, log_x: bool = False,
                y_title: str | None = None) -> go.Figure:
    """Lines+markers of `y` against `x`, one line per value of `color` (a pandas DataFrame)."""
    fig = go.Figure()
    groups = df.groupby(color, sort=False) if color else [(None, df)]
    for key, rows in groups:
        rows = rows.sort_values(x)
        name = f"{color}={key[0] if isinstance(key, tuple) else key}" if color else y
        fig.add_trace(go.Scatter(x=rows[x].tolist(), y=rows[y].tolist(), mode="lines+markers", name=name))
    fig.update_layout(title=title or f"{y} vs {x}", xaxis_title=x, yaxis_title=y_title or y, template="plotly_white")
    if log_x:
        fig.update_xaxes(type="log")
    return fig


def _render(view, *figures) -> None:
    """Replace an Output widget's content with `figures` (only inside IPython: elsewhere there is nothing to
    draw on, and display() would print the figures' repr)."""
    from IPython import get_ipython
    from IPython.display import display

    if get_ipython() is None:
        return
    view.clear_output(wait=True)
    with view:
        for fig in figures:
            display(fig)


DEFAULT_TEXTS = {
    "attributes": "self.x = x\nself.y = y\nself.z = z\nself.x = y\n",
    "loop": "for i in range(n):\n    total += i\nfor j in range(n):\n    total -= j\n",
    "imports": "import os\nimport sys\nimport re\nfrom os import path\nfrom sys import argv\n",
}


def table_explorer(tokenizer, LL: int = 1, FL: int = 2, LC: int = 8, FC: int = 3, texts: dict | None = None,
                   max_leaders: int = 16):
    """Pick or type a text; the LRU table that `update(tokens)` builds from it is drawn, MRU first.

    Sliders set LL, FL, LC and FC (small capacities show eviction). The box has `.update()` and `.state`
    (keys: tokens, table, figure, evicted)."""
    import ipywidgets as widgets

    from .ngram_table import NgramTable

    texts = dict(texts or DEFAULT_TEXTS)
    if callable(tokenizer):  # a transformers tokenizer: no special tokens, like ModelPair.encode
        encode = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    else:
        encode = tokenizer.encode
    decode = tokenizer.decode
    pick = widgets.Dropdown(options=list(texts), description="example")
    text = widgets.Textarea(value=texts[pick.value], description="text", rows=5,
                            layout=widgets.Layout(width="95%"))
    sliders = {name: widgets.IntSlider(value=value, min=1, max=top, description=name, continuous_update=False)
               for name, value, top in (("LL", LL, 4), ("FL", FL, 6), ("LC", LC, 64), ("FC", FC, 16))}
    status, view = widgets.HTML(), widgets.Output()
    state: dict = {}

    def update(_=None):
        tokens = list(encode(text.value))
        table = NgramTable(*(sliders[k].value for k in ("LL", "FL", "LC", "FC")))
        seen = set()
        width = table.leader_len + table.follower_len
        for i in range(len(tokens) - width + 1):
            seen.add(tuple(tokens[i:i + table.leader_len]))
        table.update(tokens)
        evicted = len(seen) - len(table)
        fig = table_figure(table, max_leaders=max_leaders, max_followers=table.follower_capacity, decode=decode)
        state.update(tokens=tokens, table=table, figure=fig, evicted=evicted)
        mru = ", ".join(f"<code>{token_text(l, decode)}</code>" for l in table.leaders()[:8])
        status.value = (f"{len(tokens)} tokens, {max(0, len(tokens) - width + 1)} windows inserted; "
                        f"{len(table)} leaders kept, {evicted} evicted (LC = {table.leader_capacity}). "
                        f"Leaders, most recent first: {mru}{' ...' if len(table) > 8 else ''}")
        _render(view, fig)

    def on_pick(change):
        text.value = texts[change["new"]]  # triggers update through text's observer

    pick.observe(on_pick, names="value")
    text.observe(update, names="value")
    for slider in sliders.values():
        slider.observe(update, names="value")
    update()
    box = widgets.VBox([widgets.HBox([pick]), text, widgets.HBox(list(sliders.values())[:2]),
                        widgets.HBox(list(sliders.values())[2:]), status, view])
    box.update, box.state = update, state
    return box


def tree_explorer(pair, prompts, tables_factory: Callable, tdl: int = 96, crt: int = 16, ll: int = 1, fl: int = 3,
                  accept_fn: Callable | None = None, merge: bool = False, max_mask: int = 128):
    """Sliders for TDL, CRT, LL, FL and a prompt picker; the draft tree and its mask are regrown and redrawn.

    pair: anything with `.encode(text) -> (1, P) ids` and `.decode(ids)` (a `ModelPair`). prompts: strings or
    {"id", "prompt"} dicts. tables_factory(ll, fl, context_ids) -> tables to grow from (dynamic first).
    accept_fn(tree, context_ids) -> accepted node indices (e.g. one verify step), optional: it runs the model,
    so it is the caller's code. The box has `.update()` and `.state` (keys: ids, tree, figures, build_us)."""
    import ipywidgets as widgets

    from .draft_tree import grow_tree
    from .tree_attention import dense_tree_mask

    options = [(p["id"], p["prompt"]) if isinstance(p, dict) else (f"prompt {i}", p) for i, p in enumerate(prompts)]
    pick = widgets.Dropdown(options=options, description="prompt")
    s = {name: widgets.IntSlider(value=value, min=low, max=top, step=step, description=name, continuous_update=False)
         for name, value, low, top, step in (("TDL", tdl, 2, 160, 1), ("CRT", crt, 0, 64, 1), ("LL", ll, 1, 4, 1),
                                             ("FL", fl, 1, 6, 1))}
    status, view = widgets.HTML(), widgets.Output()
    encoded: dict[str, list[int]] = {}
    state: dict = {}

    def update(_=None):
        prompt = pick.value
        if prompt not in encoded:
            ids = pair.encode(prompt)
            encoded[prompt] = [int(t) for t in (ids[0] if getattr(ids, "ndim", 1) == 2 else ids)]
        ids = encoded[prompt]
        tables = tables_factory(s["LL"].value, s["FL"].value, ids)
        start = time.perf_counter()
        tree = grow_tree(ids, tables, tdl=s["TDL"].value, crt=s["CRT"].value, merge=merge)
        build_us = (time.perf_counter() - start) * 1e6
        accepted = accept_fn(tree, ids) if accept_fn is not None else None
        tree_fig = tree_figure(tree, decode=pair.decode, accepted=accepted)
        labels = ["root"] + [token_text([t], pair.decode) for t in tree.tokens]
        figures = [tree_fig]
        if len(tree) + 1 <= max_mask:
            figures.append(mask_figure(dense_tree_mask(tree), labels=labels))
        state.update(ids=ids, tree=tree, figures=figures, build_us=build_us, accepted=accepted)
        levels = np.bincount(tree.depths).tolist()[1:] if len(tree) else []
        acc = "" if accepted is None else f"; accepted {len(accepted)}"
        status.value = (f"context {len(ids)} tokens, root <code>{token_text([tree.root], pair.decode)}</code>: "
                        f"{len(tree)} draft nodes (budget TDL - 1 = {s['TDL'].value - 1}, level 0 limited to "
                        f"{s['TDL'].value - 1 - s['CRT'].value}), nodes per depth {levels}, grown in "
                        f"{build_us:.0f} µs{acc}" + ("" if len(figures) > 1 else f"; mask not drawn (> {max_mask})"))
        _render(view, *figures)

    pick.observe(update, names="value")
    for slider in s.values():
        slider.observe(update, names="value")
    update()
    box = widgets.VBox([pick, widgets.HBox([s["TDL"], s["CRT"]]), widgets.HBox([s["LL"], s["FL"]]), status, view])
    box.update, box.state = update, state
    return box
