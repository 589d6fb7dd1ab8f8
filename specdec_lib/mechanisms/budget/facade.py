"""The one object a method holds for its draft-size knob (`Budget`), and where the `"auto"` budgets live.

A method's draft budget (Cacheback's TDL, a draft model's gamma, prompt lookup's num_tokens) trades tokens
per target forward against the forward's price. Papers pick it on their GPU, where extra rows are nearly
free; on a CPU a forward's cost grows with its rows early (notebook 00, section 3, measures the curve), and the
paper's TDL loses to a small tree (notebook 04 sweeps it). So under "auto" a chooser picks the budget, step by
step, with the best expected tokens per ms on this machine's own cost curve, a plain step included:

- cost_curve.py: what a step of the loop costs for R rows at a context (measured once, cached on disk);
- choosers.py: `ChainBudget` (a chain's length: draft model, prompt lookup, CARD's query) and `TreeBudget` (a
  tree's size: Cacheback, Lookahead's guesses, FAFO's candidates), their probes bounded to TRIAL_SHARE of the
  time;
- confidence.py: `ConfidenceBudget` (EAGLE's tree: depth and size from the head's calibrated confidence);
- side_budget.py: `SideBudget`, rows that feed a pool (Lookahead's window, FAFO's streams) or drafting at all
  (CARD), on or off;
- here: `Budget`, what a method holds (check, start, choose, record, stats, info): the int the user gave,
  honoured exactly, or "auto" and a chooser built at the generation's start; each step's choice and its expected
  gain over a plain step go into the step records ("draft_size", "expected_gain").
"""
from __future__ import annotations

from typing import Callable

from ...env import check_int
from .choosers import TRIAL_SHARE, ChainBudget, TreeBudget, tree_yield
from .confidence import ConfidenceBudget
from .cost_curve import reach, resolve_curve
from .side import SideBudget, text_tree_yield

__all__ = ["AUTO", "TRIAL_SHARE", "Budget", "ChainBudget", "ConfidenceBudget", "SideBudget", "TreeBudget",
           "check_budget", "check_costs", "chooser_stats", "is_auto", "text_tree_yield", "tree_yield"]

AUTO = "auto"

def is_auto(value) -> bool:
    return isinstance(value, str) and value == AUTO


def chooser_stats(chooser) -> dict:
    """What a method with an 'auto' budget adds to its stats (nothing if fixed): the cost curve it chose from
    last ("curve", at the generation's last context) and every curve it read ("costs": a ContextCosts' prefixes).
    The budget chosen each step is in the step records, under "draft_size"."""
    if chooser is None:
        return {}
    if isinstance(chooser, ConfidenceBudget):  # and what it learnt: the head's price, its calibration
        return chooser.stats()
    return dict(curve=repr(chooser.curve), costs=repr(chooser.costs))


def check_costs(option: str, value, **curves) -> None:
    """A method's injected cost curves (costs=, draft_costs=) are read only when its budget `option` is 'auto'."""
    given = [name for name, curve in curves.items() if curve is not None]
    if given and not is_auto(value):
        raise ValueError(f"{' and '.join(n + '=' for n in given)} {'is' if len(given) == 1 else 'are'} read only "
                         f"with {option}='auto'")


def check_budget(name: str, value, minimum: int = 1):
    """An int >= minimum, or "auto" (any other string: a TypeError, like any other non-int)."""
    if isinstance(value, str):
        if value != AUTO:
            raise TypeError(f"{name} must be an int >= {minimum} or 'auto', got {value!r}")
        return value
    return check_int(name, value, minimum)


