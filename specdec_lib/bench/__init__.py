"""Measuring: the benchmark harness (`python -m specdec_lib.bench`), the ablation runner, the forward cost curve
and the expected-speedup model, the statistical lossless check, and the side-by-side analysis of notebook 12
(`compare`: spread, per-category speedups, efficiency against the bound, the README's table), and acceptance
as measured (`acceptance`: by draft depth from the step records, the overlap sum_x min(p, q) against temperature).

    from specdec_lib import bench
    runs = bench.run_bench(pair, "code", ["hf", "cacheback"]); bench.summarize(runs)
"""
from .harness import SUITES, load_suite, machine_info, main, parse_variant, run_bench, summarize

__all__ = ["SUITES", "load_suite", "machine_info", "main", "parse_variant", "run_bench", "summarize"]
