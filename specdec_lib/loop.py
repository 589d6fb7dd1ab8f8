"""The ONE decoding loop: every speculative method of the library is a *proposer* plugged into it.

    state = LoopState(request)                       # committed = prompt; the target's cache is empty
    proposer.start(state)                            # tables from the prompt, draft cache, pools
    repeat until max_new_tokens or EOS:
        proposal = proposer.propose(state, max_depth)  # a DraftTree (a chain is one branch; no nodes = a plain
                                                     # step), optionally q per node, optionally side rows
        verdict  = verify(target, cache, proposal)   # ONE target forward: tree walk, or the q-based rule
        commit(cache, ...)                           # the only code that trims the target's cache
        proposer.observe(state, verdict)             # table update, draft-cache rollback, pool refill

Written here once, for every method: the depth cap (`max_depth`: nothing unemittable is verified), the EOS /
max_new_tokens cut (`Request.trim`), the per-step records (STEP_KEYS) and totals (STATS_KEYS), the debug
invariant (after every step the cache holds every committed token but the last) and `GenerationResult`
(target_forwards == len(accept_lengths), their sum == len(new_tokens)). The prompt's prefill belongs to the first
step: a plain or chain step's forward is the prompt's causal forward; a tree or side rows after a long prompt
feed prompt[:-1] in a causal forward first (verify.PREFILL_ROWS); `prefill_seconds` is the time to the first token.

Extension points (verify.SideRows / Proposal), each used by a method:
- Lookahead and FAFO draft inside the target's forward: `side` rows whose logits come back to `observe` in
  `verdict.side_logits`, their KV dropped by the same commit;
- CARD's `propose` reads a tree a concurrent drafter fills, and `observe` sends it the correction;
- EAGLE's head reads the target's final hidden states (`features`), carried by the verdict's rows to `observe`.

Simplifications: batch size 1; the proposer may not touch the target's cache (it gets no handle to it).
"""
from __future__ import annotations

import inspect
import statistics
import time
from dataclasses import dataclass, field

from . import compat
from .decoding import GenerationResult, Method, METHODS, Request
from .mechanisms import kv_cache
from .mechanisms.draft_tree import DraftTree
from .mechanisms.verify import Proposal, SideRows, Verdict, commit, forward_spec, verify

__all__ = ["LoopState", "Proposal", "Proposer", "SideRows", "Verdict", "decode", "register_proposer",
           "STEP_KEYS", "STATS_KEYS"]

# The stats schema of every loop method (the contract test checks it). Each step record holds STEP_KEYS (draft_us:
# propose; verify_ms: forward, verdict and commit; update_us: observe), plus
# the proposal's `info`: "draft_size" (the draft budget the step ran with: cacheback's TDL, lookahead's guesses,
# fafo's find-out candidates, prompt lookup's num_tokens, draft_model's gamma, card's query cap) and extras of
# the method's own. GenerationResult.stats holds STATS_KEYS ("config": the proposer's settings) and the
# proposer's own counters; with an "auto" budget, "curve" (the cost curve it chose from last: the one at the last
# context) and "costs" (every curve it read, by cached-prefix length). With debug=True a record also holds the step's
# tree (root, drafted, parents), the accepted node indices (accepted_nodes) and the target's own token (next_token).
STEP_KEYS = ("tree_size", "depth", "accepted", "emitted", "full", "draft_us", "verify_ms", "update_us")
STATS_KEYS = ("steps", "drafted", "accepted", "acceptance_rate", "draft_us_median", "config")


@dataclass
class LoopState:
    """What a proposer may read: the request and the committed tokens (prompt + output so far)."""
    request: Request
    committed: list[int]
    tokens: list[int] = field(default_factory=list)  # the output so far
    debug: bool = False


class Proposer:
    """The empty proposer (plain autoregressive steps); methods override what they need.

    Subclasses take their settings in __init__ (validated there, so bad settings fail before any forward).
    `no_sliding`: None where the method runs on a target with sliding-window layers (the loop's cache and masks
    handle them), else why it cannot and what to use instead (`generate` refuses with it)."""

    no_sliding: str | None = None

    def start(self, state: LoopState) -> None:
        """Once, before the first step (the prompt is state.committed)."""

    def target_cache(self, state: LoopState):
        """The target's KV cache for this generation, made once after `start` (the loop owns it from then on):
        a DynamicCache appending in place (kv_cache.ContiguousLayer), or a cache with its own layout (FAFO: a
        store.layout.FlexLayoutStore, whose compressed KV its side rows read)."""
        req = state.request  # room for every token and a step's rows (a larger step grows it); sliding-window
        # layers keep every position but read their window only (it holds the committed text between steps)
        return kv_cache.new_cache(req.target, capacity=req.prompt_length + req.max_new_tokens + 64, windowed=True)

    def finish(self, state: LoopState) -> None:
        """Once, after the last step, also when a step raised (undo what start/target_cache changed, stop what
        start started); `stats` is read after it."""

    def propose(self, state: LoopState, max_depth: int) -> Proposal:
        """This step's proposal; `max_depth` is the deepest draft that can still be emitted (deeper nodes are cut)."""
        return Proposal(DraftTree(state.committed[-1]))

    def observe(self, state: LoopState, verdict: Verdict) -> None:
        """After the commit: state.committed already ends with verdict.emitted."""

    def stats(self) -> dict:
        """Method-specific entries of GenerationResult.stats, read after finish: "config" (the settings) and
        the method's own counters (draft forwards, hit rate, ...)."""
        return dict(config={})


