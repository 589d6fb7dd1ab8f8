"""The distillation requests of SmolLM2's drafts (`training/chat_requests.py`), cut from real Python files (two of
this package's own modules, standing in for the standard-library corpus)."""
from __future__ import annotations

import ast
import inspect
import random
import re
import textwrap

import pytest
from transformers import AutoTokenizer

import specdec_lib.corpus as corpus_module
import specdec_lib.mechanisms.ngram_table as table_module
from specdec_lib.env import TINY_DIR
from specdec_lib.training.chat_requests import KINDS, chat_requests, edit_request, function_request


@pytest.fixture(scope="module")
def texts():
    # Two real files of this package: long, with documented functions.
    return [inspect.getsource(corpus_module), inspect.getsource(table_module)]


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(TINY_DIR / "target"))


def test_requests_take_the_kinds_in_turn_and_are_seeded(texts, tok):
    rows = chat_requests(texts, 9, seed=1, tok=tok)
    assert [k for k, _ in rows] == list(KINDS) * 3
    assert rows == chat_requests(texts, 9, seed=1, tok=tok)
    assert rows != chat_requests(texts, 9, seed=2, tok=tok)
    # a bigger run draws the smaller one's requests first: distillation data extends without answering them again
    assert chat_requests(texts, 15, seed=1, tok=tok)[:9] == rows
    for kind, prompt in rows:
        if kind == "code":  # consecutive lines of one of the files
            assert any(prompt in t for t in texts) and prompt.count("\n") >= 19
        if kind == "editing":
            assert prompt.startswith("# Before:\ndef ") and "\n# After (" in prompt


def test_function_request_is_a_signature_and_docstring_without_the_body(texts):
    rng = random.Random(0)
    for _ in range(10):
        head = function_request(texts[0], rng)
        node = ast.parse(head + "    pass\n").body[0]  # what remains is a def whose body is its docstring
        assert isinstance(node, ast.FunctionDef) and ast.get_docstring(node)
        whole = textwrap.dedent(inspect.getsource(getattr(corpus_module, node.name)))
        assert whole.startswith(head) and len(whole) > len(head)  # a prefix of the real function: the body is cut


def test_edit_request_rewrites_the_function_it_shows(texts, tok):
    rng = random.Random(3)
    prompts = [p for p in (edit_request(texts[1], rng, tok) for _ in range(12)) if p]
    assert prompts
    for prompt in prompts:
        before, after = prompt.split("\n# After (", 1)
        what, rewritten = after.split("):\n", 1)
        assert re.fullmatch(r"`\w+` renamed to `\w+`|indented with 2 spaces instead of 4|"
                            r"single quotes changed to double quotes|type hints added with Any", what)
        assert 2 <= rewritten.count("\n") < before.count("\n")  # the rewritten copy, cut part-way


def test_bad_requests_say_why(texts, tok):
    with pytest.raises(ValueError, match="unknown request kinds"):
        chat_requests(texts, 3, 0, tok, kinds=("code", "poetry"))
    with pytest.raises(ValueError, match="could be cut"):
        chat_requests(["x = 1\n"], 3, 0, tok)
