"""The choosers behind an "auto" `Budget` (facade.py): a chain's length (`ChainBudget`), a tree's size (`TreeBudget`).

Each step a chooser picks the budget b with the best expected throughput on this machine,

    budget* = argmax_b  E[tokens per step | b] / (draft_ms(b) + t(rows(b)))

t what one loop step of that many rows costs here at the current context (cost_curve.py), E[tokens] from the
method's running acceptance statistics. b = 0 (a plain step) is a candidate, so where no draft pays the method
decodes plainly, probing a draft again after `probe_every` steps or more (probes lose at most TRIAL_SHARE of the
time). The choice depends on the history and the curve only, never on the random stream: the budget changes what
is drafted, never what is emitted, and an injected curve (`CostCurve.from_points`) gives the same choices each run.

- `ChainBudget` (draft model, prompt lookup, CARD's query): P(accept depth d | depth d reached) counted online,
  decaying, shrunk toward the pooled rate; E[tokens | g] = 1 + sum_{d=1..g} prod_{j<=d} a_j (Leviathan's formula
  without the i.i.d. a). Deeper depths are explored by a UCB-like bonus (no coin) among the depths within
  EXPLORE_LOSS of the best; whether to draft at all is judged on the counts without the bonus.
- `TreeBudget` (Cacheback's TDL, Lookahead's guesses, FAFO's find-out rows; EAGLE's head judges its own trees,
  confidence.py): a ladder of sizes compared on the same steps. The proposer regrows its neighbours' trees and
  `tree_yield` reads what each would have yielded off the emitted path (exact, or a lower bound); a larger size is
  verified now and then (a deterministic probe).
`MeasuredSteps` corrects the curve by what the loop's steps took; rows that read only a compressed KV (FAFO's
fumble rows: `cheap_rows`) are priced on the curve at the compressed length.

Left out: the n-gram drafters' drafting time (taken as zero, microseconds against a forward's milliseconds; a
draft model prices its own, `draft_ms`); acceptance is modelled per depth only, not per context.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ...env import check_int

# a chain's per-depth counts forget at this rate per verified step (an effective memory of about 20 steps)
CHAIN_DECAY = 0.95
# a chain's acceptance before any evidence (weight: `strength` steps): a weak pair's rate, so that a draft
# proves itself; a hopeful prior has a weak draft draft long chains for its first steps, which lose time before
# the counts catch up
CHAIN_PRIOR = 0.3
# the most a chain's optimistic depth may lose against the depth the counts alone pick, per drafted step
EXPLORE_LOSS = 0.1
# the share of the time a budget's trials may lose (SideBudget's warm-up and probes, the choosers' probes)
TRIAL_SHARE = 0.03
# how fast a budget's per-row-count correction of the curve moves to what the loop's steps took (MeasuredSteps)
COST_RATE = 0.2


def trial_wait(probe_every: int, lost_ms: float, step_ms: float | None, share: float | None,
               elapsed: int = 0) -> int:
    """Steps before the next trial (a probe): `probe_every`, or more, so that `share` of the time of the steps in
    between (`step_ms` each) covers what the trial is expected to lose (`lost_ms`). Every chooser's probes wait so.
    `elapsed`: steps already run that count toward the same allowance (lost_ms then holds every trial's loss)."""
    if share is None or not step_ms:
        return probe_every
    return max(probe_every, int(np.ceil(lost_ms / (share * step_ms))) - elapsed)


class MeasuredSteps:
    """What the loop's steps took against the curve, per row count: a factor that multiplies the curve's price of
    a step (`factor`). The curve times a bare forward; a loop step adds its mask, walk, commit and Python, more
    for more rows than the curve says, and that gap can decide whether a weak draft pays. A row count not run yet gets
    the mean factor of those run (the machine's speed now); a factor starts there and moves at COST_RATE, so one
    slow step does not condemn a row count."""

    def __init__(self):
        self.scale: dict[int, float] = {}  # rows -> measured / curve ms

    def factor(self, rows: float) -> float:
        value = self.scale.get(int(round(rows)))  # read for every candidate of every step: the mean only if unseen
        return value if value is not None else self._usual(1.0)

    def _usual(self, default: float) -> float:
        return sum(self.scale.values()) / len(self.scale) if self.scale else default

    def record_ms(self, rows: int, ms: float, curve_ms: float) -> None:
        ratio = ms / max(curve_ms, 1e-9)
        old = self.scale.get(rows, self._usual(ratio))
        self.scale[rows] = old + COST_RATE * (ratio - old)


class PricedSteps:
    """What a chooser's steps cost: its curve at the current context (`self.curve`), times what the loop's steps of
    that many rows took against it (`self.measured`, MeasuredSteps). ChainBudget, TreeBudget and
    confidence.ConfidenceBudget price their candidates so, and Budget.record hands them the loop's timings."""

    curve: Callable[[float], float]
    measured: MeasuredSteps
    cheap_rows = 0  # rows every step pays that read only a compressed KV (TreeBudget: FAFO's fumble rows)

    @property
    def learns_costs(self) -> bool:
        """Whether the loop's step timings correct the curve (not for steps with cheap rows: the curve prices
        those apart)."""
        return not self.cheap_rows

    def stats(self) -> dict:
        """The curve chosen from last (at the generation's last context) and every curve read (ContextCosts)."""
        return dict(curve=repr(self.curve), costs=repr(self.costs))

    def step_ms(self, rows: float) -> float:
        """A verify step of `rows` rows: the curve, times what the loop's steps of that many rows took against it
        (a factor of 1 until some are recorded)."""
        return self.curve(rows) * self.measured.factor(rows)

    def record_ms(self, rows: int, ms: float) -> None:
        """One step of the loop with `rows` rows took `ms` (forward, verdict, commit): see MeasuredSteps."""
        self.measured.record_ms(rows, ms, self.curve(rows))


class ChainBudget(PricedSteps):
    """Chain length g from per-depth acceptance (see the module doc). draft_ms(g): the drafting time of g.
    plain: g = 0 (no draft) is a candidate; after `probe_every` plain steps in a row, one step drafts the best
    g >= 1 (a probe: a plain step teaches nothing about acceptance, unless the proposer reads the chain it would
    have drafted against the text emitted after it, `Budget.record_unverified`; probes still time the rows). A
    probe loses, by the estimates without the optimism, draft_ms(g) + t(g + 1) - E[tokens | g] x t(1); it waits
    until `trial_share` of the plain steps' time since the last one covers that (where a drafted step costs far
    more than a plain one, probes come more rarely than every `probe_every`), and, under a guard, until the
    generation's one allowance affords it (`affords`, guard.py)."""

    def __init__(self, curve, max_len: int = 16, draft_ms: Callable[[int], float] | None = None,
                 prior: float = CHAIN_PRIOR, strength: float = 2.0, explore: float = 0.25, plain: bool = True,
                 probe_every: int = 16, trial_share: float | None = TRIAL_SHARE, decay: float = CHAIN_DECAY):
        self.costs, self.max_len = curve, check_int("max_len", max_len, 1)  # a CostCurve or a ContextCosts
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        self.decay = decay
        self.curve = curve.at(0)
        self.draft_ms = draft_ms or (lambda g: 0.0)
        self.prior, self.strength, self.explore = prior, strength, explore
        self.plain, self.probe_every = plain, check_int("probe_every", probe_every, 1)
        self.trial_share = trial_share
        self.plain_run = 0  # plain steps chosen in a row (since the last probe)
        self.affords: Callable[[float], bool] | None = None  # the generation's one trial allowance (Guard.affords)
        self.gain = None  # the last choice's expected tokens/ms over a plain step's
        self.measured = MeasuredSteps()  # what the loop's steps took against the curve (record_ms)
        self.reached = np.zeros(max_len + 1)  # index d: steps whose chain had a node at depth d reaching it
        self.accepted = np.zeros(max_len + 1)

    def rates(self, optimistic: bool = False) -> np.ndarray:
        """a_d for d = 1..max_len, shrunk toward the pooled rate (itself shrunk toward `prior`); optimistic:
        plus explore / sqrt(1 + times reached), so depths seldom reached get tried (the pooled rate leans on
        depth 1, where acceptance is lowest, and would keep chains short)."""
        pooled = (self.accepted.sum() + self.prior * self.strength) / (self.reached.sum() + self.strength)
        rates = (self.accepted + pooled * self.strength) / (self.reached + self.strength)
        if optimistic:
            rates = np.minimum(1.0, rates + self.explore / np.sqrt(1.0 + self.reached))
        return rates[1:]

    def expected_tokens(self, optimistic: bool = False) -> np.ndarray:
        """E[tokens | g] for g = 0..max_len (index g)."""
        return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(self.rates(optimistic)))])

    def choose(self, limit: int | None = None, context: int | None = None) -> int:
        """argmax_g E[tokens | g] / (draft_ms(g) + t(g + 1)), g in 0..min(max_len, limit) (0 only if `plain`),
        t at `context` tokens (None: where it was last); ties: the smallest."""
        if context is not None:
            self.curve = self.costs.at(context)
        top = self.max_len if limit is None else max(1, min(self.max_len, limit))
        step_ms = np.array([self.draft_ms(g) + self.step_ms(g + 1) for g in range(0, top + 1)])
        # the optimism picks how deep to draft; whether to draft at all is judged without it, so a draft that the
        # counts say loses is not kept up by its bonus: a plain step wins ties, and probes (bounded by
        # trial_share) keep testing that verdict
        speed = self.expected_tokens(optimistic=True)[:top + 1] / step_ms  # (top + 1,)
        sure = self.expected_tokens()[:top + 1] / step_ms
        # exploring costs at most EXPLORE_LOSS of a drafted step by the counts: after one lucky opening the
        # optimism alone would pick the longest chain, a step far dearer than a plain one
        allowed = sure[1:] >= (1.0 - EXPLORE_LOSS) * sure[1:].max()
        g = 1 + int(np.argmax(np.where(allowed, speed[1:], -np.inf)))
        if self.plain and sure[0] >= sure[1:].max():
            self.plain_run += 1
            if self.plain_run < self.probe_wait(g) or not (self.affords is None or self.affords(self.probe_loss(g))):
                g = 0
            else:  # a probe at g
                self.plain_run = 0
        else:
            self.plain_run = 0
        self.gain = sure[g] / sure[0]
        return g

    def plan(self, context: int, limit: int | None = None) -> tuple[int, list[int]]:
        """The Chooser protocol (budget/facade.py): this step's chain length, nothing to regrow."""
        return self.choose(limit, context), []

    def learn(self, verdict) -> None:
        """The Chooser protocol: a drafted chain's depths reached and accepted (a plain step shows nothing)."""
        if len(verdict.proposal.tree):
            self.record(len(verdict.proposal.tree), len(verdict.accepted))

    def probe_loss(self, g: int) -> float:
        """ms a probe at g is expected to lose against a plain step, by the counts without the optimism."""
        return self.draft_ms(g) + self.step_ms(g + 1) - self.expected_tokens()[g] * self.step_ms(1)

    def probe_wait(self, g: int) -> int:
        """Plain steps before a probe at g: `probe_every`, or more where the probe's expected loss needs them."""
        if self.trial_share is None:
            return self.probe_every
        return trial_wait(self.probe_every, self.probe_loss(g), self.step_ms(1), self.trial_share)

    def record(self, drafted: int, accepted: int) -> None:
        """One verified chain: depths 1..accepted accepted, depth accepted + 1 reached and rejected (if drafted)."""
        drafted = min(drafted, self.max_len)
        reached = min(accepted + 1, drafted)
        self.reached *= self.decay  # older steps count less: acceptance follows the text (an answer's opening
        self.accepted *= self.decay  # lines are easy, its body is not), and the counts should follow it too
        self.reached[1:reached + 1] += 1
        self.accepted[1:min(accepted, drafted) + 1] += 1


