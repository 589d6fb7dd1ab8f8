"""The `generate` contract every method follows, and the method registry.

    result = generate("autoregressive", target, input_ids, max_new_tokens=64)
    result.new_tokens, result.accept_lengths, result.target_forwards, result.mat

`accept_lengths[i]` is the number of tokens the i-th target forward added to the output, the target's next token
included: the autoregressive loop gives all 1s, and MAT (`mat`, the summaries' column `mat`) is their mean. The prompt's
prefill forward counts (it yields the first new token).

A method is a function `decode(request, **config) -> GenerationResult` registered in `METHODS`. The library's
own methods are proposers of the one decoding loop (`loop.register_proposer`); Hugging Face's decoders are
registered as plain functions (`register`, methods/peers.py). `generate` validates the input once, so methods
can trust it: bad input raises a ValueError/TypeError that says what to do (see `generate`).

Simplifications: batch size 1; stopping is `max_new_tokens` exactly or the first `eos_token_id`
(kept in the output), nothing else.
"""
from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import compat
from .env import check_int
from .env import check_same_vocab, synchronize, vocab_size
from .sampling import SamplingConfig, make_generator


@dataclass
class GenerationResult:
    new_tokens: list[int]
    accept_lengths: list[int]
    target_forwards: int
    wall_seconds: float = 0.0
    method: str = ""
    stats: dict = field(default_factory=dict)  # per-method extras (draft forwards, per-step records, ...)
    # time to the first token: from the call to the end of the first target forward that yields tokens (the
    # prefill's), and how many tokens it yielded; the rest of wall_seconds is the decode phase
    prefill_seconds: float = float("nan")
    prefill_tokens: int = 0

    @property
    def mat(self) -> float:
        """MAT: mean tokens gained per target forward, the target's next token included."""
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 0.0

    @property
    def tokens_per_s(self) -> float:
        return len(self.new_tokens) / self.wall_seconds if self.wall_seconds > 0 else float("nan")

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first forward's, per second after it: the decode phase alone (prefill timed apart)."""
        seconds = self.wall_seconds - self.prefill_seconds
        return (len(self.new_tokens) - self.prefill_tokens) / seconds if seconds > 0 else float("nan")


@dataclass
class Request:
    """A validated generation request: what a method receives."""
    target: torch.nn.Module
    input_ids: torch.Tensor  # (1, P) on the target's device
    max_new_tokens: int
    sampling: SamplingConfig
    generator: torch.Generator | None
    eos_token_id: int | None
    draft: torch.nn.Module | None = None
    seed: int | None = None
    started: float | None = None  # time.perf_counter() when generate started the clock (prefill_seconds from it)

    @property
    def prompt_length(self) -> int:
        return self.input_ids.shape[1]

    def is_done(self, tokens: list[int]) -> bool:
        return len(tokens) >= self.max_new_tokens or (self.eos_token_id is not None and bool(tokens)
                                                        and tokens[-1] == self.eos_token_id)

    def trim(self, tokens: list[int]) -> list[int]:
        """Cut a candidate extension at max_new_tokens or just after the first EOS."""
        tokens = tokens[: self.max_new_tokens]
        if self.eos_token_id is not None and self.eos_token_id in tokens:
            tokens = tokens[: tokens.index(self.eos_token_id) + 1]
        return tokens


@dataclass(frozen=True)
class Method:
    name: str
    decode: Callable[..., GenerationResult]
    needs_draft: bool
    description: str
    options: tuple[str, ...] = ()  # the settings `generate(..., **config)` passes on

    def accepts(self, option: str) -> bool:
        return option in self.options


METHODS: dict[str, Method] = {}


def register(name: str, needs_draft: bool = False):
    """Function decorator: METHODS[name] = decode(request, **settings)."""
    def wrap(fn):
        doc = (fn.__doc__ or "").strip().splitlines()
        options = tuple(p for p in inspect.signature(fn).parameters if p != "req")
        METHODS[name] = Method(name, fn, needs_draft, doc[0] if doc else "", options)
        return fn
    return wrap


def context_length(model) -> int | None:
    return getattr(model.config, "max_position_embeddings", None)


