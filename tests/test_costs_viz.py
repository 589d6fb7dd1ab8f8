"""costs: the expected-speedup arithmetic against brute force, a real timing run; viz: figures carry the data."""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

from specdec_lib import viz
from specdec_lib.bench import costs
from specdec_lib.decoding import GenerationResult


def brute_force_tokens(alpha: float, gamma: int) -> float:
    """E[tokens] by enumerating accept/reject outcomes of the gamma drafted tokens (i.i.d. acceptance)."""
    total = 0.0
    for outcome in itertools.product([True, False], repeat=gamma):
        accepted = next((i for i, ok in enumerate(outcome) if not ok), gamma)  # first rejection
        prob = np.prod([alpha if ok else 1 - alpha for ok in outcome])
        total += prob * (accepted + 1)  # accepted draft tokens + the bonus/corrected token
    return total


@pytest.mark.parametrize("alpha,gamma", [(0.0, 3), (0.3, 1), (0.5, 4), (0.8, 6), (0.95, 5), (0.999, 2)])
def test_expected_tokens_matches_brute_force(alpha, gamma):
    assert costs.expected_tokens_per_step(alpha, gamma) == pytest.approx(brute_force_tokens(alpha, gamma), rel=1e-9)


def test_expected_tokens_limits_and_arrays():
    for gamma in (0, 1, 5, 10):
        assert costs.expected_tokens_per_step(1.0, gamma) == gamma + 1
        assert costs.expected_tokens_per_step(0.0, gamma) == 1.0
    assert costs.expected_tokens_per_step(1 - 1e-9, 7) == pytest.approx(8.0, rel=1e-6)
    grid = costs.expected_tokens_per_step(np.array([0.0, 0.5, 1.0])[None, :], np.array([1, 3])[:, None])
    assert grid.shape == (2, 3)
    np.testing.assert_allclose(grid, [[1.0, 1.5, 2.0], [1.0, 1.875, 4.0]])
    with pytest.raises(ValueError):
        costs.expected_tokens_per_step(1.5, 3)


def test_expected_speedup():
    assert costs.expected_speedup(0.9, 5, 0.05) > 2.5  # high acceptance, cheap draft
    assert costs.expected_speedup(0.0, 4, 0.1) < 1.0  # nothing accepted: pure overhead
    assert costs.expected_speedup(0.0, 4, 0.0) == pytest.approx(1.0)  # free draft, free verify: break even
    # The formula itself: E[tokens] / (gamma * c + verify_overhead).
    expected = costs.expected_tokens_per_step(0.7, 3) / (3 * 0.2 + 1.3)
    assert costs.expected_speedup(0.7, 3, 0.2, verify_overhead=1.3) == pytest.approx(expected)
    # A pricier verification can only lower the speedup.
    assert costs.expected_speedup(0.7, 3, 0.2, 1.5) < costs.expected_speedup(0.7, 3, 0.2, 1.0)


def test_forward_cost_on_tiny_target(tiny_pair):
    df = costs.forward_cost(tiny_pair.target, rows=(8, 1), prefix=16, repeats=2, warmup=1, name="target")
    assert df["rows"].tolist() == [1, 8]
    assert (df["median_ms"] > 0).all() and (df["min_ms"] <= df["median_ms"]).all()
    assert (df["model"] == "target").all() and (df["prefix"] == 16).all()
    np.testing.assert_allclose(df["ms_per_token"], df["median_ms"] / df["rows"])
    assert df["relative"].iloc[0] == pytest.approx(1.0)
    v = costs.verify_overhead(df, "target", gamma=7)  # 8 rows over 1 row, read off the monotone curve
    assert v == pytest.approx(max(1.0, df["median_ms"].iloc[1] / df["median_ms"].iloc[0]))
    with pytest.raises(ValueError):
        costs.forward_cost(tiny_pair.target, rows=(64,), prefix=1000)  # past the 1024-token context


