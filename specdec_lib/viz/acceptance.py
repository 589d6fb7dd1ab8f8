"""How many draft tokens the target accepted, and what the accepted tokens are (notebooks 00, 03, 04 and 05).

Per step and per token, from a `GenerationResult` and its per-step records (`result.stats["steps"]`: the same
dict for every method, with `tree_size`, `accepted`, `emitted`, `full`, `draft_us`, ...):

- `acceptance_figure(result)`: tokens gained by each target forward (the next token included), MAT as a line.
- `steps_figure(result)`: per step, the draft size verified (bars) and the tokens gained (markers).
- `draft_time_figure({name: result})`: the distribution of per-step drafting time, µs, one box per run.
- `token_kinds(result)`: (step, kind) of every new token: an accepted draft, a bonus or a correction.
- `acceptance_html(tokens_text, step_ids, kinds)`, `result_acceptance_html(result, decode)`: the generated
  text as HTML (for `IPython.display.HTML`), each token on its step's colour, the target's own token of each
  step bold and underlined (solid for a bonus, wavy for a correction).
- `distribution_figure(exact, empirical, labels)`: exact vs empirical probabilities of short continuations,
  the exact bars with a +-2 standard-error band: what a lossless acceptance rule must reproduce.
- `depth_acceptance_figure(table)`: P(accept depth d | depth d reached) per draft depth (bars, counts in the hover)
  against the i.i.d. model's one alpha (the pooled rate), and the share of steps reaching each depth against the
  i.i.d. alpha^(d-1), from `bench.acceptance.acceptance_by_depth`.
- `temperature_acceptance_figure(table)`: acceptance and MAT of speculative sampling against the temperature, with
  the acceptance the two models' overlap sum_x min(p, q) predicts.
- `chain_step_figure(step, decode)`: one draft-and-verify step token by token (`bench.acceptance.chain_step`): the
  context's last tokens, each draft over the target's token at its position, accepted / rejected / after it.
"""
from __future__ import annotations

import html
from typing import Callable, Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..bench.acceptance import pooled_acceptance
from .common import ACCEPTED, BONUS, CORRECTION, DRAFTED, cell_grid, need_columns, role_legend, step_records, token_text

# background per decoding step; consecutive steps differ, and the cycle is long enough not to repeat nearby
STEP_COLORS = ("#cfe8f3", "#fde2c8", "#d9f0d3", "#f2d7ee", "#fff3b0", "#d6def5", "#f8d3d3", "#e0ecd0")
KIND_TEXT = {"draft": "accepted draft", "bonus": "bonus (the target's token after a full acceptance)",
             "correction": "correction (the target's token at the first rejection)"}


def acceptance_figure(result, title: str | None = None) -> go.Figure:
    """Tokens each target forward added (the next token included) for one `GenerationResult`."""
    lengths = list(result.accept_lengths)
    fig = go.Figure(go.Bar(x=list(range(len(lengths))), y=lengths, name="tokens gained",
                           hovertemplate="forward %{x}: +%{y}<extra></extra>"))
    mat = sum(lengths) / len(lengths) if lengths else 0.0
    fig.add_hline(y=mat, line_dash="dash", line_color="crimson", annotation_text=f"MAT {mat:.2f}")
    fig.update_layout(title=title or f"{result.method or 'generation'}: tokens per target forward",
                      xaxis_title="target forward", yaxis_title="tokens gained", template="plotly_white")
    return fig


def steps_figure(result, title: str | None = None) -> go.Figure:
    """Bars: the draft size of every step (`tree_size`: tree nodes verified, a chain's length, 0 for
    autoregressive); markers: tokens gained (accepted + the target's token)."""
    steps = step_records(result)
    x = list(range(len(steps)))
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=x, y=[s["tree_size"] for s in steps], name="tree size (draft nodes)",
                         marker_color="rgb(158,202,225)"), secondary_y=False)
    fig.add_trace(go.Scatter(x=x, y=[s["emitted"] for s in steps], mode="markers+lines", name="tokens gained",
                             marker=dict(color="crimson", size=7), line=dict(width=1)), secondary_y=True)
    fig.update_xaxes(title_text="decoding step (one target forward)")
    fig.update_yaxes(title_text="draft nodes", rangemode="tozero", secondary_y=False)
    # whole tokens on their own grid (plotly would otherwise align this axis to the bars' ticks: 0.539, 1.078...)
    fig.update_yaxes(title_text="tokens gained", rangemode="tozero", dtick=1, showgrid=False, secondary_y=True)
    fig.update_layout(template="plotly_white", legend=dict(orientation="h", y=1.1),
                      title=title or f"{len(steps)} steps, MAT {result.mat:.2f}")
    return fig


