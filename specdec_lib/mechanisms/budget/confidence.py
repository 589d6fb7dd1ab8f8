"""EAGLE-2's budget from the head's own confidence: how deep to draft and how many nodes to verify, step by step.

Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees", section 3: the draft
head's confidence in a token tracks how often the target accepts it. EAGLE-2 uses that to expand and rerank a
tree of a fixed size; `ConfidenceBudget` also picks each step's size and depth on this machine's cost curve, from
the head itself before the target has seen anything (the other choosers learn a yield per size from past steps).

- Calibration: P(the target accepts a node | it accepted the parent) per bin of the head's probability q, counted
  from every verdict, starting from q itself (PRIOR_WEIGHT pseudo-counts per bin). A node's *value*, the product
  of the calibrated probabilities along its path, is its chance to be accepted: a tree's expected tokens are 1 +
  the sum of its values, and as a child's value never exceeds its parent's, the best b nodes by value are a tree.
- Worth: a plain step makes one token in t(1) ms (the curve at the context, corrected by MeasuredSteps), so a step
  making E tokens in T ms saves E t(1) - T; every decision below maximises that saving.
- Depth (`expand`): one more head forward (`head_ms`) where the frontier nodes it expands are expected to add more
  than head_ms / t(1) tokens (their values x g, g the running mean of an expanded node's best child), a node
  expanded only where value x g pays the verify row it adds (the curve's slope per row).
- Size (`size`): the ladder's b with the largest 1 + sum(best b values) - t(b + 1) / t(1) (b = 0: a plain verify).
- Drafting at all (`drafting`): after WARMUP drafted steps, while the running mean of the expected saving (less the
  head's forwards) is below zero, plain steps, with probes bounded by TRIAL_SHARE as the other budgets'. Judged on
  the expected saving, not the realised one: the calibration already follows the verdicts, and a step's realised
  tokens swing by several around it.

Left out: calibration per q-bin only (not per depth or context); a head forward priced at one number whatever
its rows (at most topk); one running mean g for every depth.
"""
from __future__ import annotations

from typing import Sequence

from ...env import check_int
from .choosers import TRIAL_SHARE, MeasuredSteps, PricedSteps, trial_wait
from .. import dynamic_tree
from ..draft_tree import ROOT

BINS = 10  # q-bins of the calibration, each 1 / BINS wide
PRIOR_WEIGHT = 2.0  # pseudo-counts per bin, at the head's own q, before any verdict
RATE = 0.2  # how fast the running means (saving, g, head_ms) move: a memory of about five steps
WARMUP = 8  # drafted steps before a plain one: one unlucky opening step must not stop the drafting