def test_batch_cost_times_batches_of_rows(tiny_pair):
    """B sequences of R rows in one forward: B x R tokens, the roofline's arithmetic from the model's own sizes."""
    df = costs.batch_cost(tiny_pair.target, batches=(4, 1), rows=(1, 2), prefix=16, repeats=2, name="target")
    assert df[["batch", "rows"]].values.tolist() == [[1, 1], [1, 2], [4, 1], [4, 2]]
    assert (df.tokens == df.batch * df.rows).all() and df.relative.iloc[0] == pytest.approx(1.0)
    params = sum(p.numel() for p in tiny_pair.target.parameters())
    np.testing.assert_allclose(df.flop_per_byte, 2 * params * df.tokens / (4 * params))  # float32: 4 bytes each
    np.testing.assert_allclose(df.gflops, 2 * params * df.tokens / (df.median_ms * 1e6))
    with pytest.raises(ValueError, match="batch"):
        costs.forward_cost(tiny_pair.target, rows=(1,), prefix=16, batch=2, lazy_head=True)
    with pytest.raises(ValueError, match="batch"):
        costs.batch_cost(tiny_pair.target, batches=(0,), rows=(1,), prefix=16)
    fig = viz.batch_roofline_figure(df)
    assert [t.name for t in fig.data] == ["B = 1", "B = 4"]
    assert list(fig.data[1].x) == [4, 8] and list(fig.data[1].y) == df[df.batch == 4].gflops.tolist()
    assert fig.layout.xaxis.type == "log"


def test_verify_cost_times_a_loop_step(tiny_pair):
    # verify() refuses a cache that holds anything but the prefix, so each repeat also checks the rollback
    df = costs.verify_cost(tiny_pair.target, rows=(16, 1), prefix=16, repeats=2, warmup=1, name="step")
    assert df["rows"].tolist() == [1, 16] and (df["model"] == "step").all()
    assert (df["median_ms"] > 0).all() and (df["min_ms"] <= df["median_ms"]).all()
    assert df["relative"].iloc[0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="context"):
        costs.verify_cost(tiny_pair.target, rows=(64,), prefix=1000)
    with pytest.raises(ValueError, match="repeats"):
        costs.verify_cost(tiny_pair.target, rows=(1,), repeats=0)


def test_measured_agreement(tiny_pair):
    ids = tiny_pair.encode("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n")
    assert costs.measured_agreement(tiny_pair.target, tiny_pair.target, ids) == 1.0
    agreement = costs.measured_agreement(tiny_pair.target, tiny_pair.draft, ids[0])  # 1-D input works too
    assert 0.0 <= agreement <= 1.0
    with torch.inference_mode():
        t = tiny_pair.target(input_ids=ids).logits[0].argmax(-1)
        d = tiny_pair.draft(input_ids=ids).logits[0].argmax(-1)
    assert agreement == pytest.approx(float((t == d).float().mean()))


def test_cost_curve_figure_traces_match_table():
    df = pd.DataFrame(dict(model=["target"] * 3 + ["draft"] * 3, device="cpu", prefix=256, rows=[1, 4, 16] * 2,
                           median_ms=[5.0, 5.5, 8.0, 1.0, 1.1, 1.5]))
    fig = viz.cost_curve_figure(df)
    assert isinstance(fig, go.Figure)
    assert [t.name for t in fig.data] == ["target", "draft"]
    assert list(fig.data[0].x) == [1, 4, 16] and list(fig.data[0].y) == [5.0, 5.5, 8.0]
    assert list(fig.data[1].y) == [1.0, 1.1, 1.5]
    assert fig.layout.xaxis.type == "log"
    two_devices = pd.concat([df, df.assign(device="cuda:0", median_ms=df["median_ms"] / 10)])
    assert len(viz.cost_curve_figure(two_devices).data) == 4


def test_speedup_surface_figure_values():
    alphas, gammas = np.linspace(0, 1, 5), [1, 2, 4]
    fig = viz.speedup_surface_figure(alphas, gammas, cost_ratio=0.1)
    heat = fig.data[0]
    assert list(heat.x) == alphas.tolist() and list(heat.y) == gammas
    z = np.array(heat.z)
    assert z.shape == (3, 5)
    assert z[2, 4] == pytest.approx(costs.expected_speedup(1.0, 4, 0.1))
    assert z[0, 0] == pytest.approx(costs.expected_speedup(0.0, 1, 0.1))


def test_bench_figure_bars_equal_summary():
    summary = pd.DataFrame(dict(method=["hf", "autoregressive", "hf_assisted"], tokens_per_s=[120.0, 100.0, 90.0],
                                mat=[1.0, 1.0, 2.3]))
    fig = viz.bench_figure(summary)
    assert isinstance(fig, go.Figure)
    assert list(fig.data[0].x) == summary["method"].tolist()
    assert list(fig.data[0].y) == summary["tokens_per_s"].tolist()
    assert list(fig.data[1].y) == summary["mat"].tolist()
    indexed = viz.bench_figure(summary.set_index("method"))  # method as the index works the same
    assert list(indexed.data[0].y) == summary["tokens_per_s"].tolist()


