"""Measured claims that cannot go stale: the sentence is rendered from this run's numbers and checked.

A notebook's prose is written once; its numbers change with every run (the machine, the pair, the defaults). So a
comparison, ratio or ranking measured here is never typed into Markdown: a code cell states it with `claim`,
which formats the sentence from the numbers the cell computed and says whether it held in this run:

    claim("prompt lookup is {ratio:.2f}x autoregressive on {suite}", ratio >= 1, ratio=ratio, suite="editing")

renders (Jupyter, Colab, a saved notebook: Markdown) as

    prompt lookup is 1.91x autoregressive on editing (held in this run)

and, when the condition is false, "... (did not hold in this run)", in bold, so a reader sees at once where the
run and the expectation part. `claims(...)` renders several as a list. A paper's published figures may still be
quoted in Markdown, named as such.

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

HELD, NOT_HELD = "held in this run", "did not hold in this run"


@dataclass
class Claim:
    """A sentence rendered from this run's numbers, and whether it held."""
    text: str
    held: bool
    numbers: dict = field(default_factory=dict)
    otherwise: str = ""  # why it can fail to hold, shown only when it did not

    def verdict(self) -> str:
        if self.held:
            return HELD
        return f"{NOT_HELD}: {self.otherwise}" if self.otherwise else NOT_HELD

    def markdown(self) -> str:
        return f"{self.text} *({HELD})*" if self.held else f"{self.text} **({self.verdict()})**"

    def _repr_markdown_(self) -> str:  # Jupyter / Colab display
        return self.markdown()

    def __str__(self) -> str:
        return f"{self.text} ({self.verdict()})"


def claim(template: str, holds, otherwise: str = "", **numbers) -> Claim:
    """`template` formatted with `numbers` (format specs as in str.format), and whether it held: `holds`, a bool
    computed from the same numbers (numpy bools too). A template naming a number not given is an error.
    `otherwise`: why the expectation can fail (the run's size, the device, noise), shown after "did not hold in this
    run:" when it did not, so that a reader is never left with an unexplained miss."""
    if not isinstance(template, str) or not template.strip():
        raise ValueError("a claim needs a sentence")
    try:
        text = template.format(**numbers)
    except KeyError as missing:
        raise ValueError(f"the claim names {missing} but was not given it") from None
    if not hasattr(holds, "__bool__") or isinstance(holds, str):
        raise TypeError(f"holds must be a bool computed from the numbers, got {holds!r}")
    return Claim(text, bool(holds), numbers, otherwise)


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
