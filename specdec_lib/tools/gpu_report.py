"""The GPU half in one command: `python -m specdec_lib.tools.gpu_report [--dry] [--out figures/gpu]`.

On whatever CUDA device it finds it runs these steps, each timed and kept apart (a step that fails is written
down with its error, and the next one runs):
1. `choices`: the device, its compute capability, and what "auto" picks there (the dtype; FAFO's attention
   mode, probed for the tiny target's shapes), with why;
2. `overhead`: the loop's plain step against HF's greedy decoding, per prompt, at torch's default CPU threads and
   at one (`step_overhead`), and one profiled run's operator table;
3. `hub_shapes`: forward-cost curves of randomly initialised models shaped like the hub pair and the real pair's
   target (`HUB_SHAPES`: timing only, nothing is downloaded, so it runs on a machine that reaches no hub);
4. `bench`: every method and peer on the code suite with the tiny pair (`BENCH_RUNS`: two interleaved runs, each
   with the baselines, so a method that breaks on the device leaves the others' rows); on CUDA CARD runs the
   three ways one GPU allows (`GPU_CARD`: the drafter on a second CUDA stream, or on the CPU cores beside the GPU
   target with `draft_device="cpu"`, in thread and process modes);
5. `flex_layout`: `bench.flex_layout`'s per-step costs from 1k to 64k cached tokens;
6. `notebooks`: every notebook in full mode with the tiny pair (`MODELS = "tiny"`).

Everything lands under `<out>/<device>/` (the GPU's name, lower-cased): the executed notebooks and their pages,
one CSV per step, `summary.json` and `summary.md`. `--budget-s` skips the steps left when time runs out, saying
so; `--size lease` shrinks the run to one device lease (6 prompts once, notebook 08 only). `--dry` shrinks it to
a couple of minutes for a CPU and for CI (tests/test_gpu_report.py): one notebook in SMOKE mode, two prompts of
8 tokens, one short layout case, scaled-down hub shapes, the models in bfloat16 (`--dtype`) so the half-precision
paths run on a CPU too; its folder is `<out>/cpu-dry/`.

A bare GPU image may lack wheels the notebooks need (docs/gpu.md installs them offline). One GPU only.
"""
from __future__ import annotations

import argparse
import json
import re
import threading
import time
import traceback
from pathlib import Path

import pandas as pd
import torch

from ..bench import run_bench, summarize
from ..bench.costs import forward_cost
from ..mechanisms.store.attention import choose_attention
from ..env import gpu_name, resolve_dtype, resolve_device
from ..models.loading import load_models

# Two interleaved runs, each with the baselines, so that a method that breaks on a new device (compiled FlexAttention,
# a concurrent drafter) cannot take the other rows down with it; ratios are read within a run.
BASELINES = ["hf", "autoregressive"]
BENCH_RUNS = [BASELINES + "hf_prompt_lookup,hf_assisted,prompt_lookup,draft_model,cacheback,cacheback@tdl=96+crt=16,"
                          "lookahead,eagle".split(","),
              BASELINES + ["fafo", "card", "card@mode=process"]]
BENCH_METHODS = BENCH_RUNS[0] + [m for run in BENCH_RUNS[1:] for m in run if m not in BASELINES]
# CARD on one GPU: a second stream, or the CPU cores beside it (card@mode=process alone cannot draft on CUDA)
GPU_CARD = ["card@mode=thread", "card@mode=thread+draft_device=cpu", "card@mode=process+draft_device=cpu"]
# (name: (architecture, config)) with random weights: the hub pair's shapes (models.HUB_PAIR: Qwen2.5-1.5B and
# -0.5B) and the real pair's target (SmolLM2-135M, whose 98 MB GGUF cannot travel to a GPU machine that reaches no
# index): a forward's cost depends on the shapes, not on the weights
HUB_SHAPES = {
    "qwen2.5-1.5b-shape": ("qwen2", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936)),
    "qwen2.5-0.5b-shape": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936)),
    "smollm2-135m-shape": ("llama", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152)),
}
FULL = dict(overhead_prompts=3, overhead_tokens=64, notebooks="*.ipynb", smoke=False, prompts=12, tokens=128, repeats=2,
            layout_lengths=[1024, 4096, 16384, 65536], layout=["--repeats", "20"],
            rows=(1, 2, 4, 8, 16, 32, 64, 128), prefix=1024, cost_repeats=15, shape_scale=1)
