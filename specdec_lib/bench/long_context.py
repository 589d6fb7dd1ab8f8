"""Where each method wins: decode speed against context length, every method in one run (notebook 07).

    python -m specdec_lib.bench.long_context                       # the long pair on this machine, 1k-16k
    python -m specdec_lib.bench.long_context --lengths 1024 8192 --prompts 1 --out data/results --tag cpu

The long_code suite (repository-level completion: held-out files concatenated to 1k-16k tokens) decoded by the
long pair (`load_models("tiny-long")`, YaRN), each context length its own `run_bench` (methods interleaved per
prompt, hf the reference of the same run, every row checked against hf's tokens). The prefill is timed apart:
`decode_speedup` is decode tokens/s over hf's once the first token is out, `prefill_vs_hf` the time to the first
token over hf's. The literature's regime (FAFO, MagicDec, TriForce): a decode step becomes bound by reading the KV
cache as the context grows, so a method whose extra rows read little (FAFO's fumble rows read C(kv) only) or
whose one step yields several tokens gains more, not less, with context.

Simplifications: greedy, batch size 1, one repeat per prompt by default (the long prefills dominate the run's
time, every method paying its own); `autoregressive` (the loop with no draft) is in the run so
that what the loop's cache saves is told apart from what drafting gains.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from .harness import load_suite, machine_info, run_bench, summarize

LENGTHS = (1024, 2048, 4096, 8192, 16384)
METHODS = ("hf", "autoregressive", "prompt_lookup", "cacheback", "lookahead", "fafo")
COLUMNS = ["context", "method", "decode_speedup", "decode_tokens_per_s", "prefill_vs_hf", "prefill_ms", "speedup",
           "mat", "all_match_hf"]


def run(pair, lengths=LENGTHS, methods=METHODS, prompts: int = 2, max_new_tokens: int = 128, repeats: int = 1,
        progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary: one row per context length and method, runs: one row per generation) over long_code."""
    suite = load_suite("long_code")
    summaries, all_runs = [], []
    for i, length in enumerate(lengths):
        chosen = [row for row in suite if row["context"] == length][:prompts]
        if not chosen:
            raise ValueError(f"long_code has no prompt of {length} tokens; its lengths: "
                             f"{sorted({row['context'] for row in suite})}")
        runs = run_bench(pair, chosen, methods, max_new_tokens=max_new_tokens, repeats=repeats,
                         warmup=1 if i == 0 else 0, progress=progress).assign(context=length)
        all_runs.append(runs)
        summaries.append(summarize(runs).assign(context=length))
    summary = pd.concat(summaries, ignore_index=True)
    return summary[COLUMNS + [c for c in summary.columns if c not in COLUMNS]], pd.concat(all_runs, ignore_index=True)


def wide(summary: pd.DataFrame, value: str = "decode_speedup") -> pd.DataFrame:
    """Methods as columns, context lengths as rows (the table of notebook 07 and of the README)."""
    table = summary.pivot(index="context", columns="method", values=value)
    return table[[m for m in summary.method.unique() if m != "hf"]]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--prompts", type=int, default=2, help="prompts per context length")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--models", default="tiny-long")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default=None, help="folder for long_context_<tag>.csv and its runs")
    parser.add_argument("--tag", default="cpu")
    args = parser.parse_args(argv)
    from ..models.loading import load_models

    pair = load_models(args.models, device=args.device)
    summary, runs = run(pair, args.lengths, args.methods.split(","), args.prompts, args.max_new_tokens,
                        args.repeats, progress=True)
    print(f"{pair.name} on {machine_info(pair)['device']}: decode speedup over hf (prefill timed apart)")
    print(wide(summary).round(2).to_string())
    print("\ntime to the first token over hf's")
    print(wide(summary, "prefill_vs_hf").round(2).to_string())
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        summary.assign(device=machine_info(pair)["device"], timestamp=time.strftime("%Y%m%d-%H%M%S")).to_csv(
            out / f"long_context_{args.tag}.csv", index=False)
        runs.to_csv(out / f"long_context_{args.tag}_runs.csv", index=False)
        print(f"wrote {out / f'long_context_{args.tag}.csv'}")


if __name__ == "__main__":
    main()
