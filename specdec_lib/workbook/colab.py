"""Colab readiness: every notebook's badge and setup cell point at one repository URL.

    python -m specdec_lib.workbook.colab                      # rewrite every notebook from pyproject's Repository URL
    python -m specdec_lib.workbook.colab --repo URL           # change the URL (pyproject.toml and every notebook)
    python -m specdec_lib.workbook.colab --check              # exit 1 naming the notebooks that point elsewhere
    python -m specdec_lib.workbook.colab notebooks/09_x.ipynb # only these notebooks

The URL lives in one place, `[project.urls] Repository` in pyproject.toml; the notebooks carry copies because on
Colab the setup cell runs before the library exists. The setup cell (the first code cell) clones the repository
(the library, the tiny pair and the prompt suites travel together), installs it editable, moves into the clone
so the library imports without a runtime restart, and enables Colab's custom widget manager (ipywidgets and
plotly's FigureWidget draw only with it). The badge (in the first markdown cell) opens the notebook from the
same repository's `--branch`.

Simplifications: GitHub repositories only (Colab's badge URL is GitHub-shaped).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
NOTEBOOKS_DIR = ROOT / "notebooks"
SETUP_TAG = "colab-setup"
BADGE = ("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
         "(https://colab.research.google.com/github/{owner}/{name}/blob/{branch}/notebooks/{notebook})")
BADGE_RE = re.compile(r"\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)")
SETUP = '''import sys

REPO = "{repo}"  # python -m specdec_lib.workbook.colab --repo URL changes it in every notebook
if "google.colab" in sys.modules:  # on Colab: the workbook's library, tiny pair and prompts (a local checkout has them)
    !git clone -q --depth 1 {{REPO}} /content/specdec-workbook 2>/dev/null || git -C /content/specdec-workbook pull -q
    %pip install -q -e /content/specdec-workbook
    %cd /content/specdec-workbook
    from google.colab import output

    output.enable_custom_widget_manager()  # the explorers are ipywidgets: Colab draws them only with this'''


def repository_url(pyproject=PYPROJECT) -> str:
    """[project.urls] Repository of pyproject.toml (read by a pattern: tomllib is Python 3.11+, we allow 3.10)."""
    text = Path(pyproject).read_text()
    urls = re.search(r"^\[project\.urls\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    found = re.search(r'^Repository\s*=\s*"([^"]+)"', urls.group(1), re.M) if urls else None
    if found is None:
        raise ValueError(f"{pyproject} has no [project.urls] Repository")
    return found.group(1)


def set_repository_url(url: str, pyproject=PYPROJECT) -> None:
    """Rewrite the one `Repository = "..."` line of pyproject.toml."""
    path = Path(pyproject)
    text, count = re.subn(r'^Repository = ".*"$', f'Repository = "{url}"', path.read_text(), flags=re.M)
    if count != 1:
        raise ValueError(f"{path} needs exactly one 'Repository = \"...\"' line under [project.urls]")
    path.write_text(text)


def _github(url: str) -> tuple[str, str]:
    match = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?/?", url)
    if not match:
        raise ValueError(f"not a GitHub repository URL: {url!r} (Colab opens notebooks from GitHub)")
    return match.group(1), match.group(2)


def _setup_index(nb) -> int:
    """The setup cell: the one tagged colab-setup, else the first code cell that mentions google.colab."""
    for i, cell in enumerate(nb.cells):
        if SETUP_TAG in cell.metadata.get("tags", []):
            return i
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "google.colab" in cell.source:
            return i
    raise ValueError("no Colab setup cell (a code cell mentioning google.colab)")


def expected_cells(path, repo: str, branch: str = "main") -> tuple[str, str]:
    """(badge markdown, setup cell source) that `path` should carry for `repo`."""
    owner, name = _github(repo)
    return BADGE.format(owner=owner, name=name, branch=branch, notebook=Path(path).name), SETUP.format(repo=repo)


def apply(path, repo: str, branch: str = "main") -> bool:
    """Point one notebook's badge and setup cell at `repo`; True when the file changed. Outputs are untouched."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    badge, setup = expected_cells(path, repo, branch)
    title = next(c for c in nb.cells if c.cell_type == "markdown")
    if BADGE_RE.search(title.source):
        title.source = BADGE_RE.sub(lambda _: badge, title.source, count=1)
    else:  # a badge under the title line
        head, _, rest = title.source.partition("\n")
        title.source = f"{head}\n\n{badge}\n{rest}"
    cell = nb.cells[_setup_index(nb)]
    cell.source = setup
    cell.metadata["tags"] = sorted(set(cell.metadata.get("tags", [])) | {SETUP_TAG})
    before = path.read_text()
    after = nbformat.writes(nb) + "\n"
    if after != before:
        path.write_text(after)
    return after != before


def check(path, repo: str, branch: str = "main") -> list[str]:
    """What in `path` does not point at `repo` (empty when all is right)."""
    nb = nbformat.read(path, as_version=4)
    badge, setup = expected_cells(path, repo, branch)
    problems = []
    if badge not in "".join(c.source for c in nb.cells if c.cell_type == "markdown"):
        problems.append("badge")
    try:
        if nb.cells[_setup_index(nb)].source != setup:
            problems.append("setup cell")
    except ValueError:
        problems.append("no setup cell")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="notebooks to update (default: every notebook)")
    parser.add_argument("--repo", help="new repository URL (also written to pyproject.toml)")
    parser.add_argument("--branch", default="main", help="branch the badges open")
    parser.add_argument("--check", action="store_true", help="only report notebooks that point elsewhere")
    args = parser.parse_args(argv)
    if args.repo and not args.check:
        _github(args.repo)
        set_repository_url(args.repo)
    repo = args.repo or repository_url()
    paths = [Path(p) for p in args.notebooks] or sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
    if args.check:
        bad = {p.name: problems for p in paths if (problems := check(p, repo, args.branch))}
        for name, problems in bad.items():
            print(f"{name}: {', '.join(problems)} do not point at {repo}", file=sys.stderr)
        return 1 if bad else 0
    for path in paths:
        print(f"{path.name}: {'updated' if apply(path, repo, args.branch) else 'already right'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