class TreeBudget(PricedSteps):
    """A ladder of tree-size candidates with counterfactual yields (see the module doc).

    Each step the proposer regrows, besides the verified tree, the trees of the `window` next smaller and the
    `above` next larger candidates and reports what each would have yielded (`tree_yield`): exact for the
    smaller ones, and for a larger one exact too unless it holds the whole emitted path, next token included
    (then its yield is at least one more: the bound + a learnt mean extra is recorded, see `record`). Every
    `probe_every` steps the next larger candidate is verified instead (a probe).

    Yields swing with the text far more than between neighbouring budgets, so candidates are compared on the
    same steps: a candidate's estimate is a ratio estimator, (decayed sum of its yields) / (decayed sum of the
    verified tree's yields on those same steps) x the verified yield's running mean, shrunk by one pseudo-step
    toward the ratio 1. The verified candidate is the best estimated speed, kept unless another beats it by
    `margin` (hysteresis: switching on noise costs more than it gains). Before any data: the largest candidate
    whose step costs at most `free` more than a one-row step (on a GPU often the largest; on a CPU a small one),
    but not below `first` (given when the smallest candidates draft nothing: a plain step yields no counterfactual
    to learn from at the start); the chooser falls below it, when drafting costs more than it yields, only after
    `probe_every` steps of evidence (one unlucky first step would otherwise stop the drafting), or sooner once
    those steps lost, by the estimates, `trial_share` of the plain time of the `horizon` tokens asked for. A probe is
    expected to lose, by the estimates, ms(k + 1) - tokens(k + 1) x ms(k) / tokens(k) against the verified
    candidate k; it waits, beyond `probe_every` steps, until `trial_share` of the steps' time since the last one
    covers that (as ChainBudget's probes).

    `curve` is a CostCurve or a ContextCosts read at `context` (the prompt's length at first, then what `choose`
    is given); `cheap_rows` rows every step pays that read only `cheap_context` cached tokens (FAFO's fumble rows
    on C(kv)) are priced on the curve there: what they add to a step of r full rows is
    t_cheap(r + cheap_rows) - t_cheap(r)."""

    def __init__(self, curve, candidates: Sequence[int], probe_every: int = 16, window: int = 1,
                 above: int = 1, decay: float = 0.97, free: float = 0.15, margin: float = 0.03,
                 decide_every: int = 2, draft_ms: Callable[[int], float] | None = None, context: int = 0,
                 cheap_rows: int = 0, cheap_context: int = 0, first: int | None = None,
                 trial_share: float | None = TRIAL_SHARE, horizon: int | None = None):
        self.costs, self.candidates = curve, sorted(set(int(c) for c in candidates))
        self.curve = curve.at(context)
        self.measured = MeasuredSteps()  # what the loop's steps took against the curve (record_ms)
        self.cheap_rows = check_int("cheap_rows", cheap_rows, 0)
        self.cheap = curve.at(cheap_context) if cheap_rows else None
        if not self.candidates:
            raise ValueError("no candidate budgets")
        self.probe_every, self.window, self.above = check_int("probe_every", probe_every, 1), window, above
        self.decay, self.margin, self.decide_every = decay, margin, check_int("decide_every", decide_every, 1)
        self.draft_ms = draft_ms or (lambda b: 0.0)
        n = len(self.candidates)
        # decayed sums per candidate, plain lists: this runs between two forwards every step, where numpy's
        # per-call overhead, large against these few small arrays, is not negligible
        self.weight, self.tokens, self.base, self.rows = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
        self.verified_tokens = self.verified_weight = 0.0
        self.extra_sum = self.extra_weight = 0.0  # tokens a larger tree yields past a censored bound (record)
        self.default_rows = [b + 1.0 for b in self.candidates]  # root + the tree, before any data
        self.draft = [float(self.draft_ms(b)) for b in self.candidates]
        one_row = self.step_ms(1)
        nearly_free = [i for i, r in enumerate(self.default_rows) if self.step_ms(r) <= (1 + free) * one_row]
        if first is not None and first not in self.candidates:
            raise ValueError(f"first={first} is not a candidate ({self.candidates})")
        self.lowest = 0 if first is None else self.candidates.index(first)  # a rung drafting nothing teaches nothing
        self.current = max(self.lowest, nearly_free[-1] if nearly_free else 0)
        self.steps = self.since_probe = 0
        self.trial_share = trial_share
        self.horizon = None if horizon is None else check_int("horizon", horizon, 1)
        self.floor_lost = 0.0  # ms the steps held at `first` lost against plain steps, by the estimates
        self.gain = None  # the verified candidate's estimated tokens/ms over a plain step's (1 token, 1 row)

    def estimates(self) -> tuple[list[float], list[float]]:
        """(tokens per step, ms per step) of each candidate."""
        level = (self.verified_tokens + 1.0) / (self.verified_weight + 1.0)  # the verified yield's running mean
        tokens = [level * (t + 1.0) / (b + 1.0) for t, b in zip(self.tokens, self.base)]  # ratio, same steps
        seen = [i for i, w in enumerate(self.weight) if w > 0]
        # an unseen candidate: its size + the rows the seen ones carried beyond theirs (Lookahead's window rows)
        extra = sum(self.rows[i] / self.weight[i] - self.default_rows[i] for i in seen) / len(seen) if seen else 0.0
        rows = [self.rows[i] / w if w > 0 else self.default_rows[i] + extra for i, w in enumerate(self.weight)]
        if self.candidates[0] == 0:  # no tree: the root's token, exactly (never the verified yield's level)
            tokens[0] = 1.0
        return tokens, [d + self.step_ms(r) for d, r in zip(self.draft, rows)]

    def step_ms(self, rows: float) -> float:
        """ms of a step of `rows` full-context rows, corrected by what the loop's steps took (MeasuredSteps: a
        factor of 1 until some are recorded; Budget.record records none for a proposer with side or cheap rows),
        plus the cheap rows every step pays (see the class doc)."""
        full = super().step_ms(rows)
        return full + self.cheap(rows + self.cheap_rows) - self.cheap(rows) if self.cheap_rows else full

    def speeds(self) -> list[float]:
        """Estimated tokens per ms of each candidate."""
        tokens, cost = self.estimates()
        return [t / c for t, c in zip(tokens, cost)]

    def best(self) -> int:
        """Index of the candidate to verify: the current one unless another is `margin` faster by estimate
        (looked at every `decide_every` steps: the estimates move slowly, and each look runs between two forwards)."""
        if self.verified_weight > 0 and self.steps % self.decide_every == 1 % self.decide_every:
            speeds = self.speeds()
            start = self.lowest if self.steps <= self.probe_every and not self.floor_spent() else 0
            k = max(range(start, len(speeds)), key=speeds.__getitem__)
            if speeds[k] > (1 + self.margin) * speeds[self.current]:
                self.current = k
            self.gain = speeds[self.current] * self.step_ms(1)
        return self.current

    def floor_spent(self) -> bool:
        """Whether the steps held at `first` have lost their share of the horizon's plain time (see the class
        doc): then the chooser may fall below `first` before probe_every steps of evidence."""
        if self.horizon is None or self.trial_share is None:
            return False
        return self.floor_lost > self.trial_share * self.horizon * self.step_ms(1)

    def choose(self, context: int | None = None) -> tuple[int, list[int]]:
        """(budget to verify this step, the other candidates whose trees to regrow for counterfactuals); costs
        read at `context` tokens (None: where they were last)."""
        if context is not None:
            self.curve = self.costs.at(context)
        self.steps += 1
        k = self.best()
        # steps since the last probe, or since a probe became possible (none above the largest candidate)
        self.since_probe = self.since_probe + 1 if k + 1 < len(self.candidates) else 0
        if self.since_probe >= self.probe_every and self.since_probe >= self.probe_wait(k):
            k += 1  # a probe: a larger tree's yield is only seen exactly by verifying it
            self.since_probe = 0
        others = self.candidates[max(0, k - self.window):k] + self.candidates[k + 1:k + 1 + self.above]
        return self.candidates[k], others

    def plan(self, context: int, limit: int | None = None) -> tuple[int, list[int]]:
        """The Chooser protocol (budget/facade.py): `choose` (a tree's size has no `limit`: the tree stops at the
        depth the loop allows)."""
        return self.choose(context)

    def learn(self, verdict) -> None:
        """The Chooser protocol: what the verified tree and the regrown candidates yielded (`record_proposal`)."""
        if "regrow" in verdict.proposal.carry:
            self.record_proposal(verdict.proposal, verdict.emitted)

    def probe_wait(self, k: int) -> int:
        """Steps between probes from candidate index k: `probe_every`, or more where the probe is expected to
        lose more than `trial_share` of their time (see the class doc)."""
        if self.trial_share is None:
            return self.probe_every
        tokens, cost = self.estimates()
        lost = cost[k + 1] - tokens[k + 1] * cost[k] / tokens[k]
        return trial_wait(self.probe_every, lost, cost[k], self.trial_share)

    def record(self, results: dict, verified: int | None = None) -> None:
        """{candidate: (tokens it yields, its forward's rows[, censored])} for this step, `verified` the candidate
        verified (default: the first key). A censored count is a lower bound (`tree_yield`): it is recorded as
        the bound + the mean extra a larger tree was seen to yield past it. That extra is learnt on every step
        whose verified tree went further than the next smaller one: had the smaller one been verified, the
        verified one would have been censored at (smaller's yield + 1), and its true yield is known."""
        verified = next(iter(results)) if verified is None else verified
        base, decay = results[verified][0], self.decay
        v = self.candidates.index(verified)
        if self.lowest and self.steps <= self.probe_every:  # a step held at `first`: its time over a plain step's
            self.floor_lost += self.draft[v] + self.step_ms(results[verified][1]) - base * self.step_ms(1)
        if v > 0 and self.candidates[v - 1] in results:
            smaller = results[self.candidates[v - 1]][0]
            if base > smaller:  # a censoring seen uncensored: how far past the bound it went
                self.extra_sum = decay * self.extra_sum + (base - smaller - 1)
                self.extra_weight = decay * self.extra_weight + 1.0
        extra = (self.extra_sum + 0.5) / (self.extra_weight + 1.0)  # prior: half a token past the bound
        for array in (self.weight, self.tokens, self.base, self.rows):
            array[:] = [decay * x for x in array]
        self.verified_tokens = decay * self.verified_tokens + base
        self.verified_weight = decay * self.verified_weight + 1.0
        for b, (tokens, rows, *censored) in results.items():
            i = self.candidates.index(b)
            self.weight[i] += 1
            self.tokens[i] += tokens + (extra if censored and censored[0] else 0.0)
            self.base[i] += base
            self.rows[i] += rows

    def record_step(self, verified: int, emitted: Sequence[int], rows: int, others: Sequence[int],
                    regrow: Callable[[int], tuple]) -> None:
        """One step of a tree proposer: the verified candidate yielded len(emitted) tokens over `rows` rows; for
        each of `others` (what `choose` returned), regrow(b) -> (its tree, its rows) gives what it would have
        yielded (`tree_yield`, censored or not)."""
        results = {verified: (len(emitted), rows)}
        for b in others:
            tree, b_rows = regrow(b)
            tokens, censored = tree_yield(tree, emitted)
            results[b] = (tokens, b_rows, censored)
        self.record(results, verified)


    @staticmethod
    def carry(others: Sequence[int], trees: Callable[[int], object], extra_rows: int = 0) -> dict:
        """What a tree proposer hands its own observe (Proposal.carry) after `choose`: the candidates to regrow,
        and how (trees(b): the tree candidate b would have grown from this step's context); `extra_rows`: the
        rows every step pays whatever the tree (Lookahead's window, FAFO's fumble rows), root + tree + these."""
        def regrow(b: int):
            tree = trees(b)
            return tree, 1 + len(tree) + extra_rows
        return dict(others=list(others), regrow=regrow, extra_rows=extra_rows)

    def record_proposal(self, proposal, emitted: Sequence[int]) -> None:
        """record_step for a verified proposal that carries `carry(...)` and its "draft_size" in info."""
        c = proposal.carry
        self.record_step(proposal.info["draft_size"], emitted, 1 + len(proposal.tree) + c["extra_rows"], c["others"],
                         c["regrow"])


def tree_yield(tree, emitted: Sequence[int]) -> tuple[int, bool]:
    """(tokens the step would have emitted with `tree`, whether that is only a lower bound).

    The emitted path is fixed whatever the tree (the target's token at each position does not depend on it):
    a tree that leaves the path at position j (its nodes there hold other tokens) yields j + 1, the target's
    own token included. A tree that holds the whole path, the step's next token included, yields at least
    len(emitted) + 1; how much more, only verifying it would show (censored)."""
    nodes = [-1]  # every node spelling the path so far (without merging, siblings may repeat a token)
    for n, tok in enumerate(emitted):
        nodes = [c for node in nodes for c in tree.children(node) if tree.tokens[c] == tok]
        if not nodes:
            return n + 1, False
    return len(emitted) + 1, True
