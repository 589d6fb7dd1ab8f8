"""Prepacked linear weights (prepack.py): the same math as F.linear, used only where valid, chosen by load_models."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch.nn import functional as F

from specdec_lib.models import loading as models, prepack
from specdec_lib.mechanisms.budget.cost_curve import model_key

pytestmark = pytest.mark.skipif(not prepack.available(), reason="this torch build has no oneDNN packed linear")


def packed_layer(seed=0, bias=True):
    torch.manual_seed(seed)
    layer = torch.nn.Linear(48, 80, bias=bias)
    plain = copy.deepcopy(layer)
    assert prepack.prepack(torch.nn.Sequential(layer)) == 1 and type(layer) is prepack.PackedLinear
    return layer, plain


@pytest.mark.parametrize("rows", [1, 2, 5, 16])
def test_same_outputs_as_f_linear(rows):
    layer, plain = packed_layer()
    x = torch.randn(1, rows, 48)
    with torch.no_grad():
        got, want = layer(x), plain(x)
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert "_packed" in layer.__dict__  # the packed path ran


def test_padded_rows_give_the_same_outputs_and_rowlogits_reads_four_at_a_time(monkeypatch):
    """Where 4 rows run faster than 1 (_four_over_one, forced here), fewer rows are zero-padded to 4: the same
    outputs for 1-3 rows and a 1-D input, rows_free() says 4, and RowLogits computes a read row with the next 3.
    Where 4 rows cost a little more than 1 (a slow memory's head), no padding but 4 rows free; where they cost
    much more, neither."""
    from specdec_lib.mechanisms.verify import RowLogits

    monkeypatch.setattr(prepack, "_four_over_one", lambda *args, **kwargs: 0.7)
    layer, plain = packed_layer(seed=1)
    with torch.no_grad():
        for x in (torch.randn(48), torch.randn(1, 48), torch.randn(1, 2, 48), torch.randn(3, 48)):
            got, want = layer(x), plain(x)
            assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5, rtol=1e-5)
        assert layer.rows_free() == prepack.PAD_ROWS
        hidden = torch.randn(6, 48)
        rows = RowLogits(hidden, layer)
        assert torch.allclose(rows[1], plain(hidden[1]), atol=1e-5)
        assert sorted(rows._rows) == [1, 2, 3, 4]  # the read row and the next three, in one call
        assert torch.allclose(rows[5], plain(hidden[5]), atol=1e-5) and sorted(rows._rows) == [1, 2, 3, 4, 5]
    for ratio, pad, free in ((1.07, False, prepack.PAD_ROWS), (2.0, False, 1)):
        monkeypatch.setattr(prepack, "_four_over_one", lambda *args, **kwargs: ratio)
        unpadded, plain = packed_layer(seed=2)
        x = torch.randn(2, 48)
        with torch.no_grad():
            assert torch.allclose(unpadded(x), plain(x), atol=1e-5, rtol=1e-5)
        assert unpadded.__dict__["_pad"] is pad and unpadded.rows_free() == free


def test_training_reads_the_live_weight_and_a_step_repacks():
    layer, plain = packed_layer(bias=False)
    x = torch.randn(3, 48)
    out = layer(x)  # grad enabled: F.linear on the live weight, a graph to the parameters
    out.sum().backward()
    assert layer.weight.grad is not None and "_packed" not in layer.__dict__
    with torch.no_grad():
        layer(x)
        layer.weight.mul_(2.0)  # an optimizer-style in-place step bumps the version
        assert torch.allclose(layer(x), 2.0 * plain(x), atol=1e-4)
        layer.weight.data = plain.weight.data.clone()  # new storage
        assert torch.allclose(layer(x), plain(x), atol=1e-5)


def test_other_dtypes_and_copies():
    layer, plain = packed_layer()
    x64 = torch.randn(2, 48, dtype=torch.float64)
    with torch.no_grad():
        layer(torch.randn(2, 48))
        assert torch.equal(copy.deepcopy(layer).double()(x64), plain.double()(x64))  # float64: F.linear exactly
        clone = pickle.loads(pickle.dumps(layer.float()))
        assert "_packed" not in clone.__dict__ and torch.allclose(clone(x64.float()), plain.float()(x64.float()),
                                                                  atol=1e-5)
    model = torch.nn.Sequential(layer)
    assert prepack.is_prepacked(model) and prepack.unpack(model) == 1 and not prepack.is_prepacked(model)
    assert set(model.state_dict()) == {"0.weight", "0.bias"}


def test_load_models_packs_on_a_cpu_in_float32_only():
    narrow = models.load_models("tiny")  # "auto": the tiny pair (width 256) is too narrow for packing to pay
    assert not prepack.is_prepacked(narrow.target) and "too narrow" in narrow.choices["linear"]
    pair = models.load_models("tiny", prepack=True)  # forced
    assert pair.choices["linear"].startswith("prepacked") and prepack.is_prepacked(pair.target)
    assert prepack.is_prepacked(pair.draft)
    plain = models.load_models("tiny", prepack=False)
    assert not prepack.is_prepacked(plain.target) and pair.choices["linear"] != plain.choices["linear"]
    assert model_key(pair.target) != model_key(plain.target)  # cost curves are timed per kernel choice
    wide = models.load_models("tiny", dtype="float64")
    assert not prepack.is_prepacked(wide.target) and "float32 only" in wide.choices["linear"]
    with pytest.raises(ValueError, match="float32 only"):
        models.load_models("tiny", dtype="float64", prepack=True)
    with pytest.raises(ValueError, match="prepack must be"):
        models.load_models("tiny", prepack="yes")
    ids = pair.encode("def main(argv):\n")
    with torch.no_grad():  # the two kernels give the same logits up to float32 rounding
        a = pair.target(ids).logits
        b = plain.target(ids).logits
    assert torch.allclose(a, b, atol=1e-3) and torch.equal(a.argmax(-1), b.argmax(-1))
