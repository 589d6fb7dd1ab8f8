"""Every method side by side (notebook 12): spread over repeats, per-category speedups, efficiency against each
method's own bound, and the README's benchmark table written from saved results.

All functions read the per-run frame of `harness.run_bench` (one row per method, prompt, repeat) or the JSON
that `python -m specdec_lib.bench` writes.

- `spread(runs)`: per method, the speedup over hf of each repeat (all prompts of that repeat, against hf's runs
  of the same repeat): median, min and max. The machine's noise, next to the differences between methods.
- `by_category(runs)`: speedup over hf per method and prompt category (Spec-Bench's categories, or our suites'
  names): the data of Cacheback's Figure 3 radar chart.
- `efficiency(runs, costs)`: what a method could reach on this machine if drafting were free, its *bound*
      bound = MAT x t(1) / t(rows per step)
  (each step costs one target forward over the drafted rows plus the root; t from `costs.forward_cost`,
  interpolated), and measured speedup / bound: the share of that bound it keeps after paying for drafting and
  bookkeeping. The peers record no steps, so they have no bound.
- `never_slower(summaries)`, `load_summary(path)`: every method against the loop's own plain decoding
  ("autoregressive") in each setting (pair, suite, context), with what its budgets chose (notebook 12's section
  "never slower", from saved runs of the harness and of `bench.long_context`).
- `headline_table(results_dir)`: the README's one table, each column one saved run (HEADLINE names the files).
- `markdown_table(results)`, `write_readme_table(readme, results)`: the results page's tables from one run per
  suite, between `<!-- bench-table:start -->` and `<!-- bench-table:end -->` (the tiny pair), or a named block's
  markers `<!-- bench-table:NAME:start -->` ... (`--tag cpu_smol --block smol`: the real pair's).

Simplifications: the bound uses the mean rows per step (t is close to linear over the rows a step uses);
t(rows) is measured at one prefix length (the harness's prompts are a few hundred tokens).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..mechanisms.budget.cost_curve import CostCurve

START, END = "<!-- bench-table:start -->", "<!-- bench-table:end -->"
RESULTS_PAGE = "docs/results.md"  # where the generated tables live, each under its run's dated heading
# the README's headline: (column, results file under data/results, what it ran); every method at its defaults
HEADLINE = (("CPU, tiny pair (code)", "bench_code_cpu_never.json"),
            ("CPU, real pair (HumanEval)", "bench_humaneval_cpu_never_smol.json"),
            ("GPU H200, tiny pair (code)", "gpu/nvidia-h200/lease6_bench_run1.csv"))
HEADLINE_METHODS = ("autoregressive", "prompt_lookup", "cacheback", "lookahead", "fafo", "draft_model", "card",
                    "eagle", "hf_prompt_lookup", "hf_assisted")


def markers(block: str | None = None) -> tuple[str, str]:
    """The README markers of a table: the default block, or a named one."""
    return (START, END) if not block else (f"<!-- bench-table:{block}:start -->", f"<!-- bench-table:{block}:end -->")


def command(suites, tag: str = "cpu", block: str | None = None) -> str:
    """The command that writes a block: quoted in the block itself."""
    extra = (f" --tag {tag}" if tag != "cpu" else "") + (f" --block {block}" if block else "")
    return f"python -m specdec_lib.bench.compare --readme {RESULTS_PAGE} {' '.join(suites)}{extra}"


def _speedups(runs: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """tokens/s of every method over hf's, grouped by `keys` (total tokens / total seconds in each group)."""
    grouped = runs.groupby(["method", *keys], sort=False)[["new_tokens", "wall_seconds"]].sum().reset_index()
    grouped["tokens_per_s"] = grouped.new_tokens / grouped.wall_seconds
    hf = grouped[grouped.method == "hf"].set_index(keys)["tokens_per_s"]
    if hf.empty:
        raise ValueError("the runs have no 'hf' rows: the speedup is measured against hf of the same run")
    grouped["speedup"] = grouped.tokens_per_s.to_numpy() / hf.loc[
        [tuple(r) if len(keys) > 1 else r[0] for r in grouped[keys].to_numpy()]].to_numpy()
    return grouped


