"""The notebooks' helpers (specdec_lib.workbook.notebook): a long sweep is run and saved with FULL, shown from the
saved table without it, and run again when the saved table is another pair's or missing; measured claims rendered
from the run's numbers, and the ceiling on numbers typed into Markdown."""
from __future__ import annotations

import ast
import json
import string
from types import SimpleNamespace

from pathlib import Path

import pandas as pd
import pytest
import torch

from specdec_lib.workbook import notebook
from specdec_lib.workbook.claims import typed_numbers

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def test_long_run_saves_with_full_and_shows_the_saved_table_without(tmp_path, capsys):
    pair = SimpleNamespace(name="tiny", device=torch.device("cpu"))
    calls = []

    def compute():
        calls.append(1)
        return pd.DataFrame({"variant": ["hf", "tdl=16"], "speedup": [1.0, 1.5 + len(calls)],
                             "all_match_hf": [None, True]})

    run = dict(pair=pair, results_dir=tmp_path)
    missing = notebook.long_run("04_x", compute, full=False, **run)  # nothing saved yet: it runs, saves nothing
    assert len(calls) == 1 and "no saved run" in capsys.readouterr().out and not list(tmp_path.iterdir())
    smoke = notebook.long_run("04_x", compute, full=True, smoke=True, **run)  # SMOKE never writes
    assert len(calls) == 2 and not list(tmp_path.iterdir())
    full = notebook.long_run("04_x", compute, full=True, settings={"prompts": 4}, **run)
    assert len(calls) == 3 and full.speedup.tolist() == [1.0, 4.5]
    meta = json.loads((tmp_path / "04_x.json").read_text())
    assert meta["models"] == "tiny" and meta["device_type"] == "cpu" and meta["settings"] == {"prompts": 4}
    assert "device" in meta["machine"] and meta["minutes"] >= 0
    shown = notebook.long_run("04_x", compute, full=False, **run)  # the saved table, not a new run
    assert len(calls) == 3 and shown.speedup.tolist() == [1.0, 4.5] and shown.all_match_hf.dropna().all()
    assert "set FULL = True" in capsys.readouterr().out
    other = SimpleNamespace(name="tiny-long", device=torch.device("cpu"))
    again = notebook.long_run("04_x", compute, full=False, pair=other, results_dir=tmp_path)
    assert len(calls) == 4 and again.speedup.tolist() == [1.0, 5.5] and "'tiny' on cpu" in capsys.readouterr().out
    assert missing.speedup.tolist() == [1.0, 2.5] and smoke.speedup.tolist() == [1.0, 3.5]
    smol = SimpleNamespace(name="smol", device=torch.device("cpu"))  # another pair keeps a table of its own
    notebook.long_run("04_x", compute, full=True, pair=smol, results_dir=tmp_path)
    assert json.loads((tmp_path / "04_x_smol.json").read_text())["models"] == "smol"
    assert json.loads((tmp_path / "04_x.json").read_text())["models"] == "tiny"
    assert notebook.long_run("04_x", compute, full=False, pair=smol, results_dir=tmp_path).speedup.tolist() == [1.0, 6.5]


# ---------------------------------------------------------------- measured claims (workbook/claims.py)

def test_a_claim_is_rendered_from_the_numbers_and_says_whether_it_held():
    speedup = 1.234
    held = notebook.claim("prompt lookup is {s:.2f}x autoregressive on {suite}", speedup > 1, s=speedup,
                          suite="editing")
    assert str(held) == "prompt lookup is 1.23x autoregressive on editing (held in this run)"
    assert held._repr_markdown_().endswith("*(held in this run)*") and held.numbers["s"] == speedup
    missed = notebook.claim("faster: {s:.2f}x", speedup > 2, s=speedup)
    assert not missed.held and "**(did not hold in this run)**" in missed.markdown()
    explained = notebook.claim("faster: {s:.2f}x", speedup > 2, otherwise="one prompt in SMOKE", s=speedup)
    assert explained.markdown().endswith("**(did not hold in this run: one prompt in SMOKE)**")
    assert str(notebook.claim("{s}", True, otherwise="never shown", s=1)) == "1 (held in this run)"
    both = notebook.claims(held, missed)
    assert not both.held and both.markdown().count("\n- ") == 1 and both.markdown().startswith("- ")
    import numpy as np
    assert notebook.claim("{x}", np.float64(2) > 1, x=2).held is True  # a numpy bool is a bool
    with pytest.raises(ValueError, match="'s'"):
        notebook.claim("{s:.2f}x", True)
    with pytest.raises(TypeError):
        notebook.claim("{x}", "yes", x=1)
    with pytest.raises(TypeError):
        notebook.claims("not a claim")


