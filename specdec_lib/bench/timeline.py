"""Busy intervals of drafter and target, and how much they overlap (CARD paper §1, Figure 1: "mutual waiting").

- `busy_from_steps(result)`: the intervals a sequential method's per-step records imply (draft_us, then
  verify_ms, then update_us, back to back): {"draft": [...], "target": [...]} in seconds from 0. Reconstructed
  from durations, not timestamps: the loop's own bookkeeping between steps is left out.
- `busy_from_card(result)`: the recorded intervals of a `card` run in thread mode (perf_counter timestamps),
  shifted to start at 0.
- `overlap(a, b)`: the time both interval lists are busy at once, and as a fraction of the wall time they span.

Draw them with `viz.timeline_figure`.
"""
from __future__ import annotations


def busy_from_steps(result) -> dict[str, list[tuple[float, float]]]:
    draft, target, t = [], [], 0.0
    for step in result.stats["steps"]:
        d, v, u = step["draft_us"] * 1e-6, step["verify_ms"] * 1e-3, step["update_us"] * 1e-6
        draft.append((t, t + d))
        target.append((t + d, t + d + v))
        t += d + v + u
    return {"draft": draft, "target": target}


def busy_from_card(result) -> dict[str, list[tuple[float, float]]]:
    stats = result.stats
    if "draft_busy" not in stats:
        raise ValueError("no recorded busy intervals: run card with mode='thread'")
    start = min(t for t, _ in stats["draft_busy"] + stats["target_busy"])
    return {name: [(a - start, b - start) for a, b in stats[key]]
            for name, key in (("draft", "draft_busy"), ("target", "target_busy"))}


def _merge(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def overlap(a, b) -> dict:
    """{"both_s", "wall_s", "fraction"}: seconds both lists are busy, the span of all intervals, their ratio."""
    a, b = _merge(a), _merge(b)
    both, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):  # two sorted, disjoint lists: sweep
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        both += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    spans = a + b
    wall = (max(e for _, e in spans) - min(s for s, _ in spans)) if spans else 0.0
    return {"both_s": both, "wall_s": wall, "fraction": both / wall if wall else 0.0}
