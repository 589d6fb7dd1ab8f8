"""Loading a target/draft pair: the shipped tiny pair, two local directories, or two hub ids.

Every later notebook starts with `pair = load_models()`. The pair shares one tokenizer; a draft whose
vocabulary differs from the target's is refused here, once, with both sizes in the message, because every
speculative method compares draft tokens with target tokens id by id.

Simplifications: batch size 1 everywhere; the tokenizer is the target's.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

DATA_DIR = Path(os.environ.get("SPECDEC_DATA", Path(__file__).resolve().parent.parent / "data"))
TINY_DIR = DATA_DIR / "models"
PROMPTS_DIR = DATA_DIR / "prompts"


@dataclass
class ModelPair:
    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object  # a transformers PreTrainedTokenizerFast
    device: torch.device
    name: str = "tiny"

    def encode(self, text: str) -> torch.Tensor:
        """Token ids of `text` as a (1, P) tensor on the pair's device."""
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        return ids.to(self.device)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids))


def resolve_device(device="auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but no CUDA GPU is visible; use device='cpu' or 'auto'")
    return device


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        # float32 on CPU keeps greedy parity checks exact; bf16 is the natural GPU type when supported.
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be 'auto', a torch.dtype or its name, got {dtype!r}")
    return dtype


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so a wall-clock time covers it (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def vocab_size(model) -> int:
    """Rows of the model's output layer: the token ids it can score."""
    return int(model.get_output_embeddings().weight.shape[0])


def check_same_vocab(target, draft) -> None:
    """A clear error when a draft's vocabulary (output rows) differs from the target's."""
    t, d = vocab_size(target), vocab_size(draft)
    if t != d:
        raise ValueError(f"draft and target vocabularies differ: target has {t} tokens, draft has {d}; "
                         "speculative decoding needs a draft that shares the target's tokenizer")


def _draft_tokenizer(source: str, offline: bool):
    """The draft's own tokenizer when it ships one (None when it has none: then the sizes alone are checked)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, local_files_only=offline or _is_local(source))
    except (OSError, ValueError):
        return None


def check_same_tokenizer(target_tokenizer, draft_tokenizer) -> None:
    """A clear error when both tokenizers are known and map strings to ids differently (at any vocabulary size:
    two tokenizers of equal size but other merges would make every draft token mean something else)."""
    if draft_tokenizer is None:
        return
    a, b = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if a == b:
        return
    differ = sorted(set(a.items()) ^ set(b.items()), key=lambda kv: kv[1])[:3]
    raise ValueError(f"draft and target tokenizers differ ({len(a)} and {len(b)} tokens; e.g. "
                     f"{', '.join(f'{k!r}->{v}' for k, v in differ)}): speculative decoding compares token ids, so "
                     f"the draft must use the target's tokenizer")


def _is_local(path) -> bool:
    return Path(str(path)).expanduser().is_dir()


def _load_one(source: str, device, dtype, offline_hint: bool):
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=offline_hint)
    except OSError as err:
        raise ValueError(
            f"could not load model {source!r} (no local directory of that name, and the hub is unreachable or "
            f"has no such model). Offline, use load_models('tiny') for the shipped pair. Cause: {err}") from err
    return model.to(device).eval()


def load_models(spec="tiny", device="auto", dtype="auto") -> ModelPair:
    """Load (target, draft, tokenizer).

    spec: "tiny" (the pair under data/models), or a pair (target, draft) of local directories or hub ids.
    """
    from transformers import AutoTokenizer

    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    if spec == "tiny":
        if not (TINY_DIR / "target").is_dir():
            raise FileNotFoundError(f"the shipped tiny pair is missing under {TINY_DIR}; "
                                    "train it with `python -m specdec_lib.tools.train_tiny --out data/models`")
        target_src, draft_src, name = str(TINY_DIR / "target"), str(TINY_DIR / "draft"), "tiny"
    elif isinstance(spec, (tuple, list)) and len(spec) == 2 and all(isinstance(s, (str, Path)) for s in spec):
        target_src, draft_src = (str(s) for s in spec)
        name = f"{Path(target_src).name}+{Path(draft_src).name}"
    else:
        raise TypeError(f"spec must be 'tiny' or a (target, draft) pair of directories or hub ids, got {spec!r}")
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    target = _load_one(target_src, device, dtype, offline and not _is_local(target_src))
    draft = _load_one(draft_src, device, dtype, offline and not _is_local(draft_src))
    check_same_vocab(target, draft)
    tokenizer = AutoTokenizer.from_pretrained(target_src, local_files_only=offline and not _is_local(target_src))
    check_same_tokenizer(tokenizer, _draft_tokenizer(draft_src, offline))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return ModelPair(target=target, draft=draft, tokenizer=tokenizer, device=device, name=name)
