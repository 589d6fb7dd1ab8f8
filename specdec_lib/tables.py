"""Frozen n-gram tables as files: count one from a corpus, where it lives, build on demand, resolve for a run.

The table itself (`mechanisms.ngram_table.FrozenNgramTable`, with its .npz format) is a mechanism; this module
is the data around it, beside `models` (Cacheback §3.3: the frozen table is counted offline from a corpus):
- `build_frozen_table(tokenizer, texts, LL, FL, LC, FC)`: tokenize and count;
- `frozen_table_path` (the shipped table under data/tables), `cached_table_path` / `table_cache_dir` (tables built
  on demand, under $SPECDEC_CACHE or ~/.cache/specdec_lib), `ensure_frozen_table` (build once, then reuse);
- `resolve_frozen(frozen, target, ...)`: what `cacheback(frozen=...)` means (True, False, "build", a path, a table),
  tables loaded once per process;
- the CLI that rewrites the shipped table is `python -m specdec_lib.tools.frozen_tables --build-frozen`.

Simplifications: one corpus by default (the standard library's training split); a cached table is trusted by
its name (tokenizer hash, corpus tag, LL, FL, LC, FC).
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

from .env import check_int
from .mechanisms.ngram_table import FrozenNgramTable, tokenizer_meta
from .env import DATA_DIR, cache_root, vocab_size

def build_frozen_table(tokenizer, texts, leader_len=1, follower_len=3, leader_capacity=2**20,
                       follower_capacity=128, progress=True, batch_size=256, text_column="text"):
    """Tokenize `texts` (strings, or a `datasets.Dataset` with `text_column`) and count them. No special tokens,
    as in `ModelPair.encode`, so the table holds the ids the decoder will query it with."""
    from tqdm.auto import tqdm

    if hasattr(texts, "column_names") or isinstance(texts, dict):  # a Dataset, or load_corpus's plain columns
        texts = texts[text_column]
    texts, streams = list(texts), []
    if not all(isinstance(t, str) for t in texts):
        raise TypeError("texts must be strings (or a dataset / dict with a text column)")
    for start in tqdm(range(0, len(texts), batch_size), desc="tokenize", disable=not progress):
        # verbose=False: corpus files are longer than the model's context, which is fine for counting.
        batch = tokenizer(texts[start:start + batch_size], add_special_tokens=False, verbose=False)
        streams.extend(batch["input_ids"])
    return FrozenNgramTable.from_token_streams(streams, leader_len, follower_len, leader_capacity,
                                               follower_capacity, progress=progress, meta=tokenizer_meta(tokenizer))


def frozen_table_path(leader_len: int = 1, follower_len: int = 3, name: str = "tiny") -> Path:
    """Where the workbook keeps a pair's frozen table: data/tables/<name>_frozen_LL<ll>_FL<fl>.npz."""
    return DATA_DIR / "tables" / f"{name}_frozen_LL{leader_len}_FL{follower_len}.npz"


def table_cache_dir() -> Path:
    """Where tables built on demand are kept: $SPECDEC_CACHE/tables, else ~/.cache/specdec_lib/tables."""
    return cache_root() / "tables"


def cached_table_path(tokenizer, leader_len: int, follower_len: int, leader_capacity: int = 2**20,
                      follower_capacity: int = 128, corpus_tag: str = "stdlib", cache_dir=None) -> Path:
    """Where `ensure_frozen_table` keeps a table built on demand (it may not exist yet)."""
    safe_tag = "".join(c if c.isalnum() or c in "-_." else "_" for c in corpus_tag)
    name = (f"frozen_{tokenizer_meta(tokenizer)['vocab_fingerprint']}_{safe_tag}_LL{leader_len}_FL{follower_len}"
            f"_LC{leader_capacity}_FC{follower_capacity}.npz")
    return Path(cache_dir or table_cache_dir()) / name


def ensure_frozen_table(tokenizer, leader_len: int = 1, follower_len: int = 3, leader_capacity: int = 2**20,
                        follower_capacity: int = 128, texts=None, corpus_tag: str | None = None,
                        cache_dir=None, progress: bool = True) -> Path:
    """The path of a frozen table for this tokenizer and (LL, FL), building and caching it when missing.

    Order: the table shipped under data/tables when it was built with this very tokenizer (vocabulary hash)
    and the default corpus and capacities; else a table cached under `cache_dir` (default `table_cache_dir()`)
    named by the tokenizer's hash, the corpus tag, LL, FL, LC and FC; else build it from `texts` (default: the
    training split of the standard-library corpus, loaded with `datasets`; pass other texts with a
    `corpus_tag` naming them, e.g. a hub dataset's column) and save it there. A build counts every window of
    the corpus (slow next to loading one: hence once, then cached)."""
    import tempfile

    for name, value in dict(leader_len=leader_len, follower_len=follower_len, leader_capacity=leader_capacity,
                            follower_capacity=follower_capacity).items():
        check_int(name, value, 1)
    if texts is not None and not corpus_tag:
        raise ValueError("texts given without a corpus_tag: name the corpus, so its cached table is not "
                         "mistaken for another corpus's")
    meta = tokenizer_meta(tokenizer)
    corpus_tag = corpus_tag or "stdlib"
    shipped = frozen_table_path(leader_len, follower_len)
    if corpus_tag == "stdlib" and (leader_capacity, follower_capacity) == (2**20, 128) and shipped.is_file():
        with np.load(shipped) as data:
            shipped_meta = json.loads(str(data["meta"]))
        if shipped_meta.get("vocab_fingerprint") == meta["vocab_fingerprint"]:
            return shipped
    path = cached_table_path(tokenizer, leader_len, follower_len, leader_capacity, follower_capacity, corpus_tag,
                             cache_dir)
    if path.is_file():
        return path
    if texts is None:
        from .corpus import load_corpus
        texts = load_corpus(Path(tempfile.gettempdir()) / "specdec_corpus")["train"]["text"]
    table = build_frozen_table(tokenizer, texts, leader_len, follower_len, leader_capacity, follower_capacity,
                               progress=progress)
    table.meta["corpus"] = corpus_tag
    path.parent.mkdir(parents=True, exist_ok=True)
    return table.save(path)


