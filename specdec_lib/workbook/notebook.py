"""What every notebook's first cells need, written once: the versions banner, figure saving, saved long runs,
and measured claims.

    from specdec_lib.workbook import notebook
    notebook.banner()                          # torch / transformers / specdec_lib versions and the device
    save = notebook.figure_saver(FIGURES_DIR)  # save(fig, "name") -> fig, also written to FIGURES_DIR/name.html
    notebook.claim("{m} is {r:.2f}x ...", r > 1, m=..., r=...)  # a sentence from this run's numbers (claims.py)

Simplifications: figures are saved as HTML with plotly.js from a CDN (small files; they need internet to open).
"""
from __future__ import annotations

import os
from pathlib import Path

from .claims import beats, claim, claims  # noqa: F401  (re-exported: notebook.claim(...))


EXECUTED = "SPECDEC_EXECUTED_NOTEBOOK"  # set by workbook.run_notebooks for the kernels it starts


def quiet_progress() -> None:
    """Every tqdm bar from here on is disabled, also where a caller asks for one (`progress=True`): in a notebook
    executed headless a bar is a widget frozen at 100 %, which a saved page shows as a stray snapshot. A live
    session (JupyterLab, Colab) keeps its bars: banner() calls this only under run_notebooks."""
    from tqdm import std

    if getattr(std.tqdm.__init__, "_quiet", False):
        return
    init = std.tqdm.__init__

    def quiet_init(self, *args, **kwargs):
        kwargs["disable"] = True
        init(self, *args, **kwargs)

    quiet_init._quiet = True
    std.tqdm.__init__ = quiet_init  # tqdm.auto / tqdm.notebook bars run through it too (their __init__ calls it)


def banner() -> str:
    """Print (and return) the versions and the device, and silence download/loading progress bars."""
    import torch
    import transformers

    import specdec_lib

    transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bars in the outputs
    if os.environ.get(EXECUTED):  # run headless (make workbook, CI): a saved notebook shows no progress bar
        quiet_progress()
    from specdec_lib.env import gpu_name, resolve_device

    found = resolve_device("auto")
    device = gpu_name(found) if found.type == "cuda" else f"CPU only ({torch.get_num_threads()} threads)"
    text = (f"torch {torch.__version__} | transformers {transformers.__version__} | specdec_lib "
            f"{specdec_lib.__version__}\ndevice: {device}")
    print(text)
    return text


def figure_saver(folder):
    """A `save(fig, name)` that writes fig as HTML under `folder` (when set) and returns it for display.

    The HTML loads plotly.js from `folder/plotly.min.js` (written with the first figure): no CDN."""
    def save(fig, name: str):
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            fig.write_html(Path(folder) / f"{name}.html", include_plotlyjs="directory")
        return fig
    return save



RESULTS_DIR = Path(__file__).resolve().parents[2] / "data" / "results" / "notebooks"


def long_run(name: str, compute, *, full: bool, pair, smoke: bool = False, settings: dict | None = None,
             results_dir=None):
    """The table of a long sweep: run now, or the saved run of the same pair on the same kind of device.

    full=True: `compute()` (a DataFrame) runs, and unless `smoke` it is saved as `<results_dir>/<name>.csv`
    beside `<name>.json` (where and when it ran, how long it took, `settings`). full=False: the saved table is
    shown, with a line saying where it was measured, when one exists for this pair (its name) on this kind of
    device (cpu / cuda); else `compute()` runs now, saying why. A notebook's `FULL` parameter is `full`.
    """
    import json
    import time
    from datetime import datetime, timezone

    import pandas as pd

    from specdec_lib import bench

    folder = Path(results_dir) if results_dir is not None else RESULTS_DIR
    name = saved_name(name, pair)
    table_path, meta_path = folder / f"{name}.csv", folder / f"{name}.json"
    where = dict(models=pair.name, device_type=pair.device.type)
    if not full:
        meta = json.loads(meta_path.read_text()) if meta_path.exists() and table_path.exists() else None
        if meta is not None and {k: meta.get(k) for k in where} == where:
            table = pd.read_csv(table_path)
            print(f"saved run of {meta['date']} on {meta['machine']['device']} ({meta['minutes']:.1f} min; "
                  f"{_settings_text(meta.get('settings'))}): set FULL = True to measure it again")
            return table
        why = "no saved run" if meta is None else f"the saved run is of {meta['models']!r} on {meta['device_type']}"
        print(f"{why}: running it now")
    start = time.perf_counter()
    table = compute()
    minutes = (time.perf_counter() - start) / 60
    if full and not smoke:
        folder.mkdir(parents=True, exist_ok=True)
        table.to_csv(table_path, index=False)
        meta = dict(where, name=name, date=datetime.now(timezone.utc).strftime("%Y-%m-%d"), minutes=round(minutes, 2),
                    machine=bench.machine_info(pair), settings=settings or {})
        meta_path.write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return table


