"""The Cacheback n-gram table: an LRU map from leader n-grams to follower n-grams, and its frozen twin.

Paper: Ma, Gim, Zhong, "Cacheback: Speculative Decoding With Nothing But Cache". §3.1: the table and its
recency rules; §3.2: after every decoding step the table is updated with a sliding window over the accepted
tokens; §3.3: a second, frozen table counted offline from a corpus and only read while decoding.

Recency rules (`NgramTable`), the same as the paper and its reference code:
- insert(leader, follower): the leader becomes most recently used (MRU); a present follower becomes MRU among
  its leader's followers, a new one is added as MRU after evicting the leader's LRU follower when it has FC;
  a new leader evicts the LRU leader, with all its followers, when there are LC.
- query(leader): the followers, MRU first ([] when absent); a hit makes the leader MRU, followers keep
  their order. A miss inserts nothing.
Both levels are `OrderedDict`s (a hash map over a doubly linked list, right end = MRU), so lookup, insertion,
eviction and promotion are O(1) and memory is bounded by LC * (LL + FC * FL) tokens.

Among the library's four n-gram stores (also Lookahead's NgramPool, FAFO's FumblePool, prompt lookup's NgramIndex),
this is the one capped at both levels (LRU leaders and followers) and the one with a frozen, on-disk twin.

Simplifications and choices: tokens are plain Python ints (tensors and numpy arrays are converted, because a
tensor element hashes by identity, not value); query returns a fresh list (O(number of followers)) so callers
cannot corrupt the table; frozen-table ties in frequency are broken by first occurrence in the streams.
"""
from __future__ import annotations

import hashlib
import json
import numbers
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..env import check_int

_FORMAT = "specdec-frozen-ngram-v1"


def _check_params(**params) -> tuple[int, ...]:
    return tuple(check_int(name, value, 1) for name, value in params.items())


def _key(seq, n: int, what: str) -> tuple[int, ...]:
    try:
        key = tuple(map(int, seq))
    except TypeError:
        raise ValueError(f"{what} must be a sequence of {n} token ids, got {seq!r}") from None
    if len(key) != n:
        raise ValueError(f"{what} must have exactly {n} tokens, got {len(key)}: {key}")
    return key


def _token_list(tokens) -> list[int]:
    """Plain ints from a list, a 1-D array/tensor or a (1, P) batch (`tolist` is one C call for arrays)."""
    tokens = tokens.tolist() if hasattr(tokens, "tolist") else list(map(int, tokens))
    if tokens and isinstance(tokens[0], list):
        if len(tokens) != 1:
            raise ValueError(f"one token sequence (batch size 1) expected, got a batch of {len(tokens)}")
        tokens = tokens[0]
    return tokens


class _Table:
    """What both tables share: parameters, read-only views, sizes."""

    def __init__(self, leader_len, follower_len, leader_capacity, follower_capacity):
        self.params = _check_params(leader_len=leader_len, follower_len=follower_len,
                                    leader_capacity=leader_capacity, follower_capacity=follower_capacity)
        self.leader_len, self.follower_len, self.leader_capacity, self.follower_capacity = self.params

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, leader) -> bool:
        return _key(leader, self.leader_len, "leader") in self._table

    def leaders(self) -> list[tuple[int, ...]]:
        """Leaders MRU first (for display; recency is not touched)."""
        return list(reversed(self._table))

    def followers(self, leader) -> list[tuple[int, ...]]:
        """A leader's followers MRU first, [] when absent (for display; recency is not touched)."""
        return list(reversed(self._table.get(_key(leader, self.leader_len, "leader"), ())))

    def items(self) -> list[tuple[tuple[int, ...], list[tuple[int, ...]]]]:
        """[(leader, followers)], both levels MRU first: the whole state, for display and comparisons."""
        return [(leader, list(reversed(fs))) for leader, fs in reversed(self._table.items())]

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.params == other.params and self.items() == other.items()

    __hash__ = None  # mutable (NgramTable) or large (frozen): never a dict key

    def size_summary(self) -> dict:
        """Counts for the notebook. approx_bytes: sys.getsizeof over containers and tuples (the int objects,
        partly shared, are not counted); file_bytes: the file a frozen table was saved to or loaded from."""
        import sys

        entries = sum(len(fs) for fs in self._table.values())
        approx = sys.getsizeof(self._table) + sum(
            sys.getsizeof(leader) + sys.getsizeof(fs) + sum(sys.getsizeof(f) for f in fs)
            for leader, fs in self._table.items())
        path = Path(getattr(self, "meta", {}).get("path") or "/nonexistent")
        return {"leaders": len(self._table), "follower_entries": entries,
                "tokens_held": len(self._table) * self.leader_len + entries * self.follower_len,
                "approx_bytes": approx, "file_bytes": path.stat().st_size if path.is_file() else None}

    def __repr__(self) -> str:
        return "{}(LL={}, FL={}, LC={}, FC={}; {} leaders)".format(type(self).__name__, *self.params, len(self))


