"""The guard of "auto" budgets (mechanisms/budget/guard.py): what drafted steps realise on the clock decides.

Unit checks on a scripted clock (drafting that loses stops after `judge_after` steps of a trial and is tried again
after a bounded wait; drafting that pays goes on, with a plain reference step now and then), and one generation
whose draft is made slow on purpose, where the chooser's model (the draft's measured forward price) cannot see
the cost: the guard turns the generation to plain steps, and the tokens stay the target's."""
from __future__ import annotations

import time

import pytest
import torch

from specdec_lib import generate
from specdec_lib.mechanisms.budget import Budget, ChainBudget
from specdec_lib.mechanisms.budget import cost_curve as C
from specdec_lib.mechanisms.budget.guard import Guard

from helpers import random_lm, repeating_prompt

# the guard reads the clock, which tests otherwise leave alone (SPECDEC_COSTS=estimate): these time the machine
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.measures_costs]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(guard: Guard, clock: Clock, step, steps: int) -> list[bool]:
    """`steps` steps; step(allowed) -> (drafted, tokens, ms). Returns whether each step was allowed to draft."""
    allowed = []
    guard.record(False, 1)  # the prefill's step: opens the clock, compared with nothing
    for _ in range(steps):
        allowed.append(guard.allowed)
        drafted, tokens, ms = step(guard.allowed)
        clock.now += ms / 1e3
        guard.record(drafted, tokens)
    return allowed


def test_drafting_that_loses_stops_and_is_tried_again_at_a_bounded_cost():
    clock = Clock()
    guard = Guard(judge_after=3, probe_every=16, clock=clock)
    # a drafted step: 1.5 tokens for 20 ms; a plain one: 1 token for 10 ms (drafting is 0.75x as fast)
    allowed = run(guard, clock, lambda ok: (True, 1.5, 20.0) if ok else (False, 1, 10.0), 190)
    assert allowed[:2] == [True, False]  # one drafted step, then a plain reference (no plain time yet)
    first_off = allowed.index(False, 2)
    assert first_off == 4  # judged after three drafted steps of the trial: off
    drafted = sum(allowed)
    assert drafted < 0.2 * len(allowed), allowed  # trials only
    assert guard.trials >= 2 and guard.gain == pytest.approx(0.75)
    # what the trials lost is a bounded share of the time: drafting's extra ms over plain for the same tokens
    lost = drafted * (20.0 - 1.5 * 10.0)
    total = drafted * 20.0 + (len(allowed) - drafted) * 10.0
    assert lost / total < 0.06, (lost, total)
    assert guard.stats()["guard_vetoed"] == len(allowed) - drafted


def test_drafting_that_pays_goes_on_with_a_reference_step_now_and_then():
    clock = Clock()
    guard = Guard(judge_after=3, reference_every=32, clock=clock)
    allowed = run(guard, clock, lambda ok: (True, 2.5, 14.0) if ok else (False, 1, 10.0), 200)
    plain = [i for i, ok in enumerate(allowed) if not ok]
    assert len(plain) <= 8 and all(b - a >= 32 for a, b in zip(plain[1:], plain[2:])), plain
    assert guard.on and guard.gain == pytest.approx(2.5 / 14.0 * 10.0)


def test_drafting_that_only_breaks_even_stops_but_a_small_sure_gain_goes_on():
    """The margin: 1.01x the plain steps' tokens per ms is noise on a busy machine, not a gain worth its risk; 1.06x
    is kept."""
    for speedup, keeps in ((1.01, False), (1.06, True)):
        clock = Clock()
        guard = Guard(judge_after=3, margin=0.03, clock=clock)
        allowed = run(guard, clock, lambda ok: (True, 2.0, 20.0 / speedup) if ok else (False, 1, 10.0), 60)
        assert guard.gain == pytest.approx(speedup)
        assert (sum(allowed) > 50) == keeps, (speedup, allowed)
    with pytest.raises(ValueError, match="margin"):
        Guard(margin=1.5)


def test_a_budget_guards_only_measured_greedy_choices():
    """An injected curve is taken as given (its choices reproduce), and under sampling no choice follows the
    clock: no guard there; a fixed budget is honoured exactly."""
    pair = random_lm(seed=5, logit_scale=20.0)
    ids = repeating_prompt(30, 5, pair.config.vocab_size)
    flat = C.CostCurve.from_points({1: 10.0, 128: 10.5})
    assert generate("prompt_lookup", pair, ids, 16, num_tokens="auto", costs=flat).stats.get("guard_vetoed") is None
    assert generate("prompt_lookup", pair, ids, 16, num_tokens=3).stats.get("guard_vetoed") is None
    sampled = generate("prompt_lookup", pair, ids, 16, num_tokens="auto", temperature=1.0, seed=0)
    assert sampled.stats.get("guard_vetoed") is None
    greedy = generate("prompt_lookup", pair, ids, 16, num_tokens="auto")
    assert greedy.stats["guard_vetoed"] >= 0 and "guard_gain" in greedy.stats


