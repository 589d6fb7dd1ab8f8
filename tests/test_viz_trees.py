"""viz tables, trees and masks (+ common.token_text): the figures carry exactly the data they were given, and
the explorers build and redraw."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from specdec_lib.mechanisms.draft_tree import DraftTree, grow_tree
from specdec_lib.mechanisms.masks import dense_tree_mask, tree_attention_mask
from specdec_lib.mechanisms.ngram_table import FrozenNgramTable, NgramTable
from specdec_lib.viz import common, masks, tables, trees


def decode(ids):
    return "".join(chr(ord("a") + int(i) % 26) for i in ids)


class FakePair:
    """What the tree explorer needs from a ModelPair: encode to (1, P) and decode."""

    def encode(self, text):
        return torch.tensor([[ord(c) % 13 for c in text]])

    def decode(self, ids):
        return decode(ids)


class CharTokenizer:
    """A tokenizer-like object for the table explorer: callable like HF's, with decode."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 29 for c in text]}

    def decode(self, ids):
        return decode(ids)


@pytest.fixture
def small_tree():
    #        root
    #       /    \
    #      0      3
    #     / \      \
    #    1   2      4 - 5
    return DraftTree(100, tokens=[1, 2, 3, 4, 5, 6], parents=[-1, 0, 0, -1, 3, 4])


def test_token_text():
    assert common.token_text([1, 2]) == "1 2"
    assert common.token_text(np.int64(7)) == "7"
    assert common.token_text(torch.tensor([0, 1]), decode) == "ab"
    assert common.token_text([0], lambda ids: " x\n\t") == "·x↵⇥"


def test_table_figure_lists_leaders_and_followers_in_recency_order():
    table = NgramTable(1, 2, leader_capacity=3, follower_capacity=2)
    table.insert([1], [10, 11])
    table.insert([2], [20, 21])
    table.insert([1], [12, 13])  # leader 1 is MRU again; follower (12, 13) MRU among its followers
    table.insert([3], [30, 31])
    table.query([2])  # a hit: leader 2 becomes MRU, its followers keep their order
    fig = tables.table_figure(table)
    assert isinstance(fig, go.Figure) and isinstance(fig.data[0], go.Table)
    cells = fig.data[0].cells.values
    assert list(cells[0]) == ["1", "2", "3"]  # leader rank, MRU first
    assert list(cells[1]) == ["2", "3", "1"] == [common.token_text(l) for l in table.leaders()]
    assert list(cells[2]) == ["20 21", "30 31", "12 13"]  # first follower column: each leader's MRU follower
    assert list(cells[3]) == ["", "", "10 11"]
    header = fig.data[0].header.values
    assert header[2].startswith("follower 1") and len(header) == 4
    # decoded text, a chosen subset of leaders in the given order, and the list-of-pairs input
    fig = tables.table_figure(table, leaders=[(1,), (3,)], decode=decode)
    assert list(fig.data[0].cells.values[1]) == ["b", "d"] and list(fig.data[0].cells.values[2]) == ["mn", "ef"]
    fig = tables.table_figure(table.items(), max_leaders=2)
    assert list(fig.data[0].cells.values[1]) == ["2", "3"] and "2 of 3 leaders" in fig.layout.title.text


def test_table_figure_of_a_frozen_table():
    frozen = FrozenNgramTable.from_token_streams([[1, 2, 1, 2, 1, 3]], 1, 1, 4, 4, progress=False)
    fig = tables.table_figure(frozen)
    assert list(fig.data[0].cells.values[1]) == ["1", "2"]  # leader 1 starts 3 windows, 2 starts 2
    assert list(fig.data[0].cells.values[2]) == ["2", "1"] and list(fig.data[0].cells.values[3]) == ["3", ""]


def test_tree_layout_chains_are_straight(small_tree):
    x, y = trees.tree_layout(small_tree.parents)
    assert x == [0, 1, 2, 2, 1, 2, 3]
    assert y[2] == 0 and y[3] == 1 and y[1] == 0.5  # node 0 between its children 1 and 2
    assert y[4] == y[5] == y[6] == 2  # the chain 3 - 4 - 5 on one line
    assert y[0] == (0.5 + 2) / 2  # the root between its first and last child
    assert trees.tree_layout(small_tree) == (x, y)  # the tree itself: its own children index, same layout
    with pytest.raises(ValueError, match="parent"):
        trees.tree_layout([-1, 2, 0])  # a parents list must be topological, like a DraftTree's


def test_tree_figure_nodes_edges_and_accepted_path(small_tree):
    fig = trees.tree_figure(small_tree, decode=decode, accepted=[3, 4], next_token=9)
    traces = {t.name: t for t in fig.data}
    nodes = traces["nodes"]
    assert len(nodes.x) == len(small_tree) + 1  # one point per node plus the root
    assert list(nodes.customdata) == [-1, 0, 1, 2, 3, 4, 5]
    assert list(nodes.text) == [decode([100])] + [decode([t]) for t in small_tree.tokens]
    assert list(nodes.x)[1:] == small_tree.depths
    path = traces["accepted path"]
    assert list(path.customdata) == [3, 4]  # exactly the accepted nodes, root to leaf
    assert list(path.x) == [1, 2]
    edges = [v for v in traces["edges"].x]
    assert edges.count(None) == len(small_tree)  # one segment per node, to its parent
    assert list(traces["next token"].text) == [decode([9])] and list(traces["next token"].x) == [3]
    plain = trees.tree_figure(small_tree)
    assert [t.name for t in plain.data] == ["edges", "nodes"]
    assert list(plain.data[1].text)[1:] == ["1", "2", "3", "4", "5", "6"]
    empty = trees.tree_figure(DraftTree(5))
    assert len(empty.data[1].x) == 1