def draft_time_figure(results: dict, title: str | None = None) -> go.Figure:
    """One box per named result (or list of µs values): the per-step drafting time."""
    fig = go.Figure()
    for name, result in results.items():
        values = [s["draft_us"] for s in step_records(result)] if hasattr(result, "stats") else list(result)
        fig.add_trace(go.Box(y=values, name=str(name), boxpoints="outliers"))
    fig.update_layout(template="plotly_white", yaxis_title="drafting time per step (µs)", showlegend=False,
                      title=title or "Drafting time per decoding step")
    return fig


def token_kinds(result) -> tuple[list[int], list[str]]:
    """(step id, kind) of every new token of a `GenerationResult`: kind "draft" (an accepted draft), "bonus"
    (the target's token when the walk ran off a leaf: every draft of the path accepted, or nothing drafted)
    or "correction" (the target's token at the first rejection: the walk stopped at a node that has children).
    Uses the step records' `accepted`, `emitted` and `full` when the method records them (exact, EOS cuts
    included); otherwise `accept_lengths` alone (e.g. HF's decoders), reading each step as drafts + one
    target token."""
    step_ids, kinds = [], []
    steps = result.stats.get("steps") if getattr(result, "stats", None) else None
    if steps:
        for i, s in enumerate(steps):
            k, e = s["accepted"], s["emitted"]
            # an EOS cut (e <= k) drops the target's token, and maybe some drafts, from the output
            own = ["draft"] * min(k, e) + ([("bonus" if s["full"] else "correction")] if e == k + 1 else [])
            step_ids += [i] * len(own)
            kinds += own
    else:
        for i, n in enumerate(result.accept_lengths):
            step_ids += [i] * n
            kinds += ["draft"] * (n - 1) + ["bonus"]
    if len(kinds) != len(result.new_tokens):
        raise ValueError(f"steps account for {len(kinds)} tokens, the result has {len(result.new_tokens)}")
    return step_ids, kinds


def _visible(text: str) -> str:
    return html.escape(text).replace("\n", "↵\n").replace("\t", "⇥\t")


def acceptance_html(tokens_text: Sequence[str], step_ids: Sequence[int], kinds: Sequence, prompt: str = "",
                    title: str | None = None, legend: bool = True, max_prompt_chars: int = 300) -> str:
    """The generated text as HTML: each token on the background colour of the step that produced it (colours
    cycle), the target's own token of a step (kind "bonus"/"correction", or True) bold and underlined: solid for
    a bonus, wavy for a correction. Hover a token for its step and kind.

    tokens_text: one string per token (decode token by token); kinds: from `token_kinds`, or bools (True: the
    target's own token, shown as a bonus).
    `prompt` (its last `max_prompt_chars` characters) is shown first, in grey."""
    if not len(tokens_text) == len(step_ids) == len(kinds):
        raise ValueError(f"{len(tokens_text)} tokens, {len(step_ids)} step ids, {len(kinds)} kinds")
    kinds = [k if isinstance(k, str) else ("bonus" if k else "draft") for k in kinds]
    unknown = set(kinds) - set(KIND_TEXT)
    if unknown:
        raise ValueError(f"unknown token kinds {sorted(unknown)}; use {sorted(KIND_TEXT)} or booleans")
    parts = []
    if title:
        parts.append(f"<div style='font-weight:bold;margin-bottom:4px'>{html.escape(title)}</div>")
    if legend:
        parts.append("<div style='font-size:12px;margin-bottom:6px'>background = decoding step (colours cycle); "
                     "<span style='background:#eee'>plain</span> = accepted draft; "
                     "<b style='text-decoration:underline;background:#eee'>bold underlined</b> = bonus token; "
                     "<b style='text-decoration:underline wavy;background:#eee'>wavy</b> = correction "
                     "(the target's token at a rejection)</div>")
    body = []
    if prompt:
        shown = prompt[-max_prompt_chars:]
        body.append(f"<span style='color:#999' title='prompt'>{'…' if len(prompt) > len(shown) else ''}"
                    f"{html.escape(shown)}</span>")
    for text, step, kind in zip(tokens_text, step_ids, kinds):
        style = f"background:{STEP_COLORS[int(step) % len(STEP_COLORS)]}"
        if kind != "draft":
            style += ";font-weight:bold;text-decoration:underline" + (" wavy" if kind == "correction" else "")
            style += f";text-decoration-color:{BONUS if kind == 'bonus' else CORRECTION}"
        body.append(f"<span class='tok-{kind}' data-step='{int(step)}' style='{style}' "
                    f"title='step {int(step)}: {KIND_TEXT[kind]}'>{_visible(text)}</span>")
    parts.append("<div style='font-family:monospace;white-space:pre-wrap;line-height:1.6;border:1px solid #ddd;"
                 "padding:6px'>" + "".join(body) + "</div>")
    return "<div class='acceptance-view'>" + "".join(parts) + "</div>"


