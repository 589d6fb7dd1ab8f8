"""The Cacheback n-gram tables against brute-force reference models (seeded random operation sequences).

`hypothesis` is not a dependency, so the random sequences come from seeded `random.Random`s: a failure
prints the setting and the operation index, and rerunning reproduces it exactly."""
from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import torch

from specdec_lib import FrozenNgramTable, NgramTable
from specdec_lib.mechanisms.ngram_table import tokenizer_meta
from specdec_lib.tables import build_frozen_table


class RefTable:
    """The recency rules written as plainly as possible: lists, index 0 = LRU, last = MRU, linear search."""

    def __init__(self, ll, fl, lc, fc):
        self.ll, self.fl, self.lc, self.fc = ll, fl, lc, fc
        self.entries = []  # [[leader, [followers]]]

    def _pop(self, leader):
        for i, entry in enumerate(self.entries):
            if entry[0] == leader:
                return self.entries.pop(i)
        return None

    def insert(self, leader, follower):
        entry = self._pop(leader)
        if entry is None:
            if len(self.entries) == self.lc:
                del self.entries[0]
            entry = [leader, []]
        followers = entry[1]
        if follower in followers:
            followers.remove(follower)
        elif len(followers) == self.fc:
            del followers[0]
        followers.append(follower)
        self.entries.append(entry)

    def query(self, leader):
        entry = self._pop(leader)
        if entry is None:
            return []
        self.entries.append(entry)
        return entry[1][::-1]

    def update(self, tokens):
        w = self.ll + self.fl
        for i in range(len(tokens) - w + 1):
            self.insert(tuple(tokens[i:i + self.ll]), tuple(tokens[i + self.ll:i + w]))

    def state(self):
        return [(leader, fs[::-1]) for leader, fs in reversed(self.entries)]


SETTINGS = [(1, 1, 1, 1), (1, 1, 3, 1), (1, 1, 1, 4), (1, 3, 4, 2), (2, 2, 3, 3), (1, 2, 8, 5), (3, 1, 2, 6)]


@pytest.mark.parametrize("ll,fl,lc,fc", SETTINGS)
def test_random_operations_match_reference(ll, fl, lc, fc):
    for seed in range(3):
        rng = random.Random(1000 * seed + 7 * ll + fl)
        vocab = rng.choice([2, 3, 5])  # tiny vocabularies: collisions, re-insertions and evictions all happen
        table, ref, seq = NgramTable(ll, fl, lc, fc), RefTable(ll, fl, lc, fc), []
        for step in range(1500):
            op, where = rng.random(), f"setting {(ll, fl, lc, fc)} seed {seed} step {step}"
            if op < 0.45:
                leader = tuple(rng.randrange(vocab) for _ in range(ll))
                follower = tuple(rng.randrange(vocab) for _ in range(fl))
                table.insert(leader, follower)
                ref.insert(leader, follower)
            elif op < 0.8:
                present = ref.entries and rng.random() < 0.6
                leader = rng.choice(ref.entries)[0] if present else tuple(rng.randrange(vocab) for _ in range(ll))
                assert table.query(leader) == ref.query(leader), where
            elif op < 0.9:
                tokens = [rng.randrange(vocab) for _ in range(rng.randrange(0, 12))]
                table.update(tokens)
                ref.update(tokens)
            else:  # a decoding step: n_new tokens appended, only the windows they complete are inserted
                n_new = rng.randrange(0, 5)
                seq += [rng.randrange(vocab) for _ in range(n_new)]
                table.update_new(seq, n_new)
                ref.update(seq[max(0, len(seq) - n_new - ll - fl + 1):] if n_new else [])
            assert table.items() == ref.state(), where
            assert len(table) == len(ref.entries) <= lc, where
            assert all(len(fs) <= fc for _, fs in table.items()), where


def test_capacity_one_evicts():
    t = NgramTable(1, 1, 1, 1)
    t.insert((1,), (2,))
    t.insert((1,), (3,))  # FC = 1: the old follower goes
    assert t.items() == [((1,), [(3,)])]
    t.insert((2,), (2,))  # LC = 1: leader 1 goes with its followers
    assert t.items() == [((2,), [(2,)])]
    assert t.query((1,)) == [] and len(t) == 1


def test_reinsertion_promotes_without_duplicating_or_evicting():
    t = NgramTable(1, 2, 2, 2)
    t.insert((1,), (1, 1))
    t.insert((1,), (2, 2))
    t.insert((5,), (0, 0))
    t.insert((1,), (1, 1))  # present follower: MRU again, nothing evicted; leader 1 MRU again
    assert t.items() == [((1,), [(1, 1), (2, 2)]), ((5,), [(0, 0)])]
    t.insert((1,), (3, 3))  # new follower at FC: the LRU one (2, 2) goes
    assert t.followers((1,)) == [(3, 3), (1, 1)]
    t.insert((7,), (0, 0))  # new leader at LC: the LRU leader 5 goes
    assert t.leaders() == [(7,), (1,)]


