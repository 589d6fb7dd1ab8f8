"""Side rows on or off (`SideBudget`): rows that draft nothing themselves but feed a pool (Lookahead's Jacobi
window, FAFO's fumble streams), or drafting at all (CARD's drafter), run only while they pay, and trying them costs
a bounded share of the time (choosers.TRIAL_SHARE). The class doc says how a step without them is counted.
"""
from __future__ import annotations

from ...env import check_int
from .choosers import TRIAL_SHARE, trial_wait, tree_yield


class SideBudget:
    """Whether a method's side rows pay for themselves: Lookahead's Jacobi window, FAFO's fumble streams. Those
    rows emit nothing; they fill a pool whose guesses later steps verify, so a step cannot show what they
    yield. What can be counted exactly is the step WITHOUT them: the tree the method would have verified from
    the text's own n-grams alone (a pool fed only by the text, kept beside the real one) and what it would have
    yielded on the emitted path (`tree_yield`, censored counts + half a token). With the side rows on, each step
    records (tokens, ms) both ways, ms read off the cost curve at the step's context; they stay on while

        decayed sum(tokens on) / sum(ms on)  >=  decayed sum(tokens off) / sum(ms off),

    decided every step from the `warmup`-th on (the window fills its levels first). Once off, the side rows are
    not run (a plain step, or text guesses only) and, after `probe_every` steps, switched on for `probe_len`
    steps to look again; the sums decay on the off steps too, so a probe judges the text as it is now.

    What trying costs is bounded (`trial_share`, a share of the time): a trial (the warm-up, a probe) LOSES the ms
    its steps took beyond what the steps without the side rows would have taken for the same tokens,

        lost = sum(ms on) - sum(tokens on) x sum(ms off) / sum(tokens off)     (this trial's steps, undecayed),

    and ends, off, as soon as one more step losing its steps' mean would pass its allowance (so it never overshoots
    by a step): `trial_share` x the plain time of the `horizon` tokens the generation makes (the warm-up; none
    given: no allowance), or `trial_share` x the plain time of the steps run off since the last trial (a probe).
    The next probe waits until `trial_share` of the plain time of every step so far and until then covers what
    every trial lost, the next one's expected loss (the last trial's per step x `probe_len`) included: the
    warm-up's allowance is the whole horizon's, so a probe does not add its own on top. Where the side rows cost
    about as much as a whole plain step (many fumble rows where extra rows are dear), the warm-up ends after a step
    or two and probes are rare; where side rows are nearly free, nothing changes.

    `side_rows`, when given, (full rows, rows that read only the compressed KV) a step with the side rows adds: the
    step's loss, their price over a plain step (`price`), is known before any step is run. A warm-up of `warmup`
    steps that would lose more than its allowance unless the side rows paid from its first steps cannot reach its
    verdict (FAFO's stream guesses are found k steps on), so it is not run: the side rows start off, and the first
    probe waits, as every later one, for its expected loss (`probe_len` x that step loss) to be covered. Under a
    guard a probe also waits for the generation's one allowance (`affords`, guard.py), shared with the guard's
    trials and the chooser's probes."""

    def __init__(self, costs, context: int = 0, cheap_context: int | None = None, probe_every: int = 48,
                 probe_len: int = 12, warmup: int = 12, decay: float = 0.97, horizon: int | None = None,
                 trial_share: float | None = TRIAL_SHARE, side_rows: tuple[int, int] | None = None):
        self.costs, self.curve = costs, costs.at(context)
        self.cheap = None if cheap_context is None else costs.at(cheap_context)
        self.probe_every = check_int("probe_every", probe_every, 1)
        self.probe_len = check_int("probe_len", probe_len, 1)
        if trial_share is not None and not 0 < trial_share < 1:
            raise ValueError(f"trial_share is a share of the time, in (0, 1), or None; got {trial_share!r}")
        self.warmup, self.decay, self.trial_share = warmup, decay, trial_share
        self.horizon = None if horizon is None else check_int("horizon", horizon, 1)
        self.on, self.steps, self.off_run, self.probe_left = True, 0, 0, 0
        self.sums = [0.0, 0.0, 0.0, 0.0]  # tokens on, ms on, tokens off, ms off
        self.on_steps = 0  # steps run with the side rows
        self.trial = [0.0, 0.0, 0.0, 0.0]  # the same sums over this trial's steps, undecayed
        self.trial_steps, self.in_trial, self.allowance = 0, True, None  # the warm-up is the first trial
        self.next_probe = probe_every  # off steps before the next probe
        self.plain_ms = None  # ms of a step without the side rows, over the last trial
        self.cut_short = 0  # trials ended by their allowance
        self.lost_total = 0.0  # what every trial so far lost (ms)
        self.skipped = False  # the warm-up was not run (side_rows: it could not reach its verdict)
        self.probe_loss = 0.0  # what the next probe is expected to lose (ms)
        self.affords = None  # the generation's one trial allowance, where a guard keeps it (Guard.affords)
        if side_rows is not None and trial_share is not None and self.horizon is not None:
            plain = self.price(1)  # ms of a step without side rows, before one is run
            step_loss = self.price(1 + side_rows[0], side_rows[1]) - plain
            if warmup * max(0.0, step_loss) > trial_share * self.horizon * plain:
                self.on, self.in_trial, self.skipped, self.plain_ms = False, False, True, plain
                self.probe_loss = probe_len * step_loss
                self.next_probe = trial_wait(probe_every, self.probe_loss, plain, trial_share)

    def choose(self, context: int | None = None) -> bool:
        """Run the side rows this step? (the curve read at `context` tokens)."""
        if context is not None:
            self.curve = self.costs.at(context)
        self.steps += 1
        if not self.on:
            self.sums = [self.decay * x for x in self.sums]
            self.off_run += 1
            if self.off_run >= self.next_probe and (self.affords is None or self.affords(self.probe_loss)):
                self.on, self.probe_left = True, self.probe_len
                self._start_trial(self.off_run)
        self.on_steps += self.on
        return self.on

    def _start_trial(self, off_steps: int) -> None:
        self.trial, self.trial_steps, self.in_trial = [0.0, 0.0, 0.0, 0.0], 0, True
        self.allowance = (None if self.trial_share is None or self.plain_ms is None
                          else self.trial_share * off_steps * self.plain_ms)

    def price(self, rows: int, cheap_rows: int = 0) -> float:
        """ms of a step of `rows` full rows plus `cheap_rows` rows that read the compressed KV only."""
        ms = self.curve(rows)
        if cheap_rows:
            ms += self.cheap(rows + cheap_rows) - self.cheap(rows)
        return ms

    def record(self, tokens: float, ms: float, plain_tokens: float, plain_ms: float) -> None:
        """A step run with the side rows: its (tokens, ms), and the step without them, (plain_tokens, plain_ms)."""
        self.sums = [self.decay * x for x in self.sums]
        for i, x in enumerate((tokens, ms, plain_tokens, plain_ms)):
            self.sums[i] += x
            self.trial[i] += x
        self.trial_steps += 1
        if self.in_trial and self._over_allowance():  # trying costs more than it may: off now
            self.cut_short += 1
            self._off()
            return
        if self.probe_left:
            self.probe_left -= 1
            if self.probe_left:
                return
        if self.on_steps >= self.warmup:
            self.on = self.sums[0] * self.sums[3] >= self.sums[2] * self.sums[1]
            if self.on:
                self.in_trial = False  # it pays: no longer a trial
            else:
                self._off()

    def lost(self) -> float:
        """ms this trial's steps took beyond the steps without the side rows, for the same tokens."""
        tokens, ms, plain_tokens, plain_ms = self.trial
        return ms - tokens * plain_ms / plain_tokens if plain_tokens else 0.0

    def _over_allowance(self) -> bool:
        if self.trial_share is None:
            return False
        if self.allowance is None and self.horizon is not None and self.trial[2]:  # the warm-up's
            self.allowance = self.trial_share * self.horizon * self.trial[3] / self.trial[2]
        # off once the next step, losing what this trial's did on average, would pass the allowance: a trial whose
        # steps each lose a plain step or two would otherwise overshoot it by a whole step
        lost = self.lost()
        return self.allowance is not None and lost + max(0.0, lost) / max(1, self.trial_steps) > self.allowance

    def _off(self) -> None:
        """Switch the side rows off; the next probe when the plain steps' allowance covers what a probe loses."""
        self.on, self.off_run, self.probe_left, self.in_trial = False, 0, 0, False
        if self.trial_steps:
            self.plain_ms = self.trial[3] / self.trial_steps
        lost = max(0.0, self.lost())
        self.lost_total += lost
        self.probe_loss = self.probe_len * lost / max(1, self.trial_steps)
        expected = self.lost_total + self.probe_loss
        # steps from the first: the share covers every trial's loss, not each trial's apart
        self.next_probe = trial_wait(self.probe_every, expected, self.plain_ms, self.trial_share, self.steps)

    @property
    def gain(self) -> float | None:
        """Tokens per ms with the side rows over without them (None before any step)."""
        if not (self.sums[1] and self.sums[2] and self.sums[3]):
            return None
        return (self.sums[0] / self.sums[1]) / (self.sums[2] / self.sums[3])

    def stats(self) -> dict:
        return dict(side_on_steps=self.on_steps, side_gain=None if self.gain is None else round(self.gain, 3),
                    side_trials_cut=self.cut_short, side_warmup_skipped=self.skipped)


def text_tree_yield(tree, emitted) -> float:
    """What the side-row-free tree would have yielded (a censored count + half a token, TreeBudget's prior)."""
    tokens, censored = tree_yield(tree, emitted)
    return tokens + 0.5 * censored
