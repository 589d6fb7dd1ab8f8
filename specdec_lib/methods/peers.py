"""Hugging Face's own decoders registered as methods, so every benchmark measures them in the same run.

- "hf": `model.generate` (greedy, or sampling with the same temperature/top-k/top-p).
- "hf_prompt_lookup": `generate(prompt_lookup_num_tokens=K)` (K = `num_tokens`, default 10;
  `max_matching_ngram_size` default 2, HF's own default).
- "hf_assisted": `generate(assistant_model=draft)` with a constant draft length `gamma` (default 5) and
  `assistant_confidence_threshold=0`, so the assistant really drafts gamma tokens every step (HF's default
  threshold of 0.4 stops drafting early on flat distributions).

HF does not report how many target forwards it ran, so `ForwardCounter` hooks the target and records, at the
start of each forward, the length of the cache it is given and the rows it feeds (read off the arguments' types
and shapes by `compat`, since the keyword names change between releases); from those starts follow the tokens
each forward added (see `accept_lengths_from_starts`). HF samples from the global torch RNG: `seed` seeds it.

Simplifications: batch size 1; HF's own stopping criteria beyond max_new_tokens/EOS are switched off.
"""
from __future__ import annotations

import copy
import time

import torch

from .. import compat
from ..env import check_int
from ..decoding import GenerationResult, Request, register
from ..env import synchronize


class ForwardCounter:
    """Context manager: for every forward of `model`, the cache length at its start and the rows it feeds."""

    def __init__(self, model):
        self.model, self.starts, self.rows, self._handles = model, [], [], []
        self.first_done = None  # time.perf_counter() at the end of the first forward (the prefill)

    def _hook(self, module, args, kwargs):
        cache = compat.find_cache(args, kwargs)
        self.starts.append(int(cache.get_seq_length()) if cache is not None else 0)
        self.rows.append(compat.query_rows(args, kwargs))

    def _done(self, module, args, output):
        if self.first_done is None:
            synchronize(next(module.parameters()).device)
            self.first_done = time.perf_counter()

    def __enter__(self):
        self._handles = [self.model.register_forward_pre_hook(self._hook, with_kwargs=True),
                         self.model.register_forward_hook(self._done)]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()


def accept_lengths_from_starts(starts: list[int], prompt_length: int, new_tokens: int) -> list[int]:
    """Tokens gained per forward, from the cache length at each forward's start.

    After forward k the output holds c_k = starts[k+1] + 1 tokens in all (the cache, plus the next token,
    which is not fed yet); before the first, c = prompt length; after the last, prompt + new tokens."""
    committed = [prompt_length] + [s + 1 for s in starts[1:]] + [prompt_length + new_tokens]
    return [b - a for a, b in zip(committed[:-1], committed[1:])]


def _generation_config(req: Request, **extra):
    """A private GenerationConfig for this call (HF warns when a config and loose arguments are mixed)."""
    config = copy.deepcopy(req.target.generation_config)
    sampling = req.sampling
    # eos None means "never stop at EOS": HF refills a None EOS from the model's defaults, an empty list it keeps.
    eos = req.eos_token_id if req.eos_token_id is not None else []
    settings = dict(max_new_tokens=req.max_new_tokens, min_new_tokens=0, eos_token_id=eos,
                    pad_token_id=req.eos_token_id if req.eos_token_id is not None else 0,
                    do_sample=not sampling.greedy, num_beams=1, **extra)
    if sampling.greedy:
        settings.update(temperature=None, top_k=None, top_p=None)
    else:
        settings.update(temperature=sampling.temperature, top_k=sampling.top_k or 0,
                        top_p=sampling.top_p if sampling.top_p is not None else 1.0)
    for key, value in settings.items():
        setattr(config, key, value)
    return config


def _run_hf(req: Request, assistant=None, **extra) -> GenerationResult:
    config = _generation_config(req, **extra)
    if not req.sampling.greedy and req.seed is not None:
        torch.manual_seed(req.seed)  # HF samples from the global RNG
    kwargs = {"assistant_model": assistant} if assistant is not None else {}
    with ForwardCounter(req.target) as counter:
        out = req.target.generate(req.input_ids, attention_mask=torch.ones_like(req.input_ids),
                                  generation_config=config, **kwargs)
    tokens = req.trim(out[0, req.prompt_length:].tolist())
    lengths = accept_lengths_from_starts(counter.starts, req.prompt_length, len(tokens))
    result = GenerationResult(tokens, lengths, len(counter.starts))
    if req.started is not None and counter.first_done is not None:
        result.prefill_seconds, result.prefill_tokens = counter.first_done - req.started, lengths[0]
    return result


@register("hf")
def hf(req: Request) -> GenerationResult:
    """Hugging Face `generate` (greedy or sampling): the reference every speedup is measured against."""
    return _run_hf(req)


@register("hf_prompt_lookup")
def hf_prompt_lookup(req: Request, num_tokens: int = 10, max_ngram: int = 2) -> GenerationResult:
    """Hugging Face prompt lookup decoding (`prompt_lookup_num_tokens`)."""
    check_int("num_tokens", num_tokens, 1)
    check_int("max_ngram", max_ngram, 1)
    return _run_hf(req, prompt_lookup_num_tokens=num_tokens, max_matching_ngram_size=max_ngram)


@register("hf_assisted", needs_draft=True)
def hf_assisted(req: Request, gamma: int = 5) -> GenerationResult:
    """Hugging Face assisted generation (`assistant_model`) with a constant draft length gamma."""
    check_int("gamma", gamma, 1)
    # HF reads the draft length from the *assistant's* generation config; set it for this call only.
    draft_config = req.draft.generation_config
    saved = copy.deepcopy(draft_config)
    draft_config.num_assistant_tokens = gamma
    draft_config.num_assistant_tokens_schedule = "constant"
    draft_config.assistant_confidence_threshold = 0.0
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # HF's inner assistant call warns about its own arguments
    try:
        with ForwardCounter(req.draft) as drafts, compat.assisted_generation_fixed():  # 5.15's crop bug
            result = _run_hf(req, assistant=req.draft)
    finally:
        req.draft.generation_config = saved
        hf_logging.set_verbosity(verbosity)
    result.stats["draft_forwards"] = len(drafts.starts)
    return result
