"""Views of an executed workbook that open anywhere: offline HTML, no Jupyter, no internet.

`make workbook` (run_notebooks) calls these after each notebook ran:

    add_static_fallbacks(nb)           # every plotly output and every explorer also carry text/html
    export_html(nb, "figures/00.html") # the notebook as one standalone page, scripts from files beside it
    write_index("figures", runs)       # figures/index.html: every notebook's page, .ipynb and figures

Why each piece:
- A plotly figure in an executed notebook is only `application/vnd.plotly.v1+json`: JupyterLab draws it, but
  nbconvert, GitHub and most previews show nothing. `add_static_fallbacks` adds a `text/html` rendering (a
  `plotly-graph-div` and a `Plotly.newPlot` call expecting `Plotly` on the page); JupyterLab still prefers its own.
- An explorer (an ipywidgets box) is `application/vnd.jupyter.widget-view+json` plus the widget state nbclient
  saves in the notebook's metadata; outside Jupyter it needs @jupyter-widgets/html-manager from a CDN, so offline
  it is a blank box. The fallback is a *snapshot* written here from the saved state: each control as
  "description: value" and the explorer's Output widgets (its initial figures) drawn as above. It does not move.
- nbconvert's lab template loads require.js and MathJax from CDNs. `export_html` uses the `specdec_offline`
  template (templates/ beside this file): no require.js (with it plotly.js would register as an AMD module
  instead of `window.Plotly`), no widget loader (the snapshots replace it), MathJax only when `mathjax_url` names
  a local copy (otherwise the math stays readable TeX such as `$\\gamma$`), and `plotly.min.js` from a file
  written once beside the pages.

Simplifications: no PNG fallback (kaleido needs a Chrome of its own per export, and is slow), so viewers that run
no scripts at all (GitHub's) show the figure's text/plain only.
"""
from __future__ import annotations

import html
import shutil
from pathlib import Path

PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE_MIME = "application/vnd.jupyter.widget-state+json"
PLOTLY_JS = "plotly.min.js"  # written once per folder of pages (figures/ and each figures/<notebook>/)
TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
TEMPLATE_NAME = "specdec_offline"
SNAPSHOT_CLASS = "specdec-widget-snapshot"


def write_plotly_js(folder) -> Path:
    """plotly.js (the version of the installed plotly package) as `folder/plotly.min.js`, written once."""
    from plotly.offline import get_plotlyjs

    path = Path(folder) / PLOTLY_JS
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(get_plotlyjs(), encoding="utf-8")
    return path


def plotly_html(figure: dict) -> str:
    """A div drawing `figure` (plotly's JSON) with a global `Plotly`; a fixed height, as plotly's notebook view."""
    import plotly.io as pio

    return pio.to_html(figure, full_html=False, include_plotlyjs=False, validate=False,
                       default_width="100%", default_height="525px")


def _with_plotly_fallback(output: dict) -> int:
    data = output.get("data", {})
    if PLOTLY_MIME in data and "text/html" not in data:
        data["text/html"] = plotly_html(data[PLOTLY_MIME])
        return 1
    return 0


def _widget_states(nb) -> dict:
    return nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE_MIME, {}).get("state", {})


def _render_output(output: dict) -> str:
    """One output (of a cell or of an Output widget) as HTML, richest static form first."""
    if output.get("output_type") == "stream":
        return f"<pre>{html.escape(''.join(output.get('text', '')))}</pre>"
    data = output.get("data", {})
    if "text/html" in data:
        return "".join(data["text/html"])
    if "image/png" in data:
        return f'<img src="data:image/png;base64,{"".join(data["image/png"]).strip()}">'
    if "text/plain" in data:
        return f"<pre>{html.escape(''.join(data['text/plain']))}</pre>"
    return ""


def _render_widget(model_id: str, states: dict, depth: int = 0) -> str:
    """The initial view of one widget model from the saved state (boxes, controls, Output widgets)."""
    entry = states.get(model_id)
    if entry is None or depth > 20:
        return ""
    name, state = entry.get("model_name", ""), entry.get("state", {})
    if name == "OutputModel":
        return "".join(_render_output(o) for o in state.get("outputs", []))
    if "children" in state:  # VBox, HBox, Box, GridBox, Tab, Accordion
        direction = "row" if name == "HBoxModel" else "column"
        children = "".join(_render_widget(str(c).removeprefix("IPY_MODEL_"), states, depth + 1)
                           for c in state["children"])
        return f'<div style="display:flex;flex-direction:{direction};flex-wrap:wrap;gap:4px 24px">{children}</div>'
    if name in ("HTMLModel", "HTMLMathModel"):
        return f"<div>{state.get('value', '')}</div>"
    if name == "LabelModel":
        return f"<div>{html.escape(str(state.get('value', '')))}</div>"
    if "_options_labels" in state:  # Dropdown, RadioButtons, SelectionSlider, ToggleButtons: value is an index
        labels, index = state["_options_labels"], state.get("index")
        value = labels[index] if isinstance(index, int) and 0 <= index < len(labels) else ""
    elif "value" in state:
        value = state["value"]
    elif name == "ButtonModel":
        return f"<button disabled>{html.escape(str(state.get('description', '')))}</button>"
    else:
        return ""
    label = html.escape(str(state.get("description", "")))
    return (f'<div class="specdec-widget-control"><b>{label}</b> '
            f'<code>{html.escape(str(value))}</code></div>')


