"""The GPU half in one command: `python -m specdec_lib.tools.gpu_report [--dry] [--out figures/gpu]`.

On whatever CUDA device it finds it runs these steps, each timed and kept apart (a step that fails is written
down with its error, and the next one runs):

1. `choices`: the device, its compute capability, and what "auto" picks there (the dtype; FAFO's attention
   mode, probed for the tiny target's shapes), with why;
2. `notebooks`: every notebook in full mode with the tiny pair (`MODELS = "tiny"`);
3. `bench`: every method and peer on the code suite with the tiny pair (`BENCH_METHODS`);
4. `flex_layout`: `bench.flex_layout`'s per-step costs from 1k to 64k cached tokens;
5. `hub_shapes`: forward-cost curves of randomly initialised models shaped like the hub pair (`HUB_SHAPES`:
   timing only, nothing is downloaded, so it runs on a GPU machine that reaches no hub).

Everything lands under `<out>/<device>/` (device: the GPU's name, e.g. `nvidia-h100-80gb-hbm3`): the executed
notebooks and their pages, one CSV per step, `summary.json` and `summary.md` (one table of steps, then each
step's table). `--budget-s` (default 1200: 20 minutes) skips the steps left when time runs out, saying so.

On CUDA the bench runs CARD in the three ways one GPU allows (`GPU_CARD`): the drafter on a second CUDA stream
(thread mode), and on the CPU cores beside the GPU target (`draft_device="cpu"`, thread and process modes).

`--dry` is the same command shrunk to a couple of minutes, for a CPU and for CI (tests/test_gpu_report.py):
one notebook in SMOKE mode, two prompts of 8 tokens, one short layout case, scaled-down hub shapes; the models
run in bfloat16 (`--dtype`), so the half-precision paths run on a CPU too. Its folder is `<out>/cpu-dry/`.

A bare GPU image may lack some wheels the notebooks need (datasets, plotly, ipywidgets, nbclient, ...): README's
"GPU" section says how to install them without an index. Simplifications: one GPU.
"""
from __future__ import annotations

import argparse
import json
import re
import time
import traceback
from pathlib import Path

import pandas as pd
import torch

from ..bench import run_bench, summarize
from ..bench.costs import forward_cost
from ..mechanisms.attention import choose_attention
from ..models import gpu_name, load_models, resolve_dtype, resolve_device

BENCH_METHODS = ("hf,autoregressive,hf_prompt_lookup,hf_assisted,prompt_lookup,draft_model,cacheback,"
                 "cacheback@tdl=96+crt=16,lookahead,fafo,card,card@mode=process,eagle").split(",")
# CARD on one GPU: a second stream, or the CPU cores beside it (card@mode=process alone cannot draft on CUDA)
GPU_CARD = ["card@mode=thread", "card@mode=thread+draft_device=cpu", "card@mode=process+draft_device=cpu"]
# (name, Qwen2 config) of the hub pair (models.HUB_PAIR): Qwen2.5-1.5B and -0.5B's shapes, random weights
HUB_SHAPES = {
    "qwen2.5-1.5b-shape": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                               num_attention_heads=12, num_key_value_heads=2, vocab_size=151936),
    "qwen2.5-0.5b-shape": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                               num_attention_heads=14, num_key_value_heads=2, vocab_size=151936),
}
FULL = dict(notebooks="*.ipynb", smoke=False, prompts=12, tokens=128, repeats=2,
            layout=["--lengths", "1024", "4096", "16384", "65536", "--repeats", "20"],
            rows=(1, 2, 4, 8, 16, 32, 64, 128), prefix=1024, cost_repeats=15, shape_scale=1)
DRY = dict(notebooks="01_*.ipynb", smoke=True, prompts=2, tokens=8, repeats=1,
           layout=["--lengths", "256", "--rows", "4", "--kv-budget", "64", "--heads", "4", "--kv-heads", "2",
                   "--head-dim", "32", "--block", "32", "--repeats", "2", "--no-model"],
           rows=(1, 4), prefix=32, cost_repeats=2, shape_scale=16)


def device_slug(device: torch.device, dry: bool) -> str:
    if dry or device.type != "cuda":
        return "cpu-dry" if dry else "cpu"
    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(device).lower()).strip("-")