def test_a_reason_is_rendered_from_the_numbers_and_a_tie_is_not_held():
    slower = notebook.claim("tree {t:.2f} ms against chain {c:.2f} ms", 1.5 < 1.2, t=1.5, c=1.2,
                            otherwise="the tree's {n} rows cost {t:.2f} ms here", n=16)
    assert slower.markdown().endswith("**(did not hold in this run: the tree's 16 rows cost 1.50 ms here)**")
    with pytest.raises(ValueError, match="'why'"):
        notebook.claim("{x}", False, otherwise="because {why}", x=1)
    assert notebook.claim("{a} vs {b}", notebook.beats(1.30, 1.20), a=1.3, b=1.2).held  # 8 % apart: held
    tied = notebook.claim("{a} vs {b}", notebook.beats(1.01, 1.00), otherwise="never shown", a=1.01, b=1.0)
    assert not tied.held and "(tied in this run: 1.01 against 1, within the 2% " in tied.markdown()
    assert "never shown" not in tied.markdown()
    lost = notebook.claim("{a} vs {b}", notebook.beats(0.80, 1.00), otherwise="{a} is below {b}", a=0.8, b=1.0)
    assert not lost.held and lost.markdown().endswith("(did not hold in this run: 0.8 is below 1.0)**")
    assert notebook.beats(3, 2, margin=0) and not notebook.beats(2, 2, margin=0)  # exact counts: a tie is equal
    assert notebook.claim("{n}", notebook.beats(2, 2, margin=0), n=2).markdown().endswith("(tied in this run: both 2)**")
    with pytest.raises(ValueError):
        notebook.beats(1, 2, margin=1.5)


def test_typed_numbers_finds_measured_numbers_but_not_papers_code_or_math():
    text = ("one run gave 1.3x and 15 ms, then +5 %, 42 tokens/s and MAT 2.41\n"
            "the paper reports 2.42x (its Table 1)\n"
            "`gamma=4` gives `2x`; $3x$ is math; a 10 x 6 grid; 4 sinks; 16k tokens")
    found = [hit.split(":")[0] for hit in typed_numbers(text)]
    assert found == ["1.3x", "15 ms", "+5 %", "42 tokens/s", "MAT 2.41"]
    sizes = "a tree grew in 80 µs, the run took 7 min, the store 2 MB (6144 KiB); drafting costs tens of microseconds"
    assert [hit.split(":")[0] for hit in typed_numbers(sizes)] == ["80 µs", "7 min", "2 MB", "6144 KiB",
                                                                   "tens of microseconds"]
    assert typed_numbers("a 96-token tree, 16 rows, 4 sinks and 2 streams") == []


# Measured numbers typed into each notebook's Markdown (typed_numbers): a ceiling that only goes down. A notebook
# states what it measured with notebook.claim(...) in a code cell; lower a ceiling when its prose is converted.
TYPED_CEILING: dict[str, int] = {}  # every notebook is at 0: a measured number is a claim


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name[:2])
def test_no_more_measured_numbers_typed_into_a_notebooks_markdown(path):
    cells = json.loads(path.read_text())["cells"]
    found = [hit for c in cells if c["cell_type"] == "markdown" for hit in typed_numbers("".join(c["source"]))]
    assert len(found) <= TYPED_CEILING.get(path.name[:2], 0), found