def spread(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per method: median, min and max over repeats of its speedup over hf (same repeat)."""
    per_repeat = _speedups(runs, ["repeat"])
    return (per_repeat.groupby("method", sort=False).speedup.agg(["median", "min", "max"])
            .rename(columns=lambda c: f"speedup_{c}").reset_index())


def by_category(runs: pd.DataFrame) -> pd.DataFrame:
    """Speedup over hf per method (rows) and category (columns)."""
    if "category" not in runs:
        raise ValueError("the runs have no 'category' column (run them with harness.run_bench)")
    table = _speedups(runs.fillna({"category": ""}), ["category"])
    return table.pivot(index="method", columns="category", values="speedup").loc[
        list(dict.fromkeys(table.method))]


def efficiency(runs: pd.DataFrame, costs: pd.DataFrame, baseline: str = "hf", decode: bool = False) -> pd.DataFrame:
    """Per method with step records: MAT, rows per step, its bound MAT x t(1) / t(rows), the measured speedup
    and the share of the bound it keeps. `costs`: a cost curve of one model (`costs.forward_cost`, or the loop's
    step, `costs.verify_cost`: what the loop's steps pay). `baseline`: the method the speedup is over, "hf" or
    "autoregressive" (the loop's plain decoding, whose step is the curve's t(1) when `costs` is the loop's step:
    then the bound and the speedup share their baseline, and a method keeps at most all of its bound).
    `decode`: both read after the first forward, the prompt's (as `harness.summarize`'s decode_tokens_per_s):
    speeds over the time after it, MAT over the forwards after it, so the prefill weighs on neither."""
    t = CostCurve(costs["rows"].tolist(), costs["median_ms"].tolist())  # read as the auto budgets read a curve
    columns = ["new_tokens", "wall_seconds", "target_forwards"] + (["prefill_seconds", "prefill_tokens"] if decode else [])
    totals = runs.groupby("method", sort=False)[columns].sum()
    if decode:
        firsts = runs.groupby("method", sort=False).size()  # one first forward per run
        tokens, seconds = totals.new_tokens - totals.prefill_tokens, totals.wall_seconds - totals.prefill_seconds
        forwards = totals.target_forwards - firsts
    else:
        tokens, seconds, forwards = totals.new_tokens, totals.wall_seconds, totals.target_forwards
    if baseline not in tokens.index:
        raise ValueError(f"the runs have no {baseline!r} to measure the speedup against")
    base_speed = tokens[baseline] / seconds[baseline]
    out = []
    for method, group in runs.groupby("method", sort=False):
        if method in ("hf", baseline) or group.rows_per_step.isna().all():
            continue
        mat = tokens[method] / forwards[method]
        rows = float(np.average(group.rows_per_step, weights=group.target_forwards))
        bound = mat * t(1) / t(rows)
        speedup = (tokens[method] / seconds[method]) / base_speed
        out.append(dict(method=method, mat=mat, rows_per_step=rows, bound=bound, speedup=speedup,
                        efficiency=speedup / bound))
    return pd.DataFrame(out)


# ---- never slower ------------------------------------------------------------------------------------------

NEVER_COLUMNS = ["vs_autoregressive", "paired_vs_autoregressive", "decode_vs_autoregressive", "speedup", "mat",
                 "mean_draft_size", "plain_share", "side_share", "all_match_hf"]


def load_summary(path) -> tuple[pd.DataFrame, dict]:
    """(summary table, what it ran on) of a saved run: bench_<suite>_<tag>.json (the harness: its meta) or
    long_context_<tag>.csv (bench.long_context: its device column)."""
    path = Path(path)
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        return pd.DataFrame(data["summary"]), data["meta"]
    table = pd.read_csv(path)
    meta = dict(device=str(table.device.iloc[0]) if "device" in table else "?", suite="long_code")
    if "timestamp" in table:
        meta["timestamp"] = str(table.timestamp.iloc[0])
    return table, meta


def when(meta: dict) -> str:
    """A saved run's time as YYYY-MM-DD HH:MM (its meta's timestamp, YYYYMMDD-HHMMSS), or 'not recorded'."""
    stamp = str(meta.get("timestamp", ""))
    if len(stamp) != 15 or stamp[8] != "-":
        return "not recorded"
    return f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]} {stamp[9:11]}:{stamp[11:13]}"


def never_slower(summaries: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Every method against the loop's own plain decoding, one row per (setting, method): `summaries` maps a
    setting's label (pair, suite, context) to a `summarize` table with an "autoregressive" row. vs_autoregressive
    is tokens/s over autoregressive's (prefill included); decode_vs_autoregressive the same after the first
    token (what drafting changes: at long context the shared prefill hides it)."""
    out = []
    for setting, table in summaries.items():
        if "autoregressive" not in set(table.method):
            raise ValueError(f"{setting}: no 'autoregressive' row: 'never slower' is measured against it")
        table = table[table.method != "hf"].copy()
        loop = table[table.method == "autoregressive"].iloc[0]
        table["vs_autoregressive"] = table.tokens_per_s / loop.tokens_per_s
        if "decode_tokens_per_s" in table:
            table["decode_vs_autoregressive"] = table.decode_tokens_per_s / loop.decode_tokens_per_s
        out.append(table[["method"] + [c for c in NEVER_COLUMNS if c in table]].assign(setting=setting))
    table = pd.concat(out, ignore_index=True)
    return table[["setting", "method"] + [c for c in NEVER_COLUMNS if c in table]]


