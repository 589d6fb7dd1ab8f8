"""The one object a method holds for its draft-size knob (`Budget`), and the protocol of what sits behind it.

A method's draft budget (Cacheback's TDL, a draft model's gamma, prompt lookup's num_tokens) trades tokens per
target forward against the forward's price. Papers pick it on their GPU, where extra rows are nearly free; on a
CPU a forward's cost grows with its rows early (notebook 00 measures the curve), so under "auto" a chooser picks
the budget step by step, with the best expected tokens per ms on this machine's cost curve, a plain step
included (choosers.py, confidence.py). A fixed int is a chooser too (`Fixed`), so the facade never asks which
kind it holds: every chooser answers the `Chooser` protocol,

    plan(context, limit) -> (size, others)   this step's budget (0: a plain step) and the tree sizes to regrow
    learn(verdict)                           what the verified step shows (depths, counterfactual yields,
                                             calibration)
    record_ms(rows, ms), learns_costs        the loop's timing of a step, when it corrects the curve
    stats()                                  what the method's stats add

and the choosers of EAGLE-2's dynamic tree (`Fixed`, `ConfidenceBudget`) also `grow` the tree, `keep` its best
nodes and `record_draft` what drafting took. Each step's choice and its expected gain over a plain step go into
the step records ("draft_size", "expected_gain").

Left out: budgets that change within a step; one chooser for two knobs (a method's side rows have their own
`SideBudget`, side.py).
"""
from __future__ import annotations

from typing import Callable, Protocol

from ...env import check_int
from .. import dynamic_tree
from .choosers import TRIAL_SHARE, ChainBudget, TreeBudget, tree_yield
from .confidence import ConfidenceBudget
from .cost_curve import estimating, reach, resolve_curve
from .guard import Guard
from .side import SideBudget, text_tree_yield

__all__ = ["AUTO", "TRIAL_SHARE", "Budget", "ChainBudget", "Chooser", "ConfidenceBudget", "Fixed", "SideBudget",
           "TreeBudget", "check_budget", "check_costs", "is_auto", "text_tree_yield", "tree_yield"]

AUTO = "auto"


def is_auto(value) -> bool:
    return isinstance(value, str) and value == AUTO


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


class Chooser(Protocol):
    """What every chooser answers (see the module doc)."""
    gain: float | None  # the last choice's expected tokens per ms over a plain step's (None: no estimate yet)
    cheap_rows: int  # rows every step pays that read only a compressed KV (FAFO's fumble rows)

    @property
    def learns_costs(self) -> bool: ...
    def plan(self, context: int, limit: int | None = None) -> tuple[int | None, list[int]]: ...
    def learn(self, verdict) -> None: ...
    def record_ms(self, rows: int, ms: float) -> None: ...
    def stats(self) -> dict: ...


class Fixed:
    """The budget the user gave: the same size every step, honoured exactly, nothing learnt. For a dynamic tree
    (`grow`, `keep`): the `value` best nodes by the drafter's cumulative log-probability."""
    gain, cheap_rows, learns_costs = None, 0, False

    def __init__(self, value):
        self.value = value

    def plan(self, context: int, limit: int | None = None) -> tuple[int | None, list[int]]:
        return self.value, []

    def learn(self, verdict) -> None:
        pass

    def record_ms(self, rows: int, ms: float) -> None:
        pass

    def record_draft(self, ms: float, forwards: int) -> None:
        pass

    def stats(self) -> dict:
        return {}

    def grow(self, first: tuple, forward: dynamic_tree.Forward, depth: int, topk: int) -> list:
        return dynamic_tree.grow(first, forward, depth, topk, keep=self.value)

    def keep(self, root: int, nodes: list, forwards: int) -> tuple:
        order = dynamic_tree.kept(nodes, self.value)
        return dynamic_tree.to_tree(root, nodes, order), self.value, {}


