"""FAFO's KV layout (notebook 08): block maps, the physical layout over decoding steps, the timing chart.

- `block_map_figure(table)`: which KV blocks each query block loads (a bool (query blocks, KV blocks) table, as
  `flex_layout.block_table(block_mask)` computes it), one cell per block.
- `layout_figure(snapshots)`: the store's slots over decoding steps, with a slider: top, the logical position
  each slot holds (empty slots blank); bottom, each slot's role: sink, C's other entries in the fixed region,
  evicted (the tail: kept, never loaded by compressed rows), the rows of a forward in flight, empty. Slots are
  drawn block by block (one row per block), so the fixed blocks are the top rows. A plotly slider, not a
  widget: it works in a saved HTML file too.
- `selection_figure(kept, labels)`: which positions of a text each compression keeps (one row per compression).
- `layout_timing_figure(table)`: per-step milliseconds against context length for each case of
  `bench.flex_layout` (layout, fragmented, full, rebuild, sdpa; the whole model step).

Compute lives in `mechanisms.store.layout` (`FlexLayoutStore.snapshot`, `block_table`) and `bench.flex_layout`.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

ROLES = ["empty", "evicted (tail)", "kept by C", "sink", "this forward's rows"]
ROLE_COLORS = ["rgb(245,245,245)", "rgb(189,189,189)", "rgb(49,130,189)", "rgb(255,193,7)", "rgb(230,85,13)"]


def block_map_figure(table, title: str = "KV blocks each query block loads", block: int | None = None) -> go.Figure:
    """A bool (query blocks, KV blocks) table as a grid: blue = loaded. `block`: slots per KV block (hover)."""
    table = np.asarray(table, dtype=bool)
    qb, kb = table.shape
    hover = [[f"query block {i}, KV block {j}" + (f" (slots {j * block}..{(j + 1) * block - 1})" if block else "")
              + (": loaded" if table[i, j] else ": skipped") for j in range(kb)] for i in range(qb)]
    fig = go.Figure(go.Heatmap(z=table.astype(int).tolist(), zmin=0, zmax=1, showscale=False, text=hover,
                               hoverinfo="text", xgap=1 if kb <= 64 else 0, ygap=1,
                               colorscale=[[0, "rgb(245,245,245)"], [1, "rgb(49,130,189)"]]))
    fig.update_layout(title=f"{title}: {int(table.sum())} of {table.size} loaded", height=160 + 28 * qb,
                      width=900, margin=dict(l=60, r=20, t=50, b=40))
    fig.update_xaxes(title="KV block")
    fig.update_yaxes(title="query block", autorange="reversed", dtick=1)
    return fig


def _grids(snap, sinks: int):
    """(positions grid, roles grid, hover) of one snapshot, (blocks, block) each."""
    pos = snap.positions
    slot = np.arange(len(pos))
    role = np.where(pos < 0, 0, np.where(slot < snap.compressed, 2, 1))
    role = np.where((role == 2) & (pos >= 0) & (pos < sinks), 3, role)
    role = np.where((pos >= 0) & (slot >= snap.length), 4, role)  # written by prepare, not committed yet
    shape = (-1, snap.block)
    z_pos = np.where(pos < 0, np.nan, pos).reshape(shape)
    hover = [f"slot {s}: " + ("empty" if p < 0 else f"position {p}, {ROLES[r]}") for s, p, r in zip(slot, pos, role)]
    return z_pos, role.reshape(shape), np.array(hover, dtype=object).reshape(shape)


def layout_figure(snapshots, sinks: int = 0, labels=None, title: str = "Physical layout of the KV store") -> go.Figure:
    """The store's slots over steps (a slider). snapshots: LayoutSnapshot list; sinks: positions drawn as sinks;
    labels: one slider label per snapshot (default "step i")."""
    if not snapshots:
        raise ValueError("no snapshots to draw")
    labels = labels or [f"step {i}" for i in range(len(snapshots))]
    top = max(int(s.positions.max()) for s in snapshots)
    top_role = len(ROLES) - 1
    colorscale = [[i / top_role, c] for i, c in enumerate(ROLE_COLORS)]

    def traces(snap):
        z_pos, z_role, hover = _grids(snap, sinks)
        return [go.Heatmap(z=z_pos.tolist(), zmin=0, zmax=max(top, 1), colorscale="Viridis", text=hover.tolist(),
                           hoverinfo="text", ygap=1, colorbar=dict(title="position", len=0.45, y=0.78)),
                go.Heatmap(z=z_role.tolist(), zmin=0, zmax=top_role, colorscale=colorscale, text=hover.tolist(),
                           hoverinfo="text", ygap=1, showscale=False)]

    first = snapshots[0]
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.14,
                        subplot_titles=("logical position held by each slot", "role of each slot: " +
                                        ", ".join(f"<span style='color:{c}'>■</span> {r}"
                                                  for r, c in zip(ROLES, ROLE_COLORS))))
    for i, trace in enumerate(traces(first)):
        fig.add_trace(trace, row=i + 1, col=1)
    fig.frames = [go.Frame(data=traces(s), name=label,
                           layout=dict(title_text=f"{title}: {label}, {s.length} entries, {s.compressed} in the "
                                                  f"fixed region ({s.fixed_blocks} blocks)"))
                  for s, label in zip(snapshots, labels)]
    steps = [dict(method="animate", label=label, args=[[label], dict(mode="immediate", frame=dict(duration=0,
                  redraw=True), transition=dict(duration=0))]) for label in labels]
    blocks = len(first.positions) // first.block
    fig.update_layout(title=f"{title}: {labels[0]}, {first.length} entries, {first.compressed} in the fixed "
                            f"region ({first.fixed_blocks} blocks)", height=260 + 36 * blocks, width=900,
                      sliders=[dict(active=0, steps=steps, currentvalue=dict(prefix=""), pad=dict(t=40))],
                      margin=dict(l=60, r=20, t=70, b=40))
    for row in (1, 2):
        fig.update_yaxes(title="block", autorange="reversed", dtick=1, row=row, col=1)
    fig.update_xaxes(title="slot in block", row=2, col=1)
    return fig


def selection_figure(kept: dict, labels=None, title: str = "Which positions each compression keeps") -> go.Figure:
    """kept: {name: bool array over positions}; labels: the token text of each position (hover)."""
    names = list(kept)
    z = np.array([np.asarray(kept[n], dtype=int) for n in names])  # (compressions, positions)
    n_pos = z.shape[1]
    labels = labels or [str(i) for i in range(n_pos)]
    hover = [[f"position {j} {labels[j]!r}: {'kept' if z[i, j] else 'dropped'} by {names[i]}" for j in range(n_pos)]
             for i in range(len(names))]
    fig = go.Figure(go.Heatmap(z=z.tolist(), y=[f"{n} ({int(z[i].sum())})" for i, n in enumerate(names)],
                               zmin=0, zmax=1, showscale=False, text=hover, hoverinfo="text", ygap=2,
                               colorscale=[[0, "rgb(235,235,235)"], [1, "rgb(49,130,189)"]]))
    fig.update_layout(title=title, height=140 + 40 * len(names), width=900, margin=dict(l=160, r=20, t=50, b=40))
    fig.update_xaxes(title="logical position")
    return fig


def layout_timing_figure(table, title: str | None = None) -> go.Figure:
    """Per-step ms vs context length, one line per case (a data frame from bench.flex_layout)."""
    fig = go.Figure()
    for case, rows in table.groupby("case", sort=False):
        rows = rows.sort_values("length")
        fig.add_trace(go.Scatter(x=rows["length"], y=rows["ms"], mode="lines+markers", name=case,
                                 line=dict(dash="dot" if case.startswith("step") else "solid")))
    device = table["device"].iloc[0] if "device" in table.columns else ""
    fig.update_layout(title=title or f"Per-step cost of compressed attention ({device})", height=460, width=900,
                      legend=dict(orientation="v"))
    fig.update_xaxes(title="context length (tokens)", type="log")
    fig.update_yaxes(title="ms per step (median)", type="log")
    return fig
