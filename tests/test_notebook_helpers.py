"""The notebooks' helpers (specdec_lib.tools.notebook): a long sweep is run and saved with FULL, shown from the
saved table without it, and run again when the saved table is another pair's or missing."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import torch

from specdec_lib.tools import notebook


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
