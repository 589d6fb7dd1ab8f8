"""The training corpus of the shipped tiny pair: the Python standard library's own source files.

Every Python install carries these files, so the corpus needs no download. Whole files are split into
train and held-out by a hash of their relative path (about 1 file in 20 held out), so the split is stable
across machines that carry the same file names, and no held-out line is ever seen in training.

The files are written once to a jsonl cache ({"path", "text"} per line) and then loaded through
`datasets`' `json` builder, the same way a hub dataset would be.

Simplifications: test packages (`test/`, `tests/`, `idle_test/`) and site-packages are left out; files
that are not valid UTF-8 are skipped.
"""
from __future__ import annotations

import json
import os
import sysconfig
import zlib
from pathlib import Path

HELDOUT_MODULUS = 20  # one file in HELDOUT_MODULUS is held out
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relative_path: str) -> bool:
    """Whole-file split: stable because it depends only on the path's name."""
    return zlib.crc32(relative_path.encode()) % HELDOUT_MODULUS == 0


def stdlib_files(root: Path | None = None) -> list[tuple[str, Path]]:
    """(relative path, absolute path) of every standard-library .py file we train or evaluate on, sorted."""
    root = Path(root or stdlib_root())
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = Path(dirpath) / name
                found.append((path.relative_to(root).as_posix(), path))
    return sorted(found)


def write_corpus(cache_dir: str | Path, max_files: int | None = None) -> dict[str, Path]:
    """Write train.jsonl and heldout.jsonl under cache_dir; return {split: path}.

    max_files keeps the first files of each split only (the quick mode the tests use). A cache written
    earlier with the same max_files is reused as it is (so a corpus written on one machine can be carried to
    another, e.g. a GPU machine whose Python has a different standard library)."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    meta_path = cache_dir / "corpus_meta.json"
    paths = {split: cache_dir / f"{split}.jsonl" for split in ("train", "heldout")}
    if meta_path.exists() and all(p.exists() for p in paths.values()):
        if json.loads(meta_path.read_text()).get("max_files") == max_files:
            return paths
    rows: dict[str, list[dict]] = {"train": [], "heldout": []}
    for rel, path in stdlib_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            rows["heldout" if is_heldout(rel) else "train"].append({"path": rel, "text": text})
    out = {}
    for split, items in rows.items():
        if max_files is not None:
            items = items[:max_files]
        out[split] = cache_dir / f"{split}.jsonl"
        with open(out[split], "w", encoding="utf-8") as f:
            for item in items:
                f.write(json.dumps(item) + "\n")
    meta_path.write_text(json.dumps({"max_files": max_files, "stdlib": str(stdlib_root())}))
    return out


def load_corpus(cache_dir: str | Path, max_files: int | None = None):
    """The corpus as a `datasets.DatasetDict` with splits 'train' and 'heldout' (columns path, text).

    Where `datasets` is not installed (the GPU image), the same rows come back as {split: {column: list}},
    which the training script indexes the same way."""
    files = write_corpus(cache_dir, max_files=max_files)
    try:
        import datasets
    except ImportError:
        rows = {}
        for split, path in files.items():
            items = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
            rows[split] = {"path": [r["path"] for r in items], "text": [r["text"] for r in items]}
        return rows
    return datasets.load_dataset("json", data_files={k: str(v) for k, v in files.items()})