def add_static_fallbacks(nb) -> dict:
    """Give every plotly output (cells and Output widgets) a text/html view and every widget view a snapshot.

    Mutates `nb` (an executed notebook as nbformat/dict); returns counts {"plotly": n, "widgets": n}."""
    states = _widget_states(nb)
    plotly = 0
    for entry in states.values():  # figures captured inside explorers' Output widgets
        for output in entry.get("state", {}).get("outputs", []) if entry.get("model_name") == "OutputModel" else []:
            plotly += _with_plotly_fallback(output)
    widgets = 0
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            plotly += _with_plotly_fallback(output)
            data = output.get("data", {})
            if WIDGET_VIEW_MIME in data and "text/html" not in data:
                view = _render_widget(data[WIDGET_VIEW_MIME].get("model_id", ""), states)
                data["text/html"] = (f'<div class="{SNAPSHOT_CLASS}"><p><i>A static snapshot of this explorer\'s '
                                     f"initial view (run the notebook to use it).</i></p>{view}</div>")
                widgets += 1
    return {"plotly": plotly, "widgets": widgets}


def _for_export(nb):
    """A copy that nbconvert renders without a widget manager: widget views fall back to their snapshots."""
    import copy

    nb = copy.deepcopy(nb)
    add_static_fallbacks(nb)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            output.get("data", {}).pop(WIDGET_VIEW_MIME, None)
    return nb


def export_html(nb, out_path, mathjax_url: str = "") -> Path:
    """Write `nb` (executed) as one standalone HTML page that draws its figures offline.

    plotly.min.js is written beside the page; `mathjax_url` ("" = no MathJax, math shown as TeX) may point at a
    local MathJax 2 `MathJax.js?config=...`."""
    from nbconvert import HTMLExporter

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    write_plotly_js(out_path.parent)
    exporter = HTMLExporter(template_name=TEMPLATE_NAME, extra_template_basedirs=[str(TEMPLATE_DIR)])
    exporter.mathjax_url = mathjax_url
    body, _ = exporter.from_notebook_node(_for_export(nb), resources={"plotly_js_url": PLOTLY_JS})
    out_path.write_text(body, encoding="utf-8")
    return out_path


def write_index(out_dir, names) -> Path:
    """`out_dir/index.html`: for each notebook stem in `names`, its page, its .ipynb and its figures."""
    out_dir = Path(out_dir)
    rows = []
    for stem in names:
        figures = sorted(p.name for p in (out_dir / stem).glob("*.html"))
        links = " ".join(f'<a class="figure" href="{stem}/{html.escape(f)}">{html.escape(f[:-5])}</a>'
                         for f in figures) or "<i>no figures</i>"
        page = (f'<a class="notebook" href="{stem}.html">{stem}</a>' if (out_dir / f"{stem}.html").exists()
                else stem)
        rows.append(f'<tr><td>{page}<br><a href="{stem}.ipynb">.ipynb</a></td><td>{links}</td></tr>')
    index = out_dir / "index.html"
    index.write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>specdec-workbook: executed notebooks and figures"
        "</title><style>body{font-family:sans-serif;margin:2em}td{padding:6px 12px;vertical-align:top;"
        "border-bottom:1px solid #ddd}a.figure{display:inline-block;margin:0 10px 4px 0}</style></head><body>"
        "<h1>specdec-workbook</h1><p>Each notebook as executed by <code>make workbook</code> (a page that opens "
        "offline, and the .ipynb) and the figures it saved.</p><table><tr><th>notebook</th><th>figures</th></tr>"
        + "".join(rows) + "</table></body></html>", encoding="utf-8")
    return index


def local_mathjax_url(out_dir) -> str:
    """Copy MathJax 2 from the `jupyter-server-mathjax` package (when installed) under `out_dir/mathjax` and
    return a relative URL for `export_html`; "" when the package is missing (math then stays TeX text)."""
    try:
        import jupyter_server_mathjax
    except ImportError:
        return ""
    source = Path(jupyter_server_mathjax.__file__).parent / "static"
    if not (source / "MathJax.js").exists():
        return ""
    target = Path(out_dir) / "mathjax"
    if not (target / "MathJax.js").exists():
        shutil.copytree(source, target, dirs_exist_ok=True)
    return "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"


def figure_count(nb) -> dict:
    """Plotly figures in cell outputs and in Output widgets, and widget views: what a page should draw."""
    states = _widget_states(nb)
    in_widgets = sum(PLOTLY_MIME in o.get("data", {}) for e in states.values()
                     if e.get("model_name") == "OutputModel" for o in e.get("state", {}).get("outputs", []))
    outputs = [o for c in nb.get("cells", []) if c.get("cell_type") == "code" for o in c.get("outputs", [])]
    return {"plotly": sum(PLOTLY_MIME in o.get("data", {}) for o in outputs),
            "plotly_in_widgets": in_widgets,
            "widgets": sum(WIDGET_VIEW_MIME in o.get("data", {}) for o in outputs)}