def decode(req: Request, proposer: Proposer, debug: bool = False, lazy_head: bool = True) -> GenerationResult:
    """Run the loop (see the module doc). lazy_head: project only the rows the verdict reads (verify.RowLogits)."""
    target = req.target
    state = LoopState(req, req.input_ids[0].tolist(), debug=debug)
    proposer.start(state)
    try:
        cache = proposer.target_cache(state)
        spec = forward_spec(target)  # backend, dtype, device, lazy_head_ok: once per call (after start), not per step
        result = _steps(req, proposer, state, target, cache, spec, debug, lazy_head)
    finally:
        proposer.finish(state)
    result.stats.update(proposer.stats())  # after finish: a concurrent drafter has stopped and reported
    return result


def _steps(req, proposer, state, target, cache, spec, debug, lazy_head) -> GenerationResult:
    lengths, steps = [], []
    while not req.is_done(state.tokens):
        t0 = time.perf_counter()
        max_depth = req.max_new_tokens - len(state.tokens) - 1  # a step emits at most depth + 1 tokens
        proposal = proposer.propose(state, max_depth).capped(max_depth)
        t1 = time.perf_counter()
        verdict = verify(target, cache, proposal, state.committed, req.sampling, req.generator, lazy_head, spec)
        emitted = req.trim(state.tokens + verdict.tokens + [verdict.next_token])[len(state.tokens):]
        verdict.emitted = emitted
        commit(cache, verdict.prefix_len, verdict.accepted[:len(emitted) - 1])  # the last emitted is the next root
        t2 = time.perf_counter()  # verify_ms: forward + verdict + commit (the verdict synchronised the device)
        state.tokens += emitted
        state.committed += emitted
        # for budgets that learn what steps cost: not the prefill's, and not under sampling, where the draws must
        # not depend on the machine's speed (a seed reproduces its tokens)
        verdict.verify_ms = (t2 - t1) * 1e3 if steps and req.sampling.greedy else None
        proposer.observe(state, verdict)
        t3 = time.perf_counter()
        lengths.append(len(emitted))
        if len(lengths) == 1:
            first = (t2, len(emitted))  # the prefill's forward: time to the first token
        tree = proposal.tree
        steps.append(dict(tree_size=len(tree), depth=tree.depth, accepted=len(verdict.accepted),
                          emitted=len(emitted), full=verdict.full, draft_us=(t1 - t0) * 1e6,
                          verify_ms=(t2 - t1) * 1e3, update_us=(t3 - t2) * 1e6, **proposal.info))
        if debug:  # the step token by token (bench.acceptance.chain_step): the tree, the path, the target's token
            steps[-1].update(root=tree.root, drafted=list(tree.tokens), parents=list(tree.parents),
                             accepted_nodes=list(verdict.accepted), next_token=verdict.next_token)
        del proposal, verdict  # free this forward's hidden states before the next forward allocates its own
        if debug:
            length = kv_cache.cache_length(cache)
            if length != len(state.committed) - 1 or state.committed[req.prompt_length:] != state.tokens:
                raise AssertionError(f"after step {len(steps)} the cache holds {length} entries, committed "
                                     f"{len(state.committed)} tokens (expected {len(state.committed) - 1})")
    drafted = sum(s["tree_size"] for s in steps)
    accepted = sum(s["accepted"] for s in steps)
    stats = dict(steps=steps, drafted=drafted, accepted=accepted,
                 acceptance_rate=accepted / drafted if drafted else float("nan"),
                 draft_us_median=statistics.median(s["draft_us"] for s in steps) if steps else float("nan"))
    result = GenerationResult(state.tokens, lengths, len(lengths), stats=stats)
    if steps and req.started is not None:
        result.prefill_seconds, result.prefill_tokens = first[0] - req.started, first[1]
    return result


def check_models(name: str, proposer: Proposer, req: Request) -> None:
    """Refuse, before any forward, a target (or draft) whose layers the loop cannot serve: kinds other than full and
    sliding-window attention (recurrent, chunked, KV-shared layers keep state a rejected draft cannot be rolled
    back from), and sliding-window layers for a proposer that says why not (`Proposer.no_sliding`)."""
    for role, model in (("target", req.target), ("draft", req.draft)):
        if model is None:
            continue
        layers, family = compat.attention_layers(model.config), getattr(model.config, "model_type", "?")
        if layers.other:
            raise ValueError(f"{name!r} cannot decode with a {family} {role}: its {', '.join(layers.other)} layers "
                             f"keep state that the loop's cache cannot roll back after a rejected draft (it serves "
                             f"full and sliding-window attention): use 'hf' (transformers' own generate) instead")
        if role == "target" and layers.sliding and proposer.no_sliding:
            raise ValueError(f"{name!r} cannot decode with a {family} target (sliding-window layers, window "
                             f"{layers.window}): {proposer.no_sliding}")


def register_proposer(name: str, needs_draft: bool = False):
    """Class decorator: METHODS[name] runs `decode(request, Cls(**settings), debug, lazy_head)` (after
    `check_models`)."""
    def wrap(cls):
        def run(req: Request, debug: bool = False, lazy_head: bool = True, **settings) -> GenerationResult:
            proposer = cls(**settings)
            check_models(name, proposer, req)
            return decode(req, proposer, debug=debug, lazy_head=lazy_head)

        doc = (cls.__doc__ or "").strip().splitlines()
        options = tuple(p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs"))
        METHODS[name] = Method(name, run, needs_draft, doc[0] if doc else "", options + ("debug", "lazy_head"))
        return cls
    return wrap
