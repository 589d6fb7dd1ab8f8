"""What every viz module shares: token text, the colour code, column checks and redrawing an explorer.

Nothing here draws a figure of its own. The helpers exist so that the subject modules (tables, trees, masks,
caches, acceptance, costs, bench) agree on how a token reads, what a colour means and how an explorer
redraws, without importing each other's private names.

- `token_text(tokens, decode)`: tokens as readable text (spaces "·", newlines "↵", tabs "⇥"), or the ids.
- `shade(rank, n)`: recency shading, rank 0 (MRU) dark to n - 1 (LRU) light.
- `DRAFTED`, `ACCEPTED`, `BONUS`, `CORRECTION`: one colour per token role, the same in every figure and in
  the acceptance HTML (a bonus is gold and a correction orange wherever they appear).
- `step_records(steps)`: the per-step dicts of `result.stats["steps"]`, from a `GenerationResult` or as given.
- `need_columns(table, *names)`: a KeyError naming the missing columns (summaries name tokens/s `tokens_per_s`
  and MAT `mat`, one name each, as `GenerationResult` and the saved tables do).
- `prompt_options(prompts)`: dropdown options from prompt strings or {"id", "prompt"} dicts.
- `render(view, *figures)`: replace an `Output` widget's content with figures: how every explorer redraws.
- `cell_grid(cells, colors)`: token cells {(x, row): (text, role, hover)} as one heatmap trace, a colour per role,
  the roles kept in its customdata (what tests and hover read); `role_legend(colors)`: legend entries for them.
"""
from __future__ import annotations

from typing import Callable

MRU_COLOR, LRU_COLOR = (107, 174, 214), (239, 245, 251)  # recency shading: most recent dark, least recent light
# token roles in a speculative step
DRAFTED, ACCEPTED, BONUS, CORRECTION = "rgb(200,200,200)", "rgb(49,163,84)", "rgb(255,193,7)", "rgb(230,85,13)"


def token_text(tokens, decode: Callable | None = None) -> str:
    """Tokens as a short readable string: decoded with visible whitespace, or the ids when no `decode`."""
    tokens = tokens.tolist() if hasattr(tokens, "tolist") else tokens  # arrays, tensors, numpy scalars
    tokens = [int(t) for t in (tokens if isinstance(tokens, (list, tuple)) else [tokens])]
    if decode is None:
        return " ".join(map(str, tokens))
    return decode(tokens).replace(" ", "·").replace("\n", "↵").replace("\t", "⇥")


def shade(rank: int, n: int) -> str:
    """rank 0 (MRU) .. n - 1 (LRU) -> an rgb string between MRU_COLOR and LRU_COLOR."""
    t = 0.0 if n <= 1 else rank / (n - 1)
    return "rgb({},{},{})".format(*(round(a + (b - a) * t) for a, b in zip(MRU_COLOR, LRU_COLOR)))


def step_records(steps) -> list[dict]:
    """The per-step dicts every method records (`tree_size`, `depth`, `accepted`, `emitted`, `full`,
    `draft_us`, `verify_ms`, `update_us`, ...): `result.stats["steps"]` of a `GenerationResult`, or a list."""
    return list(steps.stats["steps"]) if hasattr(steps, "stats") else list(steps)


def need_columns(table, *names: str) -> None:
    """A KeyError naming the columns of `names` that `table` lacks, and the columns it has."""
    missing = [name for name in names if name not in table.columns]
    if missing:
        raise KeyError(f"no column {', '.join(missing)}; columns: {list(table.columns)}")


def prompt_options(prompts) -> list[tuple[str, str]]:
    """(label, prompt text) pairs for a Dropdown: {"id", "prompt"} dicts by id, plain strings by position."""
    return [(p["id"], p["prompt"]) if isinstance(p, dict) else (f"prompt {i}", p) for i, p in enumerate(prompts)]


def render(view, *figures) -> None:
    """Replace an Output widget's content with `figures` (only inside IPython: elsewhere there is nothing to
    draw on, and display() would print the figures' repr).

    Explorers redraw static figures into an Output rather than mutate a plotly FigureWidget, because
    FigureWidget needs anywidget, which a plain Jupyter install may lack."""
    from IPython import get_ipython
    from IPython.display import display

    if get_ipython() is None:
        return
    view.clear_output(wait=True)
    with view:
        for fig in figures:
            display(fig)


def cell_grid(cells: dict, colors: dict, rows: list | None = None):
    """One `go.Heatmap` of token cells: cells {(x, row): (text, role, hover)}, x integers (the columns present
    and the gaps between them), `rows` the row labels top to bottom (default: in order of appearance); each cell
    painted colors[role], empty cells blank. customdata holds each cell's role ("" where empty)."""
    import plotly.graph_objects as go

    rows = rows or list(dict.fromkeys(row for _, row in cells))
    xs = list(range(min(x for x, _ in cells), max(x for x, _ in cells) + 1)) if cells else []
    roles = list(colors)
    code = {role: i for i, role in enumerate(roles)}
    z = [[None] * len(xs) for _ in rows]
    text, hover, kind = ([[""] * len(xs) for _ in rows] for _ in range(3))
    for (x, row), (label, role, tip) in cells.items():
        i, j = rows.index(row), x - xs[0]
        z[i][j], text[i][j], hover[i][j], kind[i][j] = code[role], label, tip, role
    n = max(len(roles), 1)  # one flat band of the colour scale per role
    scale = [pair for i, role in enumerate(roles) for pair in ([i / n, colors[role]], [(i + 1) / n, colors[role]])]
    return go.Heatmap(x=xs, y=rows, z=z, text=text, hovertext=hover, customdata=kind, texttemplate="%{text}",
                      hoverinfo="text", colorscale=scale or [[0, "white"], [1, "white"]], zmin=-0.5,
                      zmax=n - 0.5, showscale=False, xgap=3, ygap=3)


def role_legend(colors: dict, shown=None) -> list:
    """Legend-only traces (square markers) for the roles of a `cell_grid` (those in `shown`, default all)."""
    import plotly.graph_objects as go

    return [go.Scatter(x=[None], y=[None], mode="markers", name=role, showlegend=True,
                       marker=dict(symbol="square", size=12, color=color))
            for role, color in colors.items() if shown is None or role in shown]
