"""Benchmarks and ablations (notebooks 00, 04, 05 and 06): methods side by side, sweeps, Table 1, Figure 4.

Every figure takes a table from `specdec_lib.bench` (`harness.summarize`, `ablation.run_variants`,
`ablation.table1`, `ablation.sweep`, `ablation.ll_fl_grid`) and returns a `go.Figure`:

- `bench_figure(summary)`: tokens/s and MAT per method, side by side.
- `gamma_sweep_figure(table)`: tokens/s and MAT against gamma, one line per method.
- `table1_figure(table)`: Table 1 (dual / no frozen / only frozen tables) as bars of speedup and MAT.
- `heatmap_figure(grid)`: Figure 4, speedup (or MAT) over LL x FL.
- `sweep_figure(table, param)`: tokens/s and MAT against one parameter (TDL, CRT...).
- `ablation_explorer(pair)`: widgets to pick a method, a suite and settings (or a sweep), run it against hf
  with a progress bar, and see the table and the chart. It benchmarks through `bench.ablation`: the one
  viz function that runs models itself, since running them on demand is its purpose.
"""
from __future__ import annotations

import html
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import need_columns, render


def bench_figure(summary) -> go.Figure:
    """Bars of tokens/s (`tokens_per_s`) and MAT (`mat`) per method from `harness.summarize(runs)` (method as
    column or index)."""
    table = summary.reset_index() if "method" not in summary.columns else summary
    methods = table["method"].astype(str).tolist()
    tokens_col, mat_col = "tokens_per_s", "mat"
    need_columns(table, tokens_col, mat_col)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens / s (higher is faster)",
                                                        "MAT: tokens per target forward"))
    fig.add_trace(go.Bar(x=methods, y=table[tokens_col].tolist(), name="tokens/s",
                         text=[f"{x:.0f}" for x in table[tokens_col]], textposition="auto"), row=1, col=1)
    fig.add_trace(go.Bar(x=methods, y=table[mat_col].tolist(), name="MAT",
                         text=[f"{x:.2f}" for x in table[mat_col]], textposition="auto"), row=1, col=2)
    fig.update_layout(title="Methods side by side", showlegend=False, template="plotly_white")
    return fig


