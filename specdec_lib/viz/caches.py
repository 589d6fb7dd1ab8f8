"""KV caches of a chain method (notebook 03): both caches' lengths step by step, kept and rolled back.

- `CacheStep` / `cache_steps(steps, prompt_length)`: one record per speculative step (drafted, accepted and
  emitted tokens; each cache's length before the step, after its forwards and after the rollback), derived
  from the per-step records of the `"draft_model"` method (`result.stats["steps"]`) or recorded by hand.
- `cache_timeline_figure(steps)`: the four cache scenarios of a real run as a timeline: tokens per step
  (drafted, accepted, the target's token), and per cache the entries kept and rolled back.
- `rollback_explorer(run, prompts, decode)`: gamma, prompt and temperature widgets over the acceptance view
  (`acceptance.result_acceptance_html`) and the cache timeline. The caller's `run` does the decoding.

Cache bookkeeping of one step (the `"draft_model"` method's; c = committed tokens, prompt + output, before the
step; g drafted, k accepted, e emitted): the draft feeds what it has not seen (1 token, 2 after a full
acceptance, the prompt on step 1) and its first g - 1 drafts, so it holds c + g - 1 entries; the target feeds
what it has not seen plus the g drafts, c + g entries; then both roll back to at most c + e - 1 (everything
committed but the last token, which nobody has fed).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .acceptance import result_acceptance_html
from .common import ACCEPTED, BONUS, CORRECTION, DRAFTED, prompt_options, render, step_records

KEPT, ROLLED_BACK = "rgb(116,196,118)", "rgb(239,138,98)"  # cache entries kept / dropped by the rollback


@dataclass(frozen=True)
class CacheStep:
    """One speculative step of a chain method, with both caches' lengths (in tokens)."""
    step: int
    drafted: int  # g: tokens the draft proposed (the chain's length: `tree_size` in the step records)
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
    def full(self) -> bool:
        """The target's token was a bonus, not a correction: the walk ran off the chain's end (every draft
        accepted, or nothing drafted). The same verdict as the step records' `full`."""
        return self.accepted == self.drafted

    @property
    def full_acceptance(self) -> bool:
        """Scenario 3: drafts were proposed and all accepted."""
        return self.drafted > 0 and self.full

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
    """`CacheStep` records from the `"draft_model"` step records: `result.stats["steps"]` (dicts with
    tree_size, accepted, emitted, full) or a `GenerationResult` carrying them. Pure bookkeeping (see the module
    doc), checked against the method's real caches in tests/test_viz.py
    (`test_cache_steps_match_the_real_caches`)."""
    steps = step_records(steps)
    if prompt_length < 1:
        raise ValueError(f"prompt_length must be >= 1, got {prompt_length}")
    out: list[CacheStep] = []
    committed, target, draft = prompt_length, 0, 0
    for i, s in enumerate(steps):
        g, k, e, full = int(s["tree_size"]), int(s["accepted"]), int(s["emitted"]), bool(s["full"])
        # a chain's walk runs off its end exactly when every draft was accepted: a record saying otherwise
        # is not a chain's, and its caches cannot be placed by this bookkeeping
        if not (0 <= k <= g and 1 <= e <= k + 1 and full == (k == g)):
            raise ValueError(f"step {i}: tree_size {g}, accepted {k}, emitted {e}, full {full} is not a valid "
                             "step of a chain")
        target_fed = committed + g
        draft_fed = committed + g - 1 if g else draft
        keep = committed + e - 1
        out.append(CacheStep(i, g, k, e, committed, target, target_fed, min(target_fed, keep), draft, draft_fed,
                             min(draft_fed, keep)))
        committed, target, draft = committed + e, out[-1].target_after, out[-1].draft_after
    return out


def _as_steps(steps, prompt_length: int | None) -> list[CacheStep]:
    steps = step_records(steps)
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
    for name, color, pick in (("bonus", BONUS, lambda s: s.full), ("correction", CORRECTION, lambda s: not s.full)):
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


def rollback_explorer(run: Callable, prompts, decode: Callable, gamma: int = 4, temperature: float = 0.0,
                      max_gamma: int = 12, max_steps: int = 40):
    """Widgets for gamma, the prompt and the temperature over the acceptance view and the cache timeline.

    run(prompt_text, gamma, temperature) -> (GenerationResult of "draft_model", prompt length in tokens): the
    caller's generation (this module runs no model). prompts: strings or {"id", "prompt"} dicts. The box has
    `.update()` (what the widgets call) and `.state` (keys: result, steps, html, figure)."""
    import ipywidgets as widgets

    pick = widgets.Dropdown(options=prompt_options(prompts), description="prompt")
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
                        f"{result.mat:.2f}, acceptance rate {result.stats['acceptance_rate']:.2f}, "
                        f"{full} full acceptances, {result.tokens_per_s:.0f} tokens/s")
        text.value = page
        render(view, fig)

    for w in (pick, g, t):
        w.observe(update, names="value")
    update()
    box = widgets.VBox([pick, widgets.HBox([g, t]), status, text, view])
    box.update, box.state = update, state
    return box