class NgramTable(_Table):
    """The dynamic LRU table of §3.1 (see the module docstring for the rules)."""

    def __init__(self, leader_len, follower_len, leader_capacity, follower_capacity):
        super().__init__(leader_len, follower_len, leader_capacity, follower_capacity)
        self._table: OrderedDict[tuple, OrderedDict[tuple, None]] = OrderedDict()

    def clear(self) -> None:
        """Forget everything (the reference clears the dynamic table at the start of every generation)."""
        self._table.clear()

    def insert(self, leader, follower) -> None:
        self._insert(_key(leader, self.leader_len, "leader"), _key(follower, self.follower_len, "follower"))

    def _insert(self, leader: tuple, follower: tuple) -> None:
        # Unchecked: update() builds correctly sized int tuples itself and skips the per-pair validation.
        followers = self._table.get(leader)
        if followers is None:
            if len(self._table) >= self.leader_capacity:
                self._table.popitem(last=False)  # the LRU leader goes, with all its followers
            followers = self._table[leader] = OrderedDict()
        else:
            self._table.move_to_end(leader)
        if follower in followers:
            followers.move_to_end(follower)
        else:
            if len(followers) >= self.follower_capacity:
                followers.popitem(last=False)
            followers[follower] = None

    def query(self, leader) -> list[tuple[int, ...]]:
        leader = _key(leader, self.leader_len, "leader")
        followers = self._table.get(leader)
        if followers is None:
            return []  # a miss does not insert
        self._table.move_to_end(leader)
        return list(reversed(followers))  # follower recency changes only on insert (§3.1)

    def update(self, tokens) -> None:
        """Insert the (leader, follower) of every window of LL + FL tokens, left to right (none if shorter)."""
        toks = _token_list(tokens)
        ll, width = self.leader_len, self.leader_len + self.follower_len
        for i in range(len(toks) - width + 1):
            self._insert(tuple(toks[i:i + ll]), tuple(toks[i + ll:i + width]))

    def update_new(self, tokens, n_new: int) -> None:
        """Insert only the windows that end in the n_new newest tokens of `tokens` (the sequence so far).

        In decoding: `update(prompt)` once, then `update_new(sequence, n_accepted + 1)` after every step (the
        target's next token counts as new). That runs `update` over the last n_new + LL + FL - 1 tokens, so every
        window of the final sequence is inserted exactly once and in the same order as one `update` over the
        whole sequence would insert it."""
        if not isinstance(n_new, numbers.Integral) or n_new <= 0:
            if n_new == 0:
                return
            raise ValueError(f"n_new must be an integer >= 0, got {n_new!r}")
        toks = _token_list(tokens)
        self.update(toks[max(0, len(toks) - (n_new + self.leader_len + self.follower_len - 1)):])


