"""Is the real pair's SMOKE workbook still known to pass? `make test` asks this; `make test-full` records it.

The real pair's workbook (every notebook with MODELS = "smol": SmolLM2-135M-Instruct, its exit draft, its EAGLE head)
is the longest run of the suite (docs/testing.md has its time), so `make test` leaves it out, but a change that could break a notebook
on the real pair only must still be checked before it lands. This file hashes what such a break can come from (the
notebooks, the model-loading code, the notebook runtime, the shipped real-pair models and the lock) and compares the
hash with the one `make test-full` recorded in tests/real_pair_stamp.json after a full run that passed:

    python tests/real_pair_stamp.py --marker   # the pytest -m expression make test runs: adds the real pair's
                                                 workbook where the hash differs (and says why, on stderr)
    python tests/real_pair_stamp.py --record   # after a passing `make test-full`: write the stamp (commit it)

A change elsewhere in the library (a method, a mechanism) reaches the real pair through code `make test` already
runs on it: tests/test_smol.py runs every method on the real pair against HF greedy, token for token.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP = ROOT / "tests" / "real_pair_stamp.json"
# what a notebook run on the real pair reads besides the methods (globs relative to the repository root)
WATCHED = (
    "notebooks/*.ipynb",
    "specdec_lib/models/*.py", "specdec_lib/env.py", "specdec_lib/compat.py", "specdec_lib/tables.py",
    "specdec_lib/workbook/notebook.py", "specdec_lib/workbook/claims.py", "specdec_lib/workbook/run_notebooks.py",
    "specdec_lib/workbook/offline_views.py",
    "data/models/smol-*/**/*", "data/prompts/**/*", "data/results/notebooks/**/*", "data/tables/**/*",
    "requirements/lock.txt", "pyproject.toml", "tests/conftest.py",
)
FAST = "not full"
WITH_REAL_PAIR = "not full or real_pair_workbook"


def watched_files() -> list[Path]:
    files = {p for pattern in WATCHED for p in ROOT.glob(pattern) if p.is_file() and "__pycache__" not in p.parts}
    return sorted(files)


def digest(files: list[Path] | None = None) -> str:
    h = hashlib.sha256()
    for path in watched_files() if files is None else files:
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def recorded() -> dict | None:
    return json.loads(STAMP.read_text()) if STAMP.exists() else None


def marker() -> str:
    """FAST where the stamp matches what is here; else FAST plus the real pair's workbook (the reason on stderr)."""
    stamp = recorded()
    if stamp is None:
        print("real pair: no stamp of a full run (tests/real_pair_stamp.json): its workbook runs", file=sys.stderr)
        return WITH_REAL_PAIR
    if stamp.get("sha256") != digest():
        print(f"real pair: notebooks or model code changed since the full run of {stamp.get('recorded')}: its "
              f"workbook runs", file=sys.stderr)
        return WITH_REAL_PAIR
    print(f"real pair: unchanged since the full run of {stamp.get('recorded')} (tests/real_pair_stamp.json): its "
          f"workbook is left to make test-full", file=sys.stderr)
    return FAST


def record(seconds: float | None = None) -> dict:
    files = watched_files()  # read once: the digest and the count are of the same files
    stamp = dict(sha256=digest(files), files=len(files), recorded=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 machine=f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    if seconds is not None:
        stamp["full_seconds"] = round(seconds)
    STAMP.write_text(json.dumps(stamp, indent=1) + "\n")
    return stamp


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--marker", action="store_true", help="print the -m expression for make test")
    group.add_argument("--record", action="store_true", help="write the stamp (after a passing make test-full)")
    parser.add_argument("--seconds", type=float, help="with --record: how long the full run took")
    args = parser.parse_args(argv)
    if args.marker:
        print(marker())
    else:
        print(json.dumps(record(args.seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