# what fits one lease of a GPU machine (a command runs 10 minutes at most): fewer prompts, one repeat, notebook 08
LEASE = dict(FULL, notebooks="08_*.ipynb", prompts=6, repeats=1, layout=["--repeats", "10"], cost_repeats=10)
DRY = dict(overhead_prompts=1, overhead_tokens=8, notebooks="01_*.ipynb", smoke=True, prompts=2, tokens=8, repeats=1,
           layout_lengths=[256], layout=["--rows", "4", "--kv-budget", "64", "--heads", "4", "--kv-heads", "2",
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
    from ..env import auto_dtype

    rows = [dict(setting="device", value=gpu_name(device) if device.type == "cuda" else "CPU", why=""),
            dict(setting="dtype auto", value=str(auto_dtype(device)[0]).removeprefix("torch."),
                 why=auto_dtype(device)[1]),
            dict(setting="dtype used here", value=str(dtype).removeprefix("torch."), why=""),
            dict(setting="FAFO attention auto", value=mode, why=why)]
    return pd.DataFrame(rows)


def _find_nbconvert_templates() -> None:
    """`pip install --target DIR` puts nbconvert's templates in DIR/share/jupyter, where jupyter does not look:
    every notebook then runs and only its HTML export fails (seen on a bare GPU image). Add that folder to
    JUPYTER_PATH."""
    import os

    import nbconvert

    share = Path(nbconvert.__file__).resolve().parents[1] / "share" / "jupyter"
    paths = [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
    if (share / "nbconvert" / "templates").is_dir() and str(share) not in paths:
        os.environ["JUPYTER_PATH"] = os.pathsep.join(paths + [str(share)])


def step_notebooks(out: Path, device, dtype, size) -> pd.DataFrame:
    from ..workbook import run_notebooks

    _find_nbconvert_templates()

    runs = run_notebooks.run_all(out / "notebooks", smoke=size["smoke"], pattern=size["notebooks"],
                                 params={"MODELS": "tiny"}, log=lambda *a, **k: None)
    table = pd.DataFrame([dict(notebook=r.name, ok=r.ok, seconds=round(r.seconds, 1), stderr_outputs=len(r.stderr),
                               error=(r.error or "").strip().splitlines()[-1][:160] if r.error else "")
                          for r in runs])
    if not table.ok.all():  # the table kept, and each failure's last line in the summary (else a device lease
        table.to_csv(out / "notebooks.csv", index=False)  # may be spent again just to read the error)
        failed = table[~table.ok]
        raise RuntimeError("notebooks failed: " + "; ".join(f"{r.notebook}: {r.error}" for r in failed.itertuples()))
    return table


def step_bench(out: Path, device, dtype, size) -> pd.DataFrame:
    """`BENCH_RUNS` one after the other on the code suite; the table holds each run's rows (its baselines once)."""
    pair = load_models("tiny", device=device, dtype=dtype)
    tables, every_runs = [], []
    for number, methods in enumerate(BENCH_RUNS, start=1):
        if number not in size.get("bench_runs", range(1, len(BENCH_RUNS) + 1)):
            continue
        if device.type == "cuda":
            methods = [m for m in methods if m != "card@mode=process"]
            methods += [m for m in GPU_CARD if m not in methods] if "card" in methods else []
        try:
            runs = run_bench(pair, "code", methods, max_new_tokens=size["tokens"], repeats=size["repeats"],
                             limit=size["prompts"], progress=False)
        except Exception as err:  # the next run still measures its methods
            (out / f"bench_run{number}.error.txt").write_text(traceback.format_exc())
            tables.append(pd.DataFrame([dict(method=m, run=number, error=f"{type(err).__name__}: {err}"[:300])
                                        for m in methods if not every_runs or m not in BASELINES]))
            continue
        every_runs.append(runs.assign(run=number))
        table = summarize(runs).assign(run=number)
        tables.append(table if not every_runs[:-1] else table[~table.method.isin(BASELINES)])  # baselines once
        pd.concat(tables, ignore_index=True).to_csv(out / "bench.partial.csv", index=False)  # a lease that ends
        # mid-step keeps the runs done
    if every_runs:
        pd.concat(every_runs, ignore_index=True).to_csv(out / "bench_code_runs.csv", index=False)
    return pd.concat(tables, ignore_index=True)


def step_overhead(out: Path, device, dtype, size) -> pd.DataFrame:
    """The loop's plain step against HF's greedy decoding, per prompt, alternated, under torch's default CPU threads
    and under one thread; per-step times from the loop's records (verify_ms: forward + verdict + commit). On a
    GPU the loop's autoregressive once ran far behind HF's greedy on most prompts yet at HF's speed on others and
    under cProfile (data/results/gpu/): this step says where the time goes. One profiled run's operator table goes
    to overhead_profile.txt."""
    import statistics

    from ..bench.harness import load_suite
    from ..decoding import generate

    pair = load_models("tiny", device=device, dtype=dtype)
    prompts = [pair.encode_prompt(p) for p in load_suite("code", size["overhead_prompts"])]
    tokens, default_threads, rows = size["overhead_tokens"], torch.get_num_threads(), []
    generate("hf", pair.target, prompts[0], 8)
    generate("autoregressive", pair.target, prompts[0], 8)
    # "autoregressive, full head": the loop's plain step projecting every row (lazy_head=False), to tell the lazy
    # head's per-row work from the rest of the step
    variants = {"hf": ("hf", {}), "autoregressive": ("autoregressive", {}),
                "autoregressive, full head": ("autoregressive", dict(lazy_head=False))}
    for threads in dict.fromkeys((default_threads, 1)):  # once where torch runs one thread already
        torch.set_num_threads(threads)
        try:
            for i, ids in enumerate(prompts):
                for repeat in range(2):
                    order = list(variants) if repeat == 0 else list(variants)[::-1]
                    for name in order:
                        method, options = variants[name]
                        result = generate(method, pair.target, ids, tokens, **options)
                        steps = result.stats.get("steps") or []  # HF's greedy records none
                        verify = sorted(s["verify_ms"] for s in steps)
                        rows.append(dict(threads=threads, prompt=i, repeat=repeat, method=name,
                                         ms_per_token=1e3 * result.wall_seconds / max(len(result.new_tokens), 1),
                                         verify_ms_median=statistics.median(verify) if steps else None,
                                         verify_ms_p90=verify[int(0.9 * (len(verify) - 1))] if steps else None,
                                         verify_ms_max=max(verify) if steps else None,
                                         draft_us_median=statistics.median(s["draft_us"] for s in steps)
                                         if steps else None, python_threads=threading.active_count()))
        finally:
            torch.set_num_threads(default_threads)
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        generate("autoregressive", pair.target, prompts[0], 16)
    (out / "overhead_profile.txt").write_text(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    return pd.DataFrame(rows)


def step_flex_layout(out: Path, device, dtype, size) -> pd.DataFrame:
    from ..bench import flex_layout

    return flex_layout.main(["--lengths", *map(str, size["layout_lengths"]), *size["layout"],
                             "--dtype", str(dtype).removeprefix("torch."), "--out", str(out / "flex_layout.csv")])


def step_hub_shapes(out: Path, device, dtype, size) -> pd.DataFrame:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    classes = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}
    curves = []
    for name, (arch, shape) in HUB_SHAPES.items():
        config_class, model_class = classes[arch]
        torch.manual_seed(0)
        with torch.device(device):
            model = model_class(config_class(**scaled_shape(shape, size["shape_scale"]),
                                             tie_word_embeddings=True)).to(dtype).eval()
        curves.append(forward_cost(model, rows=size["rows"], prefix=size["prefix"], repeats=size["cost_repeats"],
                                   warmup=1, name=name))
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return pd.concat(curves, ignore_index=True)


def choose_threads(overhead: pd.DataFrame | None, setting: str = "auto") -> tuple[int, str]:
    """The CPU threads the later steps run at: a number given, or ("auto") the count under which the overhead step's
    loop ran its plain step faster (median ms per token over prompts); torch's default when nothing was measured."""
    if setting != "auto":
        return int(setting), "given"
    if overhead is None or overhead.empty:
        return torch.get_num_threads(), "torch's default (no overhead step measured)"
    plain = overhead[overhead.method == "autoregressive"].groupby("threads").ms_per_token.median()
    best = int(plain.idxmin())
    return best, "the faster plain step in the overhead step (" + ", ".join(
        f"{t} threads {ms:.1f} ms/token" for t, ms in plain.items()) + ")"


# cheapest and surest first: a lease that runs out skips the notebooks, not the tables
STEPS = {"choices": step_choices, "overhead": step_overhead, "hub_shapes": step_hub_shapes, "bench": step_bench,
         "flex_layout": step_flex_layout, "notebooks": step_notebooks}


SIZES = {"full": FULL, "lease": LEASE}


def run_report(out, dry: bool = False, dtype="auto", budget_s: float = 1200.0, steps=tuple(STEPS),
               size_name: str = "full", overrides: dict | None = None, threads_setting: str = "auto") -> dict:
    """Run `steps` into `out/<device>/`; returns the summary (also written as summary.json and summary.md).
    The steps after `overhead` run at the CPU thread count `choose_threads` picks (a row "threads" says which)."""
    device = resolve_device("auto")
    if not dry and device.type != "cuda":
        raise RuntimeError("no CUDA device is visible: run on a GPU, or pass --dry (the CPU rehearsal)")
    dtype = resolve_dtype("bfloat16" if dry and dtype == "auto" else dtype, device)
    size = dict(DRY if dry else SIZES[size_name], **(overrides or {}))
    folder = Path(out) / device_slug(device, dry)
    folder.mkdir(parents=True, exist_ok=True)
    start, results, tables = time.perf_counter(), [], {}
    for name in steps:
        if time.perf_counter() - start > budget_s:
            results.append(dict(step=name, status="skipped", seconds=0.0, detail=f"over --budget-s {budget_s:.0f}"))
            continue
        after_overhead = list(STEPS).index(name) > list(STEPS).index("overhead")
        if after_overhead and "threads" not in [r["step"] for r in results]:
            threads, why = choose_threads(tables.get("overhead"), threads_setting)
            torch.set_num_threads(threads)
            results.append(dict(step="threads", status="ok", seconds=0.0, detail=f"{threads}: {why}"))
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
    parser.add_argument("--size", default="full", choices=sorted(SIZES),
                        help="full: every notebook, 12 prompts x 2; lease: notebook 08, 6 prompts x 1 (10 minutes)")
    parser.add_argument("--bench-runs", default=None, help="comma-separated numbers of BENCH_RUNS (default all)")
    parser.add_argument("--prompts", type=int, default=None, help="the bench's prompts (default: the size's)")
    parser.add_argument("--layout-lengths", type=int, nargs="+", default=None, help="flex_layout's context lengths")
    parser.add_argument("--notebooks", default=None, help="the notebooks step's glob (default: the size's)")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, from {list(STEPS)}")
    parser.add_argument("--threads", default="auto",
                        help="CPU threads of the steps after overhead: a number, or auto (the faster plain step)")
    args = parser.parse_args(argv)
    steps = [s for s in args.steps.split(",") if s]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps {unknown}; choose from {list(STEPS)}")
    overrides = {}
    if args.bench_runs:
        overrides["bench_runs"] = [int(n) for n in args.bench_runs.split(",")]
    if args.prompts:
        overrides["prompts"] = args.prompts
    if args.layout_lengths:
        overrides["layout_lengths"] = args.layout_lengths
    if args.notebooks:
        overrides["notebooks"] = args.notebooks
    summary = run_report(args.out, dry=args.dry, dtype=args.dtype, budget_s=args.budget_s, steps=steps,
                         size_name=args.size, overrides=overrides, threads_setting=args.threads)
    return 0 if all(s["status"] == "ok" for s in summary["steps"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
