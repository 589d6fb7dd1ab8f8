"""Who computes when (notebook 09): drafter and target busy intervals as a Gantt chart.

- `timeline_figure(runs)`: runs = {label: {"draft": [(start, end), ...], "target": [...]}} (seconds), as
  `bench.timeline.busy_from_steps` / `busy_from_card` compute them; one lane per (run, side), bars where busy.
  The gaps in a sequential method's lanes are the "mutual waiting" of CARD's Figure 1.
- `card_explorer(pair, prompts)`: sliders for K and the communication ratio, a prompt, a Run button with a
  progress bar; draws the timeline of draft_model and card's modes on that prompt and their table.
"""
from __future__ import annotations

import plotly.graph_objects as go

COLORS = {"draft": "rgb(107,174,214)", "target": "rgb(230,85,13)"}


def timeline_figure(runs: dict, title: str = "Drafter and target: busy intervals",
                    max_s: float | None = None) -> go.Figure:
    """One lane per (run, side); max_s: draw only intervals that start before max_s seconds."""
    fig = go.Figure()
    lanes = []
    for label, busy in runs.items():
        for side in ("draft", "target"):
            lane = f"{label}: {side}"
            lanes.append(lane)
            spans = [(a, b) for a, b in busy.get(side, []) if max_s is None or a < max_s]
            fig.add_trace(go.Bar(y=[lane] * len(spans), x=[(b - a) * 1e3 for a, b in spans],
                                 base=[a * 1e3 for a, _ in spans], orientation="h", name=lane,
                                 marker_color=COLORS[side], showlegend=False,
                                 hovertemplate="%{base:.1f} ms + %{x:.2f} ms<extra>" + lane + "</extra>"))
    fig.update_layout(title=title, barmode="overlay", height=140 + 40 * len(lanes), width=950,
                      margin=dict(l=180, r=20, t=50, b=40))
    fig.update_xaxes(title="time (ms)")
    fig.update_yaxes(categoryorder="array", categoryarray=lanes[::-1])
    return fig


def card_explorer(pair, prompts, max_new_tokens: int = 64, width: int = 8, ratio: int = 2,
                  modes=("sync", "process"), max_s: float | None = 0.25):
    """Pick CARD's width K, its communication ratio and a prompt, then Run: the prompt is decoded by draft_model
    and by card in each of `modes` (a progress bar counts the runs), and their timeline is drawn beside a table
    (tokens/s, MAT, hit rate, overlap). `prompts`: strings or {"id", "prompt"} dicts. `.state`: the last rows
    and figure; `.update()` runs again."""
    import ipywidgets as widgets
    import pandas as pd

    from ..bench.timeline import busy_from_card, busy_from_steps, overlap
    from ..decoding import generate
    from .common import prompt_options, render

    options = prompt_options(prompts)
    slider_k = widgets.IntSlider(value=width, min=1, max=32, description="width K")
    slider_ratio = widgets.IntSlider(value=ratio, min=1, max=8, description="ratio")
    choose = widgets.Dropdown(options=options, value=options[0][1], description="prompt")
    button, progress = widgets.Button(description="Run", button_style="primary"), widgets.IntProgress(value=0)
    table, view = widgets.HTML(), widgets.Output()
    state: dict = {}

    def update(_=None):
        ids = pair.encode(choose.value)
        runs = [("draft_model", "draft_model", {})] + [
            (f"card ({mode})", "card", dict(width=slider_k.value, ratio=slider_ratio.value, mode=mode))
            for mode in modes]
        progress.max, progress.value, button.disabled = len(runs), 0, True
        busy, rows = {}, []
        try:
            for label, method, settings in runs:
                result = generate(method, pair.target, ids, max_new_tokens, draft=pair.draft, **settings)
                busy[label] = busy_from_card(result) if "draft_busy" in result.stats else busy_from_steps(result)
                rows.append(dict(run=label, tokens_per_s=result.tokens_per_s, mat=result.mat,
                                 hit_rate=result.stats.get("hit_rate"),
                                 overlap=overlap(busy[label]["draft"], busy[label]["target"])["fraction"]))
                progress.value += 1
        finally:
            button.disabled = False
        frame = pd.DataFrame(rows)
        fig = timeline_figure(busy, max_s=max_s, title=f"K={slider_k.value}, ratio={slider_ratio.value}: "
                              f"who computes when" + (f" (first {max_s * 1e3:.0f} ms)" if max_s else ""))
        table.value = frame.to_html(index=False, float_format=lambda x: f"{x:.2f}", na_rep="-")
        state.update(rows=frame, figure=fig)
        render(view, fig)

    button.on_click(update)
    box = widgets.VBox([widgets.HBox([slider_k, slider_ratio, choose]), widgets.HBox([button, progress]), table,
                        view])
    box.update, box.state = update, state
    update()
    return box
