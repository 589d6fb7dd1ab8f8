"""Prepacked linear weights on a CPU: why a forward of 8 rows can cost about what one row costs.

Decoding one token multiplies a row vector by every weight matrix: the time is reading the weights from memory
(memory-bound), so rows 2..8 should ride along nearly free, which is the whole premise of speculative decoding.
On a CPU, torch's `F.linear` sends one row to a matrix-vector kernel but two or more rows to a general matrix
multiply that first copies ("packs") the weight into its blocked layout, on every call: a wide LM head then costs
far more for two rows than for one, and so does a whole forward of a few rows. Packing each weight once, at load
time (oneDNN's reordered weight, what `torch.compile`'s CPU freezing does), removes that copy, and the cost curve
t(rows) becomes the memory-bound one the papers assume (notebook 00, section 3, measures both).

`prepack(model)` turns every `nn.Linear` into a `PackedLinear` (the same module, parameters and state dict, one
more cached tensor): the same math up to float32 rounding (the greedy parity tests compare each method with HF
greedy on the same model, so both read the same kernels). The packed copy is used only in float32 on a CPU without
autograd, and while the weight is unchanged since it was packed (same storage and version counter: an optimizer
step, a load or `.to()` repacks); elsewhere `F.linear` runs as before.

oneDNN may run a packed weight faster for 4 rows than for 1: each packed weight times itself once per process
(PAD_ROWS rows against 1, `_four_over_one`) and, where 4 rows win, pads fewer rows with zero rows, so every one-row
step's LM head (plain steps, autoregressive, HF's own generate) gets the faster kernel. Where 4 rows cost at most
FREE_RATIO x one (a machine whose memory is slow), `rows_free()` lets RowLogits (verify.py) compute 4 rows at once:
a verify walk that reads 3 rows then pays one read of the head, not three. Only wide models gain:
`load_models(prepack="auto")` packs models at least MIN_WIDTH wide; narrower matrices stay cache-resident for
F.linear, and oneDNN's per-call overhead wins. Simplifications: float32 only (bf16 kernels need AVX512-BF16);
the packed copy doubles the weights' memory (the original is kept for state dicts, training and float64 checks);
the padding decision is one timing per shape (1 row against 4), not a curve.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .. import compat
from ..env import median_ms


MIN_WIDTH = 512  # prepack="auto" packs models at least this wide (hidden size): narrower ones lose (module doc)
PAD_ROWS = 4  # a packed weight whose kernel runs 4 rows faster than 1 gets fewer rows padded to 4 (module doc)
PAD_RATIO = 0.95  # padding pays where 4 rows take under this x one row's time
FREE_RATIO = 1.25  # RowLogits computes 4 rows at a time where they take at most this x one row's time
_FOUR_OVER_ONE: dict[tuple, float] = {}  # (in, out, bias, threads) -> t(PAD_ROWS rows) / t(1 row), timed once per process


def _four_over_one(packed, linear, bias, in_features: int, out_features: int, repeats: int = 15) -> float:
    """The time of `linear` of PAD_ROWS rows over its time for one row with this packed weight (medians of
    `repeats` calls each, no warm-up): measured per weight shape and thread count, once per process."""
    key = (in_features, out_features, bias is not None, torch.get_num_threads())
    if key not in _FOUR_OVER_ONE:
        one, four = torch.randn(1, in_features), torch.randn(PAD_ROWS, in_features)  # (1, in), (4, in)
        one_ms, four_ms = (median_ms(lambda x=x: linear(x, packed, bias), repeats, warmup=0) for x in (one, four))
        _FOUR_OVER_ONE[key] = four_ms / max(one_ms, 1e-9)
    return _FOUR_OVER_ONE[key]


class PackedLinear(nn.Linear):
    """An nn.Linear whose forward reads a weight packed once for oneDNN (see the module doc)."""
    prepacked = True  # what cost curves key on (cost_curve.model_key), without importing this module

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
    return any(getattr(m, "prepacked", False) for m in model.modules())


def should_prepack(device: torch.device, dtype: torch.dtype) -> tuple[bool, str]:
    """What load_models' prepack="auto" does on `device` in `dtype`, and why."""
    if device.type != "cpu":
        return False, f"plain: {device.type} kernels need no prepacking"
    if dtype != torch.float32:
        return False, f"plain: prepacking serves float32 only, this pair is {str(dtype).removeprefix('torch.')}"
    if not available():
        return False, "plain: this torch build has no oneDNN packed linear"
    return True, "prepacked: oneDNN weights packed once (a forward of a few rows costs about one row's)"
