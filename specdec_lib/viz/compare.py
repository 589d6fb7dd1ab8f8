"""Every method side by side (notebook 12): per-category radar, efficiency against the bound, and "why no
speedup?" from the per-step records.

- `radar_figure(table)`: speedup over hf per category, one closed trace per method (Cacheback's Figure 3);
  `table` = `bench.compare.by_category(runs)` (methods x categories); grouped bars below 3 categories.
- `efficiency_figure(table)`: measured speedup beside each method's bound MAT x t(1) / t(rows), from
  `bench.compare.efficiency`: the gap is what drafting and bookkeeping cost.
- `cost_per_token_figure(results)`: for each {label: GenerationResult}, milliseconds per generated token split
  into draft, verify (target forward + verdict) and update (bookkeeping), from the step records: a method is
  faster than autoregressive only when the whole bar is shorter than autoregressive's verify bar.
  `per_token_costs(result)` gives one run's three numbers, for a table.
- `step_costs_figure(result)`: one run step by step: tokens emitted per step (bars) with draft and verify ms (lines).
- `why_explorer(results)`: pick a run, see its steps and its cost per token against the others.
- `never_slower_figure(table)`: each method's speed over the loop's plain decoding in each setting (grouped bars,
  a line at 1), from `bench.compare.never_slower`.
- `budget_figure(result)`: an `"auto"` budget step by step: the budget chosen (line) over the tokens emitted (bars).
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import ACCEPTED, render, step_records

PARTS = (("draft", "draft_us", 1e-3, "rgb(107,174,214)"), ("verify", "verify_ms", 1.0, "rgb(230,85,13)"),
         ("update", "update_us", 1e-3, "rgb(189,189,189)"))


def _has_steps(result) -> bool:
    """The hf peers (HF generate) record no steps."""
    return bool(getattr(result, "stats", {}).get("steps"))


def radar_figure(table, title: str = "Speedup over hf per category") -> go.Figure:
    """One closed polygon per method over the categories (table: methods as index, categories as columns).
    Fewer than 3 categories make no polygon: grouped bars instead (one group per method)."""
    categories = [str(c) for c in table.columns]
    if len(categories) < 3:
        fig = go.Figure([go.Bar(x=[str(m) for m in table.index], y=[float(v) for v in table[c]], name=str(c))
                         for c in table.columns])
        fig.update_layout(title=f"{title} ({len(categories)} categories: bars, a radar needs 3)", barmode="group",
                          yaxis_title="x hf", height=420, width=900)
        return fig
    fig = go.Figure()
    for method, row in table.iterrows():
        values = [float(v) for v in row.to_numpy()]
        fig.add_trace(go.Scatterpolar(r=values + values[:1], theta=categories + categories[:1], name=str(method),
                                      mode="lines+markers"))
    fig.update_layout(title=title, polar=dict(radialaxis=dict(title="x hf", rangemode="tozero")), height=480,
                      width=720)
    return fig


def efficiency_figure(table, title: str = "Measured speedup and the bound MAT x t(1) / t(rows)",
                      baseline: str = "hf") -> go.Figure:
    """The bound and the measured speedup of each method (`bench.compare.efficiency`), both over `baseline`."""
    methods = list(table.method)
    fig = go.Figure([go.Bar(x=methods, y=table.bound, name="bound (drafting free)", marker_color="rgb(198,219,239)"),
                     go.Bar(x=methods, y=table.speedup, name="measured", marker_color="rgb(49,130,189)",
                            text=[f"{e:.0%}" for e in table.efficiency], textposition="outside")])
    fig.update_layout(title=title, barmode="overlay", yaxis_title=f"x {baseline}", height=420, width=900)
    return fig


def per_token_costs(result) -> dict[str, float]:
    """{draft, verify, update}: ms per generated token from a run's step records (the "why" view's bars)."""
    steps = step_records(result)
    tokens = sum(s["emitted"] for s in steps) or 1
    return {name: sum(s[key] for s in steps) * scale / tokens for name, key, scale, _ in PARTS}


def cost_per_token_figure(results: dict, title: str = "Why (no) speedup: ms per generated token") -> go.Figure:
    """Stacked bars of draft / verify / update ms per generated token, one bar per run (runs with steps)."""
    labels = [label for label, result in results.items() if _has_steps(result)]
    costs = {label: per_token_costs(results[label]) for label in labels}
    fig = go.Figure([go.Bar(y=labels, x=[costs[label][name] for label in labels], name=name, orientation="h",
                            marker_color=color) for name, _, _, color in PARTS])
    fig.update_layout(title=title, barmode="stack", xaxis_title="ms per generated token",
                      height=160 + 36 * len(labels), width=900, margin=dict(l=200))
    fig.update_yaxes(autorange="reversed")
    return fig


def step_costs_figure(result, title: str | None = None) -> go.Figure:
    """Tokens emitted per step (bars) and the step's draft and verify ms (lines, right axis)."""
    steps = step_records(result)
    x = list(range(len(steps)))
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=x, y=[s["emitted"] for s in steps], name="tokens emitted", marker_color=ACCEPTED,
                         opacity=0.6))
    for name, key, scale, color in PARTS[:2]:
        fig.add_trace(go.Scatter(x=x, y=[s[key] * scale for s in steps], name=f"{name} ms", mode="lines",
                                 line=dict(color=color)), secondary_y=True)
    fig.update_layout(title=title or "Step by step", height=380, width=900, xaxis_title="step")
    fig.update_yaxes(title_text="tokens", secondary_y=False)
    fig.update_yaxes(title_text="ms", secondary_y=True, rangemode="tozero")
    return fig