class ConfidenceBudget(PricedSteps):
    """EAGLE's "auto" budget (see the module doc). `curve`: a CostCurve or ContextCosts; `ladder`: the sizes a
    step may verify (0 included); `head_ms`: one head forward's ms to start from; `learn_head`: whether the
    head's price moves to what drafting took (False under sampling or an injected price: no clock then)."""

    def __init__(self, curve, ladder: Sequence[int], head_ms: float, context: int = 0, probe_every: int = 16,
                 trial_share: float | None = TRIAL_SHARE, learn_head: bool = True):
        self.costs, self.ladder = curve, sorted(set(int(b) for b in ladder) | {0})
        self.head_ms, self.learn_head = float(head_ms), learn_head
        self.probe_every, self.trial_share = check_int("probe_every", probe_every, 1), trial_share
        self.measured = MeasuredSteps()
        self.hits = [PRIOR_WEIGHT * (k + 0.5) / BINS for k in range(BINS)]  # accepted, per q-bin
        self.seen = [PRIOR_WEIGHT] * BINS  # reached (parent accepted), per q-bin
        self.best_child = 0.5  # g: the calibrated probability of an expanded node's best child, running mean
        self.saving = None  # the drafted steps' running mean expected ms saved over plain steps (None: none yet)
        self.expected = 0.0  # the last `size`'s expected saving, its drafting included
        self.wait = 0  # plain steps left before the next probe
        self.gain = None  # the last choice's expected tokens per ms over a plain step's
        self.drafted = self.plain = self.timed = 0
        self.at(context)

    # -- prices -------------------------------------------------------------------------------------------
    def at(self, context: int) -> None:
        """Read the curve at `context` tokens: t(1) and the price of one more verify row."""
        self.curve = self.costs.at(context)
        self.t1 = self.step_ms(1)
        self.row_ms = max(self.step_ms(17) - self.t1, 0.0) / 16  # the curve's mean slope over a small tree

    # -- calibration --------------------------------------------------------------------------------------
    @staticmethod
    def _bin(q: float) -> int:
        return min(int(q * BINS), BINS - 1)

    def value(self, q: float) -> float:
        """Calibrated P(accepted | parent accepted) of a node the head gave probability q."""
        k = self._bin(q)
        return self.hits[k] / self.seen[k]

    # -- the step's decisions -----------------------------------------------------------------------------
    def drafting(self, context: int) -> bool:
        """Whether this step drafts (its catch-up forward included), at `context` tokens."""
        self.at(context)
        if self.drafted < WARMUP or self.saving >= 0 or self.wait == 0:  # drafting pays, or a probe is due
            return True
        self.wait -= 1
        self.plain += 1
        return False

    def expand(self, values: Sequence[float]) -> int:
        """How many of the frontier's best nodes (`values`, best first) to expand with one more head forward:
        those whose children pay their verify row, if together they pay the forward; 0 stops the drafting."""
        g = self.best_child
        paying = sum(1 for v in values if v * g * self.t1 > self.row_ms)
        worth = sum(values[:paying]) * g * self.t1
        return paying if worth > self.head_ms else 0

    def saw_children(self, best: float) -> None:
        """An expanded node's best child had calibrated probability `best` (g's running mean)."""
        self.best_child += RATE * (best - self.best_child)

    def size(self, values: Sequence[float], draft_ms: float = 0.0) -> int:
        """The ladder's size to verify from the drafted nodes' `values` (best first); `draft_ms`, what drafting
        took, enters the expected gain only (it is paid whatever is verified)."""
        best, best_saving, total, sums = 0, 0.0, 0.0, [0.0]
        for v in values:
            total += v
            sums.append(total)
        for b in self.ladder[1:]:
            if b > len(values):
                break
            saving = sums[b] * self.t1 - (self.step_ms(b + 1) - self.t1)  # over a plain verify
            if saving > best_saving:
                best, best_saving = b, saving
        self.gain = (1.0 + sums[best]) * self.t1 / (draft_ms + self.step_ms(best + 1))
        self.expected = best_saving - draft_ms
        return best

    # -- the Chooser protocol (budget/facade.py) ---------------------------------------------------------
    def plan(self, context: int, limit: int | None = None) -> tuple[int, list[int]]:
        """0 for a plain step (drafting does not pay here: a probe comes later), else the largest size the tree
        may keep (`size` picks it once the tree is grown)."""
        return (self.ladder[-1] if self.drafting(context) else 0), []

    def grow(self, first: tuple, forward, depth: int, topk: int) -> list:
        """EAGLE-2's tree, expanded where the calibrated values pay a forward (dynamic_tree.grow with this judge)."""
        return dynamic_tree.grow(first, forward, depth, topk, 0, self)

    def keep(self, root: int, nodes: list, forwards: int) -> tuple:
        """(tree, size, carry): the size from the nodes' values, drafting priced at the head's ms per forward."""
        return dynamic_tree.judged(root, nodes, self, self.head_ms * forwards)

    def learn(self, verdict) -> None:
        """A drafted step's verdict teaches the calibration (a plain step drafted nothing to calibrate)."""
        proposal = verdict.proposal
        if "probs" in proposal.carry:
            self.record(proposal.tree.parents, proposal.carry["probs"], verdict.accepted, proposal.carry["saving"])

    # -- learning from the verdict ------------------------------------------------------------------------
    def record_draft(self, ms: float, forwards: int) -> None:
        """Drafting took `ms` over `forwards` head forwards (the head's price moves there, when learnt)."""
        if self.learn_head and forwards:  # the first timings replace the start (a bare forward, timed once)
            self.timed += 1
            self.head_ms += max(RATE, 1.0 / self.timed) * (ms / forwards - self.head_ms)

    def record(self, parents: Sequence[int], probs: Sequence[float], accepted: Sequence[int], saved: float) -> None:
        """A drafted step's verdict: the verified tree's `parents` and head probabilities `probs` (per node), the
        `accepted` nodes, and the step's expected saving in ms (`expected`, as `size` found it)."""
        self.drafted += 1
        hit = set(accepted)
        for i, (p, q) in enumerate(zip(parents, probs)):
            if p == ROOT or p in hit:  # reached: the target judged this node
                k = self._bin(q)
                self.seen[k] += 1.0
                self.hits[k] += 1.0 if i in hit else 0.0
        self.saving = saved if self.saving is None else self.saving + RATE * (saved - self.saving)
        if self.saving < 0 and self.drafted >= WARMUP:  # plain steps until a probe, so that trial_share of their
            # time covers what it may lose
            self.wait = trial_wait(self.probe_every, -self.saving, self.t1, self.trial_share)

    def stats(self) -> dict:
        return dict(head_ms=round(self.head_ms, 3), calibration=[round(h / s, 3) for h, s in zip(self.hits, self.seen)],
                    calibration_counts=[int(s - PRIOR_WEIGHT) for s in self.seen], plain_steps=self.plain,
                    curve=repr(self.curve), costs=repr(self.costs))
