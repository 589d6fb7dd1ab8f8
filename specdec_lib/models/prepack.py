"""Prepacked linear weights on a CPU: why a forward of 8 rows can cost about what one row costs.

Decoding one token multiplies a row vector by every weight matrix: the time is reading the weights from memory
(memory-bound), so rows 2..8 should ride along nearly free, which is the whole premise of speculative decoding.
On a CPU, torch's `F.linear` sends one row to a matrix-vector kernel but two or more rows to a general matrix
multiply that first copies ("packs") the weight into its blocked layout, on every call: on the 2-core machine
this workbook is measured on, SmolLM2-135M's 49,152 x 576 head takes ~13 ms for one row and ~30 ms for two,
and a whole forward of 4 rows cost ~1.8x one row. Packing each weight once, at load time (oneDNN's reordered
weight, what `torch.compile`'s CPU freezing does), removes that copy: the head then takes ~8 ms for 1 row,
~8 ms for 2, ~14 ms for 8, and the cost curve t(rows) becomes the memory-bound one the papers assume
(notebook 00, section 3, measures both).

`prepack(model)` turns every `nn.Linear` of a model into a `PackedLinear` (the same module, parameters and
state dict, one more cached tensor): exact same math, float32 rounding differences only (~1e-6 relative; the
greedy parity tests compare each method with HF greedy on the same model, so both read the same kernels).
The packed copy is used only where it is valid, else `F.linear` runs as before:
- float32 on a CPU, without autograd (training a copy of a layer reads the live weight);
- the weight unchanged since it was packed (same storage, same version counter: an optimizer step, a load or
  `.to()` repacks).

A kernel that prefers more rows: on this machine oneDNN runs SmolLM2's packed head ~28 % faster for 4 rows than for
1 (3.0 against 4.1 ms; 2 rows: 4.7 ms), while its layers' weights cost the same for 1-8 rows. So each packed weight
times itself once per process (PAD_ROWS rows against 1, `_four_over_one`) and, where 4 rows win, pads fewer rows
with zero rows: every one-row step's LM head (the loop's plain steps, autoregressive, HF's own generate on the same
model) gets the faster kernel. Where 4 rows cost at most FREE_RATIO x one (a machine whose memory is slow: one
sitting's VM read the head at 17.3 ms for 1 row, 18.6 ms for 4), `rows_free()` tells RowLogits (verify.py) it may
compute 4 rows at once: a verify walk that reads 3 rows then pays one read of the head's 113 MB, not three.

Only wide models gain: `load_models(prepack="auto")` packs a model at least MIN_WIDTH wide (hidden size). Below
that the matrices are small enough for F.linear's kernels to stay cache-resident, and oneDNN's per-call overhead
wins: on this machine the tiny pair (width 256) decoded at about half the speed packed (hf, 128 new tokens, both
kernels timed side by side), while SmolLM2 (576) gains (its one-row step ~22 % faster, 8 rows ~24 %).

Simplifications: float32 only (bf16 kernels need AVX512-BF16, which only some CPUs have: the pairs decode in
float32 on a CPU); the packed copy doubles the weights' memory (the original is kept: state dicts, training and
float64 checks read it); the padding decision is one timing per shape (1 row against 4), not a curve.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .. import compat


MIN_WIDTH = 512  # prepack="auto" packs models at least this wide (hidden size): narrower ones lose (module doc)
PAD_ROWS = 4  # a packed weight whose kernel runs 4 rows faster than 1 gets fewer rows padded to 4 (module doc)
PAD_RATIO = 0.95  # padding pays where 4 rows take under this x one row's time
FREE_RATIO = 1.25  # RowLogits computes 4 rows at a time where they take at most this x one row's time
_FOUR_OVER_ONE: dict[tuple, float] = {}  # (in, out, bias, threads) -> t(PAD_ROWS rows) / t(1 row), timed once per process


def _four_over_one(packed, linear, bias, in_features: int, out_features: int, repeats: int = 15) -> float:
    """The time of `linear` of PAD_ROWS rows over its time for one row with this packed weight (medians of
    `repeats` interleaved calls): measured per weight shape and thread count, once per process."""
    import time

    key = (in_features, out_features, bias is not None, torch.get_num_threads())
    if key not in _FOUR_OVER_ONE:
        one, four = torch.randn(1, in_features), torch.randn(PAD_ROWS, in_features)
        times = {1: [], PAD_ROWS: []}
        for _ in range(repeats):
            for rows, x in ((1, one), (PAD_ROWS, four)):
                start = time.perf_counter()
                linear(x, packed, bias)
                times[rows].append(time.perf_counter() - start)
        median = {rows: sorted(ts)[len(ts) // 2] for rows, ts in times.items()}
        _FOUR_OVER_ONE[key] = median[PAD_ROWS] / max(median[1], 1e-12)
    return _FOUR_OVER_ONE[key]


class PackedLinear(nn.Linear):
    """An nn.Linear whose forward reads a weight packed once for oneDNN (see the module doc)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        ops = compat.packed_linear_ops()
        if (ops is None or torch.is_grad_enabled() or x.dtype != torch.float32 or x.device.type != "cpu"
                or self.weight.dtype != torch.float32):
            return F.linear(x, self.weight, self.bias)
        pack, linear = ops
        # the storage and its version counter (bumped by every in-place change: an optimizer step, a load)
        weight = self.weight  # an inference tensor (made under torch.inference_mode) keeps no version counter
        version = (weight.data_ptr(), -1 if weight.is_inference() else weight._version)
        if self.__dict__.get("_packed_version") != version:
            self.__dict__["_packed"] = pack(self.weight)
            self.__dict__["_packed_version"] = version
            ratio = _four_over_one(self.__dict__["_packed"], linear, self.bias, self.in_features, self.out_features)
            self.__dict__["_pad"], self.__dict__["_free"] = ratio < PAD_RATIO, ratio <= FREE_RATIO
        rows = x.numel() // self.in_features
        if rows >= PAD_ROWS or not self.__dict__["_pad"]:
            return linear(x, self.__dict__["_packed"], self.bias)
        # fewer rows than the kernel runs best: zero rows ride along (each output row reads its own input row only)
        padded = x.new_zeros(PAD_ROWS, self.in_features)  # (4, in)
        padded[:rows] = x.reshape(rows, self.in_features)
        out = linear(padded, self.__dict__["_packed"], self.bias)[:rows]  # (rows, out)
        return out.reshape(*x.shape[:-1], self.out_features)

    def rows_free(self) -> int:
        """How many rows one call costs about what a single row costs (PAD_ROWS where 4 rows take at most
        FREE_RATIO x one row's time, else 1): RowLogits computes that many rows at a time."""
        return PAD_ROWS if self.__dict__.get("_free") else 1

    def __getstate__(self):
        # the packed tensor is opaque (no storage to copy or pickle): copies repack on their first forward
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        return {k: v for k, v in state.items() if k not in ("_packed", "_packed_version", "_pad", "_free")}