def budget_figure(result, title: str | None = None) -> go.Figure:
    """Tokens emitted per step (bars) and the draft budget the step ran with (line, right axis: the step records'
    "draft_size", what an `"auto"` chooser picked or the fixed setting; gaps where no draft was made)."""
    steps = step_records(result)
    key = "draft_size"
    if not any(key in s for s in steps):
        raise ValueError("no step records a draft_size: run a method with a draft budget (cacheback, lookahead, "
                         "fafo, prompt_lookup, draft_model, card)")
    x = list(range(len(steps)))
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=x, y=[s["emitted"] for s in steps], name="tokens emitted", marker_color=ACCEPTED,
                         opacity=0.6))
    fig.add_trace(go.Scatter(x=x, y=[s.get(key) for s in steps], name="draft size", mode="lines+markers",
                             line=dict(color=PARTS[1][3], shape="hv")), secondary_y=True)
    fig.update_layout(title=title or "Draft size step by step", height=360, width=900, xaxis_title="step")
    fig.update_yaxes(title_text="tokens", secondary_y=False)
    chosen = sorted({s[key] for s in steps if key in s})
    fig.update_yaxes(title_text="draft size", secondary_y=True, rangemode="tozero", tickvals=chosen)  # the rungs used
    return fig


def why_explorer(results: dict):
    """A dropdown of runs ({label: GenerationResult}); shows the chosen run's steps and everyone's cost per token.
    `.state`: label, figures; `.update()` redraws."""
    import ipywidgets as widgets

    labels = [label for label, result in results.items() if _has_steps(result)]
    if not labels:
        raise ValueError("no run with step records (the hf peers record none)")
    choose = widgets.Dropdown(options=labels, value=labels[0], description="run")
    status, view = widgets.HTML(), widgets.Output()
    state: dict = {}

    def update(_=None):
        result = results[choose.value]
        costs = per_token_costs(result)
        status.value = (f"{choose.value}: {len(step_records(result))} steps, MAT {result.mat:.2f}; "
                        f"per token: draft {costs['draft']:.2f} ms + verify {costs['verify']:.2f} ms + update "
                        f"{costs['update']:.2f} ms")
        figures = (step_costs_figure(result, f"{choose.value}: step by step"), cost_per_token_figure(results))
        state.update(label=choose.value, figures=figures)
        render(view, *figures)

    choose.observe(update, names="value")
    box = widgets.VBox([choose, status, view])
    box.update, box.state = update, state
    update()
    return box


def never_slower_figure(table, value: str = "vs_autoregressive",
                        title: str = "Every method with its defaults, over the loop's plain decoding") -> go.Figure:
    """One bar group per method, one bar per setting (table: `bench.compare.never_slower`), a line at 1: a bar
    below it is a method that made decoding slower there. Missing values (a method not run there) are gaps."""
    methods = [m for m in dict.fromkeys(table.method) if m != "autoregressive"]
    fig = go.Figure()
    for setting, rows in table.groupby("setting", sort=False):
        values = rows.set_index("method")[value]
        fig.add_trace(go.Bar(x=methods, y=[float(values[m]) if m in values.index else None for m in methods],
                             name=str(setting)))
    fig.add_hline(y=1.0, line_dash="dash", annotation_text="autoregressive", annotation_position="top left")
    fig.update_layout(title=title, barmode="group", yaxis_title=f"{value.replace('_', ' ')} (x)", height=440,
                      width=960)
    return fig
