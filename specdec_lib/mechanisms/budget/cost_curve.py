"""t(rows, context): what one step of the decoding loop costs on this machine, the curve every "auto" budget reads.

A step that verifies R rows (the root and R - 1 drafted tokens) costs t(R) ms. On a GPU t is nearly flat for
small R (the weights are read once per forward either way); on a CPU it grows early, and not always smoothly
(a kernel switch at 2 rows is common: notebook 00 measures it). The choosers (choosers.py, confidence.py) weigh
the tokens a draft is expected to yield against this price, so the curve has to be this model's, on this device,
in this dtype, with these linear kernels (models/prepack.py), timed the way the loop really runs a step:

- `CostCurve`: t(rows) at one cached-prefix length, timed by step_cost.verify_cost (the loop's own verify +
  commit: tree mask, masked attention and the walk included, which a bare forward leaves out), linear between
  measured row counts, each a median kept as measured (a kernel switch makes t non-monotone: the choosers see it
  and draft past it), floored at t(1), cached on disk per `model_key` + prefix (`cost_cache_dir`) and in memory
  per process; `from_points` injects one (tests).
- `ContextCosts`: every full-context row reads the whole KV cache, so a row's price grows with the context:
  curves after several prefixes (PREFIXES, those the generation reaches), linear in the prefix between them and
  beyond (attention is linear in the keys it reads); `at(context)` is the curve a step at that context pays.
- `SPECDEC_COSTS=estimate` (the tests' default): no timing at all; a curve priced from the parameters a step
  reads, nearly flat in rows (a GPU's shape, so every "auto" budget drafts), the same on every machine.
- `resolve_curve` (a method's `costs=` option), `reach` (the longest context a request reaches) and
  `prepare_costs` (measure before anything is timed, so no generation's time holds a measurement).

Left out: t is measured at a few prefixes only (PREFIXES) on the loop's plain cache (FAFO's store reads through
its own attention: priced the same); the prefix holds random token ids (cost does not depend on them); batch
size 1.
"""
from __future__ import annotations

import bisect
import hashlib
import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ...env import cache_root

# in the cache key: curves timed another way (plain forwards, or kept monotone) are re-measured
CURVE_KIND = "loop verify + commit, medians as measured, packed rows padded"
MEASURE_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
PREFIXES = (256, 1024, 4096, 8192, 16384, 32768, 65536)  # cached prefixes ContextCosts times (to the context reached)
CONTEXT_STEP = 64  # ContextCosts.at memoises one curve per this many tokens of context (at the bucket's top)
_MEMO: dict[str, "CostCurve"] = {}  # curves measured or read in this process, by cache key
ESTIMATE_ENV = "SPECDEC_COSTS"  # "estimate": price steps from parameter counts, time nothing (tests set it)


def estimating() -> bool:
    """True where costs are estimated instead of timed (SPECDEC_COSTS=estimate: the tests, so that no test's outcome
    or time depends on how loaded the machine was when a curve was measured)."""
    value = os.environ.get(ESTIMATE_ENV, "")
    if value not in ("", "estimate"):
        raise ValueError(f"{ESTIMATE_ENV} must be unset (time the machine) or 'estimate', got {value!r}")
    return value == "estimate"


def estimated_ms(params: int, rows: float = 1) -> float:
    """The estimated ms of a forward of `rows` rows over `params` weights: 1 ms per million weights read for one
    row, each further row 1/64 of that (a memory-bound device, where extra rows ride along nearly free)."""
    return params / 1e6 * (1 + (rows - 1) / 64)


def cost_cache_dir() -> Path:
    """Where measured curves are kept: $SPECDEC_CACHE/costs, else ~/.cache/specdec_lib/costs."""
    return cache_root() / "costs"


def _device_name(device) -> str:
    import torch

    from ...env import cpu_model_name

    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    # cost depends on the threads and on the vector unit torch's kernels use (AVX2, AVX512, ...): a cloud CPU name
    # such as "AMD EPYC" covers several generations, and a curve of one must not price another
    return (f"{device.type}:{cpu_model_name()}:{torch.backends.cpu.get_cpu_capability()}:"
            f"{torch.get_num_threads()} threads")