def result_acceptance_html(result, decode: Callable, prompt: str = "", title: str | None = None) -> str:
    """`acceptance_html` for a `GenerationResult`, decoding token by token with `decode(list_of_ids)`."""
    step_ids, kinds = token_kinds(result)
    return acceptance_html([decode([t]) for t in result.new_tokens], step_ids, kinds, prompt=prompt, title=title)


def _series_freq(empirical) -> tuple[dict, int | None]:
    """(normalised frequencies, number of samples or None) from counts or probabilities."""
    values = list(empirical.values())
    total = float(sum(values))
    integral = all(float(v).is_integer() for v in values) and total > 1.0 + 1e-9
    if total <= 0:
        raise ValueError("an empirical distribution with no mass")
    return {k: v / total for k, v in empirical.items()}, (int(total) if integral else None)


def distribution_figure(exact, empirical, labels=None, top: int = 24, title: str | None = None,
                        band: bool = True) -> go.Figure:
    """Bars of exact vs empirical probabilities of continuations, most probable first.

    exact: {continuation: probability} (or a list of probabilities, then `labels` names them).
    empirical: counts or frequencies keyed like `exact` (a Counter of samples), or {series name: such a
    mapping} for several series side by side (e.g. the right and a wrong acceptance rule); lists work as
    for `exact`. labels: a callable continuation -> text, a mapping, or a list parallel to list inputs.
    The `top` most probable continuations get a bar each, the rest are pooled into one "other" bar (with any
    continuation of exact probability 0 that was sampled). With counts (integers) and `band`, the exact bars
    carry +-2 standard errors, 2 sqrt(P (1 - P) / n): where a lossless method's bar falls ~95% of the time."""
    if not isinstance(exact, Mapping):
        exact = dict(enumerate(exact))
        if isinstance(labels, Sequence) and not isinstance(labels, str):
            labels = dict(enumerate(labels))
    if isinstance(empirical, Mapping) and empirical and all(isinstance(v, Mapping) for v in empirical.values()):
        series = dict(empirical)
    elif isinstance(empirical, Mapping):
        series = {"empirical": empirical}
    else:
        series = {"empirical": dict(enumerate(empirical))}
    series = {name: (dict(enumerate(s)) if not isinstance(s, Mapping) else s) for name, s in series.items()}
    order = sorted(exact, key=lambda k: (-exact[k], str(k)))
    shown, rest = order[:top], order[top:]
    if callable(labels):
        names = [str(labels(k)) for k in shown]
    elif isinstance(labels, Mapping):
        names = [str(labels.get(k, k)) for k in shown]
    else:
        names = [" ".join(map(str, k)) if isinstance(k, tuple) else str(k) for k in shown]
    other_keys = set(rest) | {k for s in series.values() for k in s if k not in exact or exact[k] <= 0}
    pooled = bool(other_keys)
    if pooled:
        names.append(f"other ({len(other_keys)})")
    exact_y = [float(exact[k]) for k in shown] + ([float(sum(exact.get(k, 0.0) for k in other_keys))] if pooled else [])
    fig = go.Figure()
    counts = [_series_freq(s) for s in series.values()]
    n = counts[0][1] if counts else None
    error = None
    if band and n:
        error = dict(type="data", array=[2 * (p * (1 - p) / n) ** 0.5 for p in exact_y], visible=True,
                     color="black", thickness=1.2, width=3)
    fig.add_trace(go.Bar(x=names, y=exact_y, name="exact (enumeration)", marker_color="rgb(55,83,109)",
                         error_y=error, hovertemplate="%{x}<br>exact %{y:.4f}<extra></extra>"))
    colors = ["rgb(107,174,214)", "rgb(239,138,98)", "rgb(116,196,118)", "rgb(158,154,200)"]
    for i, ((name, _), (freq, m)) in enumerate(zip(series.items(), counts)):
        y = [freq.get(k, 0.0) for k in shown] + ([sum(freq.get(k, 0.0) for k in other_keys)] if pooled else [])
        label = f"{name} (n={m})" if m else name
        fig.add_trace(go.Bar(x=names, y=y, name=label, marker_color=colors[i % len(colors)],
                             hovertemplate="%{x}<br>" + html.escape(name) + " %{y:.4f}<extra></extra>"))
    fig.update_layout(barmode="group", template="plotly_white", xaxis_title="continuation",
                      yaxis_title="probability", legend_title="",
                      title=title or f"Exact vs empirical distribution ({len(shown)} most probable of {len(exact)})")
    fig.update_xaxes(tickangle=-45 if len(names) > 8 else 0)
    return fig


