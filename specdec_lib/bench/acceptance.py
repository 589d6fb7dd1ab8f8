"""Acceptance measured two ways: from a run's step records, and from the two models' distributions (notebook 04).

Leviathan et al. (2023) model a chain's acceptance with one number, alpha = E[sum_x min(p(x), q(x))], the same at
every draft position (i.i.d.), so E[tokens per step] = (1 - alpha^(gamma+1)) / (1 - alpha)
(`costs.expected_tokens_per_step`). This module measures what that model leaves out:
- `acceptance_by_depth(runs)`: for a chain, per draft depth d = 1..gamma, how many steps **reached** d (drafted
  it with the d - 1 before it accepted) and how many **accepted** it: P(accept d | d reached), the quantity the
  i.i.d. model holds constant (budget.ChainBudget counts the same online);
- `pooled_acceptance(table)`: the i.i.d. alpha fitted to the same steps, accepted / reached over every depth (its
  maximum-likelihood estimate); not `stats["acceptance_rate"]` (accepted / drafted), which also counts drafts
  after a rejection, never tested;
- `expected_tokens_by_depth(rates)`: E[tokens per step] = 1 + sum_d prod_{j<=d} a_j, Leviathan's formula with a
  rate per depth;
- `acceptance_summary(results)`: drafted, accepted, acceptance rate and MAT pooled over several generations;
- `tested_positions(result)`: which new tokens were the outcome of an acceptance test (an accepted draft, or the
  token drawn at a rejection; not a bonus token or a plain step's token);
- `overlap(target_logits, draft_logits, temperature)`: beta = sum_x min(p(x), q(x)) per position, the
  probability that speculative sampling accepts a draft drawn from q there (greedy: 1 where the argmaxes agree);
- `overlap_along(target, draft, tokens, start, temperatures)`: beta at every position of a text, one forward of
  each model, for several temperatures: averaged over a run's tested positions, the acceptance it should measure;
- `chain_step(result, step, prompt, target)`: one step of a debug run token by token (`ChainStep`): the drafts,
  the target's token under each, the accepted run and the target's own token (`viz.chain_step_figure`).

Simplifications: chains only (a tree's rates need its walk, not its records' counts); the models' distributions
are read teacher-forced along a finished text (the same logits as the run's cached forwards, up to rounding).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import torch

from ..sampling import SamplingConfig, probs

__all__ = ["ChainStep", "acceptance_by_depth", "acceptance_summary", "chain_step", "expected_tokens_by_depth",
           "overlap", "overlap_along", "pooled_acceptance", "tested_positions"]


def _step_lists(runs) -> list[list[dict]]:
    """One list of step records per generation: a GenerationResult, a list of step dicts, or a list of either."""
    if hasattr(runs, "stats"):
        return [list(runs.stats["steps"])]
    runs = list(runs)
    if runs and isinstance(runs[0], dict):
        return [runs]
    return [s for run in runs for s in _step_lists(run)]


def acceptance_by_depth(runs, max_depth: int | None = None) -> pd.DataFrame:
    """Per draft depth d = 1..max_depth: `reached` (steps whose chain had a draft at depth d and whose d - 1 drafts
    before it were accepted), `accepted` (steps that accepted depth d), `rate` = accepted / reached (NaN where never
    reached) and `share_reached` = reached / drafting steps (P(a step reaches depth d): it falls with d, as
    prod_{j<d} a_j).

    runs: a GenerationResult of a chain method, its step records (dicts with "tree_size", "depth", "accepted"), or
    a list of either. Steps that drafted nothing are skipped; a step whose draft is a tree (more nodes than depth) is
    refused. max_depth: default the deepest draft seen."""
    steps = [s for run in _step_lists(runs) for s in run if s["tree_size"]]
    trees = [s for s in steps if s["tree_size"] != s["depth"]]
    if trees:
        raise ValueError(f"{len(trees)} steps drafted a tree (tree_size > depth, e.g. {trees[0]['tree_size']} nodes at "
                         f"depth {trees[0]['depth']}): acceptance_by_depth counts chains only")
    deepest = max((s["depth"] for s in steps), default=0)
    depths = range(1, (deepest if max_depth is None else max_depth) + 1)
    rows = []
    for d in depths:
        reached = sum(s["depth"] >= d and s["accepted"] >= d - 1 for s in steps)
        accepted = sum(s["accepted"] >= d for s in steps)
        rows.append(dict(depth=d, reached=reached, accepted=accepted,
                         rate=accepted / reached if reached else float("nan"),
                         share_reached=reached / len(steps) if steps else float("nan")))
    return pd.DataFrame(rows, columns=["depth", "reached", "accepted", "rate", "share_reached"])


def pooled_acceptance(table: pd.DataFrame) -> float:
    """The i.i.d. alpha of an `acceptance_by_depth` table: every depth's accepted over every depth's reached."""
    reached = int(table["reached"].sum())
    return float(table["accepted"].sum() / reached) if reached else float("nan")


def expected_tokens_by_depth(rates: Sequence[float]) -> float:
    """1 + sum_d prod_{j<=d} a_j for rates a_1..a_gamma (each in [0, 1]): the tokens a step of a chain of gamma
    yields, the target's own token included, when depth d is accepted with probability a_d once reached."""
    a = np.asarray(list(rates), dtype=float)
    if a.ndim != 1 or np.any(~np.isfinite(a)) or np.any((a < 0) | (a > 1)):
        raise ValueError(f"rates must be finite and in [0, 1], got {list(rates)}")
    return float(1.0 + np.cumprod(a).sum())


