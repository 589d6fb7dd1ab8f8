"""The cached distillation data of SmolLM2's draft grows without answering old requests again
(`training/data.py`: `_smaller_data` finds the run to extend, `_concat` appends the new blocks)."""
from __future__ import annotations

import torch

from specdec_lib.training.data import _concat, _smaller_data, data_name


def test_the_biggest_smaller_run_of_the_same_settings_is_extended(tmp_path):
    kinds = ("code", "humaneval")
    for r in (64, 480):
        (tmp_path / data_name(60_000, r, 128, 0, kinds)).touch()
    (tmp_path / data_name(60_000, 700, 128, 0, kinds)).touch()  # bigger: not a base for 600
    (tmp_path / data_name(60_000, 500, 128, 1, kinds)).touch()  # another seed draws other requests
    (tmp_path / data_name(60_000, 520, 128, 0, ("code",))).touch()  # other kinds
    assert _smaller_data(tmp_path, 60_000, 600, 128, 0, kinds) == (480, tmp_path / data_name(60_000, 480, 128, 0, kinds))
    assert _smaller_data(tmp_path, 60_000, 64, 128, 0, kinds) is None
    assert _smaller_data(tmp_path, 30_000, 600, 128, 0, kinds) is None


def test_new_blocks_follow_the_old_ones_padded_to_the_longer():
    g = torch.Generator().manual_seed(0)
    old = dict(ids=torch.randint(1, 50, (3, 5), generator=g), mask=torch.ones(3, 5, dtype=torch.bool),
               feats=torch.randn(3, 5, 4, generator=g).half(), corpus_blocks=2)
    ids, mask, feats = torch.randint(1, 50, (2, 7), generator=g), torch.ones(2, 7, dtype=torch.bool), \
        torch.randn(2, 7, 4, generator=g).half()
    out = _concat(old, ids, mask, feats)
    assert out["ids"].shape == (5, 7) and out["feats"].shape == (5, 7, 4) and out["corpus_blocks"] == 2
    assert torch.equal(out["ids"][:3, :5], old["ids"]) and torch.equal(out["ids"][3:], ids)
    assert torch.equal(out["feats"][:3, :5], old["feats"]) and torch.equal(out["feats"][3:], feats)
    assert not out["mask"][:3, 5:].any() and (out["ids"][:3, 5:] == 0).all()  # padding is masked out
    assert out["mask"].sum() == old["mask"].sum() + mask.sum()
    short = _concat(dict(old, ids=ids, mask=mask, feats=feats), old["ids"], old["mask"], old["feats"])
    assert short["ids"].shape == (5, 7) and not short["mask"][2:, 5:].any()  # the new ones may be the shorter
