"""Argument checks shared by every layer, so a bad setting gets the same clear message everywhere.

`bool` is an int subclass in Python: True as a length or a capacity is a bug, not a 1, so it is refused."""
from __future__ import annotations

import numbers


def check_int(name: str, value, minimum: int | None = None) -> int:
    """`value` as an int; a TypeError naming `name` when it is not an integer (or is a bool), a ValueError when
    it is below `minimum`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int{'' if minimum is None else f' >= {minimum}'}, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)