def depth_acceptance_figure(table, title: str | None = None) -> go.Figure:
    """Bars: P(accept depth d | depth d reached) per draft depth, from a `bench.acceptance.acceptance_by_depth`
    table (columns depth, reached, accepted, rate, share_reached), the counts in the hover; a dashed line: the
    i.i.d. model's constant alpha, the pooled rate (every depth's accepted / reached). Lines: the share of drafting
    steps that reached depth d, against alpha^(d-1), what the i.i.d. model predicts for it."""
    need_columns(table, "depth", "reached", "accepted", "rate", "share_reached")
    table = table.sort_values("depth")
    depth = table["depth"].tolist()
    alpha = pooled_acceptance(table)
    counts = list(zip(table["accepted"].tolist(), table["reached"].tolist()))
    fig = go.Figure()
    fig.add_trace(go.Bar(x=depth, y=table["rate"].tolist(), name="P(accept d | reached d)", marker_color=ACCEPTED,
                         customdata=counts, text=[f"{a}/{r}" for a, r in counts], textposition="inside",
                         hovertemplate="depth %{x}: accepted %{customdata[0]} of %{customdata[1]} steps that "
                                       "reached it<br>P(accept | reached) = %{y:.3f}<extra></extra>"))
    fig.add_trace(go.Scatter(x=depth, y=table["share_reached"].tolist(), mode="lines+markers", name="share of steps "
                             "reaching d", line=dict(color="rgb(55,83,109)"), customdata=counts,
                             hovertemplate="depth %{x}: %{customdata[1]} steps reached it, share %{y:.3f}"
                                           "<extra></extra>"))
    if alpha == alpha:  # some depth was reached
        fig.add_hline(y=alpha, line_dash="dash", line_color=CORRECTION,
                      annotation_text=f"i.i.d. alpha = {alpha:.3f} (pooled)", annotation_position="top left")
        fig.add_trace(go.Scatter(x=depth, y=[alpha ** (d - 1) for d in depth], mode="lines", name="i.i.d.: "
                                 "alpha^(d-1) reach d", line=dict(color=DRAFTED, dash="dot", width=3),
                                 hovertemplate="depth %{x}: the i.i.d. model expects a share %{y:.3f}"
                                               "<extra></extra>"))
    fig.update_yaxes(title_text="probability", range=[0, 1.05])
    fig.update_xaxes(title_text="draft depth d", tickvals=depth)
    fig.update_layout(template="plotly_white", legend=dict(orientation="h", y=-0.2),
                      title=title or f"Acceptance by draft depth ({int(table['reached'].iloc[0]) if len(table) else 0}"
                                     " drafting steps)")
    return fig