def acceptance_summary(results: Iterable) -> dict:
    """Pooled over several GenerationResults: steps, drafted, accepted, acceptance_rate (accepted / drafted), mat
    (new tokens / target forwards) and new_tokens."""
    results = list(results)
    steps = [s for r in results for s in r.stats["steps"]]
    drafted = sum(s["tree_size"] for s in steps)
    accepted = sum(s["accepted"] for s in steps)
    new = sum(len(r.new_tokens) for r in results)
    forwards = sum(r.target_forwards for r in results)
    return dict(generations=len(results), steps=len(steps), drafted=drafted, accepted=accepted,
                acceptance_rate=accepted / drafted if drafted else float("nan"),
                mat=new / forwards if forwards else float("nan"), new_tokens=new)


def tested_positions(result) -> list[bool]:
    """One flag per new token of a chain method's GenerationResult: True for an accepted draft and for the token
    drawn at a rejection (both the outcome of a test), False for a bonus token (all drafts accepted) and for the
    token of a step that drafted nothing. An EOS cut drops the cut tokens' flags with them."""
    flags = []
    for s in result.stats["steps"]:
        k, e = s["accepted"], s["emitted"]
        flags += [True] * min(k, e)
        if e == k + 1:
            flags.append(bool(s["tree_size"]) and not s["full"])
    if len(flags) != len(result.new_tokens):
        raise ValueError(f"the steps account for {len(flags)} tokens, the result has {len(result.new_tokens)}")
    return flags


def overlap(target_logits: torch.Tensor, draft_logits: torch.Tensor, temperature: float, top_k: int | None = None,
            top_p: float | None = None) -> torch.Tensor:
    """beta = sum_x min(p(x), q(x)) per row of (..., V) logits, p and q warped as the library samples
    (sampling.probs), clamped to [0, 1] against rounding; temperature 0: 1.0 where the argmaxes agree (greedy
    acceptance), else 0.0. float32, (...)."""
    if target_logits.shape != draft_logits.shape:
        raise ValueError(f"target and draft logits differ in shape: {tuple(target_logits.shape)} against "
                         f"{tuple(draft_logits.shape)}")
    cfg = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    draft_logits = draft_logits.to(target_logits.device)
    if cfg.greedy:
        if top_k is not None or top_p is not None:
            raise ValueError("top_k/top_p apply to sampling (temperature > 0) only")
        return (target_logits.argmax(-1) == draft_logits.argmax(-1)).float()
    return torch.minimum(probs(target_logits, cfg), probs(draft_logits, cfg)).sum(-1).clamp(0.0, 1.0)


