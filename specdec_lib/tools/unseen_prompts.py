"""Write three suites no budget was tuned on: data/prompts/rename.jsonl, chat.jsonl and translation.jsonl.

    python -m specdec_lib.tools.unseen_prompts        # deterministic: same stdlib + same seed -> same files

"auto" budgets learn their costs and acceptance on the prompt they decode, but their priors, ladders and probe
schedules were chosen while watching the code and editing suites. These suites are different tasks, so that
`make bench-never` can show whether "never slower than plain decoding" holds where nothing was tuned:

- rename: a whole-code edit asked in words ("rename `a` to `b` and return the whole code"), a held-out
  standard-library function in a code block. Unlike the editing suite no rewritten copy is started: the model
  writes the whole function again, most of it copied from the prompt.
- chat: open questions of everyday conversation, written here (CHAT_QUESTIONS): no code, little to copy.
- translation: a prose docstring of a held-out standard-library function, to be translated into French: the
  output shares names and numbers with the prompt but few n-grams.

Each row is {"id", "suite", "prompt", "source"}; the prompt is the whole user turn (a chat model gets it as it
is, `ModelPair.chat_text`). Left out: multi-turn chat; languages other than French.
"""
from __future__ import annotations

import argparse
import ast
import random
import re
from pathlib import Path

from ..env import PROMPTS_DIR
from ..models.loading import UNSEEN_SUITES
from .make_prompts import PY, SEED, _functions, _heldout_sources, _tokenizer, write

N_PROMPTS = 12
DOC_WORDS = (30, 160)  # translation: a docstring of this many words
CHAT_QUESTIONS = (
    "What are three good habits for getting better sleep?",
    "Explain to a ten-year-old why the sky is blue.",
    "I have eggs, spinach and some cheese. What could I cook for dinner?",
    "Write a short, friendly email inviting my team to a picnic next Friday.",
    "What is the difference between weather and climate?",
    "Give me some tips for learning to play the guitar as an adult.",
    "How do I politely decline an invitation to a party?",
    "Why do leaves change colour in autumn?",
    "Suggest a plan for a relaxing weekend in a small seaside town.",
    "What should I consider before adopting a dog?",
    "Describe how a bicycle's gears make climbing hills easier.",
    "Write a short poem about the first snow of winter.",
)


def rename_prompts(tok, n: int = N_PROMPTS, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed + 1)  # not the editing suite's draw of functions
    candidates = [(rel, line, text, node) for rel, lines in _heldout_sources()
                  for line, text, node in _functions(rel, lines, tok)]
    candidates.sort(key=lambda c: (c[0], c[1]))
    rng.shuffle(candidates)
    rows, used = [], set()
    for rel, line, text, node in candidates:
        if len(rows) >= n:
            break
        if rel in used or node.name.startswith("_") or len(node.name) < 4:
            continue
        parts = node.name.split("_")
        new = parts[0] + "".join(p.title() for p in parts[1:]) if len(parts) > 1 else f"{node.name}_v2"
        if new == node.name or re.search(rf"\b{re.escape(new)}\b", text):
            continue
        used.add(rel)
        prompt = (f"Rename the function `{node.name}` to `{new}` and return the whole code.\n\n"
                  f"```python\n{text}```\n")
        rows.append({"id": f"rename-{len(rows):02d}", "suite": "rename", "prompt": prompt,
                     "source": f"{PY} Lib/{rel} line {line}"})
    return rows


def chat_prompts(n: int = N_PROMPTS) -> list[dict]:
    return [{"id": f"chat-{i:02d}", "suite": "chat", "prompt": q, "source": "written for this suite"}
            for i, q in enumerate(CHAT_QUESTIONS[:n])]


def _prose(doc: str) -> str | None:
    """The docstring's first paragraph, when it reads as prose (enough words, little code)."""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    words = paragraph.split()
    if not DOC_WORDS[0] <= len(words) <= DOC_WORDS[1]:
        return None
    if sum(ch in "()[]{}=<>_*" for ch in paragraph) > len(words) // 3 or ">>>" in paragraph:
        return None
    return paragraph


def translation_prompts(n: int = N_PROMPTS, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed + 2)
    candidates = []
    for rel, lines in _heldout_sources():
        try:
            tree = ast.parse("".join(lines))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and (doc := ast.get_docstring(node)):
                if (text := _prose(doc)) is not None:
                    candidates.append((rel, node.lineno, text))
    candidates.sort()
    rng.shuffle(candidates)
    rows, used = [], {}
    for rel, line, text in candidates:
        if len(rows) >= n:
            break
        if used.get(rel, 0) >= 2 or any(text in r["prompt"] for r in rows):  # spread over files
            continue
        used[rel] = used.get(rel, 0) + 1
        rows.append({"id": f"translation-{len(rows):02d}", "suite": "translation",
                     "prompt": f"Translate this text into French. Reply with the translation only.\n\n{text}",
                     "source": f"{PY} Lib/{rel} line {line}, docstring"})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(PROMPTS_DIR))
    parser.add_argument("--n", type=int, default=N_PROMPTS)
    args = parser.parse_args(argv)
    tok = _tokenizer()
    suites = dict(rename=rename_prompts(tok, args.n), chat=chat_prompts(args.n),
                  translation=translation_prompts(args.n))
    for name, rows in suites.items():
        path = Path(args.out) / f"{name}.jsonl"
        write(rows, path)
        lengths = [len(tok(r["prompt"])["input_ids"]) for r in rows]
        print(f"{path}: {len(rows)} prompts, {min(lengths)}-{max(lengths)} tokens")


if __name__ == "__main__":
    main()
