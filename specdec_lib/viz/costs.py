"""What a forward costs and what speculation can gain (notebooks 00-02): timing curves and expected speedups.

- `cost_curve_figure(costs)`: ms of one forward vs its query rows R, one line per model (and device), log-x.
- `speedup_surface_figure(alphas, gammas, cost_ratio)`: heatmap of the expected speedup (Leviathan et al.),
  with the break-even contour.
- `speedup_explorer(cost_ratio)`: sliders for alpha, gamma, cost ratio and verify overhead over the
  speedup-vs-gamma curve.
- `batch_roofline_figure(df)`: achieved GFLOP/s against tokens per forward (B sequences x R rows), one line per
  batch size, from `costs.batch_cost`: the roofline's rising part, then its plateau.
- `expected_tokens_figure(curve, points, alpha)`: Leviathan's E[tokens](gamma) at a measured alpha, with measured
  MAT over it (from `costs.formula_against_measured`).
- `cost_figure(df, x, y, color)`: any timing against a parameter, one line per `color` group (table
  operations against capacity, mask building against rows, ...).
- `speedup_model_figure(table)`: measured speedup against the model's, one marker per method, with y = x (from
  `costs.speedup_against_model`).
- `break_even_figure(result)`: tokens per step and per ms of a chain and a tree against the rows verified, the
  break-even R marked (from `costs.tree_break_even`).
- `speedup_slider_figure(alphas, cost_ratios)`: expected speedup against gamma, one line per c, a plotly slider
  over alpha: every state precomputed, so it works in a static HTML page (no kernel).

The numbers come from `specdec_lib.bench.costs` (`forward_cost`, `expected_speedup`); this module only draws.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..bench.costs import expected_speedup, expected_tokens_per_step
from .common import render


def cost_curve_figure(costs, y: str = "median_ms") -> go.Figure:
    """ms per forward vs query rows from `costs.forward_cost` tables (several models/devices concatenated)."""
    fig = go.Figure()
    multi_device = "device" in costs and costs["device"].nunique() > 1
    keys = ["model", "device"] if multi_device else ["model"]
    for key, part in costs.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        part = part.sort_values("rows")
        fig.add_trace(go.Scatter(x=part["rows"].tolist(), y=part[y].tolist(), mode="lines+markers",
                                 name=" on ".join(str(k) for k in key),
                                 hovertemplate="%{x} rows<br>%{y:.2f} ms<extra></extra>"))
    prefix = f" over a cached prefix of {int(costs['prefix'].iloc[0])} tokens" if "prefix" in costs else ""
    fig.update_layout(title=f"Cost of one forward vs its query rows{prefix}",
                      xaxis_title="query rows (new tokens in the forward)", yaxis_title="ms per forward (median)", template="plotly_white", legend_title="model")
    fig.update_xaxes(type="log", tickvals=sorted(costs["rows"].unique().tolist()))
    return fig


def batch_roofline_figure(batch_costs) -> go.Figure:
    """Achieved GFLOP/s against tokens per forward (B x R), one line per batch size B, log-x, from
    `costs.batch_cost`: while the weights' reads dominate, the rate grows with the tokens that share them (the
    roofline's slope); where arithmetic dominates it levels off (its plateau), and extra rows stop being free."""
    fig = go.Figure()
    for batch, part in batch_costs.groupby("batch", sort=True):
        part = part.sort_values("tokens")
        fig.add_trace(go.Scatter(
            x=part["tokens"].tolist(), y=part["gflops"].tolist(), mode="lines+markers", name=f"B = {batch}",
            customdata=np.stack([part["rows"], part["median_ms"], part["ms_per_token"]], axis=1).tolist(),
            hovertemplate="B = " + str(batch) + ", R = %{customdata[0]}<br>%{x} tokens in %{customdata[1]:.1f} ms "
                          "(%{customdata[2]:.2f} ms a token)<br>%{y:.1f} GFLOP/s<extra></extra>"))
    model = f" of {batch_costs['model'].iloc[0]}" if "model" in batch_costs else ""
    fig.update_layout(title=f"What a forward{model} achieves: B sequences x R rows each",
                      xaxis_title="tokens per forward (B x R)", yaxis_title="achieved GFLOP/s (2 x params per token)",
                      template="plotly_white", legend_title="batch size")
    fig.update_xaxes(type="log", tickvals=sorted(batch_costs["tokens"].unique().tolist()))
    return fig


