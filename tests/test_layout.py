"""The folder listing is the architecture: rooms by role, imports only downward, no cycle, short module docs."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specdec_lib"
FILES = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)

# what each room may not import (a room: a top-level folder of the package, or "" for its root modules)
HIGHER = ("models", "methods", "bench", "viz", "tools", "training", "workbook")
BANNED = {
    # the root's base modules import no other room and no contract module; the contract (decoding, loop) and
    # tables stand on mechanisms/ and never import the model loader
    "env": HIGHER + ("mechanisms", "decoding", "loop", "tables", "sampling", "corpus", "compat"),
    "compat": HIGHER + ("mechanisms", "decoding", "loop", "tables", "sampling", "corpus"),
    "sampling": HIGHER + ("mechanisms", "decoding", "loop", "tables"),
    "corpus": HIGHER + ("mechanisms", "decoding", "loop", "tables"),
    "": HIGHER,
    "mechanisms": ("models", "methods", "bench", "viz", "tools", "training", "workbook", "decoding", "loop"),
    "models": ("methods", "bench", "viz", "tools", "training", "workbook", "decoding", "loop"),
    "methods": ("bench", "viz", "tools", "training", "workbook"),
    "bench": ("tools", "training", "workbook"),
    "viz": ("tools", "training", "workbook"),
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every specdec_lib module `path` imports, at any depth of its code (function-level imports included)."""
    package = ".".join(path.relative_to(ROOT).parent.parts)
    known = {_module(p) for p in FILES}
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "specdec_lib":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "specdec_lib")
    return out


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else ""


def test_the_package_root_holds_at_most_eight_modules():
    modules = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 8, modules


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_room_imports_only_downward(path):
    me = _module(path)
    if me == "specdec_lib":  # the package's __init__ assembles the public API from every room
        return
    room = _room(me)
    banned = BANNED.get(me.split(".")[1] if room == "" else room, BANNED[""] if room == "" else ())
    for target in _imports(path):
        parts = target.split(".")
        assert len(parts) < 2 or parts[1] not in banned, f"{me} ({room or 'root'}) imports {target}"


def test_no_import_cycle():
    graph = {_module(p): {t for t in _imports(p)} for p in FILES}
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph or w == v:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            # a package's __init__ re-exporting its own modules is not a cycle of code
            code = [m for m in component if not (PACKAGE / Path(*m.split(".")[1:]) / "__init__.py").exists()]
            if len(code) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, cycles


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_docstrings_are_short_and_hold_no_measurement(path):
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
    assert len(doc.splitlines()) <= 25, f"{len(doc.splitlines())} lines"
    # a time measured on one machine (e.g. '17.3 ms', 'on this VM', a date) belongs in data/results, not in code
    found = re.findall(r"\d+\.\d+\s?ms\b|\bthis (?:sitting|VM)\b|\b20\d\d-\d\d-\d\d\b", doc)
    assert not found, found


def test_the_budget_facade_asks_no_chooser_its_type():
    """Every chooser answers one protocol (budget/facade.py): the facade never tests a chooser's class, and no
    method reaches past the facade to its chooser."""
    facade = (PACKAGE / "mechanisms" / "budget" / "facade.py").read_text()
    for node in ast.walk(ast.parse(facade)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            assert "chooser" not in ast.unparse(node), ast.unparse(node)
    for path in FILES:
        if path.parent.name != "budget":
            assert ".chooser" not in path.read_text(), f"{path.relative_to(ROOT)} reads a budget's chooser"