def model_key(model) -> dict:
    """What a curve is valid for: device name, model identity (name_or_path, parameter count, config hash),
    dtype, its linear kernels (models/prepack.py), the torch version, and what was timed."""
    import torch

    param = next(model.parameters())
    packed = any(getattr(m, "prepacked", False) for m in model.modules())  # models/prepack.PackedLinear's mark
    config = json.dumps(model.config.to_dict(), sort_keys=True, default=str)
    return dict(device=_device_name(param.device), model=str(getattr(model.config, "name_or_path", "") or ""),
                params=int(sum(p.numel() for p in model.parameters())),
                config=hashlib.sha256(config.encode()).hexdigest()[:16], dtype=str(param.dtype),
                linear="prepacked" if packed else "plain", torch=torch.__version__, timed=CURVE_KIND)


class CostCurve:
    """t(rows): ms of one target forward of `rows` query rows, linear between measured points, extended
    beyond the last one with the last slope (and flat below the first)."""

    def __init__(self, rows: Sequence[float], ms: Sequence[float], key: dict | None = None):
        order = np.argsort(np.asarray(rows, dtype=float))
        self.rows = np.asarray(rows, dtype=float)[order]
        self.ms = np.asarray(ms, dtype=float)[order]
        if len(self.rows) < 1 or len(set(self.rows)) != len(self.rows) or self.rows[0] < 1:
            raise ValueError(f"need distinct row counts >= 1, got {list(rows)}")
        if not np.all(np.isfinite(self.ms)) or np.any(self.ms <= 0):
            raise ValueError(f"costs must be positive finite ms, got {list(ms)}")
        # each point is a median of repeats, kept as measured: a point above a later, larger one is a kernel
        # switch, not noise, and the loop runs a step at its own row count, so a monotone envelope would price
        # such a row count below what it really costs. Only a point below the one-row price is noise: no step
        # costs less than a plain one.
        self.ms = np.maximum(self.ms, self.ms[0])
        self._rows, self._ms = self.rows.tolist(), self.ms.tolist()
        self.key = key

    @classmethod
    def from_points(cls, points) -> "CostCurve":
        """From {rows: ms} or [(rows, ms), ...] (tests inject curves this way)."""
        pairs = sorted(dict(points).items())
        return cls([r for r, _ in pairs], [m for _, m in pairs])

    def __call__(self, rows: float) -> float:
        """t(rows) in ms. Plain Python (bisect), not numpy: the choosers call it between two forwards, where a
        numpy call costs several times more than in isolation."""
        r, m = self._rows, self._ms
        if rows <= r[0] or len(r) == 1:
            return m[0]
        if rows >= r[-1]:  # beyond the last point: its slope
            return m[-1] + max(0.0, (m[-1] - m[-2]) / (r[-1] - r[-2])) * (rows - r[-1])
        i = bisect.bisect_right(r, rows)  # r[i - 1] <= rows < r[i]
        return m[i - 1] + (m[i] - m[i - 1]) * (rows - r[i - 1]) / (r[i] - r[i - 1])

    def __repr__(self) -> str:
        points = ", ".join(f"{int(r)}: {m:.2f}" for r, m in zip(self.rows, self.ms))
        return f"CostCurve({{{points}}} ms)"

    @classmethod
    def measure(cls, model, rows: Sequence[int] = MEASURE_ROWS, prefix: int = 256, repeats: int = 7,
                cache: bool = True) -> "CostCurve":
        """The curve of `model` here (step_cost.verify_cost: the loop's own verify + commit, after `prefix`
        cached tokens, clipped to the model's context), read from the on-disk cache when this device + model +
        dtype + prefix was measured before (cache=False: measure anew)."""
        limit = getattr(model.config, "max_position_embeddings", None) or prefix + max(rows)
        rows = [r for r in rows if r <= limit - 1] or [1]
        prefix = max(1, min(prefix, limit - max(rows)))
        if estimating():
            params = sum(p.numel() for p in model.parameters())
            return cls(rows, [estimated_ms(params, r) for r in rows], dict(estimated=params, prefix=prefix))
        key = dict(model_key(model), prefix=prefix)
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
        path = cost_cache_dir() / f"curve_{digest}.json"
        if cache and digest in _MEMO and _MEMO[digest].key == key:
            return _MEMO[digest]
        if cache and path.exists():
            data = json.loads(path.read_text())
            if data.get("key") == key:
                curve = _MEMO[digest] = cls(data["rows"], data["ms"], key)
                curve.path = path
                return curve
        from .step_cost import verify_cost  # imported here: step_cost imports verify, which is heavier
        # said aloud: at a long prefix this takes seconds, paid once per machine + model + prefix, and a first
        # generation that seems slow should say why
        print(f"budget 'auto': timing this machine's target forwards of {', '.join(map(str, rows))} rows after "
              f"{prefix} cached tokens, once; cached at {path}", flush=True)  # stdout: a notice, not a warning
        table = verify_cost(model, rows, prefix=prefix, repeats=repeats, warmup=2)
        curve = _MEMO[digest] = cls(table["rows"].tolist(), table["median_ms"].tolist(), key)  # floored at t(1)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(key=key, prefix=prefix, rows=curve.rows.tolist(), ms=curve.ms.tolist())))
        tmp.replace(path)  # atomic: a concurrent reader sees the whole file or none
        curve.path = path
        return curve

    @property
    def prefix(self) -> int | None:
        """The cached tokens a measured curve was timed after (None: an injected curve)."""
        return None if self.key is None else self.key.get("prefix")

    def at(self, context: float) -> "CostCurve":
        """The curve at a context length: one curve (an injected one) serves every context."""
        return self