def test_query_promotes_leader_only_and_miss_inserts_nothing():
    t = NgramTable(1, 1, 3, 3)
    t.update([1, 2, 1, 3, 4, 5])  # windows (1,2) (2,1) (1,3) (3,4) (4,5)
    before = t.items()
    assert t.query((9,)) == [] and t.items() == before and (9,) not in t
    assert t.leaders() == [(4,), (3,), (1,)]  # 2 was the LRU leader when 4 came (LC = 3)
    assert t.query((1,)) == [(3,), (2,)]
    assert t.leaders() == [(1,), (4,), (3,)]  # the hit promoted 1
    t.insert((3,), (7,))
    t.insert((3,), (8,))
    assert t.query((3,)) == [(8,), (7,), (4,)]
    t.insert((3,), (4,))
    assert t.query((3,)) == [(4,), (8,), (7,)]  # only an insert moves a follower


def test_views_do_not_change_recency():
    t = NgramTable(1, 1, 4, 4)
    t.update([1, 2, 3, 4, 1, 5])
    before = t.items()
    t.leaders(), t.followers((1,)), t.followers((9,)), (2,) in t, len(t), repr(t)
    assert t.items() == before


def test_short_token_sequences_insert_nothing():
    t = NgramTable(2, 3, 10, 10)
    for n in range(5):
        t.update(list(range(n)))
        assert len(t) == 0
    t.update(list(range(5)))
    assert t.items() == [((0, 1), [(2, 3, 4)])]
    t.update_new([1, 2], 2)  # fewer tokens than a window in total
    assert len(t) == 1


class Recording(NgramTable):
    def __init__(self, *args):
        super().__init__(*args)
        self.log = []

    def _insert(self, leader, follower):
        self.log.append((leader, follower))
        super()._insert(leader, follower)


@pytest.mark.parametrize("ll,fl", [(1, 1), (1, 3), (2, 2), (3, 4)])
def test_update_new_inserts_each_window_once(ll, fl):
    rng = random.Random(ll * 10 + fl)
    for _ in range(20):
        seq = [rng.randrange(6) for _ in range(rng.randrange(0, 8))]  # the prompt, possibly shorter than a window
        stepwise = Recording(ll, fl, 5, 3)
        stepwise.update(seq)
        for _ in range(rng.randrange(0, 15)):
            n_new = rng.choice([0, 1, 1, 2, 4, 7])  # accepted draft tokens + the bonus token
            seq += [rng.randrange(6) for _ in range(n_new)]
            stepwise.update_new(torch.tensor(seq), n_new)
        whole = Recording(ll, fl, 5, 3)
        whole.update(seq)
        assert stepwise.log == whole.log  # the same windows, each once, in the same order
        assert len(whole.log) == max(0, len(seq) - ll - fl + 1)
        assert stepwise.items() == whole.items()


def test_tensor_and_numpy_inputs_are_plain_ints():
    a, b = NgramTable(1, 2, 8, 8), NgramTable(1, 2, 8, 8)
    a.update([3, 1, 4, 1, 5, 9])
    b.update(torch.tensor([[3, 1, 4, 1, 5, 9]]))  # a (1, P) batch works as well
    assert a.items() == b.items()
    assert b.query(torch.tensor([1])) == b.query(np.array([1])) == [(5, 9), (4, 1)]
    with pytest.raises(ValueError):
        b.update(torch.zeros(2, 6, dtype=torch.long))


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", None, True])
@pytest.mark.parametrize("position", range(4))
def test_invalid_parameters_raise(bad, position):
    params = [1, 3, 16, 4]
    params[position] = bad
    error = ValueError if isinstance(bad, int) and not isinstance(bad, bool) else TypeError  # a number too small
    with pytest.raises(error, match="must be an int >= 1"):
        NgramTable(*params)
    with pytest.raises(error, match="must be an int >= 1"):
        FrozenNgramTable(*params)
    with pytest.raises(error, match="must be an int >= 1"):
        FrozenNgramTable.from_token_streams([[1, 2, 3, 4]], *params, progress=False)


def test_wrong_lengths_raise():
    t = NgramTable(2, 3, 4, 4)
    for leader, follower in [((1,), (1, 2, 3)), ((1, 2, 3), (1, 2, 3)), ((1, 2), (1, 2)), (5, (1, 2, 3))]:
        with pytest.raises(ValueError):
            t.insert(leader, follower)
    with pytest.raises(ValueError, match="exactly 2"):
        t.query((1,))
    with pytest.raises(ValueError):
        t.update_new([1, 2, 3, 4, 5], -1)
    assert len(t) == 0


