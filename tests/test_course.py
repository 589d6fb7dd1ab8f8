"""A course of class sessions (issue 55), checked statically: every notebook fits one class session by its
reading count, and every exercise takes the student's answer and says right or wrong."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specdec_lib.workbook import run_notebooks

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def exercises(cells) -> list[int]:
    """The numbers of the exercises listed under the notebook's `## Exercises` heading."""
    numbers, inside = [], False
    for cell in cells:
        if cell["cell_type"] != "markdown":
            continue
        for line in "".join(cell["source"]).splitlines():
            if line.startswith("## "):
                inside = line.strip() == "## Exercises"
            elif inside and (match := re.match(r"(\d+)\. ", line)):
                numbers.append(int(match.group(1)))
    return numbers


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_every_exercise_checks_the_students_answer(path):
    cells = json.loads(path.read_text())["cells"]
    listed = exercises(cells)
    assert listed, f"{path.name}: no numbered exercise under '## Exercises'"
    checks = {}
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and (match := re.match(r"# Exercise (\d+), check your answer", source)):
            checks[int(match.group(1))] = source
    for number in listed:
        assert number in checks, f"{path.name}: exercise {number} has no '# Exercise {number}, check your answer' cell"
        source = checks[number]
        assert re.search(r"notebook\.check_(answer|choice)\(", source), (
            f"{path.name}: exercise {number}'s check cell grades nothing (notebook.check_answer / check_choice)")
        # the answer is the student's: typed in the cell as None, never this run's value assigned to it
        assert re.search(r"^MY_\w+ = None\b", source, re.M), (
            f"{path.name}: exercise {number}'s check cell has no `MY_... = None` answer for the student to set")


PROSE_WORDS_PER_MINUTE = 100  # careful reading of technical prose with formulas
MINUTES_PER_CELL = 1.5  # reading a main-path code cell and its output
SESSION_MINUTES = 90  # one class session: 60-90 minutes of reading


def reading_minutes(cells) -> float:
    """The notebook's reading time by the course's count: its markdown words at PROSE_WORDS_PER_MINUTE, plus
    MINUTES_PER_CELL for each main-path code cell (exercise solutions and checks, read after the class, left out)."""
    words = sum(len("".join(c["source"]).split()) for c in cells if c["cell_type"] == "markdown")
    main = [c for c in cells if c["cell_type"] == "code" and not run_notebooks.is_exercise_cell(c)]
    return words / PROSE_WORDS_PER_MINUTE + MINUTES_PER_CELL * len(main)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_every_notebook_fits_one_class_session(path):
    minutes = reading_minutes(json.loads(path.read_text())["cells"])
    assert minutes <= SESSION_MINUTES, f"{path.name}: about {minutes:.0f} minutes of reading: split it"