def test_acceptance_figure_and_explorer(monkeypatch):
    result = GenerationResult(new_tokens=list(range(9)), accept_lengths=[1, 3, 1, 4], target_forwards=4,
                              method="demo")
    fig = viz.acceptance_figure(result)
    assert list(fig.data[0].y) == [1, 3, 1, 4] and list(fig.data[0].x) == [0, 1, 2, 3]
    # the explorer redraws into an Output only inside IPython (viz.common.render): stand in for it and keep what
    # it displays (with plotly's widget support installed, the view is a FigureWidget mutated in place instead)
    import IPython
    import IPython.display

    drawn = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: object())
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **_: drawn.extend(objs))
    box = viz.speedup_explorer(cost_ratio=0.25, alpha=0.7, gamma=3)
    sliders = {w.description: w for row in box.children[:2] for w in row.children}
    assert sliders["alpha"].value == 0.7 and sliders["gamma"].value == 3
    assert sliders["cost ratio c"].value == 0.25
    view = box.children[2]
    shown = lambda: view if isinstance(view, go.FigureWidget) else drawn[-1]  # noqa: E731

    def speedup(gamma):  # E[tokens] by enumeration over gamma * c + 1 (verify overhead 1), alpha 0.7, c 0.25
        return brute_force_tokens(0.7, gamma) / (gamma * 0.25 + 1.0)

    curve, chosen = shown().data
    assert list(curve.x) == list(range(1, 17)) and list(curve.y) == pytest.approx([speedup(g) for g in range(1, 17)])
    # gamma 3: (1 + .7 + .49 + .343) / 1.75 = 2.533 / 1.75 = 1.4474
    assert list(chosen.x) == [3] and chosen.y[0] == pytest.approx(1.44743, abs=1e-5) == speedup(3)
    renders = len(drawn)
    sliders["gamma"].value = 5  # moving a slider re-renders: the chosen point and the title follow gamma
    assert isinstance(view, go.FigureWidget) or len(drawn) == renders + 1
    fig = shown()
    curve, chosen = fig.data
    assert list(curve.y) == pytest.approx([speedup(g) for g in range(1, 17)])  # the curve does not depend on gamma
    # gamma 5: E[tokens] = 1 + .7 + .49 + .343 + .2401 + .16807 = 2.94117, over 5 x 0.25 + 1 = 2.25: 1.30719
    assert list(chosen.x) == [5] and chosen.y[0] == pytest.approx(1.30719, abs=1e-5) == speedup(5)
    assert chosen.name == "gamma=5: 1.31x"
    assert "E[tokens/step]=2.94" in fig.layout.title.text and "speedup=1.31x" in fig.layout.title.text


def test_the_formula_is_drawn_with_the_measured_points_over_it():
    measured = pd.DataFrame({"method": ["draft_model", "draft_model", "hf_assisted"], "gamma": [2, 4, 2],
                             "mat": [1.9, 2.6, 1.9]})
    curve, points = costs.formula_against_measured(measured, alpha=0.5)
    assert curve.gamma.tolist() == list(range(0, 7))  # up to the largest measured gamma + 2
    np.testing.assert_allclose(curve.expected_tokens, [costs.expected_tokens_per_step(0.5, g) for g in range(7)])
    np.testing.assert_allclose(points.expected_tokens, [1.75, 1.9375, 1.75])
    np.testing.assert_allclose(points.ratio, points.mat / points.expected_tokens)
    assert points.method.tolist() == measured.method.tolist()  # the measured rows kept, in order
    assert costs.formula_against_measured(measured, 0.5, max_gamma=3)[0].gamma.max() == 3
    with pytest.raises(ValueError, match="mat"):
        costs.formula_against_measured(measured.drop(columns="mat"), 0.5)
    with pytest.raises(ValueError, match="alpha"):
        costs.formula_against_measured(measured, 1.5)

    fig = viz.expected_tokens_figure(curve, points, alpha=0.5)
    assert isinstance(fig, go.Figure)
    line, *markers = fig.data
    assert list(line.x) == curve.gamma.tolist() and list(line.y) == pytest.approx(curve.expected_tokens.tolist())
    assert [m.name for m in markers] == ["draft_model", "hf_assisted"]
    assert list(markers[0].x) == [2, 4] and list(markers[0].y) == [1.9, 2.6] and list(markers[1].y) == [1.9]
    assert fig.layout.shapes[0].y0 == pytest.approx(2.0)  # the limit 1 / (1 - alpha)
    no_method = viz.expected_tokens_figure(curve, points.drop(columns="method"), alpha=1.0)  # alpha = 1: no limit
    assert len(no_method.data) == 2 and not no_method.layout.shapes