def scaled_shape(config: dict, scale: int) -> dict:
    """A hub shape divided by `scale` (widths, layers and vocabulary; head counts kept): dry runs stay small."""
    if scale == 1:
        return dict(config)
    heads = config["num_attention_heads"]
    head_dim = max(8, config["hidden_size"] // heads // scale)
    return dict(config, hidden_size=heads * head_dim, intermediate_size=max(16, config["intermediate_size"] // scale),
                num_hidden_layers=max(1, config["num_hidden_layers"] // scale), vocab_size=config["vocab_size"] // 64)


def step_choices(out: Path, device, dtype, size) -> pd.DataFrame:
    target = load_models("tiny", device=device, dtype=dtype).target
    cfg = target.config
    heads = cfg.num_attention_heads
    mode, why = choose_attention(device, dtype, heads, cfg.num_key_value_heads, cfg.hidden_size // heads)
    from ..models import auto_dtype

    rows = [dict(setting="device", value=gpu_name(device) if device.type == "cuda" else "CPU", why=""),
            dict(setting="dtype auto", value=str(auto_dtype(device)[0]).removeprefix("torch."),
                 why=auto_dtype(device)[1]),
            dict(setting="dtype used here", value=str(dtype).removeprefix("torch."), why=""),
            dict(setting="FAFO attention auto", value=mode, why=why)]
    return pd.DataFrame(rows)


def step_notebooks(out: Path, device, dtype, size) -> pd.DataFrame:
    from . import run_notebooks

    runs = run_notebooks.run_all(out / "notebooks", smoke=size["smoke"], pattern=size["notebooks"],
                                 params={"MODELS": "tiny"}, log=lambda *a, **k: None)
    table = pd.DataFrame([dict(notebook=r.name, ok=r.ok, seconds=round(r.seconds, 1), stderr_outputs=len(r.stderr),
                               error=(r.error or "").strip().splitlines()[-1][:160] if r.error else "")
                          for r in runs])
    if not table.ok.all():
        raise RuntimeError(f"notebooks failed: {list(table.notebook[~table.ok])}")
    return table


def step_bench(out: Path, device, dtype, size) -> pd.DataFrame:
    pair = load_models("tiny", device=device, dtype=dtype)
    methods = list(BENCH_METHODS)
    if device.type == "cuda":
        methods = [m for m in methods if m != "card@mode=process"] + GPU_CARD
    runs = run_bench(pair, "code", methods, max_new_tokens=size["tokens"], repeats=size["repeats"],
                     limit=size["prompts"], progress=False)
    runs.to_csv(out / "bench_code_runs.csv", index=False)
    return summarize(runs)


def step_flex_layout(out: Path, device, dtype, size) -> pd.DataFrame:
    from ..bench import flex_layout

    return flex_layout.main(size["layout"] + ["--dtype", str(dtype).removeprefix("torch."),
                                               "--out", str(out / "flex_layout.csv")])


def step_hub_shapes(out: Path, device, dtype, size) -> pd.DataFrame:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    curves = []
    for name, shape in HUB_SHAPES.items():
        torch.manual_seed(0)
        with torch.device(device):
            model = Qwen2ForCausalLM(Qwen2Config(**scaled_shape(shape, size["shape_scale"]),
                                                 tie_word_embeddings=True)).to(dtype).eval()
        curves.append(forward_cost(model, rows=size["rows"], prefix=size["prefix"], repeats=size["cost_repeats"],
                                   warmup=1, name=name))
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return pd.concat(curves, ignore_index=True)


STEPS = {"choices": step_choices, "notebooks": step_notebooks, "bench": step_bench,
         "flex_layout": step_flex_layout, "hub_shapes": step_hub_shapes}


def run_report(out, dry: bool = False, dtype="auto", budget_s: float = 1200.0, steps=tuple(STEPS)) -> dict:
    """Run `steps` into `out/<device>/`; returns the summary (also written as summary.json and summary.md)."""
    device = resolve_device("auto")
    if not dry and device.type != "cuda":
        raise RuntimeError("no CUDA device is visible: run on a GPU, or pass --dry (the CPU rehearsal)")
    dtype = resolve_dtype("bfloat16" if dry and dtype == "auto" else dtype, device)
    size = DRY if dry else FULL
    folder = Path(out) / device_slug(device, dry)
    folder.mkdir(parents=True, exist_ok=True)
    start, results, tables = time.perf_counter(), [], {}
    for name in steps:
        if time.perf_counter() - start > budget_s:
            results.append(dict(step=name, status="skipped", seconds=0.0, detail=f"over --budget-s {budget_s:.0f}"))
            continue
        t0 = time.perf_counter()
        try:
            table = STEPS[name](folder, device, dtype, size)
            table.to_csv(folder / f"{name}.csv", index=False)
            tables[name] = table
            status, detail = "ok", f"{len(table)} rows -> {name}.csv"
        except Exception as err:  # one broken step must not hide what the others measure
            status, detail = "failed", f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"
            (folder / f"{name}.error.txt").write_text(traceback.format_exc())
        results.append(dict(step=name, status=status, seconds=round(time.perf_counter() - t0, 1), detail=detail))
        print(f"[gpu_report] {name}: {status} in {results[-1]['seconds']} s ({detail})", flush=True)
    import transformers

    summary = dict(device=gpu_name(device) if device.type == "cuda" else "CPU", dry=dry,
                   dtype=str(dtype).removeprefix("torch."), torch=torch.__version__,
                   transformers=transformers.__version__, total_seconds=round(time.perf_counter() - start, 1),
                   steps=results)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    (folder / "summary.md").write_text(summary_markdown(summary, tables))
    return summary


def markdown(table: pd.DataFrame) -> str:
    """A DataFrame as a markdown table (floats to 3 decimals; no extra dependency)."""
    def cell(value):
        text = f"{value:.3f}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


def summary_markdown(summary: dict, tables: dict) -> str:
    head = (f"# GPU report: {summary['device']}{' (dry run)' if summary['dry'] else ''}\n\n"
            f"torch {summary['torch']}, transformers {summary['transformers']}, models in {summary['dtype']}; "
            f"{summary['total_seconds']} s in all.\n\n")
    parts = [head, markdown(pd.DataFrame(summary["steps"]))]
    for name, table in tables.items():
        parts.append(f"\n\n## {name}\n\n{markdown(table)}")
    return "".join(parts) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="figures/gpu", help="the report goes to OUT/<device>/")
    parser.add_argument("--dry", action="store_true", help="the CPU rehearsal: every step shrunk, bf16 models")
    parser.add_argument("--dtype", default="auto", help="the models' dtype (auto: by capability; dry: bfloat16)")
    parser.add_argument("--budget-s", type=float, default=1200.0, help="skip the steps left after this many seconds")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, from {list(STEPS)}")
    args = parser.parse_args(argv)
    steps = [s for s in args.steps.split(",") if s]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps {unknown}; choose from {list(STEPS)}")
    summary = run_report(args.out, dry=args.dry, dtype=args.dtype, budget_s=args.budget_s, steps=steps)
    return 0 if all(s["status"] == "ok" for s in summary["steps"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
