"""Cacheback's ablations (paper §4: Table 1, Figure 4, and the TDL/CRT/trie choices) as benchmark runs.

Paper: Ma, Gim, Zhong, "Cacheback: Speculative Decoding With Nothing But Cache", §4. Table 1 compares the
dual tables with "no frozen" and "only frozen"; Figure 4 is the speedup over LL in 1..3 and FL in 1..5 with
the other parameters at their defaults (LC=2^20, FC=128, TDL=96, CRT=16 in the paper; here the method's
defaults, so TDL is "auto": add tdl=96 to a variant's settings for the paper's tree).

Every ablation here is a `bench.run_bench` run: each configuration is a method label ("cacheback@tdl=16",
see `bench.parse_variant`), run interleaved with "hf" on the same prompts, so each speedup is a ratio
measured side by side in one run, and every run checks the tokens against hf's (greedy: lossless).

Simplifications: greedy decoding only; Figure 4 runs one benchmark per LL (its five FL variants and hf
interleaved) and drops the loaded tables between LLs, because a frozen LL=3 table holds far more leaders
than LL=1's (large as Python objects): its speedups are against the hf of the same LL's run.
"""
from __future__ import annotations

from typing import Callable, Sequence

import pandas as pd

from .harness import parse_variant, run_bench, summarize

TABLE1 = {"dual": {}, "no frozen": {"frozen": False}, "only frozen": {"dynamic": False}}


def label(method: str = "cacheback", **settings) -> str:
    """The bench label of a variant: label(tdl=16, crt=4) -> "cacheback@tdl=16+crt=4"."""
    if not settings:
        return method
    return method + "@" + "+".join(f"{k}={v}" for k, v in settings.items())


def run_variants(pair, suite, variants: dict[str, dict], max_new_tokens: int = 64, repeats: int = 2,
                 limit: int | None = None, method: str = "cacheback", config: dict | None = None,
                 progress: bool = True, callback: Callable | None = None) -> pd.DataFrame:
    """Benchmark {name: settings} variants of `method` with hf in one run; one row per variant, hf last.

    `config` holds settings that do not fit in a label (objects: a frozen table, a tokenizer) per method
    or label. Columns: variant, method label, tokens_per_s, speedup (vs hf of this run), mat,
    target_forwards, all_match_hf, hit_rate / overlap when the method reports them (card), plus one column
    per setting."""
    labels = {}
    for name, settings in variants.items():
        labels[name] = label(method, **{k: v for k, v in settings.items() if _inline(v)})
        if labels[name] == method and any(not _inline(v) for v in settings.values()):
            # object settings go through config[label]: never under the bare method name, which every
            # variant of the method would inherit
            labels[name] = f"{method}@" + "".join(c if c.isalnum() else "_" for c in name)
    if len(set(labels.values())) != len(labels):
        raise ValueError(f"two variants have the same settings: {labels}")
    config = dict(config or {})
    for name, settings in variants.items():  # settings that are objects go through config under the label
        extra = {k: v for k, v in settings.items() if not _inline(v)}
        if extra:
            config[labels[name]] = {**config.get(labels[name], {}), **extra}
    runs = run_bench(pair, suite, list(labels.values()), max_new_tokens=max_new_tokens, repeats=repeats,
                     limit=limit, config=config, progress=progress, callback=callback)
    table = summarize(runs).set_index("method")
    rows = []
    for name, settings in list(variants.items()) + [("hf", None)]:
        row = table.loc[labels.get(name, "hf")]
        merged = parse_variant(labels[name], config)[1] if settings is not None else {}
        rows.append(dict(variant=name, label=labels.get(name, "hf"), tokens_per_s=row.tokens_per_s,
                         speedup=row.speedup, mat=row.mat, target_forwards=row.target_forwards,
                         all_match_hf=row.all_match_hf,
                         **{k: row[k] for k in ("hit_rate", "overlap") if k in row.index},  # methods with them
                         **{k: v for k, v in merged.items() if _inline(v)}))
    return pd.DataFrame(rows)


def _inline(value) -> bool:
    return isinstance(value, (bool, int, float, str)) or value is None


def table1(pair, suite, frozen=True, **run) -> pd.DataFrame:
    """Table 1: dual tables vs no frozen vs only frozen (speedup, MAT, tokens/s). `frozen`: the frozen table
    of the dual and only-frozen rows (True: the shipped one; a path or a table)."""
    variants = {name: dict(settings) for name, settings in TABLE1.items()}
    for name in ("dual", "only frozen"):
        if frozen is not True:
            variants[name]["frozen"] = frozen
    return run_variants(pair, suite, variants, **run)


def sweep(pair, suite, param: str, values: Sequence, base: dict | None = None, **run) -> pd.DataFrame:
    """One run over `values` of one parameter (TDL, CRT, merge...), the others at `base` or the defaults;
    the table has a column named after the parameter (run_variants adds one per setting)."""
    base = dict(base or {})
    return run_variants(pair, suite, {f"{param}={v}": {**base, param: v} for v in values}, **run)


def ll_fl_grid(pair, suite, lls: Sequence[int] = (1, 2, 3), fls: Sequence[int] = (1, 2, 3, 4, 5),
               frozen_for: Callable | None = None, base: dict | None = None, callback: Callable | None = None,
               **run) -> pd.DataFrame:
    """Figure 4: speedup and MAT for every (LL, FL). frozen_for(ll, fl) -> the frozen table to use (a path,
    a table, or False); default: whatever frozen=True finds. One run per LL (see the module doc)."""
    from .. import tables as frozen_tables

    rows = []
    for i, ll in enumerate(lls):
        variants = {}
        for fl in fls:
            settings = {**(base or {}), "ll": ll, "fl": fl}
            if frozen_for is not None:
                settings["frozen"] = frozen_for(ll, fl)
            variants[f"LL={ll} FL={fl}"] = settings
        step = None if callback is None else (lambda d, t, _i=i: callback(_i * t + d, len(lls) * t))
        table = run_variants(pair, suite, variants, callback=step, **run)
        rows.append(table[table.variant != "hf"].assign(hf_tokens_per_s=float(
            table.loc[table.variant == "hf", "tokens_per_s"].iloc[0])))
        frozen_tables.forget_frozen_tables()  # the next LL loads other tables
    grid = pd.concat(rows, ignore_index=True)
    return grid.astype({"ll": int, "fl": int})