def _as_input_ids(input_ids, device) -> torch.Tensor:
    if isinstance(input_ids, (list, tuple)):
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in input_ids):
            raise TypeError("input_ids given as a list must hold ints (token ids)")
        input_ids = torch.tensor([list(input_ids)], dtype=torch.long)
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a tensor or a list of ints, got {type(input_ids).__name__}")
    if input_ids.dtype not in (torch.long, torch.int32, torch.int64):
        raise TypeError(f"input_ids must be integer token ids, got dtype {input_ids.dtype}")
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape (1, P) or (P,), got {tuple(input_ids.shape)}")
    if input_ids.shape[0] != 1:
        raise ValueError(f"batch size {input_ids.shape[0]} is not supported: methods decode one sequence (batch 1)")
    if input_ids.shape[1] == 0:
        raise ValueError("the prompt is empty: give at least one token")
    return input_ids.to(device=device, dtype=torch.long)


def _check_draft(target, draft) -> None:
    check_same_vocab(target, draft)
    t_device, d_device = next(target.parameters()).device, next(draft.parameters()).device
    if t_device != d_device:
        raise ValueError(f"the draft is on {d_device} and the target on {t_device}: move the draft to the "
                         f"target's device (draft.to({str(t_device)!r}))")
    # Another dtype is allowed: q is computed in float32 whatever the draft's dtype (sampling.probs).


def generate(method: str, target, input_ids, max_new_tokens: int, *, draft=None, temperature: float = 0.0,
             seed: int | None = None, eos_token_id: int | None = None, top_k: int | None = None,
             top_p: float | None = None, **config) -> GenerationResult:
    """Decode with `method` (a key of METHODS); see the module docstring for the contract.

    Refused with a message: an unknown method or setting, an empty prompt, batch > 1, token ids outside the
    vocabulary, prompt + max_new_tokens beyond the target's context (exactly at it is fine), a bad
    temperature/top_k/top_p (top_k/top_p with temperature 0 too: greedy would ignore them), an eos_token_id
    outside the vocabulary, a missing draft, or a draft with another vocabulary or on another device."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; known methods: {', '.join(sorted(METHODS))}")
    spec = METHODS[method]
    unknown = sorted(set(config) - set(spec.options))
    if unknown:
        raise TypeError(f"method {method!r} takes no setting {', '.join(unknown)}; its settings: "
                        f"{', '.join(spec.options) or 'none'}")
    check_int("max_new_tokens", max_new_tokens, 0)
    sampling = SamplingConfig(temperature, top_k, top_p)
    if sampling.greedy and (top_k is not None or top_p is not None):
        raise ValueError("top_k/top_p shape sampling, and temperature=0 is greedy decoding, which would ignore "
                         "them: set temperature > 0, or leave top_k and top_p out")
    device = next(target.parameters()).device
    ids = _as_input_ids(input_ids, device)
    limit = context_length(target)
    if limit is not None and ids.shape[1] + max_new_tokens > limit:
        raise ValueError(f"prompt ({ids.shape[1]} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                         f"target's context of {limit} tokens")
    vocab = vocab_size(target)
    if int(ids.max()) >= vocab or int(ids.min()) < 0:
        raise ValueError(f"input_ids hold token ids outside the target's vocabulary of {vocab}")
    if eos_token_id is not None:
        check_int("eos_token_id", eos_token_id)
        if not 0 <= eos_token_id < vocab:
            raise ValueError(f"eos_token_id {eos_token_id} is outside the target's vocabulary of {vocab}")
    if spec.needs_draft:
        if draft is None:
            raise ValueError(f"method {method!r} needs a draft model: pass draft=...")
        _check_draft(target, draft)
    request = Request(target, ids, max_new_tokens, sampling, make_generator(seed, device), eos_token_id,
                      draft, seed)
    if max_new_tokens == 0:
        return GenerationResult([], [], 0, 0.0, method)
    synchronize(device)
    start = request.started = time.perf_counter()
    with torch.inference_mode(), compat.decode_attention(device):
        result = spec.decode(request, **config)
    synchronize(device)
    result.wall_seconds = time.perf_counter() - start
    result.method = method
    return result