def expected_tokens_figure(curve, points, alpha: float, title: str | None = None) -> go.Figure:
    """E[tokens](gamma) = (1 - alpha^(gamma+1)) / (1 - alpha) at `alpha` (a line, from `curve`: columns gamma,
    expected_tokens), its limit 1 / (1 - alpha) as gamma grows (dotted, when alpha < 1), and the measured MAT
    (markers, from `points`: columns gamma, mat, and one marker series per `method` when it has that column)."""
    fig = go.Figure(go.Scatter(x=curve["gamma"].tolist(), y=curve["expected_tokens"].tolist(), mode="lines",
                               name=f"formula at alpha = {alpha:.2f}", line=dict(color="grey"),
                               hovertemplate="gamma=%{x}<br>E[tokens] %{y:.2f}<extra>formula</extra>"))
    if alpha < 1:
        fig.add_hline(y=1 / (1 - alpha), line_dash="dot", line_color="grey",
                      annotation_text=f"limit 1 / (1 - alpha) = {1 / (1 - alpha):.2f}", annotation_position="top left")
    groups = points.groupby("method", sort=False) if "method" in points else [("measured", points)]
    # two lossless methods of one algorithm share their MAT: an open, larger first marker keeps both visible
    for i, ((method, part), symbol) in enumerate(zip(groups, ("circle-open", "diamond", "square", "triangle-up", "x",
                                                              "star"))):
        part = part.sort_values("gamma")
        fig.add_trace(go.Scatter(x=part["gamma"].tolist(), y=part["mat"].tolist(), mode="markers", name=str(method),
                                 marker=dict(size=16 if i == 0 else 9, symbol=symbol, line=dict(width=2)),
                                 hovertemplate=f"{method}<br>gamma=%{{x}}<br>MAT %{{y:.2f}}<extra></extra>"))
    fig.update_layout(template="plotly_white", title=title or "Tokens per target forward: the formula and the runs",
                      xaxis_title="gamma (draft length)", yaxis_title="tokens per target forward", legend_title="")
    fig.update_yaxes(rangemode="tozero")
    return fig


def speedup_surface_figure(alphas, gammas, cost_ratio: float, verify_overhead: float = 1.0) -> go.Figure:
    """Expected speedup over autoregressive for each (alpha, gamma): a heatmap, > 1 means faster."""
    alphas = np.asarray(alphas, dtype=float)
    gammas = np.asarray(gammas, dtype=int)
    z = expected_speedup(alphas[None, :], gammas[:, None], cost_ratio, verify_overhead)  # (G, A)
    fig = go.Figure(go.Heatmap(x=alphas.tolist(), y=gammas.tolist(), z=z.tolist(), colorscale="RdBu",
                               zmid=1.0, colorbar_title="speedup",
                               hovertemplate="alpha=%{x:.2f}<br>gamma=%{y}<br>speedup=%{z:.2f}x<extra></extra>"))
    fig.add_trace(go.Contour(x=alphas.tolist(), y=gammas.tolist(), z=z.tolist(), showscale=False,
                             contours=dict(start=1, end=1, size=1, coloring="none", showlabels=True),
                             line=dict(color="black", width=2), name="speedup = 1", hoverinfo="skip"))
    fig.update_layout(title=f"Expected speedup (draft/target cost c = {cost_ratio:.2f}, "
                            f"verify overhead {verify_overhead:.2f})",
                      xaxis_title="alpha (acceptance rate per token)", yaxis_title="gamma (draft length)",
                      template="plotly_white")
    return fig


def _speedup_vs_gamma(alpha: float, gamma: int, cost_ratio: float, verify_overhead: float,
                      max_gamma: int) -> go.Figure:
    gammas = np.arange(1, max_gamma + 1)
    speedups = expected_speedup(alpha, gammas, cost_ratio, verify_overhead)
    fig = go.Figure(go.Scatter(x=gammas.tolist(), y=speedups.tolist(), mode="lines+markers", name="speedup"))
    chosen = expected_speedup(alpha, gamma, cost_ratio, verify_overhead)
    fig.add_trace(go.Scatter(x=[gamma], y=[chosen], mode="markers", marker=dict(size=14, color="crimson"),
                             name=f"gamma={gamma}: {chosen:.2f}x"))
    fig.add_hline(y=1.0, line_dash="dash", line_color="gray")
    fig.update_layout(title=f"alpha={alpha:.2f}, c={cost_ratio:.2f}: E[tokens/step]="
                            f"{expected_tokens_per_step(alpha, gamma):.2f}, speedup={chosen:.2f}x",
                      xaxis_title="gamma (draft length)", yaxis_title="expected speedup", template="plotly_white",
                      yaxis_range=[0, max(2.0, float(speedups.max()) * 1.1)])
    return fig


