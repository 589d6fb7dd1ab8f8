"""Figures for the draft-model notebook (03): both KV caches step by step, lossless sampling, the gamma sweep.

Like `viz` and `viz_trees`, this module draws results and never runs a model: every figure function takes
plain data (per-step records, probability tables, a data frame) and returns a plotly `go.Figure` (nothing here
calls `show()`); `acceptance_html` returns an HTML string for `IPython.display.HTML`. The one explorer takes the
caller's own `run` function, which is where any decoding happens.

- `CacheStep` / `cache_steps(steps, prompt_length)`: one record per speculative step (drafted, accepted and
  emitted tokens; each cache's length before the step, after its forwards and after the rollback), from the
  per-step stats of the `"draft_model"` method (`result.stats["steps"]`) or recorded by hand.
- `cache_timeline_figure(steps)`: the four cache scenarios of a real run as a timeline: tokens per step
  (drafted, accepted, the target's token), and per cache the entries kept and rolled back.
- `distribution_figure(exact, empirical, labels)`: exact vs empirical probabilities of short continuations,
  the exact bars with a +-2 standard-error band of the sampling noise.
- `gamma_sweep_figure(table)`: tokens/s and MAT against gamma, one line per method.
- `token_kinds(result)`, `acceptance_html(tokens_text, step_ids, is_bonus)`: the generated text, each token
  coloured by the step that produced it; the target's own token of each step (bonus or correction) bold and
  underlined.
- `rollback_explorer(run, prompts, decode)`: gamma, prompt and temperature widgets over the acceptance view and
  the cache timeline.

Cache bookkeeping of one step (the `"draft_model"` method's; c = committed tokens, prompt + output, before the
step; g drafted, k accepted, e emitted): the draft feeds what it has not seen (1 token, 2 after a full
acceptance, the prompt on step 1) and its first g - 1 drafts, so it holds c + g - 1 entries; the target feeds
what it has not seen plus the g drafts, c + g entries; then both roll back to at most c + e - 1 (everything
committed but the last token, which nobody has fed).
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

KEPT, ROLLED_BACK = "rgb(116,196,118)", "rgb(239,138,98)"  # cache entries kept / dropped by the rollback
DRAFTED, ACCEPTED, BONUS, CORRECTION = "rgb(200,200,200)", "rgb(49,163,84)", "rgb(255,193,7)", "rgb(230,85,13)"
STEP_COLORS = ("#cfe8f3", "#fde2c8", "#d9f0d3", "#f2d7ee", "#fff3b0", "#d6def5", "#f8d3d3", "#e0ecd0")
KIND_TEXT = {"draft": "accepted draft", "bonus": "bonus (the target's token after a full acceptance)",
             "correction": "correction (the target's token at the first rejection)"}


@dataclass(frozen=True)
class CacheStep:
    """One speculative step of a chain method, with both caches' lengths (in tokens)."""
    step: int
    drafted: int  # g: tokens the draft proposed
    accepted: int  # k: drafts the target accepted
    emitted: int  # e: tokens the step added to the output (k + 1, fewer when EOS cut the run)
    committed_before: int  # c: prompt + output before the step
    target_before: int
    target_fed: int  # after the target's one forward (prompt or 1 token, plus the g drafts)
    target_after: int  # after the rollback
    draft_before: int
    draft_fed: int  # after the draft's g forwards
    draft_after: int

    @property
    def target_input(self) -> int:
        """Tokens in the target's forward: 1 + g (the prompt + g on the first step)."""
        return self.target_fed - self.target_before

    @property
    def draft_input(self) -> int:
        """Tokens in the draft's first forward of the step: 1, 2 after a full acceptance, the prompt on step 1
        (0 when it did not draft)."""
        return self.committed_before - self.draft_before if self.drafted else 0

    @property
    def full_acceptance(self) -> bool:
        return self.drafted > 0 and self.accepted == self.drafted

    @property
    def cut(self) -> bool:
        """EOS inside the accepted run: the step emitted fewer than k + 1 tokens."""
        return self.emitted < self.accepted + 1

    @property
    def scenarios(self) -> list[str]:
        """The blog's scenarios this step shows: 1 first step, 2 partial, 3 full acceptance, 4 EOS cut."""
        out = ["1 first step"] if self.step == 0 else []
        if self.accepted < self.drafted:
            out.append("2 partial")
        if self.full_acceptance:
            out.append("3 full")
        if self.cut:
            out.append("4 EOS cut")
        return out


