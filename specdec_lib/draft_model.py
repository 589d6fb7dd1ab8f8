"""Draft-model speculative decoding: a small draft proposes gamma tokens, the target checks them in one forward.

Leviathan, Kalman & Matias 2023 ("Fast Inference from Transformers via Speculative Decoding") and Chen et al.
2023 ("Accelerating Large Language Model Decoding with Speculative Sampling"). The KV-cache handling follows
the four scenarios of Clay's note "Implementation Notes on Integrating Speculative Decoding with KV Cache":

1. first step: both caches are empty. The draft prefills the prompt as its first draft forward, and the
   target's first forward is prompt + drafts: prefill and first verification are one forward (as in HF's
   assisted generation), so accept_lengths[0] counts the accepted drafts + 1.
2. k < gamma drafts accepted: both caches are rolled back to the committed tokens minus the last one (the
   target's own token, which nobody has fed yet); next step each model's input starts with that one token.
3. all gamma accepted: the draft never fed its last draft, so it is two tokens behind: its next input is
   [last draft, bonus token] (the target's is still one token).
4. EOS inside the accepted run, or max_new_tokens reached: the step's tokens are cut by `Request.trim`.
   No step drafts more than can be emitted: gamma_eff = min(gamma, remaining - 1), since the step adds
   gamma_eff + 1 tokens at most.

Notation (package docstring): p target, q draft, both warped by temperature/top-k/top-p (sampling.probs).
One step, committed = prompt + output so far, g = gamma_eff:
    draft:  feed committed[d:] (1 or 2 tokens; the prompt on step 1), then its own drafts one at a time:
            x_1..x_g, x_i = argmax q_i or x_i ~ q_i                       (g draft forwards)
    target: ONE forward of committed[t:] + [x_1..x_g]; its last g + 1 rows are p_1..p_{g+1}
    verify: greedy: accept x_i while x_i == argmax p_i, then add argmax p_{k+1};
            sampling: accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection draw
            from norm(max(p_i - q_i, 0)); when all g are accepted draw the bonus from p_{g+1}.
    commit: both caches are rolled back to exactly the accepted length (`TrackedCache.commit`).
The sampling rule emits every token with probability exactly p (Leviathan et al., Appendix A.1):
tests/test_draft_model.py checks it against an exact enumeration, with a negative control.

Simplifications: batch size 1; draft and target on one device and sharing a tokenizer; no confidence-based
early stop of drafting (HF's assistant_confidence_threshold); the draft stops drafting at EOS (nothing
after it can be emitted); the adaptive schedule is HF's "heuristic" one.
"""
from __future__ import annotations

import torch

from . import kv_cache
from .decoding import GenerationResult, Request, register
from .sampling import probs, sample


class TrackedCache:
    """A model, its DynamicCache, and the token ids the cache holds: all cache-length bookkeeping lives here.

    Invariant, checked by `check` after every step in debug mode: cache_length(cache) == len(tokens), and
    `tokens` is a prefix of the committed sequence. Between steps the target's cache holds every committed
    token but the last; the draft's every committed token but the last one (or two, after a full acceptance).
    """

    def __init__(self, model):
        self.model, self.cache, self.tokens = model, kv_cache.new_cache(model), []
        self.device = next(model.parameters()).device

    def feed(self, ids: list[int], keep: int = 1) -> torch.Tensor:
        """Forward `ids` after the cached tokens; the logits of the last `keep` positions, (keep, V)."""
        inputs = torch.tensor([ids], device=self.device)  # (1, len(ids))
        # logits_to_keep: the LM head runs on the rows we read only (on step 1 that skips the prompt's rows)
        out = self.model(input_ids=inputs, past_key_values=self.cache, use_cache=True, logits_to_keep=keep)
        self.tokens.extend(ids)
        return out.logits[0]  # (keep, V)

    def commit(self, committed: list[int]) -> None:
        """Roll back to the longest cached prefix of `committed` that leaves its last token unfed.

        What the cache holds agrees with `committed` up to the first rejected draft, and the last committed
        token (bonus or resampled) was never fed, so that prefix has min(len(tokens), len(committed) - 1)
        tokens: for the target len(committed) - 1; for the draft too, except after a full acceptance where it
        never fed its last draft (len(committed) - 2: scenario 3)."""
        keep = min(len(self.tokens), len(committed) - 1)
        kv_cache.rollback(self.cache, keep)
        del self.tokens[keep:]

    def check(self, committed: list[int], name: str) -> None:
        length = kv_cache.cache_length(self.cache)
        if length != len(self.tokens) or self.tokens != committed[:length] or length >= len(committed):
            raise AssertionError(f"{name} cache holds {length} entries, its tokens {len(self.tokens)}, "
                                 f"committed {len(committed)} (prefix match: {self.tokens == committed[:length]})")


