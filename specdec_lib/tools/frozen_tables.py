"""`python -m specdec_lib.tools.frozen_tables --build-frozen`: count the tiny pair's frozen table from the
standard-library corpus and write it under data/tables (what the workbook ships). The tables themselves, built
on demand and resolved for a run, are `specdec_lib.tables`."""
from __future__ import annotations

from pathlib import Path

from ..env import TINY_DIR
from ..tables import build_frozen_table, frozen_table_path


def main(argv=None) -> int:
    """`python -m specdec_lib.tools.frozen_tables --build-frozen`: the tiny pair's frozen table, paper defaults (LC: all)."""
    import argparse, tempfile  # noqa: E401
    from transformers import AutoTokenizer
    from ..corpus import load_corpus
    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("--build-frozen", action="store_true", required=True, help="build and save the table")
    for flag, default in (("--ll", 1), ("--fl", 3), ("--lc", 2**20), ("--fc", 128)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--corpus-dir", default=str(Path(tempfile.gettempdir()) / "specdec_corpus"))
    parser.add_argument("--out", default=None, help="default: data/tables/tiny_frozen_LL<ll>_FL<fl>.npz")
    args = parser.parse_args(argv)
    tokenizer = AutoTokenizer.from_pretrained(str(TINY_DIR / "target"))
    texts = load_corpus(args.corpus_dir)["train"]["text"]  # training split only; a list also without `datasets`
    table = build_frozen_table(tokenizer, texts, args.ll, args.fl, args.lc, args.fc)
    print(table, "->", table.save(args.out or frozen_table_path(args.ll, args.fl)), table.size_summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