def available() -> bool:
    """Whether this torch build has oneDNN's packed linear (it answers the same as F.linear)."""
    return compat.packed_linear_ops() is not None


def prepack(model: nn.Module) -> int:
    """Turn `model`'s nn.Linear layers into PackedLinear in place (nothing else changes); returns how many."""
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = PackedLinear
            count += 1
    return count


def unpack(model: nn.Module) -> int:
    """Back to plain nn.Linear (the packed copies dropped); returns how many."""
    count = 0
    for module in model.modules():
        if type(module) is PackedLinear:
            module.__dict__.pop("_packed", None)
            module.__dict__.pop("_packed_version", None)
            module.__dict__.pop("_pad", None)
            module.__dict__.pop("_free", None)
            module.__class__ = nn.Linear
            count += 1
    return count


def is_prepacked(model: nn.Module) -> bool:
    return any(type(m) is PackedLinear for m in model.modules())


def should_prepack(device: torch.device, dtype: torch.dtype) -> tuple[bool, str]:
    """What load_models' prepack="auto" does on `device` in `dtype`, and why."""
    if device.type != "cpu":
        return False, f"plain: {device.type} kernels need no prepacking"
    if dtype != torch.float32:
        return False, f"plain: prepacking serves float32 only, this pair is {str(dtype).removeprefix('torch.')}"
    if not available():
        return False, "plain: this torch build has no oneDNN packed linear"
    return True, "prepacked: oneDNN weights packed once (a forward of a few rows costs about one row's)"