def gamma_sweep_figure(table, methods: Sequence[str] | None = None, title: str | None = None) -> go.Figure:
    """Tokens/s (left) and MAT (right) against gamma, one line per method.

    table: one row per (gamma, method), e.g. `harness.summarize` outputs concatenated with a `gamma` column;
    tokens/s from `tokens_per_s`, MAT from `mat`."""
    tps, mat = "tokens_per_s", "mat"
    need_columns(table, tps, mat)
    methods = list(methods) if methods is not None else list(dict.fromkeys(table["method"]))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens / s (higher is faster)",
                                                        "MAT: tokens per target forward"))
    palette = ["rgb(31,119,180)", "rgb(255,127,14)", "rgb(44,160,44)", "rgb(214,39,40)", "rgb(148,103,189)",
               "rgb(140,86,75)"]
    for i, method in enumerate(methods):
        rows = table[table["method"] == method].sort_values("gamma")
        color = palette[i % len(palette)]
        for col, column in ((1, tps), (2, mat)):
            fig.add_trace(go.Scatter(x=rows["gamma"].tolist(), y=rows[column].tolist(), mode="lines+markers",
                                     name=method, legendgroup=method, showlegend=col == 1,
                                     line=dict(color=color),
                                     hovertemplate=f"{method}<br>gamma=%{{x}}<br>%{{y:.2f}}<extra></extra>"),
                          row=1, col=col)
    gammas = sorted(table["gamma"].dropna().unique().tolist())
    fig.update_xaxes(title_text="gamma (draft length)", tickvals=gammas)
    fig.update_yaxes(title_text="tokens / s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="MAT", rangemode="tozero", row=1, col=2)
    fig.update_layout(template="plotly_white", title=title or "Speed and MAT against gamma", legend_title="method")
    return fig


def table1_figure(table, title: str | None = None) -> go.Figure:
    """Table 1's rows (column `variant`, hf dropped) as two bar groups: speedup over hf and MAT."""
    rows = table[table.variant != "hf"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("speedup over hf", "MAT"))
    fig.add_trace(go.Bar(x=list(rows.variant), y=list(rows.speedup), name="speedup",
                         text=[f"{v:.2f}x" for v in rows.speedup], textposition="outside"), row=1, col=1)
    fig.add_trace(go.Bar(x=list(rows.variant), y=list(rows.mat), name="MAT",
                         text=[f"{v:.2f}" for v in rows.mat], textposition="outside"), row=1, col=2)
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey", row=1, col=1)
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(template="plotly_white", showlegend=False, title=title or "Table 1: which tables")
    return fig


def heatmap_figure(grid, value: str = "speedup", title: str | None = None) -> go.Figure:
    """Figure 4: `value` over LL (rows) x FL (columns) from a frame with columns ll, fl and `value`."""
    lls, fls = sorted(set(grid.ll)), sorted(set(grid.fl))
    cell = {(int(r.ll), int(r.fl)): float(getattr(r, value)) for r in grid.itertuples()}
    z = [[cell.get((ll, fl)) for fl in fls] for ll in lls]
    fig = go.Figure(go.Heatmap(z=z, x=[str(f) for f in fls], y=[str(l) for l in lls], colorscale="Viridis",
                               text=[[("" if v is None else f"{v:.2f}") for v in row] for row in z],
                               texttemplate="%{text}", colorbar=dict(title=value),
                               hovertemplate="LL %{y}, FL %{x}: %{z:.3f}<extra></extra>"))
    fig.update_layout(template="plotly_white", xaxis_title="FL (follower length)", yaxis_title="LL (leader length)",
                      title=title or f"{value} over LL x FL", height=320 + 20 * len(lls))
    return fig


def sweep_figure(table, param: str, title: str | None = None) -> go.Figure:
    """tokens/s (with hf's as a dotted line) and MAT against `param`, from `ablation.sweep`'s table."""
    rows = table[table.variant != "hf"]
    hf = table.loc[table.variant == "hf", "tokens_per_s"]
    # hf's row has no setting (NaN), which turns an int column into floats: print 16, not 16.0
    xs = [str(int(v)) if isinstance(v, float) and v.is_integer() else str(v) for v in rows[param]]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens / s", "MAT"))
    fig.add_trace(go.Scatter(x=xs, y=list(rows.tokens_per_s), mode="lines+markers", name="tokens/s",
                             text=[f"{s:.2f}x hf" for s in rows.speedup], hovertemplate="%{x}: %{y:.0f} tok/s, "
                             "%{text}<extra></extra>"), row=1, col=1)
    if len(hf):
        fig.add_hline(y=float(hf.iloc[0]), line_dash="dot", line_color="grey", annotation_text="hf", row=1, col=1)
    fig.add_trace(go.Scatter(x=xs, y=list(rows.mat), mode="lines+markers", name="MAT"), row=1, col=2)
    fig.update_xaxes(title_text=param, type="category")
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(template="plotly_white", showlegend=False, title=title or f"Sweep over {param}")
    return fig


def context_figure(summary, title: str | None = None) -> go.Figure:
    """Decode speedup over hf (left) and time to the first token over hf's (right) against the context length,
    one line per method, from `bench.long_context.run`'s summary."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("decode speedup over hf", "time to first token / hf's"))
    for method, rows in summary[summary.method != "hf"].groupby("method", sort=False):
        rows = rows.sort_values("context")
        xs = [f"{c // 1024}k" for c in rows.context]
        fig.add_trace(go.Scatter(x=xs, y=list(rows.decode_speedup), mode="lines+markers", name=method,
                                 legendgroup=method, hovertemplate=f"{method}, %{{x}}: %{{y:.2f}}x<extra></extra>"),
                      row=1, col=1)
        fig.add_trace(go.Scatter(x=xs, y=list(rows.prefill_vs_hf), mode="lines+markers", name=method,
                                 legendgroup=method, showlegend=False,
                                 hovertemplate=f"{method}, %{{x}}: %{{y:.2f}}x hf's<extra></extra>"), row=1, col=2)
    for col in (1, 2):
        fig.add_hline(y=1.0, line_dash="dot", line_color="grey", row=1, col=col)
    fig.update_xaxes(title_text="prompt tokens", type="category")
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(template="plotly_white", title=title or "Where each method wins: speed against context")
    return fig


def _bars(table, title: str) -> go.Figure:
    fig = go.Figure(go.Bar(x=list(table.variant), y=list(table.tokens_per_s),
                           text=[f"{s:.2f}x, MAT {m:.2f}" for s, m in zip(table.speedup, table.mat)],
                           textposition="outside"))
    fig.update_layout(template="plotly_white", yaxis_title="tokens / s", title=title)
    return fig


EXPLORED = ("cacheback", "prompt_lookup", "hf_prompt_lookup", "draft_model", "hf_assisted", "autoregressive")
CONTROLS = ("tdl", "crt", "ll", "fl", "merge", "num_tokens", "max_ngram", "gamma")  # the explorer's settings


def method_settings(method: str) -> tuple[str, ...]:
    """The explorer's controls `method` reads: the options METHODS records for it among CONTROLS, and Table 1's
    tables (frozen/dynamic) when it takes frozen=."""
    from ..decoding import METHODS

    options = METHODS[method].options
    return tuple(name for name in CONTROLS if name in options) + (("tables",) if "frozen" in options else ())


def _values(text: str) -> list:
    """The sweep's "values" box as Python values: "16, 32" -> [16, 32]; anything not a literal stays a string."""
    import ast

    out = []
    for item in text.replace(";", ",").split(","):
        item = item.strip()
        if item:
            try:
                out.append(ast.literal_eval(item))
            except (ValueError, SyntaxError):
                out.append(item)
    return out


def ablation_explorer(pair, suites: Sequence[str] = ("code", "editing"), prompts: int = 2,
                      max_new_tokens: int = 48, repeats: int = 1):
    """Pick a method, a suite and its settings, optionally a parameter to sweep; "run" benchmarks it against
    hf (ablation.run_variants) with a progress bar, then shows the table and a chart. `.run()` does what the
    button does; `.state` holds table, figure and error."""
    import ipywidgets as widgets

    from ..bench.ablation import TABLE1, run_variants

    method = widgets.Dropdown(options=list(EXPLORED), value="cacheback", description="method")
    suite = widgets.Dropdown(options=list(suites), description="suite")
    ints = {name: widgets.IntSlider(value=v, min=lo, max=hi, description=name, continuous_update=False)
            for name, v, lo, hi in (("tdl", 96, 2, 160), ("crt", 16, 0, 64), ("ll", 1, 1, 3), ("fl", 3, 1, 5),
                                    ("num_tokens", 10, 1, 32), ("max_ngram", 3, 1, 5), ("gamma", 4, 1, 12))}
    merge = widgets.Checkbox(value=False, description="trie merging")
    tables = widgets.Dropdown(options=list(TABLE1), description="tables")
    controls = {**ints, "merge": merge, "tables": tables}
    sweep_param = widgets.Dropdown(options=["(none)"], description="sweep")
    sweep_values = widgets.Text(value="16, 32, 96", description="values")
    n_prompts = widgets.IntSlider(value=prompts, min=1, max=24, description="prompts")
    n_tokens = widgets.IntSlider(value=max_new_tokens, min=8, max=256, step=8, description="new tokens")
    button = widgets.Button(description="run", button_style="primary")
    bar = widgets.IntProgress(value=0, min=0, max=1, description="progress")
    status, table_view, view = widgets.HTML(), widgets.HTML(), widgets.Output()
    state: dict = {}

    def on_method(_=None):
        used = method_settings(method.value)
        for name, w in controls.items():
            w.disabled = name not in used
        sweep_param.options = ["(none)"] + [n for n in used if n != "tables"] + (["tables"] if "tables" in used else [])
        sweep_param.value = "(none)"

    def settings_of() -> dict:
        out = {}
        for name in method_settings(method.value):
            if name == "tables":
                out.update(TABLE1[tables.value])
            else:
                out[name] = controls[name].value
        return out

    def progress(done, total):
        bar.max, bar.value = total, done

    def run(_=None):
        base = settings_of()
        param = sweep_param.value
        if param == "(none)":
            variants = {method.value: base}
        elif param == "tables":
            variants = {name: {**{k: v for k, v in base.items() if k not in ("frozen", "dynamic")}, **extra}
                        for name, extra in TABLE1.items()}
        else:
            variants = {f"{param}={v}": {**base, param: v} for v in _values(sweep_values.value)}
        bar.value, button.disabled = 0, True
        status.value = f"running {len(variants)} variant(s) + hf on {n_prompts.value} prompt(s) of {suite.value}..."
        try:
            table = run_variants(pair, suite.value, variants, max_new_tokens=n_tokens.value, repeats=repeats,
                                 limit=n_prompts.value, method=method.value, progress=False, callback=progress)
        except (ValueError, TypeError) as err:
            state.update(table=None, figure=None, error=str(err))
            status.value = f"<span style='color:crimson'>{html.escape(str(err))}</span>"
            return
        finally:
            button.disabled = False
        if param not in ("(none)", "tables"):  # run_variants gave the table a column per setting
            fig = sweep_figure(table, param, title=f"{method.value} on {suite.value}: sweep over {param}")
        else:
            fig = _bars(table, f"{method.value} on {suite.value}")
        state.update(table=table, figure=fig, error=None)
        lossless = "every variant reproduced hf's tokens" if table.all_match_hf.dropna().all() else "MISMATCH with hf"
        status.value = f"done: {lossless}"
        table_view.value = table.drop(columns=["label"]).round(3).to_html(index=False)
        render(view, fig)

    method.observe(on_method, names="value")
    button.on_click(run)
    on_method()
    box = widgets.VBox([widgets.HBox([method, suite]), widgets.HBox([ints["tdl"], ints["crt"]]),
                        widgets.HBox([ints["ll"], ints["fl"]]), widgets.HBox([merge, tables]),
                        widgets.HBox([ints["num_tokens"], ints["max_ngram"], ints["gamma"]]),
                        widgets.HBox([sweep_param, sweep_values]), widgets.HBox([n_prompts, n_tokens]),
                        widgets.HBox([button, bar]), status, table_view, view])
    box.run, box.state, box.controls = run, state, dict(controls, method=method, suite=suite, sweep=sweep_param,
                                                        values=sweep_values, prompts=n_prompts, tokens=n_tokens)
    return box
