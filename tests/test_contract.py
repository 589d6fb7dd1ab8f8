"""The one contract test: every method registered in METHODS joins it automatically.

- greedy parity with HF `generate` on random Llama and Qwen2 models (float64) and on the shipped pair (float64);
- EOS inside an accepted run, exact max_new_tokens, sum(accept_lengths) == len(new_tokens),
  target_forwards == len(accept_lengths); the loop's debug invariant on for every method that takes it;
- sampling: chi-square against the target's exact distribution of 2- and 3-token continuations at temperature
  0.7 and 1.3 and with top_k and top_p, for every method, HF's peers included, with negative controls (a wrong
  acceptance rule and a lossy tree walk must fail the same test);
- the drafter really drafts during decoding (the dynamic table / the prompt index learn from generated text);
- one stats schema: every loop method's step records hold loop.STEP_KEYS (plus "draft_size", an int, where the
  method drafted under a budget), its stats loop.STATS_KEYS with "config" a dict.

Sampling tests use fixed seeds, so each is deterministic; a lossless method fails one with probability about
alpha = 1e-3 over the choice of seeds.
"""
from __future__ import annotations

import functools

import pytest
import torch

from specdec_lib import METHODS, generate
from specdec_lib.loop import STATS_KEYS, STEP_KEYS
from specdec_lib.bench.lossless import lossless_check
from specdec_lib.mechanisms import verify
from specdec_lib.mechanisms.ngram_table import NgramTable

from helpers import SHIPPED_PROMPTS, random_lm, repeating_prompt, with_head

ALL = sorted(METHODS)
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore::specdec_lib.tables.NoFrozenTableWarning")]


def run(method, target, ids, n, draft=None, **kwargs):
    """generate() with the debug invariant on wherever the method takes it."""
    if METHODS[method].accepts("debug"):
        kwargs.setdefault("debug", True)
    return generate(method, target, ids, n, draft=draft, **kwargs)


def check_lengths(result, n):
    assert len(result.new_tokens) == n
    assert sum(result.accept_lengths) == len(result.new_tokens)
    assert result.target_forwards == len(result.accept_lengths) and all(a >= 1 for a in result.accept_lengths)
    # the time to the first token: the first forward that yields tokens ends inside the call, and yields those
    assert 0 < result.prefill_seconds <= result.wall_seconds and result.prefill_tokens == result.accept_lengths[0]
    if "steps" in result.stats:  # the loop's per-step records
        check_schema(result.stats)
        steps = result.stats["steps"]
        assert [s["emitted"] for s in steps] == result.accept_lengths
        assert all(s["accepted"] <= s["depth"] <= s["tree_size"] and s["emitted"] <= s["accepted"] + 1
                   for s in steps)


def check_schema(stats):
    """The stats schema every loop method shares (loop.STEP_KEYS / STATS_KEYS)."""
    missing = [k for k in STATS_KEYS if k not in stats]
    assert not missing and isinstance(stats["config"], dict), missing
    for s in stats["steps"]:
        assert all(k in s for k in STEP_KEYS), sorted(s)
        if "draft_size" in s:
            assert isinstance(s["draft_size"], int) and s["draft_size"] >= 0, s
    if "curve" in stats:
        assert stats["curve"].startswith("CostCurve(")


@pytest.fixture(scope="module")
def random_pairs():
    """{(kind, seed): (target, draft)}: peaked random float64 models, a 1-layer draft of the same family; each
    target with an EAGLE head trained on its own text."""
    return {(kind, seed): (with_head(random_lm(kind, seed=seed, layers=3, logit_scale=20.0)),
                           random_lm(kind, seed=seed + 100, layers=1, logit_scale=20.0))
            for kind in ("llama", "qwen2") for seed in (0, 1)}


# ---------------------------------------------------------------- greedy parity

@pytest.mark.parametrize("method", ALL)
def test_greedy_parity_random_float64(random_pairs, method):
    for (kind, seed), (target, draft) in random_pairs.items():
        ids = repeating_prompt(24, seed, target.config.vocab_size)
        reference = generate("hf", target, ids, 40).new_tokens
        result = run(method, target, ids, 40, draft)
        assert result.new_tokens == reference, (kind, seed)
        check_lengths(result, 40)


@pytest.mark.parametrize("method", ALL)
def test_greedy_parity_shipped_pair_float64(tiny_pair64, tiny_pair, method):
    target, draft, _ = tiny_pair64
    for text in SHIPPED_PROMPTS:
        ids = tiny_pair.encode(text)
        assert run(method, target, ids, 48, draft).new_tokens == generate("hf", target, ids, 48).new_tokens, text


# ---------------------------------------------------------------- stopping

def _eos_inside_a_run(result) -> int | None:
    """The index of a token whose first occurrence is inside a multi-token step (not a step's first token)."""
    starts, position = set(), 0
    for length in result.accept_lengths:
        starts.add(position)
        position += length
    tokens = result.new_tokens
    return next((j for j in range(2, len(tokens)) if tokens.index(tokens[j]) == j and j not in starts), None)