class Budget:
    """One method's draft-size knob: check it, start a generation, choose each step, record each verdict,
    report stats. A fixed int (>= `minimum`) is honoured exactly (`Fixed`); "auto" builds a chooser at `start`
    from the target's cost curve (injected `costs=`, or measured here up to the context the request reaches).

    `costs`: the method's injected curves by option name (costs=, draft_costs=), read only under "auto", or
    when `shared` (another "auto" knob of the method reads them too: Lookahead's window, FAFO's streams, CARD's
    drafting; they get them from `curve`).
    optional: None is allowed too (CARD's query), no budget of its own: `choose` returns None."""

    def __init__(self, option: str, value, minimum: int = 1, optional: bool = False, shared: bool = False,
                 plain: int = 0, **costs):
        self.option = option
        self.value = None if value is None and optional else check_budget(option, value, minimum)
        if not shared:
            check_costs(option, value, **costs)
        self.costs = costs
        self.chooser: Chooser = Fixed(self.value)
        self.others: list[int] = []  # a tree chooser's neighbouring candidates this step (to regrow)
        self.guard: Guard | None = None  # what the clock says of drafted steps (guard.py), "auto" and greedy only
        self.plain = plain  # the budget of a plain step (Cacheback's TDL 2): what `choose` says when the guard stops

    @property
    def auto(self) -> bool:
        return is_auto(self.value)

    @property
    def measured(self) -> bool:
        """Its target curve is timed on this machine: not injected (costs=, taken as given) and not estimated (the
        tests price steps from parameter counts and read no clock). Only then may a choice follow the clock."""
        return self.costs.get("costs") is None and not estimating()

    def curve(self, model, upto: int = 0, name: str = "costs"):
        """The curve injected as `name`, or `model`'s measured here (cost_curve.resolve_curve)."""
        return resolve_curve(self.costs.get(name), model, upto)

    def start(self, request, build: Callable, guard: bool = True) -> None:
        """A new generation: under "auto", build(curve) -> the chooser, over the target's curve up to the
        context `request` reaches; a fixed value keeps its `Fixed`. The guard watches a measured curve's choices
        under greedy decoding (an injected curve is taken as given, and a seed's draws follow no clock);
        guard=False where the method's steps run side rows the guard cannot stop (a fixed window or streams: no
        step of it is plain, so none would price a plain step)."""
        self.chooser = build(self.curve(request.target, reach(request))) if self.auto else Fixed(self.value)
        timed = guard and self.auto and request.sampling.greedy and self.measured
        self.guard = Guard() if timed else None
        if hasattr(self.chooser, "affords"):  # its probes draw on the guard's one allowance
            self.chooser.affords = self.affords

    @property
    def affords(self) -> Callable[[float], bool] | None:
        """The generation's one trial allowance (Guard.affords) for the method's other trials (a SideBudget's
        probes); None without a guard."""
        return None if self.guard is None else self.guard.affords

    def may_draft(self) -> bool:
        """False when the guard has stopped drafting for now (the step is plain: no draft, no side rows)."""
        return self.guard is None or self.guard.allowed

    def choose(self, context: int, limit: int | None = None) -> int | None:
        """This step's budget at `context` tokens (a chain's at most `limit`; a tree chooser's other candidates
        wait in `others`, for `carry`; EAGLE-2's judge: 0 for a plain step, else the largest size it may keep).
        `plain` without asking the chooser while the guard stops drafting."""
        if not self.may_draft():
            self.others = []
            return self.plain
        size, self.others = self.chooser.plan(context, limit)
        return size

    def price_cheap_rows(self, rows: int) -> None:
        """This step pays `rows` rows that read only the compressed KV (FAFO's fumble rows, when they run)."""
        self.chooser.cheap_rows = rows

    def carry(self, trees: Callable[[int], object], extra_rows: int = 0) -> dict:
        """Proposal.carry for a tree chooser's step (TreeBudget.carry); {} when fixed (nothing to regrow)."""
        return TreeBudget.carry(self.others, trees, extra_rows) if self.auto else {}

    def grow(self, first: tuple, forward: dynamic_tree.Forward, depth: int, topk: int) -> list:
        """EAGLE-2's dynamic tree, every node drafted this step (dynamic_tree.grow, shaped by the chooser)."""
        return self.chooser.grow(first, forward, depth, topk)

    def keep(self, root: int, nodes: list, forwards: int) -> tuple:
        """(the DraftTree to verify, its size, the proposal's carry) from a grown tree's nodes; `forwards`: the
        drafter forwards this step took (priced by the judge)."""
        return self.chooser.keep(root, nodes, forwards)

    def record_draft(self, ms: float, forwards: int) -> None:
        """A dynamic tree's drafting took `ms` over `forwards` drafter forwards (the judge's price learns)."""
        self.chooser.record_draft(ms, forwards)

    def info(self, size: int) -> dict:
        """What the step record says of this step's budget: "draft_size", and under "auto" the chooser's
        "expected_gain" (estimated tokens per ms over a plain step's; None before it has data)."""
        if not self.auto:
            return dict(draft_size=size)
        gain = self.chooser.gain
        return dict(draft_size=size, expected_gain=None if gain is None else round(float(gain), 3))

    def record(self, verdict) -> None:
        """Learn from a verified step (nothing when fixed, nothing from a step the guard made plain), and correct
        a measured curve by the loop's timing."""
        proposal = verdict.proposal
        if self.guard is not None:
            vetoed = not self.guard.allowed
            self.guard.record(bool(len(proposal.tree)) or proposal.side is not None, len(verdict.emitted))
            if vetoed:
                return
        self.chooser.learn(verdict)
        if not self.chooser.learns_costs:
            return
        ms = verdict.verify_ms  # the loop's timing of this step (None: the prefill)
        # a measured curve is corrected by the steps (an injected one is taken as given), where the step's rows
        # are the tree's (side rows, Lookahead's window or FAFO's fumble rows, are priced by the curve alone)
        if ms is not None and self.costs.get("costs") is None and proposal.side is None:
            self.chooser.record_ms(len(proposal.tree) + 1, ms)

    def record_unverified(self, drafted: int, accepted: int) -> None:
        """A plain step's chain of `drafted` tokens, never verified, of which the text emitted after it spelt the
        first `accepted` (prompt lookup's: a copy costs nothing to make): counted as a verified chain (a
        ChainBudget's); nothing when fixed."""
        if self.auto:
            self.chooser.record(drafted, accepted)

    def stats(self) -> dict:
        """What a method with an 'auto' budget adds to its stats (nothing if fixed): the cost curve it chose from
        last ("curve") and every curve it read ("costs"), and what a judge learnt (EAGLE's head price, its
        calibration), and what the guard saw. The budget chosen each step is in the step records ("draft_size")."""
        return {**self.chooser.stats(), **(self.guard.stats() if self.guard is not None else {})}