# Claims with no `otherwise=`: each is a check that cannot fail but by a bug (tokens equal, arithmetic, a seeded test,
# a structural bound), not a measurement that a run's machine, size or noise can turn; every other claim says why it
# may not hold ("did not hold in this run: <why>"), so that no miss is left unexplained.
NO_OTHERWISE: dict[tuple[str, str], str] = {
    ("03", "nb03-sol1"): "a seeded chi-square test and exact first-token errors: the same numbers every run",
    ("03", "nb03-sol3"): "the by-hand loop's tokens against section 3's: equal unless a rollback is wrong",
    ("05", "n4-sol1"): "a longer leader's followers are a subset of a shorter one's: a property of the table",
    ("07", "n6-sol2"): "a step emits at most k + 1 tokens (its first claim); the second, measured, has otherwise",
    ("07", "n6-sol3"): "both compressions write greedy's tokens: lossless whatever the streams read",
    ("07", "n6-sol4"): "a re-aligned window writes greedy's tokens: lossless whatever it proposes",
    ("07", "n6-sol6"): "a curve changes what the chooser drafts, never the tokens: both runs write the same",
    ("08", "nb05-sol2"): "the fixed region's block count is arithmetic (ceil of the budget over the block)",
    ("08", "nb05-sol3"): "the block tables of an interleaved layout and a float64 attention check: exact",
    ("08", "nb05-sol4"): "StreamingLLM's kept entries form two runs: at most one block more, by construction",
    ("09", "nb07-sol5"): "the caps the auto query chose never exceed the fixed query's: a bound of the chooser",
}


def _claims_without_otherwise(source: str) -> int:
    """How many notebook.claim(...) calls of a code cell give no `otherwise=`."""
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]  # IPython magics
    calls = [node for node in ast.walk(ast.parse("\n".join(lines))) if isinstance(node, ast.Call)
             and (getattr(node.func, "attr", None) == "claim" or getattr(node.func, "id", None) == "claim")]
    return sum(all(k.arg != "otherwise" for k in call.keywords) for call in calls)


def _claim_calls(source: str) -> tuple[list, list]:
    """(every notebook.claim(...) call of a code cell, the bare `claim(...)` statements that are not its last)."""
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]  # IPython magics
    tree = ast.parse("\n".join(lines))
    is_claim = lambda node: isinstance(node, ast.Call) and "claim" in (getattr(node.func, "attr", None),  # noqa: E731
                                                                        getattr(node.func, "id", None))
    hidden = [st for st in tree.body[:-1] if isinstance(st, ast.Expr) and is_claim(st.value)]
    return [node for node in ast.walk(tree) if is_claim(node)], hidden


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name[:2])
def test_every_claim_a_cell_makes_is_displayed(path):
    """Jupyter displays a cell's last value only: a bare claim(...) before the last statement is made and never
    seen (two claims of a cell go through notebook.claims(...), or display(...))."""
    cells = json.loads(path.read_text())["cells"]
    hidden = [(c.get("id"), ast.unparse(st)[:80]) for c in cells if c["cell_type"] == "code"
              for st in _claim_calls("".join(c["source"]))[1]]
    assert not hidden, f"claims no reader sees: {hidden}"


def _stock_reason(call) -> bool:
    """True when a claim's otherwise= is a fixed sentence: a string naming none of the run's numbers."""
    why = next((k.value for k in call.keywords if k.arg == "otherwise"), None)
    if why is None or isinstance(why, ast.JoinedStr):
        return False
    if isinstance(why, ast.Constant) and isinstance(why.value, str):
        return not any(name for _, name, _, _ in string.Formatter().parse(why.value))
    return False  # a name or a call: computed in the cell


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name[:2])
def test_every_reason_a_claim_gives_is_computed_from_the_run(path):
    """A claim that did not hold says why from this run's numbers (otherwise= names one of them, or is computed),
    never with a stock sentence that would read the same whatever the run measured."""
    cells = json.loads(path.read_text())["cells"]
    calls = [(c.get("id"), call) for c in cells if c["cell_type"] == "code"
             for call in _claim_calls("".join(c["source"]))[0]]
    stock = [(cell, ast.unparse(call)[:100]) for cell, call in calls if _stock_reason(call)]
    assert not stock, f"stock reasons: {stock}"
    unknown = []  # a template's fields are numbers the claim is given (else it fails when it is rendered)
    for cell, call in calls:
        given = {k.arg for k in call.keywords}
        if None in given:  # **numbers: not known statically
            continue
        for arg in [a for a in call.args[:1]] + [k.value for k in call.keywords if k.arg == "otherwise"]:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names = {n.split(".")[0].split("[")[0] for _, n, _, _ in string.Formatter().parse(arg.value) if n}
                unknown += [(cell, name) for name in sorted(names - given)]
    assert not unknown, f"template fields the claim is not given: {unknown}"


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name[:2])
def test_every_measured_claim_says_why_it_may_not_hold(path):
    cells = json.loads(path.read_text())["cells"]
    bare = [(path.name[:2], c.get("id")) for c in cells if c["cell_type"] == "code"
            and _claims_without_otherwise("".join(c["source"]))]
    unexplained = [cell for cell in bare if cell not in NO_OTHERWISE]
    assert not unexplained, f"claims with no otherwise= (add one, or list the cell in NO_OTHERWISE): {unexplained}"