def temperature_acceptance_figure(table, title: str | None = None) -> go.Figure:
    """Speculative sampling against the temperature (0 = greedy), one row per temperature of `table`: left, the
    acceptance rate (`acceptance_rate`: accepted / drafted) and, where the columns are there, the rate per test
    (`test_rate`: accepted / reached) and the overlap sum_x min(p, q) the two models predict for it (`overlap`);
    right, MAT (`mat`). Hover: the counts (`drafted`, `accepted`) where given."""
    need_columns(table, "temperature", "acceptance_rate", "mat")
    table = table.sort_values("temperature")
    x = table["temperature"].tolist()
    labels = [f"{t:g} (greedy)" if t == 0 else f"{t:g}" for t in x]
    counted = "accepted" in table and "drafted" in table
    counts = list(zip(table["accepted"].tolist(), table["drafted"].tolist())) if counted else None
    hover_counts = "<br>accepted %{customdata[0]} of %{customdata[1]} drafted" if counted else ""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("acceptance", "MAT: tokens per target forward"))
    lines = [("acceptance_rate", "accepted / drafted", ACCEPTED, "solid"),
             ("test_rate", "accepted / tested (P(accept | reached))", "rgb(55,83,109)", "solid"),
             ("overlap", "predicted: mean sum_x min(p, q)", CORRECTION, "dash")]
    for column, name, color, dash in lines:
        if column not in table:
            continue
        fig.add_trace(go.Scatter(x=x, y=table[column].tolist(), mode="lines+markers", name=name, customdata=counts,
                                 line=dict(color=color, dash=dash), text=labels,
                                 hovertemplate="T = %{text}: %{y:.3f}" + hover_counts + "<extra>" +
                                               html.escape(name) + "</extra>"),
                      row=1, col=1)
    mat = table["mat"].tolist()
    fig.add_trace(go.Bar(x=x, y=mat, name="MAT", marker_color=BONUS, text=[f"{m:.2f}" for m in mat],
                         customdata=labels, hovertemplate="T = %{customdata}: MAT %{y:.2f}<extra></extra>",
                         showlegend=False), row=1, col=2)
    fig.update_xaxes(title_text="temperature T", tickvals=x, ticktext=[f"{t:g}" for t in x])
    fig.update_yaxes(title_text="probability", range=[0, 1.05], row=1, col=1)
    fig.update_yaxes(title_text="tokens per target forward", rangemode="tozero", row=1, col=2)
    fig.update_layout(template="plotly_white", legend=dict(orientation="h", y=-0.25),
                      title=title or "Speculative sampling: acceptance against temperature")
    return fig


REJECTED = "rgb(215,48,39)"  # the first draft the target disagreed with
STEP_ROLES = {"context": "rgb(236,236,236)", "accepted": ACCEPTED, "rejected": REJECTED,
              "after the rejection": "rgb(200,200,200)", "correction": CORRECTION, "bonus": BONUS}


def chain_step_figure(step, decode: Callable | None = None, context: int = 6, title: str | None = None) -> go.Figure:
    """One step of a chain (a `bench.acceptance.ChainStep`), token by token: row "drafted" holds the context's last
    `context` tokens (the root at position 0) and the drafts at 1..g; row "target" the target's token at each
    position: green where the two agree (accepted), the first draft it disagreed with red, the drafts after it and
    the target's tokens under them grey (never read), and the target's own token at position k + 1 marked: a
    correction (orange) or, when every draft was accepted, the bonus (gold) at g + 1. Token text via
    `common.token_text`; cell roles in the heatmap's customdata."""
    drafted, target, k = list(step.drafted), list(step.target), step.accepted
    cells = {}
    shown = step.context[-context:] if context > 0 else []
    for i, token in enumerate(shown):
        pos = i - len(shown) + 1  # the root at 0
        cells[pos, "drafted"] = (token_text([token], decode), "context", f"context, position {pos}: id {token}")
    for i, token in enumerate(drafted):
        pos, agree = i + 1, i < k
        role = "accepted" if agree else "rejected" if i == k else "after the rejection"
        mine = target[i]
        under = "not computed" if mine is None else f"{token_text([mine], decode)!r} (id {mine})"
        cells[pos, "drafted"] = (token_text([token], decode), role,
                                 f"position {pos}: drafted {token_text([token], decode)!r} (id {token}), the target's "
                                 f"{under}: {role}")
    for i, token in enumerate(target):
        pos = i + 1
        if token is None:
            continue
        role = ("accepted" if i < k else ("bonus" if step.full else "correction") if i == k
                else "after the rejection")
        what = {"bonus": "the bonus: every draft accepted", "correction": "the correction at the first rejection",
                "accepted": "agrees with the draft", "after the rejection": "after a rejected draft: never read"}[role]
        cells[pos, "target"] = (token_text([token], decode), role,
                                f"position {pos}: the target's {token_text([token], decode)!r} (id {token}): {what}")
    fig = go.Figure(cell_grid(cells, STEP_ROLES, rows=["drafted", "target"]))
    for trace in role_legend(STEP_ROLES, shown={role for _, role, _ in cells.values()}):
        fig.add_trace(trace)
    fig.add_vline(x=0.5, line_dash="dot", line_color="grey")  # the context | the drafts
    kind = "bonus" if step.full else "correction"
    fig.update_layout(template="plotly_white", height=260, plot_bgcolor="white",
                      title=title or f"Step {step.step}: {k} of {len(drafted)} drafts accepted, then the target's "
                                     f"{kind} {token_text([step.next_token], decode)!r}",
                      xaxis=dict(title="position (0: the last committed token)", dtick=1, showgrid=False),
                      yaxis=dict(autorange="reversed", showgrid=False),
                      legend=dict(orientation="h", y=-0.45))
    return fig