def speedup_explorer(cost_ratio: float = 0.2, alpha: float = 0.6, gamma: int = 4, verify_overhead: float = 1.0,
                     max_gamma: int = 16):
    """An ipywidgets VBox: sliders for alpha, gamma and cost ratio over the speedup-vs-gamma curve."""
    import ipywidgets as widgets

    a = widgets.FloatSlider(value=alpha, min=0.0, max=1.0, step=0.01, description="alpha")
    g = widgets.IntSlider(value=gamma, min=1, max=max_gamma, description="gamma")
    c = widgets.FloatSlider(value=round(cost_ratio, 3), min=0.0, max=1.0, step=0.005, description="cost ratio c",
                            readout_format=".3f")
    v = widgets.FloatSlider(value=verify_overhead, min=1.0, max=3.0, step=0.05, description="verify overhead")
    figure = lambda: _speedup_vs_gamma(a.value, g.value, c.value, v.value, max_gamma)  # noqa: E731
    try:  # a live FigureWidget where plotly's widget support (anywidget) is installed
        view = go.FigureWidget(figure())

        def update(_=None):
            new = figure()
            with view.batch_update():
                for old_trace, new_trace in zip(view.data, new.data):
                    old_trace.x, old_trace.y, old_trace.name = new_trace.x, new_trace.y, new_trace.name
                view.layout.title.text = new.layout.title.text
                view.layout.yaxis.range = new.layout.yaxis.range
    except (ImportError, ValueError):  # otherwise re-render a static figure into an Output
        view = widgets.Output()

        def update(_=None):
            render(view, figure())

        update()
    for slider in (a, g, c, v):
        slider.observe(update, names="value")
    return widgets.VBox([widgets.HBox([a, g]), widgets.HBox([c, v]), view])


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


def speedup_model_figure(table, title: str | None = None) -> go.Figure:
    """Measured speedup (y) against the speedup the model predicts (x) at each method's measured alpha, c and v,
    one marker per row of `costs.speedup_against_model`, with y = x: above the line the method beat the model,
    below it lost to what the model leaves out (Python per step, cache rollbacks, the prefill)."""
    fig = go.Figure()
    low = 0.0
    high = max(1.0, float(np.nanmax(table[["predicted_speedup", "measured_speedup"]].to_numpy()))) * 1.1
    fig.add_trace(go.Scatter(x=[low, high], y=[low, high], mode="lines", line=dict(color="grey", dash="dash"),
                             name="y = x (the model exact)", hoverinfo="skip"))
    mat = table["mat"] if "mat" in table else _nans(len(table))
    custom = np.stack([table["alpha"], table["gamma"], table["cost_ratio"], table["verify_overhead"],
                       table["expected_tokens"], mat], axis=1).tolist()
    fig.add_trace(go.Scatter(
        x=table["predicted_speedup"].tolist(), y=table["measured_speedup"].tolist(), mode="markers+text",
        text=table["method"].tolist(), textposition="top center", marker=dict(size=11, color="crimson"),
        customdata=custom, name="methods",
        hovertemplate="%{text}<br>predicted %{x:.2f}x, measured %{y:.2f}x<br>alpha %{customdata[0]:.2f}, gamma "
                      "%{customdata[1]}, c %{customdata[2]:.3f}, v %{customdata[3]:.2f}<br>E[tokens] "
                      "%{customdata[4]:.2f}, MAT %{customdata[5]:.2f}<extra></extra>"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="lightgrey")
    base = table["baseline"].iloc[0] if "baseline" in table and len(table) else "autoregressive"
    fig.update_layout(template="plotly_white", title=title or f"The speedup model against the benchmark (over {base})",
                      xaxis=dict(title="predicted speedup E[tokens] / (gamma c + v)", range=[low, high]),
                      yaxis=dict(title=f"measured speedup over {base}", range=[low, high]), showlegend=True)
    return fig


def _nans(n: int) -> np.ndarray:
    """n NaNs (a missing column's values in a hover)."""
    return np.full(n, np.nan)


def break_even_figure(result, title: str | None = None) -> go.Figure:
    """A `costs.BreakEven` drawn against R, the rows verified: top, the tokens one step yields (chain, tree); bottom,
    tokens per ms, the best chain's level dashed and the break-even R (the first where the tree beats it) marked."""
    table = result.table
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=("tokens per step", "tokens per ms"))
    for shape, color in (("chain", "rgb(49,130,189)"), ("tree", "rgb(230,85,13)")):
        part = table.dropna(subset=[f"{shape}_tokens"])
        name = "chain" if shape == "chain" else f"tree, width {result.width}"
        for row, column in ((1, f"{shape}_tokens"), (2, f"{shape}_tokens_per_ms")):
            fig.add_trace(go.Scatter(x=part["rows"].tolist(), y=part[column].tolist(), mode="lines+markers",
                                     name=name, legendgroup=shape, showlegend=row == 1, line=dict(color=color),
                                     customdata=part[f"{shape}_ms"].tolist(),
                                     hovertemplate=f"{name}<br>R = %{{x}}<br>%{{y:.3f}}<br>%{{customdata:.3f}} ms a "
                                                   "step<extra></extra>"), row=row, col=1)
    fig.add_hline(y=result.best_chain_tokens_per_ms, line_dash="dash", line_color="rgb(49,130,189)", row=2, col=1,
                  annotation_text=f"best chain (R = {result.best_chain_rows})", annotation_position="bottom right")
    if result.break_even is not None:
        fig.add_vline(x=result.break_even, line_dash="dot", line_color="black", row=2, col=1,
                      annotation_text=f"tree pays from R = {result.break_even}", annotation_position="top left")
    what = (f"the tree pays from R = {result.break_even}" if result.break_even is not None
            else "the tree never beats the best chain here")
    fig.update_xaxes(title_text="R: rows the target verifies (the root + the drafts)", row=2, col=1)
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(template="plotly_white", height=560, title=title or f"Chain or tree: {what}")
    return fig