# ---- the frozen table --------------------------------------------------------------------------------------

def reference_frozen(streams, ll, fl, lc, fc):
    """Count with a Counter; rank by count, ties by first occurrence; return items() form."""
    pair_count, pair_first, leader_count, leader_first, n = Counter(), {}, Counter(), {}, 0
    for stream in streams:
        for i in range(len(stream) - ll - fl + 1):
            leader, follower = tuple(stream[i:i + ll]), tuple(stream[i + ll:i + ll + fl])
            pair_count[leader, follower] += 1
            leader_count[leader] += 1
            pair_first.setdefault((leader, follower), n)
            leader_first.setdefault(leader, n)
            n += 1
    leaders = sorted(leader_count, key=lambda l: (-leader_count[l], leader_first[l]))[:lc]
    out = []
    for leader in leaders:
        fs = sorted((f for (l, f) in pair_count if l == leader), key=lambda f: (-pair_count[leader, f],
                                                                                  pair_first[leader, f]))
        out.append((leader, fs[:fc]))
    return out


@pytest.mark.parametrize("ll,fl,lc,fc", [(1, 1, 1, 1), (1, 3, 4, 2), (2, 1, 3, 5), (1, 2, 100, 100)])
def test_frozen_counts_match_reference(ll, fl, lc, fc):
    rng = random.Random(ll + 10 * fl + lc)
    for _ in range(10):
        streams = [[rng.randrange(4) for _ in range(rng.randrange(0, 40))] for _ in range(rng.randrange(1, 5))]
        table = FrozenNgramTable.from_token_streams(streams, ll, fl, lc, fc, progress=False)
        expected = reference_frozen(streams, ll, fl, lc, fc)
        assert table.items() == expected
        assert len(table) <= lc and all(len(fs) <= fc for _, fs in table.items())
        for leader, fs in expected:
            assert table.query(leader) == fs


def test_frozen_frequency_order_and_stream_boundaries():
    streams = [[1, 2, 1, 3, 1, 3, 2, 4], [9], [4, 2, 4, 2, 4]]
    t = FrozenNgramTable.from_token_streams(streams, 1, 1, 2, 2, progress=False)
    # windows: 1>2 2>1 1>3 3>1 1>3 3>2 2>4 | 4>2 2>4 4>2 2>4; never 4>4 across the stream boundary
    assert t.leaders() == [(2,), (1,)]  # leader 2: 4 windows; 1: 3; 4: 2 (cut by LC); 3: 2
    assert t.query((2,)) == [(4,), (1,)]  # 2>4 three times, 2>1 once
    assert t.query((1,)) == [(3,), (2,)]  # 1>3 twice, then 1>2
    assert t.query((4,)) == []


def test_frozen_is_read_only(tmp_path):
    t = FrozenNgramTable.from_token_streams([[1, 2, 3, 1, 2, 4, 1, 5]], 1, 1, 8, 8, progress=False)
    before = t.items()
    for leader in [(1,), (2,), (3,), (7,)] * 3:
        t.query(leader)
    t.query((1,)).append((99,))  # the returned list is a copy
    assert t.items() == before
    for call in (lambda: t.insert((1,), (2,)), lambda: t.update([1, 2, 3]), lambda: t.update_new([1, 2], 1)):
        with pytest.raises(TypeError, match="frozen"):
            call()
    assert t.items() == before


def test_frozen_from_dynamic_snapshot_and_limits():
    d = NgramTable(1, 2, 4, 3)
    d.update([5, 1, 2, 5, 3, 4, 5, 1, 2, 6, 5])
    f = FrozenNgramTable.from_table(d)
    assert f.items() == d.items() and f.query((5,)) == d.followers((5,))
    with pytest.raises(ValueError, match="capacity"):
        FrozenNgramTable(1, 1, 4, 1, entries={(1,): [(2,), (3,)]})
    with pytest.raises(ValueError, match="capacity"):
        FrozenNgramTable(1, 1, 1, 4, entries={(1,): [(2,)], (2,): [(3,)]})