class FrozenNgramTable(_Table):
    """The read-only table of §3.3: the LC most frequent leaders, each with its FC most frequent followers.

    `query` returns followers most frequent first (the place of MRU in the dynamic table) and changes
    nothing; `insert`, `update` and `update_new` raise TypeError."""

    def __init__(self, leader_len, follower_len, leader_capacity, follower_capacity, entries=(), meta=None,
                 _trusted=False):
        """entries: {leader: followers} or [(leader, followers)], both most frequent first."""
        super().__init__(leader_len, follower_len, leader_capacity, follower_capacity)
        table = dict(entries)
        if not _trusted:  # tables this module counted or loaded itself skip the per-token checks
            table = {_key(leader, self.leader_len, "leader"): tuple(_key(f, self.follower_len, "follower")
                                                                  for f in fs) for leader, fs in table.items()}
            if len(table) > self.leader_capacity or max(map(len, table.values()), default=0) > follower_capacity:
                raise ValueError(f"more than leader_capacity={leader_capacity} leaders or follower_capacity="
                                 f"{follower_capacity} followers of one leader")
        # Stored least frequent first, so reversed() gives the same "MRU first" views as NgramTable.
        self._table = {leader: tuple(fs)[::-1] for leader, fs in reversed(table.items())}
        self.meta = dict(meta or {})

    @classmethod
    def from_table(cls, table: NgramTable) -> "FrozenNgramTable":
        """A read-only snapshot of a dynamic table, recency order kept."""
        return cls(*table.params, entries=table.items())

    def query(self, leader) -> list[tuple[int, ...]]:
        return list(reversed(self._table.get(_key(leader, self.leader_len, "leader"), ())))

    def _frozen(self, *args, **kwargs):
        raise TypeError("FrozenNgramTable is frozen (read-only): insert/update only into an NgramTable")

    insert = update = update_new = _frozen

    @classmethod
    def from_token_streams(cls, streams, leader_len, follower_len, leader_capacity, follower_capacity,
                           progress=True, meta=None) -> "FrozenNgramTable":
        """Count every LL + FL window of every stream (windows never cross streams) and keep the top.

        A leader's count is the number of windows it starts; ties (leaders and followers) go to the one seen
        first. Counting is done with numpy (sort-based unique), not a Python Counter, to keep a corpus of a
        few million tokens within a few hundred MB."""
        from tqdm.auto import tqdm

        ll, fl, lc, fc = _check_params(leader_len=leader_len, follower_len=follower_len,
                                       leader_capacity=leader_capacity, follower_capacity=follower_capacity)
        width, chunks = ll + fl, []
        for stream in tqdm(streams, desc="windows", disable=not progress):
            toks = np.asarray(_token_list(stream), dtype=np.int64)
            if len(toks) >= width:
                chunks.append(sliding_window_view(toks, width))
        if not chunks:
            return cls(ll, fl, lc, fc, meta=meta, _trusted=True)
        windows = np.concatenate(chunks)
        pairs, first, counts = np.unique(windows, axis=0, return_index=True, return_counts=True)
        leaders, pair_leader = np.unique(pairs[:, :ll], axis=0, return_inverse=True)
        pair_leader = pair_leader.reshape(-1)
        leader_count = np.bincount(pair_leader, weights=counts)
        leader_first = np.full(len(leaders), len(windows))
        np.minimum.at(leader_first, pair_leader, first)
        keep = np.lexsort((leader_first, -leader_count))[:lc]  # most frequent, then first seen
        rank = np.full(len(leaders), len(leaders))
        rank[keep] = np.arange(len(keep))
        order = np.lexsort((first, -counts, rank[pair_leader]))
        order = order[rank[pair_leader[order]] < len(keep)]
        entries: dict[tuple, list] = {}
        for row in pairs[order].tolist():
            fs = entries.setdefault(tuple(row[:ll]), [])
            if len(fs) < fc:
                fs.append(tuple(row[ll:]))
        return cls(ll, fl, lc, fc, entries=entries, meta=meta, _trusted=True)

    def save(self, path) -> Path:
        """Write a compressed .npz: int32 leaders, follower offsets, followers, and a JSON meta string."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        items = self.items()
        leaders = np.array([l for l, _ in items], dtype=np.int64).reshape(-1, self.leader_len)
        offsets = np.cumsum([0] + [len(fs) for _, fs in items])
        followers = np.array([f for _, fs in items for f in fs], dtype=np.int64).reshape(-1, self.follower_len)
        dtype = np.int32 if max(leaders.max(initial=0), followers.max(initial=0)) < 2**31 else np.int64
        meta = {k: v for k, v in self.meta.items() if k != "path"}
        meta.update(format=_FORMAT, params=list(self.params))
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:  # an open file: np.savez would otherwise append ".npz" to other names
            np.savez_compressed(f, leaders=leaders.astype(dtype), offsets=offsets,
                                followers=followers.astype(dtype), meta=np.array(json.dumps(meta)))
        os.replace(tmp, path)  # atomic: a process building the same table beside this one reads a whole file
        self.meta["path"] = str(path)
        return path

    @classmethod
    def load(cls, path, tokenizer=None) -> "FrozenNgramTable":
        """Read a table written by `save`; with `tokenizer`, refuse one built with a different vocabulary."""
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if meta.get("format") != _FORMAT:
                raise ValueError(f"{path} is not a frozen n-gram table ({meta.get('format')!r})")
            mine = tokenizer_meta(tokenizer) if tokenizer is not None else {}
            if meta.get("vocab_fingerprint") and mine:
                if (mine["vocab_size"], mine["vocab_fingerprint"]) != (meta["vocab_size"], meta["vocab_fingerprint"]):
                    raise ValueError(f"{path} was built with tokenizer {meta['tokenizer']!r} (vocab "
                                     f"{meta['vocab_size']}), not {mine['tokenizer']!r} (vocab {mine['vocab_size']})")
            leaders, offsets, followers = z["leaders"].tolist(), z["offsets"], z["followers"].tolist()
        params, _ = meta.pop("params"), meta.pop("format")
        table = {tuple(leader): map(tuple, followers[offsets[i]:offsets[i + 1]]) for i, leader in enumerate(leaders)}
        return cls(*params, entries=table, meta=dict(meta, path=str(path)), _trusted=True)


_META_MEMO: dict = {}  # id(tokenizer) -> (tokenizer, meta): hashing a vocabulary takes milliseconds


def tokenizer_meta(tokenizer) -> dict:
    """Name, vocab size and a hash of the vocabulary: names differ between a local path and a hub id, so
    only the size and the hash decide whether a saved table fits a tokenizer."""
    memo = _META_MEMO.get(id(tokenizer))
    if memo is not None and memo[0] is tokenizer and memo[1]["vocab_size"] == len(tokenizer):
        return dict(memo[1])
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    meta = {"tokenizer": getattr(tokenizer, "name_or_path", type(tokenizer).__name__),
            "vocab_size": len(tokenizer), "vocab_fingerprint": hashlib.sha256(vocab.encode()).hexdigest()[:16]}
    _META_MEMO[id(tokenizer)] = (tokenizer, meta)
    return dict(meta)