def cache_steps(steps, prompt_length: int) -> list[CacheStep]:
    """`CacheStep` records from the `"draft_model"` stats: `result.stats["steps"]` (dicts with drafted,
    accepted, emitted) or a `GenerationResult` carrying them. Pure bookkeeping (see the module doc), checked
    against the method's real caches in tests/test_viz_rollback.py."""
    if hasattr(steps, "stats"):
        steps = steps.stats["steps"]
    if prompt_length < 1:
        raise ValueError(f"prompt_length must be >= 1, got {prompt_length}")
    out: list[CacheStep] = []
    committed, target, draft = prompt_length, 0, 0
    for i, s in enumerate(steps):
        g, k, e = int(s["drafted"]), int(s["accepted"]), int(s["emitted"])
        if not (0 <= k <= g and 1 <= e <= k + 1):
            raise ValueError(f"step {i}: drafted {g}, accepted {k}, emitted {e} is not a valid step")
        target_fed = committed + g
        draft_fed = committed + g - 1 if g else draft
        keep = committed + e - 1
        out.append(CacheStep(i, g, k, e, committed, target, target_fed, min(target_fed, keep), draft, draft_fed,
                             min(draft_fed, keep)))
        committed, target, draft = committed + e, out[-1].target_after, out[-1].draft_after
    return out


def _as_steps(steps, prompt_length: int | None) -> list[CacheStep]:
    steps = list(steps.stats["steps"]) if hasattr(steps, "stats") else list(steps)
    if steps and not isinstance(steps[0], CacheStep):
        if prompt_length is None:
            raise ValueError("per-step dicts need prompt_length to place the caches")
        steps = cache_steps(steps, prompt_length)
    return steps


