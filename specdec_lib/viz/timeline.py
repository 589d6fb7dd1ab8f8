"""Who computes when (notebook 07): drafter and target busy intervals as a Gantt chart.

- `timeline_figure(runs)`: runs = {label: {"draft": [(start, end), ...], "target": [...]}} (seconds), as
  `bench.timeline.busy_from_steps` / `busy_from_card` compute them; one lane per (run, side), bars where busy.
  The gaps in a sequential method's lanes are the "mutual waiting" of CARD's Figure 1.
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
