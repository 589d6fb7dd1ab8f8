"""The draft budget: what a method holds (`Budget`, facade.py) and the "auto" choosers behind it.

facade (`Budget` and the `Chooser` protocol every chooser answers: plan a step, learn from a verdict, report
its stats) -> choosers (`ChainBudget`: a chain's length; `TreeBudget`: a tree's size) -> confidence
(`ConfidenceBudget`: EAGLE-2's dynamic tree sized by calibrated confidence) -> side (`SideBudget`: side rows
on or off) -> step_cost (what a forward and a loop step of R rows cost here) -> cost_curve (those costs as
t(rows, context), cached on disk).
"""
from .facade import *  # noqa: F401,F403  (the facade's __all__)
from .facade import __all__  # noqa: F401