@pytest.mark.parametrize("method", ALL)
def test_eos_inside_an_accepted_run(random_pairs, method):
    """EOS = a token the method first emits inside a multi-token step (for methods that make any): the output
    and the cache are cut there, whatever the step had accepted after it."""
    cases = 0
    for (kind, seed), (target, draft) in random_pairs.items():
        for prompt_seed in range(4):
            ids = repeating_prompt(24, 10 * seed + prompt_seed, target.config.vocab_size)
            free = run(method, target, ids, 40, draft)
            j = _eos_inside_a_run(free)
            if j is None:
                if any(a > 1 for a in free.accept_lengths):
                    continue  # speculative, but no usable token in this run: try the next prompt
                j = next(j for j in range(7, 40) if free.new_tokens.index(free.new_tokens[j]) == j)
            tokens = free.new_tokens
            result = run(method, target, ids, 40, draft, eos_token_id=tokens[j])
            assert result.new_tokens == tokens[:j + 1], (kind, seed, prompt_seed)
            assert sum(result.accept_lengths) == j + 1 and result.target_forwards == len(result.accept_lengths)
            cases += 1
            if cases == 2:
                return
    pytest.fail("no prompt gave an EOS inside an accepted run")


@pytest.mark.parametrize("method", ALL)
def test_exact_max_new_tokens(random_pairs, method):
    target, draft = random_pairs["qwen2", 1]
    ids = repeating_prompt(24, 1, target.config.vocab_size)
    reference = generate("hf", target, ids, 17).new_tokens
    for n in (1, 2, 5, 17):
        result = run(method, target, ids, n, draft)
        assert result.new_tokens == reference[:n]
        check_lengths(result, n)
    assert generate(method, target, ids, 0, draft=draft).new_tokens == []


# ---------------------------------------------------------------- lossless sampling

SETTINGS = {  # (continuation length, sampling settings, seeded runs)
    "T0.7-len3": (3, dict(temperature=0.7), 1500),
    "T1.3-top_k3-len2": (2, dict(temperature=1.3, top_k=3), 1500),
    "T1.3-top_p0.8-len3": (3, dict(temperature=1.3, top_p=0.8), 1500),
}


@pytest.fixture(scope="module")
def peaked():
    """Vocab 8, peaked p and an unrelated q (many rejections: the residual matters); the prompt ends in the
    target's own greedy loop, so tables and lookups propose drafts that are often accepted under sampling."""
    target = with_head(random_lm("llama", vocab=8, layers=1, hidden=16, seed=3, logit_scale=20.0))
    draft = random_lm("qwen2", vocab=8, layers=1, hidden=16, seed=2, logit_scale=20.0)
    base = [1, 2, 3]
    ids = torch.tensor([base + generate("autoregressive", target, base, 12).new_tokens])
    return target, draft, ids


# their draft budget (and Lookahead's window, FAFO's streams, CARD's drafting) is "auto" unless set
AUTO_BY_DEFAULT = {"cacheback", "fafo", "eagle", "prompt_lookup", "draft_model", "lookahead", "card"}


def drafting(method) -> dict:
    """Settings under which an "auto" method drafts: injected curves with rows nearly free (this machine's timing
    must not decide whether anything is drafted, or the sampling checks would test plain steps only)."""
    if method not in AUTO_BY_DEFAULT:
        return {}
    costs = dict(costs={1: 1.0, 128: 1.05})
    if method == "draft_model":
        costs["draft_costs"] = {1: 0.1, 128: 0.2}  # a draft forward a tenth of the target's
    if method == "eagle":
        costs["head_ms"] = 0.1  # a head forward a tenth of a step
    if method == "card":  # its "auto" width times drafted steps and keeps the prompt's step plain: a fixed width
        return dict(width=8)  # drafts from the first step on
    return costs


def check_sampling(method, peaked, setting):
    target, draft, ids = peaked
    length, sampling, n = SETTINGS[setting]
    return lossless_check(method, target, ids, length=length, n_samples=n, draft=draft, **sampling,
                          **drafting(method))


# HF's decoders that make test samples through "hf" alone: all three take their sampling settings from one
# function (methods/peers.py `_generation_config`); what HF does with them is HF's, checked in make test-full
HF_SAMPLED_IN_FULL = {"hf_prompt_lookup", "hf_assisted"}


def _sampling_grid():
    """Every method under every setting; `make test` runs each method under one setting, the settings taken in
    turn (each setting still runs for a third of the methods, and sampling.probs' top_k / top_p are shared by all),
    `make test-full` the whole grid. A negative control of each kind below runs in both tiers."""
    for i, method in enumerate(ALL):
        for j, setting in enumerate(SETTINGS):
            fast = j == i % len(SETTINGS) and method not in HF_SAMPLED_IN_FULL
            marks = () if fast else (pytest.mark.full,)
            yield pytest.param(method, setting, marks=marks, id=f"{method}-{setting}")


@pytest.mark.parametrize("method, setting", list(_sampling_grid()))
def test_sampling_matches_the_target_distribution(peaked, method, setting):
    report = check_sampling(method, peaked, setting)
    assert report.passed, str(report)


