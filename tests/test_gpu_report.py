"""`python -m specdec_lib.tools.gpu_report`: its dry mode (the CPU rehearsal CI runs) goes through every step with
bf16 models on the CPU and writes the report; on a CPU without --dry it refuses, saying why.

The dry report (a few minutes: its notebooks, its bench in bfloat16) is in `make test-full`; `make test` keeps the
pieces it is made of: the tiny workbook (tests/test_notebooks.py), the exactness notebook in bfloat16
(test_an_exactness_notebook_runs_in_bfloat16), the bench harness (tests/test_bench.py) and the unit tests here."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from specdec_lib.tools import gpu_report


@pytest.fixture(scope="module")
def dry_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu")
    return out, gpu_report.run_report(out, dry=True)


@pytest.mark.full
def test_dry_report_runs_every_step_and_writes_the_summary(dry_report):
    out, summary = dry_report
    folder = out / "cpu-dry"
    assert [s["step"] for s in summary["steps"] if s["step"] != "threads"] == list(gpu_report.STEPS)
    threads = [s for s in summary["steps"] if s["step"] == "threads"]
    assert [s["step"] for s in summary["steps"]].index("threads") == 2  # chosen right after the overhead step
    assert len(threads) == 1 and threads[0]["detail"].split(":")[0].isdigit()
    assert all(s["status"] == "ok" for s in summary["steps"]), summary["steps"]
    assert summary["dtype"] == "bfloat16" and summary["dry"] is True
    assert json.loads((folder / "summary.json").read_text()) == summary
    page = (folder / "summary.md").read_text()
    assert page.startswith("# GPU report: CPU (dry run)") and "| bench | ok |" in page
    assert (folder / "notebooks" / "index.html").exists()


@pytest.mark.full
def test_dry_bench_runs_every_method_in_bfloat16_with_sane_peers(dry_report):
    out, _ = dry_report
    bench = pd.read_csv(out / "cpu-dry" / "bench.csv")
    assert list(bench.method) == gpu_report.BENCH_METHODS
    assert "error" not in bench or bench.error.isna().all(), "every method ran"
    assert list(bench.run.unique()) == [1, 2] and set(gpu_report.BASELINES) <= set(bench[bench.run == 1].method)
    hf = bench.set_index("method").loc["hf"]
    assert hf.mat == 1.0 and hf.speedup == 1.0
    assert (bench.mat >= 1.0).all() and (bench.target_forwards > 0).all()
    runs = pd.read_csv(out / "cpu-dry" / "bench_code_runs.csv")
    assert (runs.new_tokens == gpu_report.DRY["tokens"]).all()


@pytest.mark.full
def test_dry_choices_layout_and_hub_shapes(dry_report):
    out, _ = dry_report
    folder = out / "cpu-dry"
    choices = pd.read_csv(folder / "choices.csv").set_index("setting")
    assert choices.loc["dtype auto", "value"] == "float32" and choices.loc["dtype used here", "value"] == "bfloat16"
    assert choices.loc["FAFO attention auto", "value"] == "split"
    layout = pd.read_csv(folder / "flex_layout.csv")
    assert {"(a) layout", "(c) full"} <= set(layout.case) and (layout.dtype == "bfloat16").all()
    overhead = pd.read_csv(folder / "overhead.csv")
    assert set(overhead.method) == {"hf", "autoregressive", "autoregressive, full head"}
    assert set(overhead.threads) == {torch.get_num_threads(), 1}  # torch's default and one (one run where equal)
    assert (overhead.ms_per_token > 0).all() and overhead[overhead.method == "autoregressive"].verify_ms_median.gt(0).all()
    assert "Self CPU" in (folder / "overhead_profile.txt").read_text()
    curves = pd.read_csv(folder / "hub_shapes.csv")
    assert set(curves.model) == set(gpu_report.HUB_SHAPES)
    assert (curves.median_ms > 0).all() and sorted(set(curves.rows)) == list(gpu_report.DRY["rows"])


def test_hub_shapes_scale_down_keeping_head_counts():
    arch, full = gpu_report.HUB_SHAPES["qwen2.5-1.5b-shape"]
    assert arch == "qwen2"
    assert gpu_report.scaled_shape(full, 1) == full
    small = gpu_report.scaled_shape(full, 16)
    assert small["num_attention_heads"] == 12 and small["num_key_value_heads"] == 2
    assert small["hidden_size"] % small["num_attention_heads"] == 0 and small["hidden_size"] < full["hidden_size"]


def test_a_full_report_needs_a_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="no CUDA device"):
        gpu_report.run_report(tmp_path)
    assert not any(tmp_path.iterdir()), "nothing is written before the device is checked"


def test_unknown_steps_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        gpu_report.main(["--dry", "--steps", "choices,nope", "--out", str(tmp_path)])
    assert "unknown steps ['nope']" in capsys.readouterr().err


def test_device_slug_names_the_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert gpu_report.device_slug(torch.device("cuda"), dry=False) == "nvidia-h100-80gb-hbm3"
    assert gpu_report.device_slug(torch.device("cpu"), dry=True) == "cpu-dry"


def test_choose_threads_reads_the_overhead_steps_plain_step():
    table = pd.DataFrame(dict(threads=[16, 16, 1, 1], method=["autoregressive"] * 4, ms_per_token=[60.0, 50.0, 9.0, 8.0]))
    assert gpu_report.choose_threads(table)[0] == 1
    assert gpu_report.choose_threads(table.assign(ms_per_token=[5.0, 6.0, 9.0, 8.0]))[0] == 16
    assert gpu_report.choose_threads(table, "4") == (4, "given")
    assert gpu_report.choose_threads(None)[0] == torch.get_num_threads()