def saved_name(name: str, pair) -> str:
    """The saved run's file stem: `name` for the tiny pairs (the workbook's default), `name_<pair>` for another
    pair (e.g. 12_runs_smol), so each pair keeps its own table."""
    if pair.name in ("tiny", "tiny-long"):
        return name
    return name + "_" + "".join(c if c.isalnum() or c in "-." else "_" for c in pair.name)


def _settings_text(settings: dict | None) -> str:
    return ", ".join(f"{key} {value}" for key, value in (settings or {}).items()) or "default settings"


class AnswerCheck:
    """An exercise's answer against the value this run computes (`check_answer`); renders as one Markdown line."""

    def __init__(self, what: str, answer, expected: float, rel_tol: float):
        self.what, self.answer, self.expected, self.rel_tol = what, answer, float(expected), rel_tol
        self.right = answer is not None and abs(float(answer) - self.expected) <= rel_tol * abs(self.expected)

    def markdown(self) -> str:
        if self.answer is None:
            return f"{self.what}: no answer yet (set it above and run the cell again)"
        if self.right:
            return f"{self.what}: {float(self.answer):.3g}, right (this run: {self.expected:.3g})"
        hint = "too high" if float(self.answer) > self.expected else "too low"
        return f"{self.what}: {float(self.answer):.3g} is {hint}; try again (or open the solution cell above)"

    _repr_markdown_ = markdown

    def __str__(self) -> str:
        return self.markdown()


def check_answer(what: str, answer, expected: float, rel_tol: float = 0.05) -> AnswerCheck:
    """An exercise's `answer` (None: not answered yet) against `expected`, this run's value, within `rel_tol`."""
    if expected is None or expected != expected:
        raise ValueError(f"no value to check {what!r} against in this run")
    return AnswerCheck(what, answer, expected, rel_tol)


class ChoiceCheck:
    """A prediction among named options against the option this run's numbers pick (`check_choice`)."""

    def __init__(self, what: str, answer, expected, options, why: str):
        self.what, self.answer, self.expected, self.options, self.why = what, answer, expected, options, why
        self.right = answer is not None and _option(answer) == _option(expected)

    def markdown(self) -> str:
        listed = " / ".join(str(o) for o in self.options)
        if self.answer is None:
            return f"{self.what}: no answer yet (one of {listed}; set it above and run the cell again)"
        if self.right:
            return f"{self.what}: {self.answer!s}, right ({self.why})"
        return f"{self.what}: {self.answer!s} is not what this run shows; try again (or open the solution cell above)"

    _repr_markdown_ = markdown

    def __str__(self) -> str:
        return self.markdown()


def _option(value) -> str:
    return str(value).strip().lower()


def check_choice(what: str, answer, expected, options, why: str = "") -> ChoiceCheck:
    """An exercise's predicted option (None: not answered yet) against `expected`, the option this run's numbers
    pick; `why` (computed from the run) is shown once the answer is right. An answer that is not one of `options`
    is a ValueError, so a typo is not graded as wrong."""
    options = tuple(options)
    if _option(expected) not in {_option(o) for o in options}:
        raise ValueError(f"{what!r}: this run's option {expected!r} is not one of {options}")
    if answer is not None and _option(answer) not in {_option(o) for o in options}:
        raise ValueError(f"{what!r}: answer {answer!r} is not one of {options}")
    return ChoiceCheck(what, answer, expected, options, why)


def exact(dtype) -> bool:
    """Whether greedy tokens are expected to equal a plain decode's token for token in `dtype`: float32 and float64.
    In bfloat16 or float16 (a GPU's "auto") a forward of several rows rounds differently from a one-row step and
    near-ties flip, even for methods exact in float32, so the notebooks' token checks are asserted in exact dtypes
    only; the tests compare in float64 on a CPU."""
    import torch

    return dtype in (torch.float32, torch.float64)


def logit_tolerance(dtype) -> float:
    """How far the notebooks let two computations of the same logits differ: 1e-3 in float32/float64; 0.5 in
    half precision, above what rounding alone makes equal computations differ by and well below what a wrong mask
    or a stale cache entry does (notebooks 02, 03 and 08 in bfloat16 on a CPU)."""
    return 1e-3 if exact(dtype) else 0.5