def test_a_draft_slower_than_its_price_is_stopped_and_the_tokens_stay_the_targets(monkeypatch):
    """The draft is slowed by a sleep in its forward that the chooser's price of a draft forward (measured on
    the bare model before the generation) does not hold, and its drafts are always right (the target itself):
    by the model drafting pays; by the clock each drafted step takes far longer than a plain one for its tokens.
    The guard makes most steps plain; the output is the target's. Drafts are long (the chooser believes them
    free) and the judge waits for 3 drafted steps, so the generation is long enough for the plain steps to follow."""
    target = random_lm(seed=5, logit_scale=20.0)
    draft = random_lm(seed=5, logit_scale=20.0)
    ids = repeating_prompt(30, 5, target.config.vocab_size)
    reference = generate("hf", target, ids, 192).new_tokens
    cheap = C.CostCurve.from_points({1: 0.01, 64: 0.02})  # what the chooser believes a draft forward costs
    original = draft.forward

    def slow(*args, **kwargs):
        time.sleep(0.02)  # the hidden cost: far beyond a plain step of this small target
        return original(*args, **kwargs)

    monkeypatch.setattr(draft, "forward", slow)
    result = generate("draft_model", target, ids, 192, draft=draft, gamma="auto", draft_costs=cheap)
    assert result.new_tokens == reference
    steps = result.stats["steps"]
    plain = sum(s["tree_size"] == 0 for s in steps[1:])
    assert result.stats["guard_vetoed"] >= 0.5 * (len(steps) - 1), result.stats
    assert plain >= 0.5 * (len(steps) - 1)
    assert result.stats["guard_gain"] < 1.0  # what the clock said: drafting lost


@pytest.mark.parametrize("method, kwargs", [
    ("prompt_lookup", dict(num_tokens="auto")), ("draft_model", dict(gamma="auto")),
    ("draft_model", dict(gamma="auto", topk=4)), ("cacheback", dict(tdl="auto")),
    ("lookahead", dict(guesses="auto")), ("fafo", dict(candidates="auto")), ("eagle", dict(budget="auto"))])
def test_a_step_the_guard_stops_is_plain_in_every_method(tiny_pair64, tiny_pair, monkeypatch, method, kwargs):
    """While the guard stops drafting, each method's step verifies no draft and runs no side rows (a window, fumble
    streams), and its chooser is not asked; the tokens are the target's."""
    from specdec_lib.mechanisms.budget import facade

    seen = []

    class Stopped(Guard):
        def __init__(self):
            super().__init__()
            self.allowed = False

        def record(self, drafted, tokens):
            seen.append(drafted)
            self.allowed = False

    monkeypatch.setattr(facade, "Guard", Stopped)
    target, draft, _ = tiny_pair64
    ids = tiny_pair.encode("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fib")
    reference = generate("hf", target, ids, 24).new_tokens
    result = generate(method, target, ids, 24, draft=draft, debug=True, **kwargs)
    assert result.new_tokens == reference
    assert seen and not any(seen), seen
    assert all(s["tree_size"] == 0 for s in result.stats["steps"])


def test_card_times_plain_steps_before_drafting_so_a_busy_curve_keeps_no_slow_draft(monkeypatch):
    """CARD's width="auto" judges its drafted steps against plain ones. A curve measured while the machine was
    busier prices a plain step far too high (here 1 s); were that price the reference, a slow draft (a sleep in
    its forward) would look as if it paid and draft on. On a measured curve the first steps after the prompt's are
    plain and timed, so drafting stops after its first trial; the tokens stay the target's."""
    from specdec_lib.mechanisms.budget import facade
    from specdec_lib.methods.card import PLAIN_FIRST

    target, draft = random_lm(seed=5, logit_scale=20.0), random_lm(seed=9, layers=1)
    ids = repeating_prompt(30, 5, target.config.vocab_size)
    reference = generate("hf", target, ids, 64).new_tokens
    busy = C.CostCurve.from_points({1: 1000.0, 128: 1001.0})
    monkeypatch.setattr(facade, "resolve_curve", lambda costs, model, upto=0: busy)  # "measured", but busy
    original = draft.forward

    def slow(*args, **kwargs):
        time.sleep(0.02)  # far beyond a plain step of this small target
        return original(*args, **kwargs)

    monkeypatch.setattr(draft, "forward", slow)
    result = generate("card", target, ids, 64, draft=draft)
    assert result.new_tokens == reference
    steps = result.stats["steps"]
    assert all(s["tree_size"] == 0 for s in steps[1:1 + PLAIN_FIRST])  # timed before anything drafts
    assert result.stats["plain_step_ms"] < 100  # what a plain step took here, not the curve's 1000 ms
    assert result.stats["plain_steps"] >= 0.8 * result.target_forwards, result.stats["plain_steps"]