class ContextCosts:
    """t(rows, context): CostCurves measured after several cached-prefix lengths; `at(context)` is the curve at
    a context: linear in the prefix between two measured ones and beyond the last (with the last two's slope,
    never falling: a longer context never makes a row cheaper), the first curve below the first prefix."""

    def __init__(self, curves: dict):
        if not curves:
            raise ValueError("need a curve at one prefix at least")
        self.prefixes = sorted(int(p) for p in curves)
        self.curves = [curves[p] for p in self.prefixes]
        self._memo: dict[int, CostCurve] = {}

    @classmethod
    def measure(cls, model, upto: int = 0, prefixes: Sequence[int] = PREFIXES, **kwargs) -> "ContextCosts":
        """The curves of `model` after each of `prefixes` up to `upto` (the longest context the generation
        reaches; the first prefix always; beyond the last, `at` extrapolates), each CostCurve.measure (cached on
        disk)."""
        prefixes = sorted(prefixes)
        wanted = [p for i, p in enumerate(prefixes) if i == 0 or p <= upto]
        curves = {}
        for p in wanted:
            curve = CostCurve.measure(model, prefix=p, **kwargs)
            curves.setdefault(curve.prefix, curve)  # prefixes clipped to the model's context are one curve
        return cls(curves)

    def at(self, context: float) -> CostCurve:
        bucket = -(-int(context) // CONTEXT_STEP)  # rounded up: a step is never priced below its context
        curve = self._memo.get(bucket)
        if curve is None:
            curve = self._memo[bucket] = self._interpolate(bucket * CONTEXT_STEP)
        return curve

    def _interpolate(self, context: int) -> CostCurve:
        p = self.prefixes
        if len(p) == 1 or context <= p[0]:
            return self.curves[0]
        i = min(bisect.bisect_right(p, context), len(p) - 1) - 1  # p[i] <= context < p[i + 1], or the last two
        low, high = self.curves[i], self.curves[i + 1]
        w = (context - p[i]) / (p[i + 1] - p[i])  # > 1 beyond the last prefix
        rows = sorted(set(low._rows) | set(high._rows))
        ms = [low(r) + w * max(0.0, high(r) - low(r)) for r in rows]
        return CostCurve(rows, ms)

    def __call__(self, rows: float, context: float = 0) -> float:
        return self.at(context)(rows)

    def __repr__(self) -> str:
        return "ContextCosts(" + "; ".join(f"{p} cached: {c!r}" for p, c in zip(self.prefixes, self.curves)) + ")"


def resolve_curve(costs, model, upto: int = 0):
    """A method's `costs=` option: None (measure `model` here after each prefix up to the `upto` tokens the
    generation reaches: a ContextCosts, cached), a CostCurve or a ContextCosts, or {rows: ms}."""
    if costs is None:
        return ContextCosts.measure(model, upto)
    if isinstance(costs, (CostCurve, ContextCosts)):
        return costs
    if isinstance(costs, dict):
        return CostCurve.from_points(costs)
    raise TypeError(f"costs must be None (measure here), a CostCurve, a ContextCosts or {{rows: ms}}, got "
                    f"{type(costs).__name__}")


def reach(request) -> int:
    """The longest context a request's generation reaches: its prompt and every new token."""
    return request.prompt_length + request.max_new_tokens


def prepare_costs(model, upto: int) -> None:
    """Measure (or read) the curves a generation of up to `upto` tokens of context will choose from, before
    anything is timed (a benchmark calls this, so no generation's time holds a measurement)."""
    ContextCosts.measure(model, upto)