# the saved runs of `make bench-never`: {setting: (file under data/results, the ratio its table shows)}; at 8k
# tokens the prefill (the same causal forward in every method) is most of a short run, so the decode ratio is shown
NEVER_FILES = {"tiny, code": ("bench_code_cpu_never.json", "vs_autoregressive"),
               "tiny, editing": ("bench_editing_cpu_never.json", "vs_autoregressive"),
               "smol, humaneval": ("bench_humaneval_cpu_never_smol.json", "vs_autoregressive"),
               "smol, editing": ("bench_editing_cpu_never_smol.json", "vs_autoregressive"),
               "smol, rename": ("bench_rename_cpu_never_smol.json", "vs_autoregressive"),
               "smol, chat": ("bench_chat_cpu_never_smol.json", "vs_autoregressive"),
               "smol, translation": ("bench_translation_cpu_never_smol.json", "vs_autoregressive"),
               "tiny-long, 8k": ("long_context_cpu_never.csv", "decode_vs_autoregressive")}


def load_never(results_dir) -> tuple[pd.DataFrame, dict]:
    """(never_slower table, {setting: what it ran on}) from the saved runs NEVER_FILES names (those present)."""
    summaries, metas = {}, {}
    for setting, (name, _) in NEVER_FILES.items():
        path = Path(results_dir) / name
        if path.exists():
            summaries[setting], metas[setting] = load_summary(path)
    if not summaries:
        raise FileNotFoundError(f"no saved 'never slower' run under {results_dir} (make bench-never writes them)")
    return never_slower(summaries), metas


def never_markdown(table: pd.DataFrame, metas: dict) -> str:
    """The "never slower" table (docs/results.md): methods (rows) x settings (columns), each the ratio NEVER_FILES names."""
    settings = list(dict.fromkeys(table.setting))
    devices = sorted({str((m.get("machine") or {}).get("device", m.get("device", "?"))) for m in metas.values()})
    lines = [f"Generated by `python -m specdec_lib.bench.compare --never --readme {RESULTS_PAGE}` from `data/results/` "
             f"(`make bench-never`): tokens/s over the loop's own plain decoding (`autoregressive`) of the same run, "
             f"every method with its defaults, the old fixed defaults as `@` variants; at 8k tokens the decode "
             f"speed (after the first token); in brackets, where a column ran repeats, the median over its interleaved "
             f"(prompt, repeat) blocks of plain decoding's time over the method's in the same block (the machine's "
             f"drift between blocks cancels); {', '.join(devices)}; every method matched hf's tokens unless marked.",
             "", "| method | " + " | ".join(settings) + " |", "|---|" + "---|" * len(settings)]
    cells = {(r.setting, r.method): r for r in table.itertuples()}
    for method in dict.fromkeys(table.method):
        row = []
        for setting in settings:
            r = cells.get((setting, method))
            if r is None:
                row.append("-")
                continue
            value = getattr(r, NEVER_FILES.get(setting, (None, "vs_autoregressive"))[1])
            repeated = metas.get(setting, {}).get("repeats", 1) > 1  # one run: the paired ratio adds nothing
            paired_ratio = getattr(r, "paired_vs_autoregressive", None) if repeated else None
            shown = paired_ratio is not None and not pd.isna(paired_ratio)
            row.append(f"{value:.2f}" + (f" ({paired_ratio:.2f})" if shown else "")
                       + (" (differs!)" if getattr(r, "all_match_hf", None) is False else ""))
        lines.append(f"| {method} | " + " | ".join(row) + " |")
    lines += ["", "Measured: " + "; ".join(f"{s} {when(metas.get(s, {}))}" for s in settings) + "."]
    return "\n".join(lines)


# ---- the README's table -------------------------------------------------------------------------------------

def _headline_column(path: Path) -> tuple[dict, str]:
    """({method: (x hf, MAT, matched hf)}, "when, machine") of one saved run: a harness JSON or a GPU lease's CSV."""
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        meta = data["meta"]
        rows = {r["method"]: (r["speedup"], r["mat"], r.get("all_match_hf")) for r in data["summary"]}
        return rows, f"{when(meta)}, {meta['machine']['device']}"
    frame = pd.read_csv(path)
    frame = frame[frame.run == frame.run.max()] if "run" in frame else frame
    rows = {r.method: (r.speedup, r.mat, None if pd.isna(r.all_match_hf) else bool(r.all_match_hf))
            for r in frame.itertuples()}
    return rows, f"{path.stem.split('_')[0]} of {path.parent.name} (its README: data/results/gpu/{path.parent.name}), bfloat16"


