"""Draft trees (notebooks 02 and 05): a tree laid out by depth and breadth, its accepted path, and an explorer.

- `tree_layout(tree)`: (x, y) of the root and every node: x = depth, y = breadth (leaves on consecutive
  rows, a parent between its first and last child, so a chain is a straight line).
- `tree_figure(tree, decode, accepted, next_token)`: the draft tree with edges to parents and token labels; the
  accepted path (and the target's next token after it) highlighted.
- `tree_explorer(pair, prompts, tables_factory)`: sliders for TDL, CRT, LL, FL and a prompt picker; the tree
  and its mask (`masks.mask_figure`) are regrown and redrawn. Growing a tree is a table lookup: no model runs
  unless the caller passes `accept_fn`.
- `budget_explorer(run, prompts, budgets)`: a budget slider and a prompt picker over trees of several shapes
  drafted at the same budget (notebook 11: a static and a dynamic EAGLE tree), each with its accepted path; the
  caller's `run` drafts them.

The explorer returns an ipywidgets box (ipywidgets is imported only there) carrying `.update()` (the callback
the widgets call) and `.state` (the last tree and figures), so it can be driven and checked without a browser.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np
import plotly.graph_objects as go

from ..mechanisms.draft_tree import ROOT, DraftTree, grow_tree
from .common import prompt_options, render, token_text
from .masks import mask_figure, mask_labels


def tree_layout(tree: DraftTree | Sequence[int]) -> tuple[list[float], list[float]]:
    """(x, y) for the root (index 0) and every node (index i + 1): x = depth, y = breadth.

    `tree`: a `DraftTree` (its own children index is read), or a parents list (-1 = a child of the root).
    Leaves get consecutive y slots in depth-first order (children in insertion order), a parent sits at the
    middle of its first and last child, so a chain (one follower) is a straight horizontal line."""
    if not isinstance(tree, DraftTree):  # a bare parents list: the tree's constructor checks it is topological
        tree = DraftTree(0, tokens=[0] * len(tree), parents=list(tree))
    n = len(tree)
    x = [0.0] + [float(d) for d in tree.depths]
    y = [0.0] * (n + 1)
    slot = 0
    stack = [(ROOT, False)]  # iterative post-order: deep trees (long chains) do not hit the recursion limit
    while stack:
        node, done = stack.pop()
        children = tree.children(node)
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
                next_token: int | None = None, title: str | None = None, labels: bool | None = None) -> go.Figure:
    """A draft tree: root at depth 0 on the left, nodes at x = depth, edges to their parents.

    Traces, in order: "edges", "nodes" (one point per node plus the root: customdata = node index, -1 for
    the root), and, when `accepted` (node indices, root to leaf) is given, "accepted path" (exactly those
    nodes, same customdata) over a thick "accepted edges" line from the root; `next_token` adds the target's own
    next token (the verdict's next_token: a bonus or a correction) one level after the path. `labels` (default:
    when the tree has at most 160 nodes) writes the tokens on the nodes."""
    parents, tokens = list(tree.parents), list(tree.tokens)
    n = len(tokens)
    xs, ys = tree_layout(tree)
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
        if next_token is not None:
            bx, by = px[-1] + 1, py[-1]
            fig.add_trace(go.Scatter(x=[px[-1], bx], y=[py[-1], by], mode="lines", hoverinfo="skip",
                                     line=dict(color="darkorange", width=2, dash="dot"), showlegend=False))
            fig.add_trace(go.Scatter(x=[bx], y=[by], mode="markers+text", name="next token",
                                     text=[token_text([next_token], decode)], textposition="middle right",
                                     marker=dict(size=13, symbol="diamond", color="darkorange"),
                                     hovertext=[f"next token (the target's own) id {next_token}"], hoverinfo="text"))
    leaves = max(1, int(max(ys)) + 1) if ys else 1
    depth_max = max(depth) if depth else 0
    if title is None:
        title = f"Draft tree: {n} nodes, depth {depth_max}, {len(tree.leaves()) if n else 0} leaves"
        if accepted is not None:
            title += f"; accepted {len(accepted)}" + (" + next token" if next_token is not None else "")
    fig.update_layout(title=title, template="plotly_white", height=min(1400, max(320, 90 + 20 * leaves)),
                      xaxis=dict(title="depth (0 = root)", dtick=1, range=[-0.5, depth_max + 2.2]),
                      yaxis=dict(visible=False, autorange="reversed"), showlegend=accepted is not None,
                      legend=dict(orientation="h", y=-0.08), margin=dict(l=20, r=20, t=50, b=40))
    return fig


def tree_explorer(pair, prompts, tables_factory: Callable, tdl: int = 96, crt: int = 16, ll: int = 1, fl: int = 3,
                  accept_fn: Callable | None = None, merge: bool = False, max_mask: int = 128):
    """Sliders for TDL, CRT, LL, FL and a prompt picker; the draft tree and its mask are regrown and redrawn.

    pair: anything with `.encode(text) -> (1, P) ids` and `.decode(ids)` (a `ModelPair`). prompts: strings or
    {"id", "prompt"} dicts. tables_factory(ll, fl, context_ids) -> tables to grow from (dynamic first).
    accept_fn(tree, context_ids) -> accepted node indices (e.g. one verify step), optional: it runs the model,
    so it is the caller's code. The box has `.update()` and `.state` (keys: ids, tree, figures, build_us)."""
    import ipywidgets as widgets

    from ..mechanisms.masks import dense_tree_mask

    pick = widgets.Dropdown(options=prompt_options(prompts), description="prompt")
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
        figures = [tree_fig]
        if len(tree) + 1 <= max_mask:  # a bigger mask is too many cells to read
            figures.append(mask_figure(dense_tree_mask(tree), labels=mask_labels(tree, pair.decode)))
        state.update(ids=ids, tree=tree, figures=figures, build_us=build_us, accepted=accepted)
        levels = np.bincount(tree.depths).tolist()[1:] if len(tree) else []
        acc = "" if accepted is None else f"; accepted {len(accepted)}"
        status.value = (f"context {len(ids)} tokens, root <code>{token_text([tree.root], pair.decode)}</code>: "
                        f"{len(tree)} draft nodes (budget TDL - 1 = {s['TDL'].value - 1}, level 0 limited to "
                        f"{s['TDL'].value - 1 - s['CRT'].value}), nodes per depth {levels}, grown in "
                        f"{build_us:.0f} µs{acc}" + ("" if len(figures) > 1 else f"; mask not drawn (> {max_mask})"))
        render(view, *figures)

    pick.observe(update, names="value")
    for slider in s.values():
        slider.observe(update, names="value")
    update()
    box = widgets.VBox([pick, widgets.HBox([s["TDL"], s["CRT"]]), widgets.HBox([s["LL"], s["FL"]]), status, view])
    box.update, box.state = update, state
    return box