def test_save_load_roundtrip(tmp_path):
    rng = random.Random(3)
    streams = [[rng.randrange(50) for _ in range(300)] for _ in range(4)]
    t = FrozenNgramTable.from_token_streams(streams, 2, 3, 40, 3, progress=False, meta={"note": "x"})
    path = t.save(tmp_path / "sub" / "table.ngrams")
    u = FrozenNgramTable.load(path)
    assert u == t and u.params == t.params and u.meta["note"] == "x"
    assert u.size_summary()["file_bytes"] == path.stat().st_size > 0
    empty = FrozenNgramTable(1, 3, 4, 4)
    assert FrozenNgramTable.load(empty.save(tmp_path / "empty.npz")) == empty


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from specdec_lib.env import TINY_DIR

    return AutoTokenizer.from_pretrained(str(TINY_DIR / "target"))


TEXTS = ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i)\n",
         "import os\nimport sys\n\ndef main():\n    return os.path.join(sys.argv[0], 'x')\n",
         "class A:\n    def __init__(self):\n        self.x = 1\n        self.y = 2\n"]


def test_build_from_texts_with_shipped_tokenizer(tokenizer, tmp_path):
    import datasets

    table = build_frozen_table(tokenizer, TEXTS, 1, 2, 64, 4, progress=False)
    streams = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    assert table.items() == reference_frozen(streams, 1, 2, 64, 4) and len(table) > 10
    for leader, followers in table.items():
        for follower in table.query(leader):  # every follower really follows its leader somewhere
            gram = list(leader + follower)
            assert any(s[i:i + 3] == gram for s in streams for i in range(len(s))), (leader, follower)
    same = build_frozen_table(tokenizer, datasets.Dataset.from_dict({"text": TEXTS}), 1, 2, 64, 4, progress=False)
    assert same == table
    assert table.meta["vocab_size"] == len(tokenizer) == tokenizer_meta(tokenizer)["vocab_size"]
    path = table.save(tmp_path / "frozen.npz")
    assert FrozenNgramTable.load(path, tokenizer=tokenizer) == table

    class OtherTokenizer:
        name_or_path = "other"

        def get_vocab(self):
            return {"a": 0, "b": 1}

        def __len__(self):
            return 2

    with pytest.raises(ValueError, match="other"):
        FrozenNgramTable.load(path, tokenizer=OtherTokenizer())


def test_build_frozen_table_accepts_plain_corpus_columns_and_refuses_non_text():
    from specdec_lib.tables import build_frozen_table
    from transformers import AutoTokenizer
    from specdec_lib.env import TINY_DIR

    tokenizer = AutoTokenizer.from_pretrained(str(TINY_DIR / "target"))
    texts = ["for i in range(10):\n    print(i)\n"] * 3
    from_dict = build_frozen_table(tokenizer, {"path": ["a", "b", "c"], "text": texts}, progress=False)
    from_list = build_frozen_table(tokenizer, texts, progress=False)
    assert len(from_dict) == len(from_list) > 0
    with pytest.raises(TypeError, match="strings"):
        build_frozen_table(tokenizer, [[1, 2, 3]], progress=False)


def test_ensure_frozen_table_builds_once_and_is_found_by_cacheback(tokenizer, tmp_path, monkeypatch):
    from specdec_lib.methods import cacheback as cb
    from specdec_lib import load_models
    from specdec_lib.tables import cached_table_path, ensure_frozen_table, frozen_table_path

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    # the shipped table is returned as it is for the tokenizer it was built with
    assert ensure_frozen_table(tokenizer, 1, 3, progress=False) == frozen_table_path(1, 3)
    with pytest.raises(ValueError, match="corpus_tag"):
        ensure_frozen_table(tokenizer, 2, 2, texts=TEXTS)
    path = ensure_frozen_table(tokenizer, 2, 2, texts=TEXTS, corpus_tag="stdlib", progress=False)
    assert path == cached_table_path(tokenizer, 2, 2) and path.parent == tmp_path / "tables"
    table = FrozenNgramTable.load(path, tokenizer=tokenizer)
    assert table.params == (2, 2, 2**20, 128) and table.meta["corpus"] == "stdlib"
    streams = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    assert table.items() == reference_frozen(streams, 2, 2, 2**20, 128)
    stamp = path.stat().st_mtime_ns
    assert ensure_frozen_table(tokenizer, 2, 2, texts=["other text"], corpus_tag="stdlib") == path
    assert path.stat().st_mtime_ns == stamp  # cached: not rebuilt
    other = ensure_frozen_table(tokenizer, 2, 2, texts=TEXTS[:1], corpus_tag="mine", progress=False)
    assert other != path and "_mine_" in other.name
    # cacheback: frozen=True with the tokenizer finds the cached table (no shipped LL=2, FL=2 table)
    target = load_models("tiny").target
    assert not frozen_table_path(2, 2).exists()
    found = cb.resolve_frozen(True, target, 2, 2, 2**20, 128, tokenizer=tokenizer)
    assert found is not None and found.meta["path"] == str(path)
