"""What the clock says decides (`Guard`): whatever an "auto" budget predicts, drafting stops where it does not pay.

A chooser picks its budget from a model of the machine and the text: a cost curve measured once, acceptance
counted per depth, a draft forward's price. On a task unlike those its priors and schedules were chosen on, that
model can be wrong in ways its own counts cannot see (a draft's catch-up and rollback, cache bookkeeping, Python
between forwards, a thread beside the target), and the generation decodes slower than plain steps would. The
guard reads the realised throughput instead: the wall time from one step's start to the next (drafting, the
target's forward, the verdict, the commit, the method's update) and the tokens each step emitted, drafted steps
and plain steps apart. Drafting goes on while

    decayed sum(tokens, drafted steps) / sum(ms, drafted steps)  >=  (1 + margin) / (decayed mean ms of a plain step)

judged after `judge_after` drafted steps of a trial, then at every drafted step. The `margin` is there because
both sides are noisy estimates: drafting that only breaks even gains nothing, and one that looks like it on a few
steps may lose a few % over the generation (a busy CPU's steps vary by more than that). When it does not hold the method
takes plain steps (its chooser is not asked: `Budget.choose` says the plain size, side rows stay off) until the
next trial, after `probe_every` steps or more. One allowance bounds every trial of a generation, the guard's, its
chooser's probes and a SideBudget's (`affords`): a trial starts only while what every drafted step so far lost
against plain ones (gains count too), its expected loss added, stays within `trial_share` of the plain time of
the tokens so far. A plain step's time is measured, not priced: without one in the last `reference_every` steps
(or none yet, once a trial has drafted), the next step is plain.

Only for "auto" budgets under greedy decoding: a fixed budget is honoured exactly, and under sampling a choice
may not follow the machine's speed (a seed reproduces its tokens). Left out: judging each budget size apart (the
chooser does that); the prefill step (it is no step of the comparison).
"""
from __future__ import annotations

import time

from ...env import check_int
from .choosers import TRIAL_SHARE


class Guard:
    """Realised tokens per ms of drafted steps against plain ones (see the module doc). `record(drafted, tokens)`
    ends a step (a step runs from the end of the last record to the end of this one: the method's update after
    its record, the next proposal, the forward, the verdict); `allowed` says whether the next step may draft."""

    def __init__(self, judge_after: int = 3, reference_every: int = 32, probe_every: int = 16,
                 decay: float = 0.9, trial_share: float | None = TRIAL_SHARE, margin: float = 0.03,
                 clock=time.perf_counter):
        self.judge_after = check_int("judge_after", judge_after, 1)
        self.reference_every = check_int("reference_every", reference_every, 2)
        self.probe_every = check_int("probe_every", probe_every, 1)
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {margin!r}")
        self.decay, self.trial_share, self.margin, self.clock = decay, trial_share, margin, clock
        self.drafted = [0.0, 0.0]  # decayed (tokens, ms) of this trial's drafted steps
        self.plain_ms: float | None = None  # decayed mean of the plain steps' ms
        self.trial = [0, 0.0, 0.0]  # this trial's drafted steps, tokens, ms (undecayed: what it lost)
        self.on, self.off_run = True, 0
        self.since_plain = 0  # drafted steps since the last plain one
        self.allowed = True  # may the next step draft
        self.vetoed = self.references = self.trials = 0  # steps the guard made plain; of them, references
        self.tokens = 0.0  # the tokens of the steps compared so far
        self.spent = [0.0, 0.0]  # every drafted step's tokens, ms (undecayed: what drafting lost or gained)
        self.next_loss = 0.0  # what the next trial is expected to lose (ms): the last one's loss
        self._last: float | None = None  # when the last step ended (None: before the prefill's end)

    def record(self, drafted: bool, tokens: int) -> None:
        """A step ended: it drafted (rows beyond a plain step's) or not, and emitted `tokens`."""
        now = self.clock()
        self.vetoed += not self.allowed
        self.references += self.on and not self.allowed
        if self._last is not None:  # the prefill's step is not compared
            self._account(drafted, tokens, 1e3 * (now - self._last))
        self._last = now
        if not self.on:
            self.off_run += 1
            if self.off_run >= self.probe_every and self.affords(self.next_loss):  # a new trial, on its own steps
                self.on, self.trial, self.drafted = True, [0, 0.0, 0.0], [0.0, 0.0]
                self.trials += 1
        reference = self.on and (self.since_plain >= self.reference_every
                                 or (self.plain_ms is None and self.trial[0] > 0))
        self.allowed = self.on and not reference

    def _account(self, drafted: bool, tokens: int, ms: float) -> None:
        self.tokens += tokens
        if not drafted:
            self.since_plain = 0
            self.plain_ms = ms if self.plain_ms is None else self.decay * self.plain_ms + (1 - self.decay) * ms
            return
        self.since_plain += 1
        self.spent = [self.spent[0] + tokens, self.spent[1] + ms]
        self.drafted = [self.decay * self.drafted[0] + tokens, self.decay * self.drafted[1] + ms]
        self.trial = [self.trial[0] + 1, self.trial[1] + tokens, self.trial[2] + ms]
        if self.on and self.plain_ms is not None and self.trial[0] >= self.judge_after:
            # fewer tokens per ms than plain steps by the margin
            if self.drafted[0] * self.plain_ms < (1 + self.margin) * self.drafted[1]:
                self._off()

    def _off(self) -> None:
        # the next trial is expected to lose what this one did: ms beyond plain steps' for its tokens
        self.next_loss = max(0.0, self.trial[2] - self.trial[1] * self.plain_ms)
        self.on, self.off_run = False, 0

    @property
    def lost(self) -> float:
        """ms every drafted step so far took beyond plain steps for the same tokens (< 0: drafting gained)."""
        return 0.0 if self.plain_ms is None else self.spent[1] - self.spent[0] * self.plain_ms

    def affords(self, expected_ms: float) -> bool:
        """May a trial expected to lose `expected_ms` start now: does what drafting lost so far, plus that, stay
        within `trial_share` of the plain time of the tokens so far? (Yes before a plain step is timed.)"""
        if self.trial_share is None or self.plain_ms is None:
            return True
        return self.lost + max(0.0, expected_ms) <= self.trial_share * self.tokens * self.plain_ms

    @property
    def gain(self) -> float | None:
        """Realised tokens per ms of drafted steps over plain ones (None before both are measured)."""
        if self.plain_ms is None or not self.drafted[1]:
            return None
        return self.drafted[0] / self.drafted[1] * self.plain_ms

    def stats(self) -> dict:
        gain = self.gain
        return dict(guard_gain=None if gain is None else round(gain, 3), guard_vetoed=self.vetoed,
                    guard_references=self.references, guard_trials=self.trials,
                    guard_lost_ms=round(self.lost, 1))
