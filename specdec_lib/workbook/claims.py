"""Measured claims that cannot go stale: the sentence is rendered from this run's numbers and checked.

A notebook's prose is written once; its numbers change with every run (the machine, the pair, the defaults). So a
comparison, ratio or ranking measured here is never typed into Markdown: a code cell states it with `claim`,
which formats the sentence from the numbers the cell computed and says whether it held in this run:

    claim("prompt lookup is {ratio:.2f}x autoregressive on {suite}", ratio >= 1, ratio=ratio, suite="editing")

renders (Jupyter, Colab, a saved notebook: Markdown) as

    prompt lookup is 1.91x autoregressive on editing (held in this run)

and, when false, "... (did not hold in this run: <why>)" in bold; the why, `otherwise=`, is a template formatted
from the same numbers (the notebook tests refuse a stock sentence). Two measured numbers compare through
`beats(a, b, margin)`: within the margin it is a tie ("tied in this run"), never held. `claims(...)` renders
several as a list (a cell displays its last value only). A paper's figures may be quoted in Markdown, named so.

`typed_numbers(markdown)` finds measured-looking numbers typed into Markdown (a number with a unit of speed,
time, size or ratio: "1.3x", "15 ms", "80 µs", "7 min", "2 MB", "42 tokens/s", "+5 %", or a time in words: "tens
of microseconds"), except on lines that quote a paper (they name it: "paper", "Table 3", "reports", ...): the
notebook test counts them per notebook against a ceiling that only goes down.

Simplifications: the unit list is what this workbook writes (x, ms, µs, s, min, %, tokens/s, KB/MiB/...); a number
written out in words is found only as "tens/hundreds/thousands of (micro/milli)seconds".
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

HELD, NOT_HELD, TIED = "held in this run", "did not hold in this run", "tied in this run"


@dataclass(frozen=True)
class Comparison:
    """`beats(a, b, margin)`: a above b by more than the margin (held), within it (a tie), or not."""
    a: float
    b: float
    margin: float

    @property
    def tie(self) -> bool:
        return abs(self.a - self.b) <= self.margin * max(abs(self.a), abs(self.b))

    def __bool__(self) -> bool:
        return self.a > self.b and not self.tie


def beats(a, b, margin: float = 0.02) -> Comparison:
    """Whether measured `a` beats measured `b`: by more than `margin` (a share of the larger); within it the run
    cannot tell them apart (a tie: not held). margin 0 for exact counts."""
    if not 0 <= margin < 1:
        raise ValueError(f"margin is a share in [0, 1), got {margin!r}")
    return Comparison(float(a), float(b), float(margin))


@dataclass
class Claim:
    """A sentence rendered from this run's numbers, and whether it held (a tie: `beats` within its margin)."""
    text: str
    held: bool
    numbers: dict = field(default_factory=dict)
    otherwise: str = ""  # why it can fail to hold, rendered from the numbers, shown only when it did not
    tie: Comparison | None = None

    def verdict(self) -> str:
        if self.held:
            return HELD
        if self.tie is not None and self.tie.tie:
            if not self.tie.margin:  # exact counts: equal
                return f"{TIED}: both {self.tie.a:.4g}"
            return (f"{TIED}: {self.tie.a:.4g} against {self.tie.b:.4g}, within the {self.tie.margin:.0%} "
                    f"this run cannot resolve")
        return f"{NOT_HELD}: {self.otherwise}" if self.otherwise else NOT_HELD

    def markdown(self) -> str:
        return f"{self.text} *({HELD})*" if self.held else f"{self.text} **({self.verdict()})**"

    def _repr_markdown_(self) -> str:  # Jupyter / Colab display
        return self.markdown()

    def __str__(self) -> str:
        return f"{self.text} ({self.verdict()})"


def claim(template: str, holds, otherwise: str = "", **numbers) -> Claim:
    """`template` formatted with `numbers` (format specs as in str.format), and whether it held: `holds`, a bool
    computed from the same numbers (numpy bools too), or `beats(a, b)` (a tie is not held). A template naming a
    number not given is an error. `otherwise`: why the expectation did not hold, a template formatted from the same
    numbers (the run's size, the device, the costs it measured), shown after "did not hold in this run:" when it
    did not, so that a reader is never left with an unexplained miss."""
    if not isinstance(template, str) or not template.strip():
        raise ValueError("a claim needs a sentence")
    try:
        text, why = template.format(**numbers), otherwise.format(**numbers)
    except KeyError as missing:
        raise ValueError(f"the claim names {missing} but was not given it") from None
    if not hasattr(holds, "__bool__") or isinstance(holds, str):
        raise TypeError(f"holds must be a bool computed from the numbers, got {holds!r}")
    tie = holds if isinstance(holds, Comparison) else None
    return Claim(text, bool(holds), numbers, why, tie)


@dataclass
class Claims:
    """Several claims, rendered as a Markdown list."""
    items: list

    def markdown(self) -> str:
        return "\n".join(f"- {c.markdown()}" for c in self.items)

    def _repr_markdown_(self) -> str:
        return self.markdown()

    def __str__(self) -> str:
        return "\n".join(f"- {c}" for c in self.items)

    @property
    def held(self) -> bool:
        return all(c.held for c in self.items)


def claims(*items: Claim) -> Claims:
    if not all(isinstance(c, Claim) for c in items):
        raise TypeError("claims(...) takes Claim objects (made by claim(...))")
    return Claims(list(items))


# a number with a unit of speed, time, size or ratio: 1.3x, 0.95×, 15 ms, 80 µs, 2.1 s, 7 min, 2 MB, 42 tokens/s,
# +5 %, MAT 2.4; and times in words ("tens of microseconds")
_MEASURED = re.compile(r"(?<![\w.$\\{])[+-]?\d+(?:\.\d+)?(?:[x×]|\s?(?:ms|µs|us|s|min|minutes?|hours?|%|tokens/s|"
                       r"[KMG]i?B))(?!\w)|\bMAT (?:of )?\d+\.\d+|\b(?:tens|hundreds|thousands) of (?:micro|milli)?seconds\b")
_QUOTES_A_PAPER = re.compile(r"paper|Table \d|Figure \d|reports?|published|Spec-Bench|Leviathan|\bet al\b|MT-bench|"
                             r"A100|H100|Llama-2", re.I)


def typed_numbers(markdown: str) -> list[str]:
    """Measured-looking numbers typed into `markdown` (see the module doc), with their line; code spans and
    math ($...$) are skipped, and so are lines that quote a paper."""
    found = []
    for line in markdown.splitlines():
        if _QUOTES_A_PAPER.search(line):
            continue
        bare = re.sub(r"`[^`]*`|\$[^$]*\$", "", line)
        found += [f"{m.group(0).strip()}: {line.strip()}" for m in _MEASURED.finditer(bare)]
    return found