class Budget:
    """One method's draft-size knob: check it, start a generation, choose each step, record each verdict,
    report stats. A fixed int (>= `minimum`) is honoured exactly; "auto" builds a chooser at `start` from the
    target's cost curve (injected `costs=`, or measured here up to the context the request reaches).

    `costs`: the method's injected curves by option name (costs=, draft_costs=), read only under "auto", or
    when `shared` (another "auto" knob of the method reads them too: Lookahead's window, FAFO's streams, CARD's
    drafting; they get them from `curve`).
    optional: None is allowed too (CARD's query), no budget of its own: `choose` returns None."""

    def __init__(self, option: str, value, minimum: int = 1, optional: bool = False, shared: bool = False,
                 **costs):
        self.option = option
        self.value = None if value is None and optional else check_budget(option, value, minimum)
        if not shared:
            check_costs(option, value, **costs)
        self.costs = costs
        self.chooser: ChainBudget | TreeBudget | ConfidenceBudget | None = None
        self.others: list[int] = []  # a tree chooser's neighbouring candidates this step (to regrow)

    @property
    def auto(self) -> bool:
        return is_auto(self.value)

    def curve(self, model, upto: int = 0, name: str = "costs"):
        """The curve injected as `name`, or `model`'s measured here (cost_curve.resolve_curve)."""
        return resolve_curve(self.costs.get(name), model, upto)

    def start(self, request, build: Callable) -> None:
        """A new generation: build(curve) -> the chooser (a ChainBudget or TreeBudget over the target's curve up
        to the context `request` reaches), under "auto"; nothing for a fixed value."""
        self.chooser = build(self.curve(request.target, reach(request))) if self.auto else None

    def choose(self, context: int, limit: int | None = None) -> int:
        """This step's budget at `context` tokens: the fixed value, or the chooser's (a chain's at most `limit`;
        a tree chooser's other candidates wait in `others`, for `carry`)."""
        self.others = []
        if self.chooser is None:
            return self.value
        if isinstance(self.chooser, ChainBudget):
            return self.chooser.choose(limit, context)
        size, self.others = self.chooser.choose(context)
        return size

    def carry(self, trees: Callable[[int], object], extra_rows: int = 0) -> dict:
        """Proposal.carry for a tree chooser's step (TreeBudget.carry); {} when fixed (nothing to regrow)."""
        return {} if self.chooser is None else TreeBudget.carry(self.others, trees, extra_rows)

    def info(self, size: int) -> dict:
        """What the step record says of this step's budget: "draft_size", and under "auto" the chooser's
        "expected_gain" (estimated tokens per ms over a plain step's; None before it has data)."""
        if self.chooser is None:
            return dict(draft_size=size)
        gain = self.chooser.gain
        return dict(draft_size=size, expected_gain=None if gain is None else round(float(gain), 3))

    def record(self, verdict) -> None:
        """Learn from a verified step (nothing when fixed): a chain's depths drafted and accepted, a tree's
        counterfactual yields (what `carry` regrows), EAGLE's calibration (the verified nodes' head probabilities)."""
        if self.chooser is None:
            return
        proposal = verdict.proposal
        if isinstance(self.chooser, TreeBudget):
            if "regrow" in proposal.carry:
                self.chooser.record_proposal(proposal, verdict.emitted)
        elif isinstance(self.chooser, ConfidenceBudget):
            if "probs" in proposal.carry:  # a drafted step (a plain one drafted nothing to calibrate)
                self.chooser.record(proposal.tree.parents, proposal.carry["probs"], verdict.accepted,
                                    proposal.carry["saving"])
        elif len(proposal.tree):
            self.chooser.record(len(proposal.tree), len(verdict.accepted))
        ms = verdict.verify_ms  # the loop's timing of this step (None: the prefill's)
        # a measured curve is corrected by the steps (an injected one is taken as given), where the step's rows
        # are the tree's (side rows, Lookahead's window or FAFO's fumble rows, are priced by the curve alone)
        if ms is not None and self.costs.get("costs") is None and proposal.side is None \
                and not getattr(self.chooser, "cheap_rows", 0):
            self.chooser.record_ms(len(proposal.tree) + 1, ms)

    def stats(self) -> dict:
        return chooser_stats(self.chooser)