def overlap_along(target, draft, tokens, start: int, temperatures: Sequence[float]) -> np.ndarray:
    """beta at every position of `tokens` from index `start` on: row t, column i is the overlap, at temperatures[t],
    of the two models' next-token distributions after tokens[:start + i] (so column i scores the token at
    tokens[start + i]). One forward of each model over tokens[:-1]. tokens: a list or (N,) / (1, N) ids;
    1 <= start < N. Returns (len(temperatures), N - start)."""
    ids = torch.as_tensor(tokens).reshape(-1)
    if not 1 <= start < len(ids):
        raise ValueError(f"start must be in [1, {len(ids) - 1}] for {len(ids)} tokens, got {start}")
    with torch.inference_mode():
        rows = {}
        for name, model in (("target", target), ("draft", draft)):
            device = next(model.parameters()).device
            keep = len(ids) - start  # the LM head only on the rows read (a long prompt's rows are not)
            logits = model(input_ids=ids[None, :-1].to(device), logits_to_keep=keep).logits[0, -keep:]  # (keep, V)
            rows[name] = logits.float().cpu()
        return np.stack([overlap(rows["target"], rows["draft"], t).numpy() for t in temperatures])


@dataclass(frozen=True)
class ChainStep:
    """One step of a chain method, token by token (positions relative to the root, the last committed token: draft
    i sits at position i, and the target's token at position i is its choice after the context and drafts < i)."""
    step: int  # index in result.stats["steps"]
    context: list[int]  # the committed tokens before the step (prompt + output so far), the root last
    drafted: list[int]  # the g drafts verified, position 1..g
    target: list[int | None]  # g + 1: the target's token at positions 1..g + 1 (None: not computed)
    accepted: int  # k: drafts accepted (drafted[:k] == target[:k])
    next_token: int  # the target's own token, at position k + 1: a correction, or the bonus when k == g
    emitted: list[int]  # what the step added to the output (drafted[:k] + [next_token], unless EOS cut it)

    @property
    def full(self) -> bool:
        """Every draft accepted: the target's own token is a bonus, not a correction."""
        return self.accepted == len(self.drafted)


def _first_partial(steps) -> int:
    """The first step that accepted some drafts and rejected one, else the first that drafted, else 0."""
    for pick in (lambda s: 0 < s["accepted"] < s["tree_size"], lambda s: s["tree_size"] > 0):
        found = [i for i, s in enumerate(steps) if pick(s)]
        if found:
            return found[0]
    return 0


def chain_step(result, step: int | None, prompt, target=None) -> ChainStep:
    """Step `step` (None: the first that accepted some drafts and rejected one) of a chain method's
    GenerationResult run with debug=True (its step records hold the tree: `loop.STEP_KEYS`' comment), token by token.

    prompt: the run's input ids (a list, (P,) or (1, P)). Without `target` the target's tokens are the ones the
    step read (the accepted drafts and its own token), None after the rejection; with the target model, one
    teacher-forced forward over the context and the drafts gives its argmax at all g + 1 positions, checked
    against the step (a ValueError if they differ: the step was sampled, or from another model)."""
    steps = result.stats["steps"]
    if not steps or "drafted" not in steps[0]:
        raise ValueError("these step records hold no drafts: run generate(..., debug=True)")
    step = _first_partial(steps) if step is None else step
    if not 0 <= step < len(steps):
        raise ValueError(f"step must be in [0, {len(steps) - 1}], got {step}")
    s = steps[step]
    drafted, k = list(s["drafted"]), s["accepted"]
    if s["parents"] != list(range(-1, len(drafted) - 1)):
        raise ValueError(f"step {step} drafted a tree ({len(drafted)} nodes at depth {s['depth']}), not a chain")
    done = sum(r["emitted"] for r in steps[:step])
    context = [int(t) for t in torch.as_tensor(prompt).reshape(-1).tolist()] + list(result.new_tokens[:done])
    if context[-1] != s["root"]:
        raise ValueError(f"the prompt and the output before step {step} end with {context[-1]}, the step's root is "
                         f"{s['root']}: pass the run's prompt")
    read = drafted[:k] + [s["next_token"]]
    tokens = read + [None] * (len(drafted) - k)
    if target is not None:
        device = next(target.parameters()).device
        with torch.inference_mode():
            ids = torch.tensor([context + drafted], device=device)  # (1, C + g)
            logits = target(input_ids=ids, logits_to_keep=len(drafted) + 1).logits[0]  # (g + 1, V)
        tokens = logits.argmax(-1).tolist()
        if tokens[:k + 1] != read:
            raise ValueError(f"the target's argmax {tokens[:k + 1]} is not what step {step} read ({read}): a sampled "
                             "step, or another target")
    emitted = list(result.new_tokens[done:done + s["emitted"]])
    return ChainStep(step, context, drafted, tokens, k, s["next_token"], emitted)