@pytest.mark.parametrize("method", [m for m in ALL if METHODS[m].accepts("debug") and m != "autoregressive"])
def test_sampling_checks_are_not_vacuous(peaked, method):
    """Drafts are proposed and accepted under sampling on this prompt (with the settings the checks above use),
    so the checks above test the rule."""
    target, draft, ids = peaked
    accepted = sum(generate(method, target, ids, 3, draft=draft, temperature=1.0, seed=s, **drafting(method)
                            ).stats["accepted"] for s in range(100))
    assert accepted > 30


WRONG = {
    # draft-model rule: accept a draft iff p(x) >= q(x) (deterministic; the right rule accepts w.p. min(1, p/q))
    "accept_iff_p_ge_q": ("accept_probability", lambda p_x, q_x: (p_x >= q_x).to(p_x.dtype)),
    # forget the residual: after a rejection draw from p (over-weights tokens the draft likes)
    "residual_is_p": ("residual", lambda p, q: p),
}


# make test: the wrong acceptance rule (the residual's control is the same check with another wrong rule)
@pytest.mark.parametrize("wrong", [w if w == "accept_iff_p_ge_q" else pytest.param(w, marks=pytest.mark.full)
                                   for w in WRONG])
def test_negative_control_wrong_speculative_rule_fails(peaked, monkeypatch, wrong):
    name, rule = WRONG[wrong]
    monkeypatch.setattr(verify, name, rule)
    report = check_sampling("draft_model", peaked, "T0.7-len3")
    assert not report.passed, str(report)


@pytest.mark.parametrize("method", ["cacheback", pytest.param("prompt_lookup", marks=pytest.mark.full)])
def test_negative_control_lossy_tree_walk_fails(peaked, monkeypatch, method):
    """A Medusa-style "typical acceptance" walk (take the most probable drafted child whenever p gives it at
    least 0.2): fast but lossy. It must fail the test the library's walk passes."""
    from specdec_lib.sampling import probs

    def lossy_walk(tree, logits, sampling, generator=None):
        node, accepted = -1, []
        while True:
            p = probs(logits[node + 1], sampling)  # (V,)
            best = max(tree.children(node), key=lambda c: float(p[tree.tokens[c]]), default=None)
            if best is not None and float(p[tree.tokens[best]]) >= 0.2:
                accepted.append(best)
                node = best
                continue
            token = verify.pick_token(logits[node + 1], sampling, generator)
            child = tree.child_with(node, token)
            if child is None:
                return accepted, [tree.tokens[i] for i in accepted], token
            accepted.append(child)
            node = child

    monkeypatch.setattr(verify, "walk_tree", lossy_walk)
    report = check_sampling(method, peaked, "T1.3-top_p0.8-len3")
    assert not report.passed, str(report)


# ---------------------------------------------------------------- the drafter drafts during decoding

@functools.lru_cache(maxsize=1)
def _looping_case():
    """A prompt of distinct tokens after which greedy decoding falls into a loop that the prompt never shows
    (built once: two tests read it, neither changes it)."""
    target = with_head(random_lm("llama", vocab=97, layers=2, seed=11, logit_scale=20.0))
    prompt = torch.randperm(97, generator=torch.Generator().manual_seed(5))[:16][None]
    return target, prompt


def test_cacheback_learns_from_generated_text(monkeypatch):
    target, prompt = _looping_case()
    out = generate("hf", target, prompt, 60).new_tokens
    repeats = [j for j in range(1, len(out)) if out[j] in out[:j]]
    assert len(repeats) > 30, "the continuation must repeat itself (a loop) for this test to mean anything"
    learned = generate("cacheback", target, prompt, 60, frozen=False)
    assert learned.new_tokens == out and learned.mat > 2.0
    # Sensitivity: with the table never updated after the prompt, the same text gets (almost) nothing accepted.
    monkeypatch.setattr(NgramTable, "update_new", lambda self, tokens, n_new: None)
    frozen_at_prompt = generate("cacheback", target, prompt, 60, frozen=False)
    assert frozen_at_prompt.new_tokens == out and frozen_at_prompt.mat < 1.3


# fixed budgets: "auto" times the machine to decide whether to draft at all, and its guard stops drafting where
# the clock says it loses (budget/guard.py); this is a mechanism test
FIXED = {"card": dict(width=8), "draft_model": dict(gamma=4), "eagle": dict(budget=8),
         "prompt_lookup": dict(num_tokens=8), "cacheback": dict(tdl=16), "lookahead": dict(guesses=7, window=5),
         "fafo": dict(streams=4, candidates=8)}


def test_every_proposer_drafts_on_generated_text(random_pairs):
    target, prompt = _looping_case()
    draft = random_lm("llama", vocab=97, layers=2, seed=11, logit_scale=20.0)  # a draft equal to the target
    for method in [m for m in ALL if METHODS[m].accepts("debug") and m != "autoregressive"]:
        result = run(method, target, prompt, 60, draft, **({"frozen": False} if method == "cacheback" else {}),
                     **FIXED.get(method, {}))
        assert result.stats["accepted"] > 20 and result.mat > 1.5, method