def headline_table(results_dir) -> str:
    """Every default method's tokens/s over hf's (MAT in brackets) per HEADLINE column; a method that did not
    run there: "-"; bfloat16 tokens that left hf's greedy path (near-ties, docs/gpu.md): marked."""
    columns = [(name, *_headline_column(Path(results_dir) / file)) for name, file in HEADLINE]
    lines = ["| method | " + " | ".join(name for name, *_ in columns) + " |", "|---|" + "---|" * len(columns)]
    for method in HEADLINE_METHODS:
        cells = []
        for _, rows, _ in columns:
            if method not in rows:
                cells.append("-")
                continue
            speed, mat, matched = rows[method]
            cells.append(f"{speed:.2f} ({mat:.2f})" + (" (tokens differ)" if matched is False else ""))
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += ["", "x hf (MAT), each column one run: " + "; ".join(f"{name}: {src}" for name, _, src in columns)
              + f". Generated by `python -m specdec_lib.bench.compare --headline --readme README.md`."]
    return "\n".join(lines)


def load_results(paths) -> dict[str, dict]:
    """{suite: the JSON `python -m specdec_lib.bench` wrote} for each path."""
    out = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        out[data["meta"]["suite"]] = data
    return out


def markdown_table(results: dict[str, dict], tag: str = "cpu", block: str | None = None) -> str:
    """Speedup over hf and MAT per method (rows) and suite (column pairs), with the run's settings above."""
    suites = list(results)
    first = results[suites[0]]["meta"]
    methods = list(dict.fromkeys(m for s in suites for m in results[s]["meta"]["methods"]))
    rows = {s: {r["method"]: r for r in results[s]["summary"]} for s in suites}
    hf_speed = " / ".join(f"{rows[s]['hf']['tokens_per_s']:.0f}" for s in suites)
    machine = first["machine"]
    lines = [f"Generated by `{command(suites, tag, block)}` "
             f"from `data/results/`: models {first['models']} ({first['dtype'].replace('torch.', '')}), greedy, "
             f"{first['prompts']} prompts x {first['repeats']} repeats, {first['max_new_tokens']} new tokens, "
             f"{machine['device']}, torch {machine['torch']}, transformers {machine['transformers']}; "
             f"speedups against `hf` of the same run; every method matched hf's tokens unless marked.", "",
             "| method | " + " | ".join(f"{s}: x hf | MAT" for s in suites) + " |",
             "|---|" + "---|---|" * len(suites)]
    for method in methods:
        cells = []
        for s in suites:
            row = rows[s].get(method)
            if row is None:
                cells += ["-", "-"]
                continue
            mark = " (differs!)" if row.get("all_match_hf") is False else ""
            cells += [f"{row['speedup']:.2f}{mark}", f"{row['mat']:.2f}"]
        name = f"hf ({hf_speed} tokens/s)" if method == "hf" else method
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_readme_table(readme, results: dict[str, dict], tag: str = "cpu", block: str | None = None) -> str:
    """Replace the text between the README's markers with `markdown_table(results)`; returns the new text."""
    return _fill_block(readme, markdown_table(results, tag, block), block)


def _fill_block(readme, table: str, block: str | None) -> str:
    path = Path(readme)
    text = path.read_text()
    start, end = markers(block)
    if start not in text or end not in text:
        raise ValueError(f"{path} has no {start} ... {end} block to fill")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{start}\n{table}\n{end}{tail}"
    path.write_text(new)
    return new


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Write the benchmark tables (README, docs/results.md) from saved "
                                     "results.")
    parser.add_argument("suites", nargs="*", help="suite names: data/results/bench_<suite>_<tag>.json is read")
    parser.add_argument("--never", action="store_true", help='the "never slower" table (block "never") instead')
    parser.add_argument("--headline", action="store_true", help="the README's headline table (block "
                        '"headline": HEADLINE\'s runs) instead')
    parser.add_argument("--results", default=str(Path(__file__).resolve().parents[2] / "data" / "results"))
    parser.add_argument("--readme", default=None, help="README to update (else the table is printed)")
    parser.add_argument("--tag", default="cpu", help="the files' tag (the harness's --tag): cpu, cpu_smol, ...")
    parser.add_argument("--block", default=None, help="a named README block (<!-- bench-table:NAME:start -->)")
    args = parser.parse_args(argv)
    if args.headline:
        text, block = headline_table(args.results), "headline"
    elif args.never:
        text, block = never_markdown(*load_never(args.results)), "never"
    else:
        if not args.suites:
            parser.error("name the suites (or --never)")
        results = load_results(Path(args.results) / f"bench_{suite}_{args.tag}.json" for suite in args.suites)
        text, block = markdown_table(results, args.tag, args.block), args.block
    if args.readme:
        _fill_block(args.readme, text, block)
        print(f"updated {args.readme}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
