"""N-gram tables (notebook 01): a table's leaders and followers in recency order, and an explorer that builds one.

- `table_figure(table, ...)`: leaders MRU first (top), each with its followers MRU first (left to right),
  cells shaded by recency; works for `NgramTable`, `FrozenNgramTable` (frequency order in place of recency)
  or a list of (leader, followers) pairs.
- `table_explorer(tokenizer, LL, FL, LC, FC)`: type or pick a text, watch the LRU table it builds; sliders
  for the four sizes (small capacities show eviction).

The explorer returns an ipywidgets box (ipywidgets is imported only there) carrying `.update()` (the callback
the widgets call) and `.state` (the last table and figure), so it can be driven and checked without a browser.
"""
from __future__ import annotations

from typing import Callable

import plotly.graph_objects as go

from .common import render, shade, token_text


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
    fills = [["white"] * len(items), [shade(i, len(items)) for i in range(len(items))]]
    for j in range(width):
        columns.append([token_text(fs[j], decode) if j < len(fs) else "" for _, fs in items])
        fills.append([shade(j, len(fs)) if j < len(fs) else "white" for _, fs in items])
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

    from ..mechanisms.ngram_table import NgramTable

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
        # the distinct leaders the text offers, to report how many the capacity LC evicted
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
        render(view, fig)

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