def accept_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x) / q(x)) per drafted token, shape (g,). q(x) > 0: x was drawn from q."""
    return (p_x / q_x).clamp(max=1.0)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)), shape (V,): where a rejected position draws from. All zero only if p == q
    (then nothing is ever rejected, up to rounding): fall back to p."""
    r = (p - q).clamp(min=0.0)
    total = r.sum()
    return r / total if total > 0 else p


def speculative_verify(p: torch.Tensor, q: torch.Tensor, drafts: list[int], generator) -> tuple[int, int]:
    """The speculative sampling rule. p: (g + 1, V) target rows, q: (g, V) draft rows, g drafts.

    Returns (k accepted drafts, the next token): from the residual at row k if x_{k+1} was rejected, else the
    bonus from p[g]. One uniform per draft is drawn up front from `generator` (seeded: reproducible)."""
    g = len(drafts)
    if g:
        x = torch.tensor(drafts, device=p.device)[:, None]  # (g, 1)
        # the rule is looked up at call time, so tests can swap in a wrong one (the negative control)
        ratio = accept_probability(p[:g].gather(1, x)[:, 0], q.gather(1, x)[:, 0])  # (g,)
        u = torch.rand(g, generator=generator, device=p.device, dtype=ratio.dtype)
        rejected = (u >= ratio).tolist()
        if True in rejected:
            k = rejected.index(True)
            return k, sample(residual(p[k], q[k]), generator)
    return g, sample(p[g], generator)


@register("draft_model", needs_draft=True)
def draft_model(req: Request, gamma: int = 4, adaptive: bool = False, debug: bool = False) -> GenerationResult:
    """Draft-model speculative decoding (chain of gamma drafts, one-forward verification, cache rollback)."""
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be a positive int, got {gamma!r}")
    cfg, gen = req.sampling, req.generator
    target, draft = TrackedCache(req.target), TrackedCache(req.draft)
    committed = req.input_ids[0].tolist()  # prompt + output: what both caches are measured against
    tokens: list[int] = []
    lengths, gammas, steps = [], [], []
    draft_forwards = 0
    while not req.is_done(tokens):
        g = min(gamma, req.max_new_tokens - len(tokens) - 1)  # the step adds g + 1 tokens at most
        gammas.append(g)
        drafts, q_rows = [], []
        feed = committed[len(draft.tokens):]  # 1 token, 2 after a full acceptance, the prompt on step 1
        for _ in range(g):
            logits = draft.feed(feed)[-1]  # (V,)
            draft_forwards += 1
            if cfg.greedy:
                x = int(logits.argmax())
            else:
                q_rows.append(probs(logits, cfg))  # q_i, (V,)
                x = sample(q_rows[-1], gen)
            drafts.append(x)
            feed = [x]
            if x == req.eos_token_id:
                break
        # One target forward: uncached committed tokens (1, or the prompt) + drafts; rows p_1..p_{g+1}.
        rows = target.feed(committed[len(target.tokens):] + drafts, keep=len(drafts) + 1)  # (g + 1, V)
        if cfg.greedy:
            choice = rows.argmax(-1).tolist()  # the target's token after each prefix, g + 1 of them
            k = 0
            while k < len(drafts) and drafts[k] == choice[k]:
                k += 1
            nxt = choice[k]
        else:
            q = torch.stack(q_rows) if q_rows else rows.new_zeros((0, rows.shape[-1]), dtype=torch.float32)
            k, nxt = speculative_verify(probs(rows, cfg), q, drafts, gen)  # q: (g, V)
        emitted = req.trim(tokens + drafts[:k] + [nxt])[len(tokens):]  # EOS / max_new_tokens cut
        tokens += emitted
        committed += emitted
        lengths.append(len(emitted))
        steps.append(dict(drafted=len(drafts), accepted=k, emitted=len(emitted)))
        target.commit(committed)
        draft.commit(committed)
        if debug:
            target.check(committed, "target")
            draft.check(committed, "draft")
            if len(target.tokens) != len(committed) - 1:
                raise AssertionError(f"target cache {len(target.tokens)} != committed {len(committed)} - 1")
        if adaptive and drafts:  # HF's "heuristic" schedule
            gamma = gamma + 2 if k == len(drafts) else max(1, gamma - 1)
    drafted = sum(s["drafted"] for s in steps)
    accepted = sum(s["accepted"] for s in steps)
    stats = dict(draft_forwards=draft_forwards, gammas=gammas, steps=steps, drafted=drafted, accepted=accepted,
                 acceptance_rate=accepted / drafted if drafted else float("nan"))
    return GenerationResult(tokens, lengths, len(lengths), stats=stats)
