"""Write the project's own prompt suites: data/prompts/code.jsonl, editing.jsonl and long_code.jsonl.

    python -m specdec_lib.tools.make_prompts            # deterministic: same stdlib + same seed -> same files

Both suites are cut from the *held-out* standard-library files only (`corpus.is_heldout`), so the tiny pair
never saw a line of them in training. Each row is {"id", "suite", "prompt", "source"}.

- code: continue a file. A seeded cut point at a line boundary; the prompt is the lines before it (60 to
  120 lines are taken, then leading lines are dropped until the prompt fits PROMPT_TOKENS tokens of the
  tiny tokenizer). The continuation is fresh code: the setting of Spec-Bench's "coding" category.
- editing: "repetitive editing". A function from a held-out file, then a rewritten copy of it (an identifier
  renamed, indentation changed, quotes swapped, or type hints added) cut part-way, so most of the
  continuation repeats text already in the prompt: the case where prompt lookup shines.

- long_code: repository-level completion for long contexts. Held-out files concatenated (each under a
  `# file: Lib/<path>` line) to about 1k, 2k, 4k, 8k and 16k tokens, ending part-way through the last file:
  the continuation of that file, with the other files as context (`category` is the length, "16k").

Prompts of code and editing + 128 new tokens stay well inside the tiny target's 1024-token context; long_code
needs the long pair (`load_models("tiny-long")`, YaRN).

Simplifications: the suites depend on the standard library of the Python that wrote them (the `source`
field names the version); they are committed, so other machines read them rather than rebuild them.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import json
import keyword
import random
import re
import sys
import textwrap
from pathlib import Path

from ..corpus import is_heldout, stdlib_files
from ..env import PROMPTS_DIR, TINY_DIR

PROMPT_TOKENS = 300  # code prompts: at most this many tiny-tokenizer tokens
SNIPPET_TOKENS = 170  # editing: the original function is at most this long
EDIT_PROMPT_TOKENS = 400  # editing: original + partial rewrite
N_PROMPTS = 24
SEED = 0
LONG_LENGTHS = (1024, 2048, 4096, 8192, 16384)  # long_code: prompt lengths (tiny-tokenizer tokens, at most)
LONG_PER_LENGTH = 3
LONG_TAIL_LINES = 40  # the last file keeps at least this many lines after the cut (the continuation)
LONG_SLACK = 256  # whole files are taken while this many tokens are left for the cut file
PY = f"cpython-{sys.version_info.major}.{sys.version_info.minor}"


def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TINY_DIR / "target"))


def _heldout_sources() -> list[tuple[str, list[str]]]:
    """(relative path, lines with their newlines) of every held-out file that reads as UTF-8."""
    out = []
    for rel, path in stdlib_files():
        if is_heldout(rel):
            try:
                out.append((rel, path.read_text(encoding="utf-8").splitlines(keepends=True)))
            except (UnicodeDecodeError, OSError):
                continue
    return out


def code_prompts(tok, n: int = N_PROMPTS, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    files = [(rel, lines) for rel, lines in _heldout_sources() if len(lines) >= 150]
    rng.shuffle(files)
    rows = []
    for attempt in range(50 * n):  # one prompt per file per round over the files
        if len(rows) >= n:
            break
        rel, lines = files[len(rows) % len(files)]
        cut = rng.randint(80, len(lines) - 40)  # the prompt ends just before line `cut` (0-based)
        if not lines[cut].strip() or not lines[cut - 1].strip():
            continue  # start the continuation on a non-blank line, after a non-blank one
        start = max(0, cut - rng.randint(60, 120))
        while start < cut - 5 and len(tok("".join(lines[start:cut]))["input_ids"]) > PROMPT_TOKENS:
            start += 1
        prompt = "".join(lines[start:cut])
        if len(tok(prompt)["input_ids"]) > PROMPT_TOKENS or any(r["prompt"] == prompt for r in rows):
            continue
        rows.append({"id": f"code-{len(rows):02d}", "suite": "code", "prompt": prompt,
                     "source": f"{PY} Lib/{rel} lines {start + 1}-{cut}"})
    return rows


def _functions(rel: str, lines: list[str], tok):
    """(first line, function source dedented, node) of each function that fits SNIPPET_TOKENS."""
    try:
        tree = ast.parse("".join(lines))
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and 6 <= node.end_lineno - node.lineno < 40:
            text = textwrap.dedent("".join(lines[node.lineno - 1: node.end_lineno]))
            if len(tok(text)["input_ids"]) <= SNIPPET_TOKENS and node.body[0].lineno > node.lineno:
                yield node.lineno, text, node


def _rename(text: str, node, rng):
    names = {}
    for sub in ast.walk(node):
        name = sub.id if isinstance(sub, ast.Name) else sub.arg if isinstance(sub, ast.arg) else None
        if name and name not in ("self", "cls") and not keyword.iskeyword(name) and len(name) > 1:
            names[name] = names.get(name, 0) + 1
    names = sorted(n for n, c in names.items() if c >= 3 and n not in dir(builtins))
    if not names:
        return None
    old = rng.choice(names)
    parts = old.strip("_").split("_")
    new = parts[0] + "".join(p.title() for p in parts[1:]) if len(parts) > 1 else old + "_value"
    if new == old or re.search(rf"\b{re.escape(new)}\b", text):
        new = "the_" + old.strip("_")
    return re.sub(rf"\b{re.escape(old)}\b", new, text), f"`{old}` renamed to `{new}`"


def _indent2(text: str, node, rng):
    out = [re.sub(r"^((?:    )+)", lambda m: "  " * (len(m.group(1)) // 4), line)
           for line in text.splitlines(keepends=True)]
    return "".join(out), "indented with 2 spaces instead of 4"


def _quotes(text: str, node, rng):
    if text.count("'") < 2 or '"' in text:
        return None
    return text.replace("'", '"'), "single quotes changed to double quotes"


def _hints(text: str, node, rng):
    args = node.args
    every = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
    if not every or any(a.annotation for a in every) or node.returns:
        return None
    for a in every:
        if a.arg not in ("self", "cls"):
            a.annotation = ast.Name("Any")
    lines = text.splitlines(keepends=True)
    header = node.body[0].lineno - node.lineno  # signature lines (decorators are not in `text`)
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    signature = f"{prefix} {node.name}({ast.unparse(args)}) -> Any:\n"
    return signature + "".join(lines[header:]), "type hints added with Any"


EDITS = [_rename, _indent2, _quotes, _hints]


def edit_prompt(text: str, node, edit, rng) -> str | None:
    """The function `text`, then its copy rewritten by `edit` cut part-way (30-60 % of its lines, at least 2);
    None where the edit does not apply or changes nothing."""
    changed = edit(text, node, rng)
    if changed is None or changed[0] == text:
        return None
    new_text, what = changed
    new_lines = new_text.splitlines(keepends=True)
    keep = max(2, round(len(new_lines) * rng.uniform(0.3, 0.6)))
    return f"# Before:\n{text}\n# After ({what}):\n{''.join(new_lines[:keep])}"


def editing_prompts(tok, n: int = N_PROMPTS, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    candidates = [(rel, line, text, node) for rel, lines in _heldout_sources()
                  for line, text, node in _functions(rel, lines, tok)]
    candidates.sort(key=lambda c: (c[0], c[1]))
    rng.shuffle(candidates)
    rows, used_files = [], {}
    for rel, line, text, node in candidates:
        if len(rows) >= n:
            break
        if used_files.get(rel, 0) >= 2:  # spread the suite over many files
            continue
        edit = EDITS[len(rows) % len(EDITS)]
        prompt = edit_prompt(text, node, edit, rng)
        if prompt is None or len(tok(prompt)["input_ids"]) > EDIT_PROMPT_TOKENS:
            continue
        used_files[rel] = used_files.get(rel, 0) + 1
        rows.append({"id": f"editing-{len(rows):02d}", "suite": "editing", "prompt": prompt,
                     "source": f"{PY} Lib/{rel} line {line}, {edit.__name__.strip('_')}"})
    return rows


def long_code_prompts(tok, lengths=LONG_LENGTHS, per_length: int = LONG_PER_LENGTH, seed: int = SEED) -> list[dict]:
    """Repository-level completion: held-out files, each under a `# file: Lib/<path>` line, concatenated until
    the prompt holds close to `length` tokens, the last file cut at a line boundary with at least
    LONG_TAIL_LINES lines of it left to continue. One seeded file order per prompt."""
    sources = [(rel, lines) for rel, lines in _heldout_sources() if len(lines) >= 2 * LONG_TAIL_LINES]
    count = lambda text: len(tok(text)["input_ids"])  # noqa: E731
    rows, rng = [], random.Random(seed)
    for length in lengths:
        for i in range(per_length):
            order = list(sources)
            rng.shuffle(order)
            text, used = "", []
            for rel, lines in order:
                header = f"# file: Lib/{rel}\n"
                whole = header + "".join(lines) + "\n"
                if count(text + whole) <= length - LONG_SLACK:  # a whole file fits: take it and go on
                    text, used = text + whole, used + [f"Lib/{rel}"]
                    continue
                lo, hi = LONG_TAIL_LINES // 2, len(lines) - LONG_TAIL_LINES  # the cut of the last file
                if count(text + header + "".join(lines[:lo])) > length:
                    continue  # not even its first lines fit: try a shorter file
                while lo < hi:  # the longest cut that fits
                    mid = (lo + hi + 1) // 2
                    lo, hi = (mid, hi) if count(text + header + "".join(lines[:mid])) <= length else (lo, mid - 1)
                prompt = text + header + "".join(lines[:lo])
                rows.append({"id": f"long_code-{length // 1024}k-{i}", "suite": "long_code",
                             "category": f"{length // 1024}k", "context": length, "prompt": prompt,
                             "source": f"{PY} " + ", ".join(used + [f"Lib/{rel} lines 1-{lo}"])})
                break
    return rows


def write(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(PROMPTS_DIR))
    parser.add_argument("--n", type=int, default=N_PROMPTS)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    tok = _tokenizer()
    makers = (("code", lambda: code_prompts(tok, args.n, args.seed)),
              ("editing", lambda: editing_prompts(tok, args.n, args.seed)),
              ("long_code", lambda: long_code_prompts(tok, seed=args.seed)))
    for name, make in makers:
        rows = make()
        path = Path(args.out) / f"{name}.jsonl"
        write(rows, path)
        lengths = [len(tok(r["prompt"])["input_ids"]) for r in rows]
        print(f"{path}: {len(rows)} prompts, {min(lengths)}-{max(lengths)} tokens, "
              f"{path.stat().st_size / 1024:.1f} KB")


if __name__ == "__main__":
    main()
