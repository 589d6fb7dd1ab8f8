"""Execute the workbook's notebooks headless: `python -m specdec_lib.workbook.run_notebooks --out figures [--smoke]`.

Each notebook under `notebooks/` (matching --pattern) runs top to bottom on a fresh `python3` kernel through
nbclient. As papermill does, a cell is injected right after the cell tagged `parameters`: it sets
`FIGURES_DIR = "<out>/<notebook stem>"` (figures are saved there as HTML), with --smoke `SMOKE = True` (the next
cell shrinks the sizes), with --full `FULL = True` (the long sweeps otherwise read from data/results/notebooks
run again and are saved there). Written: the executed copy `<out>/<name>.ipynb`, with the `offline_views`
fallbacks (plotly figures as text/html, explorers as static snapshots), a standalone page `<out>/<name>.html`,
and `<out>/index.html`. The executed copies are signed as trusted (what `jupyter trust` does: JupyterLab draws
saved widgets of trusted notebooks only, and these outputs are our own). Each notebook's time is printed, the
exit status is non-zero, naming the notebook and the error, when a cell fails, and every output a cell wrote to
stderr (a warning, a library's log line) is listed; --fail-on-stderr fails the run on one (the tests and the
drift check use it). With --jobs N, N notebooks run at once, each kernel given its share of the cores (a --full
run measures speeds: keep it at one).

Why our own runner and not papermill or nbmake (both sit on nbclient, like this one):
- papermill injects parameters and writes executed copies too, but has the stall below and brings a dozen
  dependencies for the ten lines it would replace;
- nbmake runs notebooks as pytest items, but cannot inject parameters (the tests need `SMOKE = True`), has the
  same stall, and does not write the executed copies `make workbook` publishes.
What only this runner does:
- it avoids nbclient's poll stall (jupyter/nbclient#312): a cell sending a burst of ipywidgets comm messages may
  wait for its reply until the cell timeout; `_poll_shell_in_slices` re-polls every half second;
- the offline views above (fallbacks, standalone HTML, the index).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from queue import Empty
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from specdec_lib.workbook import notebook as notebook_helpers, offline_views

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"
INJECTED_TAG = "injected-parameters"


@dataclass
class NotebookRun:
    name: str
    seconds: float
    output: Path
    error: str | None = None
    html: Path | None = None  # the standalone page (None when it could not be written)
    stderr: list[str] = field(default_factory=list)  # "cell N: text" of every stderr output (a red box)

    @property
    def ok(self) -> bool:
        return self.error is None


def stderr_outputs(nb) -> list[str]:
    """"cell N: text" for every stream output a code cell wrote to stderr (N counts cells from 0)."""
    return [f"cell {i}: {out.text.strip()}" for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            for out in cell.get("outputs", []) if out.output_type == "stream" and out.name == "stderr"]


def inject_parameters(nb, params: dict) -> None:
    """Insert (or replace) a code cell setting `params` right after the cell tagged `parameters`."""
    nb.cells = [c for c in nb.cells if INJECTED_TAG not in c.get("metadata", {}).get("tags", [])]
    index = next((i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])),
                 None)
    source = "# Parameters injected by specdec_lib.workbook.run_notebooks\n" + "\n".join(
        f"{key} = {value!r}" for key, value in params.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": [INJECTED_TAG]})
    nb.cells.insert(0 if index is None else index + 1, cell)


def _poll_shell_in_slices(client, slice_s: float = 0.5) -> None:
    """Make the kernel client's shell `get_msg(timeout)` poll in short slices.

    nbclient waits for a cell's reply with one `poll(timeout)` of the whole cell timeout; when the kernel also
    sends many iopub messages (ipywidgets' comm traffic), that poll can miss the wake-up and return only when
    the timeout expires (jupyter/nbclient#312): a notebook with a slider view then stalls for `timeout` seconds
    after that cell. Re-polling every `slice_s` seconds picks the waiting reply up at once."""
    channel = client.kc.shell_channel
    original = channel.get_msg

    async def get_msg(timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = slice_s if deadline is None else max(0.0, min(slice_s, deadline - time.monotonic()))
            try:
                return await original(timeout=left)
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    channel.get_msg = get_msg


def is_exercise_cell(cell) -> bool:
    """A code cell of the exercises: a solution (collapsed, "# Exercise N, the solution", or tagged "solution")
    or an answer's check ("# Exercise N, check your answers")."""
    if cell.get("cell_type") != "code":
        return False
    source = "".join(cell.get("source", ""))
    return source.startswith(("# Exercise", "# Solution")) or "solution" in cell.get("metadata", {}).get("tags", [])


def run_notebook(path, out_dir, smoke: bool = False, timeout: int = 600, kernel_name: str = "python3",
                 html: bool = True, params: dict | None = None, skip_exercises: bool = False,
                 env: dict | None = None) -> NotebookRun:
    """Execute one notebook into `out_dir/<name>.ipynb` (and `<name>.html` when `html`); never raises on a cell
    error (see `.error`). skip_exercises: the exercises' solution and check cells are left out (the tests run them
    on the tiny pair, and on the real pair only the notebook's own sections: CI's time). env: more environment
    variables for the kernel (it gets this process's environment)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path, out_dir = Path(path), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(path, as_version=4)
    if skip_exercises:
        nb.cells = [cell for cell in nb.cells if not is_exercise_cell(cell)]
    settings = {"FIGURES_DIR": str((out_dir / path.stem).resolve()), **(params or {})}
    if smoke:
        settings["SMOKE"] = True
    inject_parameters(nb, settings)
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name,
                            resources={"metadata": {"path": str(path.parent)}})
    client.on_notebook_start = lambda notebook: _poll_shell_in_slices(client)
    error = None
    start = time.perf_counter()
    # the kernel's own environment (not ours: notebooks may run side by side in threads): notebook.banner() turns
    # progress bars off where EXECUTED is set
    kernel_env = {**os.environ, notebook_helpers.EXECUTED: "1", **(env or {})}
    try:
        client.execute(env=kernel_env)
    except CellExecutionError as err:
        error = str(err)
    except Exception as err:  # kernel death, timeout, missing kernel: report it like a cell error
        error = f"{type(err).__name__}: {err}"
    seconds = time.perf_counter() - start
    stderr = stderr_outputs(nb)
    offline_views.add_static_fallbacks(nb)
    output = out_dir / path.name
    nbformat.write(nb, output)
    _trust(nb)
    page = None
    if html:
        try:
            page = offline_views.export_html(nb, out_dir / f"{path.stem}.html",
                                             mathjax_url=offline_views.local_mathjax_url(out_dir))
        except Exception as err:  # a page that cannot be written fails the run like a cell would
            error = error or f"HTML export failed: {type(err).__name__}: {err}"
    return NotebookRun(path.name, seconds, output, error, page, stderr)


def _trust(nb) -> None:
    """Sign `nb` in the user's notebook-signature store (JUPYTER_DATA_DIR), as `jupyter trust` would."""
    from nbformat.sign import NotebookNotary

    try:
        NotebookNotary().sign(nb)
    except Exception as err:  # a read-only home: the notebook stays untrusted, JupyterLab shows the snapshots
        print(f"could not mark the executed notebook trusted ({type(err).__name__}: {err})", file=sys.stderr)


def find_notebooks(notebooks_dir=NOTEBOOKS_DIR, pattern: str = "*.ipynb") -> list[Path]:
    return sorted(p for p in Path(notebooks_dir).glob(pattern) if ".ipynb_checkpoints" not in p.parts)


def kernel_threads(jobs: int) -> dict:
    """The kernels' thread settings when `jobs` notebooks run side by side: the cores shared out (a kernel that
    sets its own count, as the notebooks' SMOKE cells do, keeps it), so two kernels do not both spread over
    every core. {} for one job: a kernel then picks as it would in Jupyter."""
    if jobs <= 1:
        return {}
    threads = str(max(1, (os.cpu_count() or 1) // jobs))
    return {name: os.environ.get(name, threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}


def run_all(out_dir, smoke: bool = False, pattern: str = "*.ipynb", notebooks_dir=NOTEBOOKS_DIR,
            timeout: int = 600, stop_on_error: bool = False, log=print, params: dict | None = None,
            skip_exercises: bool = False, jobs: int = 1) -> list[NotebookRun]:
    """Execute every notebook matching `pattern` into `out_dir` (`params`: more settings injected after the
    parameters cell, e.g. {"MODELS": "tiny"}), then write `out_dir/index.html`.

    jobs: notebooks run at once (each on its own kernel, `kernel_threads(jobs)` threads each). The SMOKE runs
    set one thread, so side by side they share the cores instead of waiting for each other (the tests run them
    so). A FULL run measures speeds: keep it at one job. The runs come back in the
    notebooks' order; with stop_on_error, the notebooks not started when one fails are skipped."""
    from concurrent.futures import ThreadPoolExecutor

    paths = find_notebooks(notebooks_dir, pattern)
    if not paths:
        raise FileNotFoundError(f"no notebooks matching {pattern!r} under {notebooks_dir}")
    jobs = max(1, min(int(jobs), len(paths)))
    env = kernel_threads(jobs)
    failed = []

    def one(path):
        if failed and stop_on_error:
            return None
        log(f"running {path.name}{' (smoke)' if smoke else ''} ...", flush=True)
        run = run_notebook(path, out_dir, smoke=smoke, timeout=timeout, params=params, skip_exercises=skip_exercises,
                           env=env)
        log(f"  {run.name}: {'ok' if run.ok else 'FAILED'} in {run.seconds:.1f} s -> {run.output}", flush=True)
        for text in run.stderr:
            log(f"  {run.name}: stderr output, {text.splitlines()[0][:160]}", flush=True)
        if not run.ok:
            failed.append(run)
        return run

    # threads suffice: each notebook's work is in its kernel, a process of its own
    with ThreadPoolExecutor(jobs) as pool:
        runs = [run for run in pool.map(one, paths) if run is not None]
    offline_views.write_index(out_dir, [Path(r.name).stem for r in runs])
    return runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="figures", help="folder for executed notebooks and figures")
    parser.add_argument("--smoke", action="store_true", help="set SMOKE = True (small, fast runs)")
    parser.add_argument("--full", action="store_true",
                        help="set FULL = True: measure the long sweeps again and save them under data/results/notebooks "
                             "(a cell may then run for half an hour: the cell timeout becomes at least 3600 s)")
    parser.add_argument("--pattern", default="*.ipynb", help="glob of notebook names, e.g. '0*.ipynb'")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell")
    parser.add_argument("--notebooks", default=str(NOTEBOOKS_DIR), help="folder holding the notebooks")
    parser.add_argument("--stop-on-error", action="store_true", help="stop at the first failing notebook")
    parser.add_argument("--fail-on-stderr", action="store_true",
                        help="a notebook with any stderr output (a warning's red box) fails the run")
    parser.add_argument("--jobs", type=int, default=1,
                        help="notebooks run at once (SMOKE runs use one thread each: 2 on a 2-core machine halves "
                             "the time; keep 1 for --full, which measures speeds)")
    parser.add_argument("--models", default=None,
                        help='set MODELS: "tiny", "smol" (the real pair), "auto", or "TARGET_DIR,DRAFT_DIR"')
    args = parser.parse_args(argv)
    params = {"FULL": True} if args.full else {}
    if args.models:
        params["MODELS"] = args.models if "," not in args.models else tuple(args.models.split(","))
    wall = time.perf_counter()
    try:
        runs = run_all(args.out, smoke=args.smoke, pattern=args.pattern, notebooks_dir=args.notebooks,
                       timeout=max(args.timeout, 3600) if args.full else args.timeout,
                       stop_on_error=args.stop_on_error, params=params or None, jobs=args.jobs)
    except FileNotFoundError as err:
        print(err, file=sys.stderr)
        return 2
    total, wall = sum(r.seconds for r in runs), time.perf_counter() - wall
    print(f"{sum(r.ok for r in runs)}/{len(runs)} notebooks ok in {total:.1f} s"
          + (f" ({wall:.1f} s of wall time, {args.jobs} at once)" if args.jobs > 1 else ""))
    failed = [r for r in runs if not r.ok]
    for run in failed:
        print(f"\nFAILED: {run.name} (executed copy: {run.output})\n{run.error}", file=sys.stderr)
    noisy = [r for r in runs if r.stderr] if args.fail_on_stderr else []
    for run in noisy:
        print(f"\nSTDERR OUTPUT: {run.name} (executed copy: {run.output})\n" + "\n".join(run.stderr), file=sys.stderr)
    return 1 if failed or noisy else 0


if __name__ == "__main__":
    sys.exit(main())