def cache_timeline_figure(steps, prompt_length: int | None = None, max_steps: int | None = 40,
                          title: str | None = None) -> go.Figure:
    """Both caches of a chain run, step by step (x). `steps`: `CacheStep`s, or per-step dicts of the
    `"draft_model"` stats (or its `GenerationResult`) with `prompt_length`.

    Row 1: tokens per step: drafted (grey), accepted (green) and on top the target's own token: the bonus
    (gold, all accepted) or the correction (orange, first rejection); an EOS cut shows no target token.
    Rows 2-3: the target's and the draft's cache: a bar from the length before the step to the length after
    its forward(s), green for the entries the rollback keeps, orange for those it drops; a diamond marks the
    steps whose draft input is two tokens (after a full acceptance). The first step's bar starts at 0 (the
    prefill), below the drawn range."""
    steps = _as_steps(steps, prompt_length)
    total = len(steps)
    if max_steps is not None:
        steps = steps[:max_steps]
    x = [s.step for s in steps]
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.3, 0.35, 0.35],
                        subplot_titles=("tokens per step", "target cache", "draft cache"))
    hover = [f"step {s.step} ({', '.join(s.scenarios) or 'steady'}): drafted {s.drafted}, accepted "
             f"{s.accepted}, emitted {s.emitted}" for s in steps]
    fig.add_trace(go.Bar(x=x, y=[s.drafted for s in steps], name="drafted", marker_color=DRAFTED,
                         offsetgroup="drafted", hovertext=hover, hoverinfo="text"), row=1, col=1)
    fig.add_trace(go.Bar(x=x, y=[s.accepted for s in steps], name="accepted", marker_color=ACCEPTED,
                         offsetgroup="emitted", hovertext=hover, hoverinfo="text"), row=1, col=1)
    for name, color, pick in (("bonus", BONUS, lambda s: s.full_acceptance or s.drafted == 0),
                              ("correction", CORRECTION, lambda s: not (s.full_acceptance or s.drafted == 0))):
        chosen = [s for s in steps if not s.cut and pick(s)]
        fig.add_trace(go.Bar(x=[s.step for s in chosen], y=[1] * len(chosen), base=[s.accepted for s in chosen],
                             name=f"target's token: {name}", marker_color=color, offsetgroup="emitted",
                             hovertext=[hover[steps.index(s)] for s in chosen], hoverinfo="text"), row=1, col=1)
    for row, who in ((2, "target"), (3, "draft")):
        before = [getattr(s, f"{who}_before") for s in steps]
        fed = [getattr(s, f"{who}_fed") for s in steps]
        after = [getattr(s, f"{who}_after") for s in steps]
        text = [f"step {s.step}, {who}: {b} cached -> {f} after the forward{'s' if who == 'draft' else ''} -> "
                f"{a} after the rollback ({f - a} dropped)" for s, b, f, a in zip(steps, before, fed, after)]
        fig.add_trace(go.Bar(x=x, y=[a - b for a, b in zip(after, before)], base=before, marker_color=KEPT,
                             name="cache: kept", legendgroup="kept", showlegend=row == 2, offsetgroup=who,
                             hovertext=text, hoverinfo="text"), row=row, col=1)
        fig.add_trace(go.Bar(x=x, y=[f - a for f, a in zip(fed, after)], base=after, marker_color=ROLLED_BACK,
                             name="cache: rolled back", legendgroup="dropped", showlegend=row == 2,
                             offsetgroup=who, hovertext=text, hoverinfo="text"), row=row, col=1)
    two = [s for s in steps if s.drafted and s.step > 0 and s.draft_input == 2]
    fig.add_trace(go.Scatter(x=[s.step for s in two], y=[s.draft_before + 1 for s in two], mode="markers",
                             marker=dict(symbol="diamond", size=9, color="black"),
                             name="draft input: 2 tokens", hoverinfo="skip"), row=3, col=1)
    later = [v for s in steps for v in (s.target_before, s.draft_before) if s.step > 0]
    first = [v for s in steps[:1] for v in (s.target_after, s.draft_after)]
    low = max(0, min(later + first, default=0) - 1)
    high = max((max(s.target_fed, s.draft_fed) for s in steps), default=1) + 1
    for row in (2, 3):
        fig.update_yaxes(range=[low, high], title_text="tokens", row=row, col=1)
    fig.update_yaxes(title_text="tokens", row=1, col=1)
    fig.update_xaxes(title_text="step (one target forward each)", row=3, col=1)
    shown = f" (first {len(steps)} of {total})" if len(steps) < total else ""
    fig.update_layout(barmode="group", template="plotly_white", height=620, bargap=0.25,
                      title=title or f"Both caches, step by step{shown}")
    return fig


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


def _pick(table, candidates, what):
    for name in candidates:
        if name in table.columns:
            return name
    raise KeyError(f"no {what} column (looked for {', '.join(candidates)}); columns: {list(table.columns)}")


def gamma_sweep_figure(table, methods: Sequence[str] | None = None, title: str | None = None) -> go.Figure:
    """Tokens/s (left) and MAT (right) against gamma, one line per method.

    table: one row per (gamma, method), e.g. `bench.summarize` outputs concatenated with a `gamma` column;
    tokens/s from `tokens_per_s` (or `tokens_per_second`), MAT from `mat` (or `mean_accepted`)."""
    tps = _pick(table, ("tokens_per_s", "tokens_per_second"), "tokens/s")
    mat = _pick(table, ("mat", "MAT", "mean_accepted"), "MAT")
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


