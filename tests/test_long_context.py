"""Long context: the long pair (YaRN over the shipped tiny pair), the long_code suite, and parity at thousands of
tokens.

- `load_models("tiny-long")` stretches both models' rope by YaRN (config only) and says so in its name; a context
  no longer than the trained one is refused;
- the long_code suite loads through `datasets`: every length in its category, each prompt within its length, the
  files it concatenates marked;
- every method equals hf greedy token for token on a 3000-token prompt of that suite, in float64: the causal
  prefill of a masked first step (verify.prefill) and every method's long-context path are lossless;
- the harness times the prefill apart from the decode phase.
"""
from __future__ import annotations

import pytest
import torch

from specdec_lib import METHODS, bench, generate, load_models
from specdec_lib.models import TINY_LONG_CONTEXT

PARITY_TOKENS = 3000  # prompt tokens of the float64 parity run (3x the pair's trained context)


@pytest.fixture(scope="module")
def long_pair():
    return load_models("tiny-long", device="cpu")


@pytest.fixture(scope="module")
def long_pair64(long_pair):
    import copy

    return copy.deepcopy(long_pair.target).to(torch.float64), copy.deepcopy(long_pair.draft).to(torch.float64)


def test_the_long_pair_is_the_tiny_pair_read_through_yarn(long_pair):
    for model in (long_pair.target, long_pair.draft):
        rope = model.config.rope_parameters
        assert rope["rope_type"] == "yarn" and rope["original_max_position_embeddings"] == 1024
        assert rope["factor"] * 1024 == TINY_LONG_CONTEXT == model.config.max_position_embeddings
    assert long_pair.name == long_pair.spec == "tiny-long" and long_pair.context == TINY_LONG_CONTEXT
    tiny = load_models("tiny", device="cpu")
    assert torch.equal(tiny.target.lm_head.weight, long_pair.target.lm_head.weight)  # no new weights
    with pytest.raises(ValueError, match="not longer"):
        load_models("tiny", device="cpu", context=1024)
    with pytest.raises(ValueError, match="exceeds the target's context of 1024"):  # the shipped pair stays short
        generate("hf", tiny.target, torch.zeros(1, 1000, dtype=torch.long), 100)


def test_long_code_suite_loads_through_datasets(long_pair):
    rows = bench.load_suite("long_code")
    by_length = {}
    for row in rows:
        by_length.setdefault(row["context"], []).append(row)
        assert row["category"] == f"{row['context'] // 1024}k" and row["prompt"].startswith("# file: Lib/")
    assert sorted(by_length) == [1024, 2048, 4096, 8192, 16384] and all(len(r) == 3 for r in by_length.values())
    for row in (by_length[2048][0], by_length[16384][0]):
        n = long_pair.encode(row["prompt"]).shape[1]
        assert row["context"] * 0.8 < n <= row["context"]


@pytest.mark.usefixtures("one_thread")
def test_every_method_is_lossless_at_thousands_of_tokens_float64(long_pair, long_pair64):
    target, draft = long_pair64
    prompt = next(r for r in bench.load_suite("long_code") if r["context"] == 4096)["prompt"]
    ids = long_pair.encode(prompt)[:, -PARITY_TOKENS:]
    want = generate("hf", target, ids, 24).new_tokens
    for method in sorted(METHODS):
        if method == "hf":
            continue
        settings = {"tokenizer": long_pair.tokenizer} if METHODS[method].accepts("tokenizer") else {}
        result = generate(method, target, ids, 24, draft=draft, **settings)
        assert result.new_tokens == want, method


@pytest.mark.usefixtures("one_thread")
def test_the_harness_times_the_prefill_apart(long_pair):
    prompt = next(r for r in bench.load_suite("long_code") if r["context"] == 2048)
    runs = bench.run_bench(long_pair, [prompt], ["hf", "cacheback", "lookahead"], max_new_tokens=16, repeats=1,
                           progress=False)
    assert (runs.prefill_seconds < runs.wall_seconds).all() and (runs.prefill_tokens >= 1).all()
    assert runs.matches_hf.dropna().all()
    table = bench.summarize(runs)
    assert {"prefill_ms", "decode_tokens_per_s", "decode_speedup", "prefill_vs_hf"} <= set(table.columns)
    hf = table.set_index("method").loc["hf"]
    assert hf.decode_speedup == pytest.approx(1.0) and hf.prefill_vs_hf == pytest.approx(1.0)
    assert (table.decode_tokens_per_s > 0).all()


@pytest.mark.usefixtures("one_thread")
def test_the_long_context_run_and_its_figure(long_pair):
    from specdec_lib import viz
    from specdec_lib.bench import long_context

    summary, runs = long_context.run(long_pair, [1024, 2048], ["hf", "cacheback", "fafo"], prompts=1,
                                     max_new_tokens=8)
    assert sorted(set(summary.context)) == [1024, 2048] and len(runs) == 2 * 3
    assert summary.all_match_hf.dropna().astype(bool).all()
    table = long_context.wide(summary)
    assert list(table.columns) == ["cacheback", "fafo"] and list(table.index) == [1024, 2048]
    fig = viz.context_figure(summary)
    lines = {trace.name: trace for trace in fig.data if trace.showlegend is not False}
    assert set(lines) == {"cacheback", "fafo"} and list(lines["fafo"].x) == ["1k", "2k"]
    fafo = summary[summary.method == "fafo"].sort_values("context")
    assert list(lines["fafo"].y) == pytest.approx(list(fafo.decode_speedup))
    with pytest.raises(ValueError, match="no prompt of 3000 tokens"):
        long_context.run(long_pair, [3000], ["hf"], prompts=1, max_new_tokens=4)