def _undisplayed_figures(source: str) -> list[str]:
    """The `save(...)` calls of a code cell whose figure is neither wrapped in display(...) nor the cell's value."""
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]  # IPython magics
    body = ast.parse("\n".join(lines)).body
    shown = {id(node.args[0]) for node in ast.walk(ast.Module(body=body, type_ignores=[]))
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "display" and node.args}
    if body and isinstance(body[-1], ast.Expr):
        shown.add(id(body[-1].value))  # the cell's last expression is displayed by Jupyter
    return [ast.unparse(node)[:80] for node in ast.walk(ast.Module(body=body, type_ignores=[]))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "save" and id(node) not in shown]


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name[:2])
def test_every_figure_is_displayed_where_it_is_built(path):
    cells = json.loads(path.read_text())["cells"]
    hidden = [hit for c in cells if c["cell_type"] == "code" for hit in _undisplayed_figures("".join(c["source"]))]
    assert not hidden, f"figures saved but never shown (wrap them in display(...)): {hidden}"


def test_quiet_progress_turns_every_bar_off_even_one_asked_for(monkeypatch, capsys):
    from tqdm import std
    from tqdm.auto import tqdm

    monkeypatch.setattr(std.tqdm, "__init__", std.tqdm.__init__)  # restored after the test
    assert not tqdm(range(2), disable=False).disable
    capsys.readouterr()  # that bar's output
    notebook.quiet_progress()
    notebook.quiet_progress()  # idempotent: wrapped once
    bar = tqdm(range(2), disable=False)
    assert bar.disable and list(bar) == [0, 1]
    assert "it/s" not in capsys.readouterr().err


def test_an_exercise_answer_is_checked_against_this_runs_value():
    assert "no answer yet" in notebook.check_answer("alpha", None, 0.7).markdown()
    right = notebook.check_answer("alpha", 0.71, 0.7)
    assert right.right and "right" in str(right)
    high, low = notebook.check_answer("alpha", 0.9, 0.7), notebook.check_answer("alpha", 0.5, 0.7, rel_tol=0.1)
    assert not high.right and "too high" in high.markdown() and "too low" in low._repr_markdown_()
    with pytest.raises(ValueError, match="no value"):
        notebook.check_answer("alpha", 0.5, float("nan"))


def test_a_predicted_option_is_checked_against_the_option_this_run_picks():
    unanswered = notebook.check_choice("faster", None, "chain", ("chain", "tree"))
    assert not unanswered.right and "no answer yet" in unanswered.markdown()
    right = notebook.check_choice("faster", "Chain", "chain", ("chain", "tree"), why="1.20x against 1.05x")
    assert right.right and "1.20x against 1.05x" in right.markdown()
    wrong = notebook.check_choice("faster", "tree", "chain", ("chain", "tree"))
    assert not wrong.right and "try again" in wrong.markdown()
    with pytest.raises(ValueError, match="not one of"):
        notebook.check_choice("faster", "trie", "chain", ("chain", "tree"))
    with pytest.raises(ValueError, match="this run's option"):
        notebook.check_choice("faster", "tree", "both", ("chain", "tree"))