def token_kinds(result) -> tuple[list[int], list[str]]:
    """(step id, kind) of every new token of a `GenerationResult`: kind "draft" (an accepted draft), "bonus"
    (the target's token after every draft was accepted, or in a step that drafted nothing) or "correction"
    (the target's token at the first rejection; for a tree: the walk stopped at a node that has children).
    Uses `stats["steps"]` when the method records them (exact,
    EOS cuts included); otherwise `accept_lengths` alone, reading each step as drafts + one target token."""
    step_ids, kinds = [], []
    steps = result.stats.get("steps") if getattr(result, "stats", None) else None
    if steps:
        for i, s in enumerate(steps):
            k, e = s["accepted"], s["emitted"]
            full = s["full"] if "full" in s else k == s["drafted"]  # trees record "full": walked off a leaf
            own = ["draft"] * min(k, e) + ([("bonus" if full else "correction")] if e == k + 1 else [])
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


def acceptance_html(tokens_text: Sequence[str], step_ids: Sequence[int], is_bonus: Sequence, prompt: str = "",
                    title: str | None = None, legend: bool = True, max_prompt_chars: int = 300) -> str:
    """The generated text as HTML: each token on the background colour of the step that produced it (colours
    cycle), the target's own token of a step (is_bonus True, or kind "bonus"/"correction") bold and
    underlined: solid for a bonus, wavy for a correction. Hover a token for its step and kind.

    tokens_text: one string per token (decode token by token); is_bonus: bools or kinds from `token_kinds`.
    `prompt` (its last `max_prompt_chars` characters) is shown first, in grey."""
    if not len(tokens_text) == len(step_ids) == len(is_bonus):
        raise ValueError(f"{len(tokens_text)} tokens, {len(step_ids)} step ids, {len(is_bonus)} kinds")
    kinds = [k if isinstance(k, str) else ("bonus" if k else "draft") for k in is_bonus]
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


def rollback_explorer(run: Callable, prompts, decode: Callable, gamma: int = 4, temperature: float = 0.0,
                      max_gamma: int = 12, max_steps: int = 40):
    """Widgets for gamma, the prompt and the temperature over the acceptance view and the cache timeline.

    run(prompt_text, gamma, temperature) -> (GenerationResult of "draft_model", prompt length in tokens): the
    caller's generation (this module runs no model). prompts: strings or {"id", "prompt"} dicts. The box has
    `.update()` (what the widgets call) and `.state` (keys: result, steps, html, figure)."""
    import ipywidgets as widgets

    from .viz_trees import _render

    options = [(p["id"], p["prompt"]) if isinstance(p, dict) else (f"prompt {i}", p) for i, p in enumerate(prompts)]
    pick = widgets.Dropdown(options=options, description="prompt")
    g = widgets.IntSlider(value=gamma, min=1, max=max_gamma, description="gamma", continuous_update=False)
    t = widgets.FloatSlider(value=temperature, min=0.0, max=1.5, step=0.1, description="temperature",
                            continuous_update=False)
    status, text, view = widgets.HTML(), widgets.HTML(), widgets.Output()
    state: dict = {}

    def update(_=None):
        result, prompt_length = run(pick.value, g.value, t.value)
        steps = cache_steps(result.stats["steps"], prompt_length)
        page = result_acceptance_html(result, decode, prompt=pick.value[-200:])
        fig = cache_timeline_figure(steps, max_steps=max_steps,
                                    title=f"gamma={g.value}, temperature={t.value:.1f}: both caches")
        state.update(result=result, steps=steps, html=page, figure=fig)
        full = sum(s.full_acceptance for s in steps)
        status.value = (f"{len(result.new_tokens)} tokens in {result.target_forwards} target forwards: MAT "
                        f"{result.mean_accepted:.2f}, acceptance rate {result.stats['acceptance_rate']:.2f}, "
                        f"{full} full acceptances, {result.tokens_per_second:.0f} tokens/s")
        text.value = page
        _render(view, fig)

    for w in (pick, g, t):
        w.observe(update, names="value")
    update()
    box = widgets.VBox([pick, widgets.HBox([g, t]), status, text, view])
    box.update, box.state = update, state
    return box