def _table_ready(tokenizer, ll: int, fl: int, lc: int, fc: int) -> bool:
    """True when `ensure_frozen_table` would find the table (shipped for this tokenizer, or cached) unbuilt."""
    if cached_table_path(tokenizer, ll, fl, lc, fc).is_file():
        return True
    shipped = frozen_table_path(ll, fl)
    if (lc, fc) != (2**20, 128) or not shipped.is_file():
        return False
    with np.load(shipped) as data:
        return json.loads(str(data["meta"])).get("vocab_fingerprint") == tokenizer_meta(tokenizer)["vocab_fingerprint"]


class NoFrozenTableWarning(UserWarning):
    """frozen=True but no usable frozen table: Cacheback runs with the dynamic table alone."""


_WARNED = False  # the no-frozen-table warning is given once per process
_FROZEN: dict = {}  # (path, mtime, lc, fc) -> FrozenNgramTable, loaded once per process


def _load_frozen(path: Path, lc: int, fc: int, tokenizer=None) -> FrozenNgramTable:
    """Load once per process; keep the top lc leaders and top fc followers when smaller than the file's."""
    key = (str(path.resolve()), path.stat().st_mtime_ns, lc, fc, id(tokenizer) if tokenizer is not None else None)
    if key not in _FROZEN:
        table = FrozenNgramTable.load(path, tokenizer=tokenizer)
        if lc < table.leader_capacity or fc < table.follower_capacity:
            table = FrozenNgramTable(table.leader_len, table.follower_len, min(lc, table.leader_capacity),
                                     min(fc, table.follower_capacity), meta=table.meta, _trusted=True,
                                     entries=[(leader, fs[:fc]) for leader, fs in table.items()[:lc]])
        _FROZEN[key] = table
    return _FROZEN[key]


def forget_frozen_tables() -> None:
    """Drop the frozen tables this process has loaded (a large-LL table holds hundreds of MB)."""
    _FROZEN.clear()


def _mismatch(table, vocab: int) -> str | None:
    built = table.meta.get("vocab_size")
    if built is not None and built != vocab:
        return (f"it was built for a vocabulary of {built} tokens ({table.meta.get('tokenizer')}), "
                f"the target has {vocab}")
    return None


def resolve_frozen(frozen, target, ll: int, fl: int, lc: int, fc: int, tokenizer=None):
    """The frozen table to use, or None.

    True: with `tokenizer`, the table of the pair's own tokenizer: the shipped one when it was built with it,
    else one built earlier in the cache, else built now from the standard-library corpus (once, slowly;
    one line says so) and cached (`ensure_frozen_table`); without `tokenizer`, the shipped table if it fits the
    target's vocabulary, else warn once and return None. "build": the same as True with a tokenizer (which it
    needs). A path or a FrozenNgramTable: that table, which must fit the target's vocabulary."""
    global _WARNED
    vocab = vocab_size(target)
    if frozen is False or frozen is None:
        return None
    if isinstance(frozen, str) and frozen == "build" and tokenizer is None:
        raise ValueError('frozen="build" needs tokenizer= (the table is counted from text with it)')
    if (frozen is True or frozen == "build") and tokenizer is not None:
        args = (tokenizer, ll, fl, max(lc, 2**20), max(fc, 128))
        if not _table_ready(*args):
            print(f"cacheback: building the frozen table of this tokenizer ({vocab} tokens, LL={ll}, FL={fl}) from "
                  f"the standard-library corpus, once; cached at {cached_table_path(*args)}", flush=True)
        frozen = ensure_frozen_table(*args, progress=False)
    if frozen is True:
        path = frozen_table_path(ll, fl)
        if not path.is_file() and tokenizer is not None:  # built on demand earlier (ensure_frozen_table)
            path = cached_table_path(tokenizer, ll, fl, max(lc, 2**20), max(fc, 128))
        reason = None
        if not path.is_file():
            reason = f"no table for LL={ll}, FL={fl} at {path}"
        else:
            try:
                table = _load_frozen(path, lc, fc, tokenizer)
                reason = _mismatch(table, vocab)
            except ValueError as err:  # another tokenizer (hash check)
                reason = str(err)
        if reason is None:
            return table
        if not _WARNED:
            _WARNED = True
            warnings.warn(f"cacheback: no usable frozen table ({reason}); running with the dynamic table alone "
                          f"(warned once per process; frozen=\"build\" with tokenizer= builds one)",
                          NoFrozenTableWarning, stacklevel=6)  # the caller of generate()
        return None
    if isinstance(frozen, (str, Path)):
        frozen = _load_frozen(Path(frozen), lc, fc, tokenizer)
    if not isinstance(frozen, FrozenNgramTable):
        raise TypeError(f"frozen must be True, False, \"build\", a path or a FrozenNgramTable, "
                        f"got {type(frozen).__name__}")
    reason = _mismatch(frozen, vocab)
    if reason is not None:
        raise ValueError(f"this frozen table does not fit the target: {reason}")
    return frozen