def test_mask_figure_z_equals_the_mask(small_tree):
    mask = dense_tree_mask(small_tree)
    labels = ["root"] + [decode([t]) for t in small_tree.tokens]
    assert masks.mask_labels(small_tree, decode) == labels
    fig = masks.mask_figure(mask, labels=labels)
    heat = fig.data[0]
    np.testing.assert_array_equal(np.array(heat.z), mask.numpy().astype(int))
    assert list(fig.layout.yaxis.ticktext) == [f"{i}: {t}" for i, t in enumerate(labels)]
    assert list(fig.layout.xaxis.ticktext) == labels
    # a full (1, 1, q, prefix + q) mask is squeezed; no labels past max_labels
    full = tree_attention_mask(small_tree, prefix_len=3, backend="bool")
    fig = masks.mask_figure(full, max_labels=2, labels=labels)
    np.testing.assert_array_equal(np.array(fig.data[0].z), full[0, 0].numpy().astype(int))
    assert fig.layout.yaxis.ticktext is None


def _widgets(box):
    found, stack = {}, [box]
    while stack:
        w = stack.pop()
        if getattr(w, "description", None):
            found[w.description] = w
        stack.extend(getattr(w, "children", ()))
    return found


def test_table_explorer_builds_and_updates():
    box = tables.table_explorer(CharTokenizer(), LL=1, FL=1, LC=3, FC=2, texts={"a": "abcabc", "b": "xyz"})
    w = _widgets(box)
    assert {"example", "text", "LL", "FL", "LC", "FC"} <= set(w)
    first = box.state["figure"]
    assert box.state["table"].leaders() == [(ord("b") % 29,), (ord("a") % 29,), (ord("c") % 29,)]
    w["text"].value = "abcdefg"  # the observer redraws: 6 windows, LC = 3 keeps the last 3 leaders
    assert box.state["figure"] is not first
    assert len(box.state["table"]) == 3 and box.state["evicted"] == 3
    assert list(box.state["figure"].data[0].cells.values[1]) == [decode([ord(c) % 29]) for c in "fed"]
    w["LC"].value = 10
    assert box.state["evicted"] == 0 and len(box.state["table"]) == 6
    w["example"].value = "b"
    assert w["text"].value == "xyz" and len(box.state["table"]) == 2
    before = box.state["figure"]
    box.update()
    assert box.state["figure"] is not before


def test_tree_explorer_builds_and_updates():
    calls = []

    def tables_factory(ll, fl, ids):
        calls.append((ll, fl))
        table = NgramTable(ll, fl, 64, 8)
        table.update(ids)
        return [table]

    prompts = [{"id": "p0", "prompt": "abcabcabcabd"}, {"id": "p1", "prompt": "hello hello hello"}]
    box = trees.tree_explorer(FakePair(), prompts, tables_factory, tdl=12, crt=2, ll=1, fl=2,
                              accept_fn=lambda tree, ids: tree.path_to(len(tree) - 1) if len(tree) else [])
    w = _widgets(box)
    assert {"prompt", "TDL", "CRT", "LL", "FL"} <= set(w)
    tree = box.state["tree"]
    ids = FakePair().encode("abcabcabcabd")[0].tolist()
    assert box.state["ids"] == ids
    assert tree == grow_tree(ids, tables_factory(1, 2, ids), tdl=12, crt=2)
    tree_fig, mask_fig = box.state["figures"]
    assert len(tree_fig.data[1].x) == len(tree) + 1
    np.testing.assert_array_equal(np.array(mask_fig.data[0].z), dense_tree_mask(tree).numpy().astype(int))
    assert list(next(t for t in tree_fig.data if t.name == "accepted path").customdata) == box.state["accepted"]
    w["TDL"].value = 4  # a smaller budget: the tree and both figures are regrown
    assert len(box.state["tree"]) <= 3 and box.state["figures"][0] is not tree_fig
    w["FL"].value = 1
    assert calls[-1] == (1, 1)
    w["prompt"].value = "hello hello hello"
    assert box.state["ids"] == FakePair().encode("hello hello hello")[0].tolist()


def test_budget_explorer_draws_one_tree_per_shape_and_redraws_on_the_budget():
    calls = []

    def run(prompt, budget):
        calls.append((prompt, budget))
        chain = DraftTree.chain(7, list(range(budget)))
        wide = DraftTree(7, tokens=list(range(budget)), parents=[-1] * budget)
        return {"static": dict(tree=chain, accepted=[0, 1][:budget], next_token=9, mat=1.5),
                "dynamic": dict(tree=wide, accepted=None, mat=None)}

    prompts = [{"id": "p0", "prompt": "abc"}, "hello"]
    box = trees.budget_explorer(run, prompts, budgets=(2, 4, 8), budget=4, decode=decode)
    assert calls == [("abc", 4)]
    w = _widgets(box)
    assert {"prompt", "budget"} <= set(w)
    static, dynamic = box.state["figures"]
    assert len(static.data[1].x) == 4 + 1 and len(dynamic.data[1].x) == 4 + 1  # nodes + the root
    assert list(next(t for t in static.data if t.name == "accepted path").customdata) == [0, 1]
    assert [t.name for t in static.data][-1] == "next token"
    assert not any(t.name == "accepted path" for t in dynamic.data)
    assert "MAT of the generation 1.50" in static.layout.title.text and "MAT" not in dynamic.layout.title.text
    w["budget"].value = 8
    assert calls[-1] == ("abc", 8) and box.state["budget"] == 8
    assert len(box.state["figures"][1].data[1].x) == 8 + 1
    w["prompt"].value = "hello"
    assert calls[-1] == ("hello", 8) and box.state["prompt"] == "hello"