COLORWAY = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")  # one per c


def speedup_slider_figure(alphas=np.round(np.linspace(0.1, 0.95, 18), 2), cost_ratios=(0.0, 0.05, 0.1, 0.2, 0.4),
                          gammas=range(1, 17), verify_overhead: float = 1.0, active: int | None = None,
                          title: str | None = None) -> go.Figure:
    """Expected speedup (`costs.expected_speedup`) against gamma, one line per cost ratio c, with a plotly slider
    over alpha: a trace per (alpha, c), every one precomputed, the slider's steps switching which are visible, so
    the figure needs no Python behind it (`fig.write_html` gives a working page). `active`: the alpha index shown
    first (default the middle one)."""
    alphas, gammas = [float(a) for a in alphas], np.asarray(list(gammas), dtype=int)
    if not alphas or not len(cost_ratios) or not len(gammas):
        raise ValueError("need at least one alpha, one cost ratio and one gamma")
    active = len(alphas) // 2 if active is None else active
    fig = go.Figure()
    top = 1.0
    for i, alpha in enumerate(alphas):
        for k, c in enumerate(cost_ratios):
            y = expected_speedup(alpha, gammas, c, verify_overhead)
            top = max(top, float(np.max(y)))
            fig.add_trace(go.Scatter(x=gammas.tolist(), y=np.asarray(y).tolist(), mode="lines+markers",
                                     name=f"c = {c:g}", visible=i == active, meta=dict(alpha=alpha, cost_ratio=c),
                                     line=dict(color=COLORWAY[k % len(COLORWAY)]),
                                     hovertemplate=f"alpha {alpha:.2f}, c {c:g}<br>gamma %{{x}}: %{{y:.2f}}x"
                                                   "<extra></extra>"))
    n = len(cost_ratios)
    steps = [dict(method="update", label=f"{alpha:.2f}",
                  args=[{"visible": [j // n == i for j in range(len(alphas) * n)]},
                        {"title.text": _slider_title(alpha, verify_overhead, title)}])
             for i, alpha in enumerate(alphas)]
    fig.add_hline(y=1.0, line_dash="dash", line_color="grey")
    fig.update_layout(template="plotly_white", title=_slider_title(alphas[active], verify_overhead, title),
                      xaxis_title="gamma (draft length)", yaxis=dict(title="expected speedup", range=[0, top * 1.05]),
                      sliders=[dict(active=active, steps=steps, currentvalue=dict(prefix="alpha = "), pad=dict(t=50))],
                      legend_title="draft/target cost")
    return fig


def _slider_title(alpha: float, verify_overhead: float, title: str | None) -> str:
    return title or f"Expected speedup at alpha = {alpha:.2f} (verify overhead {verify_overhead:.2f})"
