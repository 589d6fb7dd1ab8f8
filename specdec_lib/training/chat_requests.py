"""Chat requests to distil a chat target's drafts on: the three kinds of request the benchmark makes, cut from
the standard-library corpus (`make smol-draft`, `make smol-eagle`).

A draft learns what the target says next, so its training text should be what the target says at decode time:
its own answers to the kinds of request it is benchmarked on. The benchmark's suites ask three things
(`models.CHAT_INSTRUCTIONS`); each has a stand-in here built from corpus files of the split asked for (the
training split for training, the held-out split for the held-out measure), never from HumanEval (a test suite)
or the committed prompt files:

- "code": continue a file: 20-40 consecutive lines of a file (the code suite's setting);
- "humaneval": complete a function: a function's signature and docstring, its body left out (HumanEval's
  setting, with the standard library's own documented functions instead of its problems);
- "editing": write the code after an edit: a function, then a copy of it rewritten by one of the editing
  suite's edits (`make_prompts.EDITS`: a rename, 2-space indents, quotes, type hints) cut part-way.

Simplifications: one request per drawn file or function (seeded); the functions are those `make_prompts`
would take for its editing suite (6-40 lines, at most SNIPPET_TOKENS of the target's tokenizer).
"""
from __future__ import annotations

import ast
import random
import textwrap

KINDS = ("code", "humaneval", "editing")
MAX_CHARS = 1600  # a "continue" request of 20-40 lines keeps to about 400 tokens (batched answers pad to the longest)


def continue_request(text: str, rng: random.Random) -> str | None:
    """20-40 consecutive lines of a file of more than 60 lines: continue it."""
    lines = text.splitlines()
    if len(lines) <= 60:
        return None
    start, size = rng.randrange(0, len(lines) - 45), rng.randrange(20, 40)
    taken = lines[start:start + size]
    while len(taken) > 20 and sum(map(len, taken)) > MAX_CHARS:  # long lines: fewer of them
        taken.pop()
    return "\n".join(taken)


def _documented(text: str, node) -> str | None:
    """A function's signature and docstring (dedented), without its body; None when it has no docstring or
    nothing follows the docstring."""
    body = node.body
    if not (ast.get_docstring(node) and len(body) > 1 and isinstance(body[0], ast.Expr)):
        return None
    lines = text.splitlines(keepends=True)
    return textwrap.dedent("".join(lines[node.lineno - 1: body[0].end_lineno]))


def function_request(text: str, rng: random.Random) -> str | None:
    """A documented function of a file (module level or a method), its body left out: complete it."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    heads = [h for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
             and 3 <= node.end_lineno - node.lineno < 60 and (h := _documented(text, node))]
    return rng.choice(heads) if heads else None


def edit_request(text: str, rng: random.Random, tok) -> str | None:
    """A function, then a rewritten copy of it cut part-way: the editing suite's prompt, from this file."""
    from ..tools.make_prompts import EDITS, _functions, edit_prompt

    functions = list(_functions("", text.splitlines(keepends=True), tok))
    if not functions:
        return None
    _, snippet, node = rng.choice(functions)
    return edit_prompt(snippet, node, rng.choice(EDITS), rng)


def chat_requests(texts: list[str], n: int, seed: int, tok, kinds=KINDS) -> list[tuple[str, str]]:
    """`n` (kind, prompt) pairs, the kinds in turn, each cut from a seeded draw of `texts` (whole files)."""
    rng = random.Random(seed)
    makers = {"code": continue_request, "humaneval": function_request,
              "editing": lambda text, r: edit_request(text, r, tok)}
    unknown = set(kinds) - set(makers)
    if unknown:
        raise ValueError(f"unknown request kinds {sorted(unknown)}: choose among {list(makers)}")
    out = []
    for _ in range(50 * n):
        if len(out) >= n:
            break
        kind = kinds[len(out) % len(kinds)]
        prompt = makers[kind](rng.choice(texts), rng)
        if prompt and prompt.strip():
            out.append((kind, prompt))
    if len(out) < n:
        raise ValueError(f"only {len(out)} of {n} requests could be cut from {len(texts)} files")
    return out
