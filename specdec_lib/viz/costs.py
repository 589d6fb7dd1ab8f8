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

The numbers come from `specdec_lib.bench.costs` (`forward_cost`, `expected_speedup`); this module only draws.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

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