def test_card_prices_a_plain_step_at_its_fastest_recent_one_and_times_it_again(monkeypatch):
    """One slow plain step among the few CARD times (a hiccup of the machine: 0.3 s) must not price every later
    plain step: a decayed mean started there would let a slow draft draft on; the fastest of the last PLAIN_KEEP
    does not. And while drafting runs on, a plain step is timed again every REFERENCE_EVERY drafted steps."""
    from specdec_lib.mechanisms.budget import facade
    from specdec_lib.methods import card as card_module

    target, draft = random_lm(seed=5, logit_scale=20.0), random_lm(seed=9, layers=1)
    ids = repeating_prompt(30, 5, target.config.vocab_size)
    reference = generate("hf", target, ids, 64).new_tokens
    cheap = C.CostCurve.from_points({1: 1.0, 128: 2.0})
    monkeypatch.setattr(facade, "resolve_curve", lambda costs, model, upto=0: cheap)
    original_target, original_draft, calls = target.model.forward, draft.forward, [0]

    def hiccup(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 2:  # the first plain step after the prompt's
            time.sleep(0.3)
        return original_target(*args, **kwargs)

    def slow(*args, **kwargs):
        time.sleep(0.02)
        return original_draft(*args, **kwargs)

    monkeypatch.setattr(target.model, "forward", hiccup)  # the loop reads the target's last hidden states
    monkeypatch.setattr(draft, "forward", slow)
    result = generate("card", target, ids, 64, draft=draft)
    assert result.new_tokens == reference
    assert result.stats["plain_step_ms"] < 100, result.stats["plain_step_ms"]
    assert result.stats["plain_steps"] >= 0.8 * result.target_forwards, result.stats["plain_steps"]

    monkeypatch.setattr(target.model, "forward", original_target)
    monkeypatch.setattr(draft, "forward", original_draft)
    monkeypatch.setattr(card_module, "REFERENCE_EVERY", 3)
    # "measured" at a second a plain step, none timed first: drafting pays until a reference step is timed
    busy = C.CostCurve.from_points({1: 1e3, 128: 2e3})
    monkeypatch.setattr(facade, "resolve_curve", lambda costs, model, upto=0: busy)
    monkeypatch.setattr(card_module, "PLAIN_FIRST", 0)
    paying = generate("card", target, ids, 64, draft=draft)
    assert paying.new_tokens == reference
    drafted = "".join("d" if s["tree_size"] else "." for s in paying.stats["steps"][2:])
    assert "dddd" not in drafted and "ddd" in drafted, drafted


def test_the_guard_and_its_chooser_probe_on_one_allowance():
    """The guard's trials and the chain chooser's own probes (while the guard is on) draw on one allowance (each
    had its own before). A probe that is due waits while the guard's ledger is spent; and over a draft that never
    pays, on a scripted clock, the ledger is every drafted step's loss against plain steps, which stays within the
    share of the plain time, plus the first trial's."""
    clock = Clock()
    curve = C.CostCurve.from_points({1: 10.0, 2: 11.0, 16: 20.0})
    guard = Guard(clock=clock)
    guard.record(False, 1)  # the prefill's step
    for drafted, tokens, ms in ((False, 1, 10.0), (True, 1, 100.0)):  # a plain step, then a drafted one losing 90 ms
        clock.now += ms / 1e3
        guard.record(drafted, tokens)
    assert guard.allowed and guard.lost == pytest.approx(90.0) and not guard.affords(0.0)
    choices = {}
    for shared in (True, False):
        chain = ChainBudget(curve, max_len=4, draft_ms=lambda g: 4.0 * g)
        chain.affords = guard.affords if shared else None
        choices[shared] = [chain.choose(None, context=64) for _ in range(200)]
    assert not any(choices[True]) and any(choices[False])  # the same chooser alone probes

    clock = Clock()
    chain = ChainBudget(curve, max_len=4, draft_ms=lambda g: 4.0 * g)
    guard = Guard(clock=clock)
    chain.affords = guard.affords
    guard.record(False, 1)  # the prefill's step
    lost, plain_time = [], 0.0
    for _ in range(1500):
        g = chain.choose(None, context=64) if guard.allowed else 0
        ms = 4.0 * g + curve(g + 1)  # the draft's forwards, then the verify of g + 1 rows; nothing accepted
        if g:
            chain.record(g, 0)
            lost.append(ms - 10.0)
        plain_time += 10.0
        clock.now += ms / 1e3
        guard.record(g > 0, 1)
    first_trial = sum(lost[:guard.judge_after])
    assert len(lost) > guard.judge_after + 2  # it is tried again now and then
    assert sum(lost) - first_trial <= 0.03 * plain_time + max(lost), (sum(lost), plain_time, len(lost))
    assert guard.stats()["guard_lost_ms"] == pytest.approx(sum(lost), abs=0.1)