def budget_explorer(run: Callable, prompts, budgets: Sequence[int] = (2, 4, 8, 16, 32), budget: int | None = None,
                    decode: Callable | None = None):
    """A budget slider and a prompt picker over trees of several shapes drafted at the same budget.

    run(prompt_text, budget) -> {label: {"tree": DraftTree, "accepted": node indices (root to leaf) or None,
    "next_token": the target's own token after them or None, "mat": a float or None}}: the caller's drafts (this module
    runs no model), e.g. a static and a dynamic tree of the same step and the MAT of a whole generation with each.
    One `tree_figure` per label, in run's order. prompts: strings or {"id", "prompt"} dicts. The box has
    `.update()` and `.state` (keys: prompt, budget, runs, figures)."""
    import ipywidgets as widgets

    budgets = [int(b) for b in budgets]
    pick = widgets.Dropdown(options=prompt_options(prompts), description="prompt")
    size = widgets.SelectionSlider(options=budgets, value=budgets[len(budgets) // 2] if budget is None else budget,
                                   description="budget", continuous_update=False)
    status, view = widgets.HTML(), widgets.Output()
    state: dict = {}

    def update(_=None):
        runs = run(pick.value, size.value)
        figures, parts = [], []
        for label, r in runs.items():
            tree, accepted, mat = r["tree"], r.get("accepted"), r.get("mat")
            title = f"{label}: {len(tree)} nodes, depth {tree.depth}"
            if accepted is not None:
                title += f", {len(accepted)} accepted"
            if mat is not None:
                title += f"; MAT of the generation {mat:.2f}"
            figures.append(tree_figure(tree, decode=decode, accepted=accepted, next_token=r.get("next_token"),
                                       title=title))
            parts.append(f"<b>{label}</b>: {len(tree)} nodes, depth {tree.depth}"
                         + ("" if accepted is None else f", {len(accepted)} accepted")
                         + ("" if mat is None else f", MAT {mat:.2f}"))
        state.update(prompt=pick.value, budget=size.value, runs=runs, figures=figures)
        status.value = f"budget {size.value}: " + "; ".join(parts)
        render(view, *figures)

    pick.observe(update, names="value")
    size.observe(update, names="value")
    update()
    box = widgets.VBox([widgets.HBox([pick, size]), status, view])
    box.update, box.state = update, state
    return box
