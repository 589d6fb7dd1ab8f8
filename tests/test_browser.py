"""The workbook's views in a real browser: headless Chromium (Debian's `chromium`) driven by Playwright.

On the smoke workbook the notebook tests already built (conftest `smoke_workbook`: executed notebooks, pages,
figures, index.html), with every request that is not a local file or the local JupyterLab refused:
(a) the figure index and the first figure of every notebook draw their plot;
(b) every notebook's standalone page draws all its plots and shows a snapshot of each explorer;
(c) JupyterLab (`jupyter lab --no-browser` on a local port) opens an executed notebook and draws its plotly figures
    and its widgets (sliders restored from the saved widget state);
each with no uncaught JavaScript error. Screenshots go to figures/screenshots/ (build output).

Skipped, saying why, where Chromium or Playwright is missing (`.ci/run` installs Chromium; `make test` installs
the `browser` extra). The one outside request every page makes, the Colab badge image, is refused like any other
and allowed to fail.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from specdec_lib.workbook import offline_views, run_notebooks

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "figures" / "screenshots"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the install
    sync_playwright = None
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
NOTEBOOKS = run_notebooks.find_notebooks()
# a graph plotly has drawn: plotly marks its div js-plotly-plot and puts its SVG layers (or a canvas) inside
DRAWN = "[...document.querySelectorAll('.js-plotly-plot')].filter(d => d.querySelector('svg.main-svg, canvas')).length"

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or sync_playwright is None,
    reason="browser test SKIPPED: needs Debian's chromium (apt-get install chromium) and playwright "
           "(pip install -e .[browser]); found chromium=%s, playwright=%s" % (CHROMIUM, sync_playwright is not None))


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        yield browser
        browser.close()


class Page:
    """A page that records uncaught errors, console errors and every request it had to refuse."""

    def __init__(self, browser, allow_prefix: str = "file:"):
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.errors, self.refused = [], []
        self.page.on("pageerror", lambda err: self.errors.append(f"uncaught: {err}"))
        self.page.on("console", self._console)
        self.page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(allow_prefix)
                        else (self.refused.append(route.request.url), route.abort()))

    def _console(self, message):
        if message.type == "error" and "Failed to load resource" not in message.text:
            self.errors.append(f"console: {message.text}")  # refused loads are checked through self.refused

    def open(self, url: str):
        self.page.goto(url)
        self.page.wait_for_load_state("load")
        return self.page

    def drawn(self, expected: int, timeout_ms: int = 20_000) -> int:
        try:
            self.page.wait_for_function(f"{DRAWN} >= {expected}", timeout=timeout_ms)
        except Exception:  # the assertion below names the numbers
            pass
        return self.page.evaluate(DRAWN)

    def check_offline(self, what: str):
        assert not self.errors, f"{what}: JavaScript errors {self.errors}"
        outside = [url for url in self.refused if url != COLAB_BADGE]
        assert not outside, f"{what} asked the network for {outside}"

    def screenshot(self, name: str, selector: str | None = None):
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        if selector and self.page.locator(selector).count():
            self.page.locator(selector).first.scroll_into_view_if_needed()
            self.page.locator(selector).first.screenshot(path=str(SCREENSHOTS / f"{name}.png"))
        else:
            self.page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))

    def close(self):
        self.page.close()


def test_figure_index_and_a_figure_of_every_notebook(smoke_workbook, browser):
    out = smoke_workbook["out"]
    page = Page(browser)
    index = page.open((out / "index.html").as_uri())
    notebooks = index.locator("a.notebook")
    assert notebooks.count() == len(smoke_workbook["runs"])
    figure_links = [index.locator("a.figure").nth(i).get_attribute("href") for i in range(index.locator("a.figure").count())]
    page.screenshot("index")
    page.check_offline("index.html")
    page.close()
    with_figures = {link.split("/")[0] for link in figure_links}
    assert with_figures, "no notebook saved a figure"
    for stem in sorted(with_figures):
        first = next(link for link in figure_links if link.startswith(f"{stem}/"))
        page = Page(browser)
        page.open((out / first).as_uri())
        assert page.drawn(1) == 1, f"{first}: the figure did not draw"
        page.screenshot(f"figure_{stem}")
        page.check_offline(first)
        page.close()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_executed_notebook_page_draws_its_figures_offline(smoke_workbook, browser, path):
    run = smoke_workbook["runs"][path.name]
    assert run.html is not None, f"{path.name}: no page ({run.error})"
    nb = nbformat.read(run.output, as_version=4)
    counts = offline_views.figure_count(nb)
    page = Page(browser)
    html = page.open(run.html.as_uri())
    divs = html.locator(".plotly-graph-div").count()
    snapshots = html.locator(f".{offline_views.SNAPSHOT_CLASS}").count()
    assert divs >= counts["plotly"] and snapshots == counts["widgets"], (divs, snapshots, counts)
    assert page.drawn(divs) == divs, f"{path.name}: {page.page.evaluate(DRAWN)} of {divs} plots drew"
    if any("$" in c.source for c in nb.cells if c.cell_type == "markdown"):
        if html.locator("script[src*='mathjax']").count():  # the local MathJax typesets the math
            html.wait_for_selector(".MathJax, .MathJax_Display", state="attached", timeout=20_000)
        else:  # no MathJax copy: the TeX stays readable text
            assert "$" in html.inner_text("main")
    page.screenshot(f"page_{path.stem}", ".js-plotly-plot")
    if snapshots:
        page.screenshot(f"page_{path.stem}_explorer", f".{offline_views.SNAPSHOT_CLASS}")
    page.check_offline(run.html.name)
    page.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def jupyterlab(smoke_workbook, tmp_path_factory):
    """`jupyter lab --no-browser` on a local port over a copy of notebook 00 as executed, with the Jupyter data dir
    the workbook was built with (run_notebooks signs the executed notebooks there: JupyterLab draws the widgets of
    trusted notebooks only); no news or update checks; every cell rendered (no windowing), so off-screen outputs
    exist."""
    root = tmp_path_factory.mktemp("lab")
    settings = root / "settings"
    run = smoke_workbook["runs"][NOTEBOOKS[0].name]
    shutil.copy(run.output, root / run.output.name)
    env = dict(os.environ, JUPYTER_DATA_DIR=str(smoke_workbook["jupyter_data"]),
               JUPYTERLAB_SETTINGS_DIR=str(settings))
    for plugin, values in (("notebook-extension/tracker", '{"windowingMode": "none"}'),
                           ("apputils-extension/notification", '{"fetchNews": "false", "checkForUpdates": false}')):
        target = settings / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(values)
    port, token = _free_port(), "specdec-browser-test"
    args = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
            f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--LabApp.news_url="]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--allow-root")
    log = open(root / "lab.log", "w")
    server = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert server.poll() is None, f"jupyter lab exited: {(root / 'lab.log').read_text()[-2000:]}"
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, "jupyter lab did not start in 90 s"
                time.sleep(0.5)
        yield f"{base}/lab/tree/{run.output.name}?token={token}", run
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def test_jupyterlab_draws_plots_and_widgets(jupyterlab, browser):
    url, run = jupyterlab
    counts = offline_views.figure_count(nbformat.read(run.output, as_version=4))
    page = Page(browser, allow_prefix=url.split("/lab/")[0])
    lab = page.open(url)
    lab.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    lab.wait_for_function(f"document.querySelectorAll('.jp-RenderedPlotly').length >= {counts['plotly']}",
                          timeout=60_000)
    for i in range(lab.locator(".jp-RenderedPlotly").count()):  # plotly draws a figure once it is on screen
        lab.locator(".jp-RenderedPlotly").nth(i).scroll_into_view_if_needed()
    assert page.drawn(counts["plotly"], timeout_ms=30_000) >= counts["plotly"], "JupyterLab did not draw the plots"
    assert counts["widgets"] >= 1, "notebook 00 should hold an explorer"
    lab.wait_for_selector(".widget-slider", timeout=30_000)
    assert lab.locator(".widget-slider").count() >= 1
    assert lab.locator(f".{offline_views.SNAPSHOT_CLASS}").count() == 0, "a trusted notebook shows live widgets"
    page.screenshot("jupyterlab_plot", ".jp-RenderedPlotly")
    lab.locator(".widget-slider").first.scroll_into_view_if_needed()
    page.screenshot("jupyterlab_widgets")
    page.check_offline("JupyterLab")
    page.close()
