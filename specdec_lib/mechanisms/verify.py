"""Verifying a proposal in ONE target forward, and committing the result to the target's KV cache.

Cacheback paper §3.2 (tree attention: "validate all branches of the tree in parallel as one input"), and the
speculative-sampling rule of Leviathan et al. 2023 (App. A.1) / Chen et al. 2023 for drafts that come with q.

Between steps the target's cache holds every committed token but the last (the *root*); on step 1 it is empty.
1. `build_forward`: rows = the committed tokens the cache lacks (prompt[:-1] on step 1) + root + tree nodes
   (+ side rows), their positions and ONE mask from masks.py's pieces (one per attention kind with sliding-window
   layers). A plain step or a chain (`causal_rows`) is a causal forward with transformers' mask (step 1: the
   prompt's prefill); a masked step after over PREFILL_ROWS tokens (always in FAFO's store) feeds prompt[:-1] first.
2. `run_forward` keeps the rows of root, nodes and side rows; with `lazy` (PLAIN_HEAD_MODELS; features: also
   the soft-capped, `output_head`) it returns `RowLogits`, projecting a row only when read: 1 + k of 1 + n rows.
3. the verdict. No q (tables, prompt lookup, greedy drafts): `walk_tree` picks the target's token for the
   current row (argmax, or one seeded draw from p) and follows the SET of nodes spelling the accepted tokens
   (siblings may repeat a token), committing the first node of the deepest set; one draw per emitted token from
   p given exactly the tokens before it, so lossless for drafts that are a deterministic function of the history.
   q given (a chain drawn from the draft): `speculative_chain` accepts x_i with probability
   min(1, p_i(x_i) / q_i(x_i)), draws from norm(max(p_i - q_i, 0)) at the first rejection, else the bonus from
   p_{g+1}: exactly p for every emitted token.
4. `commit(cache, prefix_len, kept)`: keep prefix + root + the accepted nodes' KV in path order
   (kv_cache.compact; each key was rotated at its final position, so nothing is re-fed); side rows and rejected
   nodes are dropped. The only code that shrinks the target's cache after a forward.

Simplifications: batch size 1; q-based verification takes a chain only (a sampled tree would need SpecInfer-style
recursive rejection sampling); side rows never see the tree nodes.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, NamedTuple

import torch

from .. import compat
from . import kv_cache
from . import masks
from .store.flex_backend import ATTENTION_NAME
from .draft_tree import ROOT, DraftTree
from ..sampling import SamplingConfig, pick_token, probs, sample


@dataclass
class SideRows:
    """Extra query rows that ride the verifying forward without being verified (the extension point for
    Lookahead's Jacobi rows and FAFO's fumble rows); their logits come back in `Verdict.side_logits`.

    tokens[i] sits at position root + depths[i]; it sees the committed text (only the keys where
    `prefix_mod(kv_idx)` is True, when given; only the compression's C(kv) when `compressed`, which needs the
    target's cache to be a store.layout.FlexLayoutStore) and side row j where sees[i, j]. `logits_rows`: the
    side rows whose logits `verify` returns (all when None): FAFO reads one row per stream."""
    tokens: list[int]
    depths: list[int]
    sees: torch.Tensor  # bool (S, S), the diagonal included
    prefix_mod: Callable | None = None  # kv_idx -> bool over committed keys; None: all of them
    compressed: bool = False  # see C(kv) only (FAFO's fumble rows)
    logits_rows: list[int] | None = None

    def __post_init__(self):
        if not (len(self.tokens) == len(self.depths) == self.sees.shape[0] == self.sees.shape[1]):
            raise ValueError("side rows need as many depths and a square `sees` matrix as tokens")

    def __len__(self) -> int:
        return len(self.tokens)

    def mask_mod(self, first_row: int, cached: int, root_key: int, device=None) -> masks.MaskMod:
        committed = masks.prefix(root_key + 1)  # the committed text, the root included
        if self.prefix_mod is not None:
            committed = masks.and_masks(committed, lambda b, h, q_idx, kv_idx: self.prefix_mod(kv_idx))
        return masks.or_masks(committed, masks.visible(self.sees, first_row, cached + first_row, device))


@dataclass
class Proposal:
    """What a proposer hands the loop each step: a DraftTree (root = the last committed token; a chain is a tree
    with one branch; no nodes = a plain step), optionally the draft's q per node (q[i]: the distribution node i
    was drawn from; a chain only), optional side rows, per-step extras for the step records (`info`; the draft
    budget a proposer chose for the step under the key "draft_size"), and `carry`: what the proposer's own
    `observe` needs of this step (it gets the proposal back as verdict.proposal), kept off the proposer.
    `compressed_root`: the root row sees C(kv) only, like a compressed side row (decoding under a KV
    compression, not lossless; the target's cache must be a store.layout.FlexLayoutStore).
    `features`: the proposer reads the target's final hidden states (EAGLE's head): the rows come back as
    RowLogits whatever the loop's lazy_head, and the committed tokens this forward feeds before the root (the
    prompt on step 1) keep theirs in `RowLogits.context`."""
    tree: DraftTree
    q: torch.Tensor | None = None  # (n, V)
    side: SideRows | None = None
    info: dict = field(default_factory=dict)
    carry: dict = field(default_factory=dict)
    compressed_root: bool = False
    features: bool = False

    def capped(self, max_depth: int) -> "Proposal":
        """The proposal without nodes deeper than max_depth (what can still be emitted); topology kept."""
        tree = self.tree
        if tree.depth <= max_depth:
            return self
        keep = [i for i, d in enumerate(tree.depths) if d <= max_depth]
        new = {old: n for n, old in enumerate(keep)}
        capped = DraftTree(tree.root, [tree.tokens[i] for i in keep], [new.get(tree.parents[i], ROOT) for i in keep])
        q = self.q[keep] if self.q is not None else None
        return replace(self, tree=capped, q=q)


@dataclass
class Verdict:
    """The outcome of one verification; `emitted` is set by the loop after the EOS / max_new_tokens cut."""
    proposal: Proposal
    accepted: list[int]  # accepted node indices, root-to-leaf order (may be empty)
    tokens: list[int]  # their tokens
    next_token: int  # the target's own token after them: a bonus (full) or a correction
    full: bool  # True when every drafted token on the path was accepted (the walk ran off a leaf)
    prefix_len: int  # cache entries before the root's (the root's kv index)
    logits: object  # rows of root + nodes: (1 + n, V) tensor or RowLogits
    side_logits: torch.Tensor | None = None  # (S, V)
    emitted: list[int] = field(default_factory=list)
    verify_ms: float | None = None  # set by the loop: the step's forward + verdict + commit (None: the prefill's)


def attention_backend(model) -> str:
    return getattr(model.config, "_attn_implementation", None) or "sdpa"


# Model types whose causal-LM head is exactly `lm_head(final hidden state)` (no soft-capping or logit
# scale): for them the walk may compute only the rows it reads (RowLogits).
PLAIN_HEAD_MODELS = {"llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2"}


class RowLogits:
    """Logits of a forward computed row by row on demand: `rows[r]` -> (V,), cached; `full()` -> (R, V).

    The walk reads 1 + k of the R rows, so projecting all R hidden states through the LM head (R x hidden x V
    multiply-adds: a sixth of the tiny target's work per row) is mostly wasted on a CPU."""

    def __init__(self, hidden: torch.Tensor, head, context: torch.Tensor | None = None):
        self.hidden, self.head, self._rows = hidden, head, {}  # hidden (R, H)
        self.context = context  # (C, H): committed rows fed before the root, when a proposal asked (features)
        self.shape = (hidden.shape[0], head.out_features)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, row: int) -> torch.Tensor:
        if row not in self._rows:
            # a packed head that pads rows (prepack.py) computes the next rows the walk may read at no extra cost
            free = self.head.rows_free() if hasattr(self.head, "rows_free") else 1
            rows = [r for r in range(row, self.shape[0]) if r not in self._rows][:free]
            for r, logits in zip(rows, self.head(self.hidden[rows])):  # (len(rows), V)
                self._rows[r] = logits
        return self._rows[row]

    def full(self) -> torch.Tensor:
        return self.head(self.hidden)  # (R, V)


def lazy_head_ok(target) -> bool:
    """True when logits are lm_head(hidden) for this model, so RowLogits gives exactly its logits."""
    return (getattr(target.config, "model_type", None) in PLAIN_HEAD_MODELS
            and isinstance(target.get_output_embeddings(), torch.nn.Linear) and hasattr(target, "model"))


# Model types whose logits are cap * tanh(lm_head(hidden) / cap), cap their config's final_logit_softcapping (no
# cap when None: Gemma 3's default). The same argmax, other probabilities: RowLogits over the LM head alone would
# sample from the wrong distribution, so only a proposer reading features (`output_head`) projects through the cap.
SOFTCAPPED_HEAD_MODELS = {"gemma2", "gemma3_text"}


def logit_softcap(target) -> float | None:
    """The cap of the target's final logit soft-capping, or None where its logits are not capped."""
    if getattr(target.config, "model_type", None) in SOFTCAPPED_HEAD_MODELS:
        return getattr(target.config, "final_logit_softcapping", None)
    return None


def softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap * tanh(logits / cap), as Gemma 2's forward computes it (the same ops, so the same rounding); the
    logits themselves when cap is None."""
    return logits if cap is None else torch.tanh(logits / cap) * cap


class SoftcappedHead:
    """An LM head followed by final logit soft-capping: the target's own logits of its final hidden states."""

    def __init__(self, linear, cap: float):
        self.linear, self.cap, self.out_features = linear, cap, linear.out_features

    def rows_free(self) -> int:
        return self.linear.rows_free() if hasattr(self.linear, "rows_free") else 1

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return softcap(self.linear(hidden), self.cap)  # (..., V)


def output_head(target):
    """hidden (..., H) -> the target's own logits (..., V), for a target whose logits are a function of its final
    normed hidden state that this module knows (PLAIN_HEAD_MODELS: the LM head; SOFTCAPPED_HEAD_MODELS: the LM
    head, then the cap); None for any other (a logit scale, a bias, a multimodal wrapper)."""
    lm_head = target.get_output_embeddings()
    if not (isinstance(lm_head, torch.nn.Linear) and hasattr(target, "model")):
        return None
    if lazy_head_ok(target):
        return lm_head
    if getattr(target.config, "model_type", None) in SOFTCAPPED_HEAD_MODELS:
        cap = logit_softcap(target)
        return lm_head if cap is None else SoftcappedHead(lm_head, cap)
    return None


# a masked step (a tree, side rows) after at most this many committed tokens the cache lacks (the prompt, on the
# first step) feeds them in its own forward, masked with the rest; after more, a causal prefill comes first
# (`prefill`): past this length the P x P mask of one combined forward costs more than a second forward does
PREFILL_ROWS = 512


def causal_rows(proposal: Proposal, backend: str) -> bool:
    """Whether the step's rows are a plain causal sequence (no draft, or a chain: each node the previous one's
    child, at the next position) with no side rows, outside the store: one causal forward verifies it, the
    prompt's prefill included on the first step, with no mask of ours (a draft model's or prompt lookup's first
    step then pays one forward, not a prefill and a masked forward of the chain)."""
    side, parents = proposal.side, proposal.tree.parents
    return (backend != ATTENTION_NAME and (side is None or not len(side))
            and all(p == i - 1 for i, p in enumerate(parents)))


def build_forward(proposal: Proposal, pending: list[int], cached: int, backend: str = "sdpa",
                  dtype=torch.float32, device=None, cache=None, layers=None) -> tuple[dict, int]:
    """(model inputs, rows to keep) of the forward verifying `proposal` after `cached` cache entries.
    A target attached to a FlexLayoutStore (backend flex_backend.ATTENTION_NAME) gets the store's mask: `cache`.
    `layers` (compat.AttentionLayers of the target): with sliding-window layers, their mask also hides the keys
    outside each row's window, by logical position (masks.render_layers); the cache holds every position."""
    tree, side = proposal.tree, proposal.side
    m, n, s = len(pending), len(tree), len(side) if side is not None else 0
    root_row, root_pos = m - 1, cached + m - 1
    ids = pending + tree.tokens + (side.tokens if s else [])
    pos = list(range(cached, cached + m)) + [root_pos + d for d in tree.depths] + \
        ([root_pos + d for d in side.depths] if s else [])
    inputs = dict(input_ids=torch.tensor([ids], dtype=torch.long, device=device))  # (1, m + n + s)
    store = backend == ATTENTION_NAME  # the store always needs its mask: it holds the rows' slots and kinds
    if causal_rows(proposal, backend):  # a plain causal forward; transformers derives the same positions and mask
        # by itself (and skips building a mask for it: given position_ids, it looks for packed sequences, a small
        # cost per token)
        return inputs, 1 + n
    positions = torch.tensor(pos, dtype=torch.long, device=device)  # (m + n + s,)
    inputs["position_ids"] = positions[None]
    segments = [(0, masks.causal(cached))] if m > 1 else []
    segments.append((root_row, masks.tree(tree.parents, root_row, cached, device)))
    if s:
        segments.append((m + n, side.mask_mod(m + n, cached, root_pos, device)))
    mask_mod, rows = masks.by_rows(segments), m + n + s
    if store:
        compressed = torch.zeros(rows, dtype=torch.bool)  # (R,): the rows that see C(kv) only
        compressed[root_row] = proposal.compressed_root
        if s and side.compressed:
            compressed[m + n:] = True
        inputs["attention_mask"] = _store_mask(cache, mask_mod, rows, cached, compressed, positions,
                                               causal=not (n or s))
    else:
        window = masks.window(positions, layers.window, cached) if layers is not None and layers.sliding else None
        first = kv_cache.window_start(cache) if window is not None and cache is not None else 0  # WindowedLayers
        inputs["attention_mask"] = masks.render_layers(mask_mod, rows, cached + rows, layers, window, backend, dtype,
                                                       device, first)
    return inputs, 1 + n + s


def _store_mask(store, mask_mod, rows: int, cached: int, compressed: torch.Tensor, positions, causal: bool = False):
    """The BlockMask of the store's layout for `mask_mod`: committed keys sit at slots < cached in any order, so
    only the forward's own rows (R x R) need evaluating; rows flagged in `compressed` (R,) see C(kv) only."""
    if not hasattr(store, "prepare"):
        raise ValueError(f"the target runs the store's attention ({ATTENTION_NAME!r}) but its cache is a "
                         f"{type(store).__name__}: give the loop a flex_layout.FlexLayoutStore")
    if causal:  # a plain forward (a prompt's prefill): the store's causal default, which its attention knows
        return store.prepare(positions, None, compressed)
    device = positions.device
    q_idx = torch.arange(rows, device=device)[:, None]  # (R, 1)
    kv_idx = torch.arange(cached, cached + rows, device=device)[None, :]  # (1, R)
    sees = torch.broadcast_to(mask_mod(0, 0, q_idx, kv_idx), (rows, rows))  # (R, R)
    return store.prepare(positions, sees, compressed)


class ForwardSpec(NamedTuple):
    """What a forward needs to know about the target: resolved once per decode call (loop.py), not per step."""
    backend: str
    dtype: torch.dtype
    device: torch.device
    lazy_ok: bool  # lazy_head_ok(target)
    layers: compat.AttentionLayers  # the decoder layers' attention kinds (sliding-window layers' masks)
    head: object = None  # output_head(target): what a features proposal's rows project through (None: refused)


def forward_spec(target) -> ForwardSpec:
    param = next(target.parameters())
    return ForwardSpec(attention_backend(target), param.dtype, param.device, lazy_head_ok(target),
                       compat.attention_layers(target.config), output_head(target))


def forward_proposal(target, cache, proposal: Proposal, pending: list[int], lazy: bool = True,
                     spec: ForwardSpec | None = None):
    """build_forward for this target (its attention backend, dtype and device: `spec`, resolved here when None)
    and run_forward: the rows of root, nodes and side rows, (1 + n + S, V) or RowLogits."""
    spec = spec or forward_spec(target)
    side = proposal.side
    if ((side is not None and side.compressed) or proposal.compressed_root) and spec.backend != ATTENTION_NAME:
        raise ValueError("compressed rows read C(kv) from a flex_layout.FlexLayoutStore: the target must be "
                         "attached to one (the proposer's target_cache)")
    if spec.backend == ATTENTION_NAME and spec.layers.sliding:
        raise ValueError("the store's attention (FAFO's layout) has no sliding window: a target with sliding-window "
                         "layers verifies through the loop's own cache")
    if proposal.features and spec.head is None:
        raise ValueError("this proposer reads the target's final hidden states, which needs a model whose logits "
                         f"are a known function of them ({sorted(PLAIN_HEAD_MODELS | SOFTCAPPED_HEAD_MODELS)})")
    context = None
    # the prompt apart past PREFILL_ROWS, and always in the store (FAFO's fumble rows read the prompt's
    # compression, C(kv), which the prompt's prefill writes)
    apart = len(pending) > PREFILL_ROWS or (len(pending) > 1 and spec.backend == ATTENTION_NAME)
    if apart and not causal_rows(proposal, spec.backend) and (len(proposal.tree) or (side is not None and len(side))):
        context = prefill(target, cache, pending[:-1], spec, proposal.features)
        pending = pending[-1:]
    inputs, keep = build_forward(proposal, pending, kv_cache.cache_length(cache), spec.backend, spec.dtype,
                                 spec.device, cache, spec.layers)
    if proposal.features:
        before = len(pending) - 1  # committed rows fed with the root in this forward (a plain first step)
        rows = run_forward(target, cache, inputs, keep + before, True, checked=True, head=spec.head)
        return RowLogits(rows.hidden[before:], rows.head, context if context is not None else rows.hidden[:before])
    return run_forward(target, cache, inputs, keep, lazy and spec.lazy_ok, checked=True)


def prefill(target, cache, tokens: list[int], spec: ForwardSpec, hidden: bool = False):
    """Feed `tokens` (the committed tokens the cache lacks but the root: the prompt, on the first step) in a
    causal forward of their own, before a step's masked forward: with no mask the attention takes its causal
    kernel (a P x P mask would cost the prompt's prefill several times over at long context), and only the
    step's own rows meet a mask. The logits are not read; `hidden`: return the final hidden states (T, H)."""
    inputs, _ = build_forward(Proposal(DraftTree(tokens[-1])), tokens, kv_cache.cache_length(cache), spec.backend,
                              spec.dtype, spec.device, cache, spec.layers)
    if hidden:
        return compat.forward(target.model, cache=cache, use_cache=True, **inputs).last_hidden_state[0]
    compat.forward(target, cache=cache, use_cache=True, logits_to_keep=1, **inputs)
    return None


def run_forward(target, cache, inputs: dict, keep: int, lazy: bool = True, checked: bool = False, head=None):
    """The target's last `keep` rows: RowLogits when lazy (and lazy_head_ok; `checked`: the caller checked it),
    projected through `head` (output_head(target); None: the LM head), else logits (keep, V)."""
    if lazy and (checked or lazy_head_ok(target)):
        hidden = compat.forward(target.model, cache=cache, use_cache=True, **inputs).last_hidden_state[0, -keep:]
        # hidden (keep, H), after the final norm
        return RowLogits(hidden, head if head is not None else target.get_output_embeddings())
    return compat.forward(target, cache=cache, use_cache=True, logits_to_keep=keep, **inputs).logits[0]  # (keep, V)


def walk_tree(tree: DraftTree, logits, sampling: SamplingConfig = SamplingConfig(),
              generator: torch.Generator | None = None) -> tuple[list[int], list[int], int]:
    """(accepted node indices, their tokens, next token) from a tree's rows (1 + n, V); see the module doc."""
    nodes = [ROOT]  # every node whose path spells the tokens accepted so far
    while True:
        token = pick_token(logits[nodes[0] + 1], sampling, generator)  # row i + 1 holds node i's logits
        matching = [c for node in nodes for c in tree.children(node) if tree.tokens[c] == token]
        if not matching:
            accepted = tree.path_to(nodes[0])  # a real root-to-node chain (empty at the root)
            return accepted, [tree.tokens[i] for i in accepted], token
        nodes = matching


def accept_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x) / q(x)) per drafted token, shape (g,). q(x) > 0: x was drawn from q."""
    return (p_x / q_x).clamp(max=1.0)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)), shape (V,): where a rejected position draws from. All zero only if p == q
    (then nothing is ever rejected, up to rounding): fall back to p."""
    r = (p - q).clamp(min=0.0)
    total = r.sum()
    return r / total if total > 0 else p


def speculative_chain(p: torch.Tensor, q: torch.Tensor, drafts: list[int], generator) -> tuple[int, int]:
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


def verify(target, cache, proposal: Proposal, committed: list[int], sampling: SamplingConfig = SamplingConfig(),
           generator: torch.Generator | None = None, lazy: bool = True, spec: ForwardSpec | None = None) -> Verdict:
    """ONE target forward of the proposal after what the cache holds, and the verdict (the cache then holds the
    forward's rows too: `commit` keeps the accepted ones). spec: forward_spec(target), when the caller has it."""
    tree, cached = proposal.tree, kv_cache.cache_length(cache)
    pending = committed[cached:]
    if not pending or pending[-1] != tree.root:
        raise ValueError(f"the cache holds {cached} of {len(committed)} committed tokens, and the tree's root "
                         f"must be the last committed token (the cache must not hold it yet)")
    if proposal.q is not None and len(tree.leaves()) > 1:
        raise ValueError("q-based verification takes a chain (one branch); a sampled tree needs another rule")
    rows = forward_proposal(target, cache, proposal, pending, lazy, spec)
    n, side_logits = len(tree), None
    if proposal.side is not None and len(proposal.side):
        side_logits = side_row_logits(rows, n + 1, proposal.side)
    if proposal.q is not None and not sampling.greedy:
        p = probs(rows.full()[:n + 1] if isinstance(rows, RowLogits) else rows[:n + 1], sampling)  # (n + 1, V)
        k, token = speculative_chain(p, proposal.q, tree.tokens, generator)
        accepted, full = list(range(k)), k == n
    else:
        accepted, _, token = walk_tree(tree, rows, sampling, generator)
        full = not tree.children(accepted[-1] if accepted else ROOT)
    return Verdict(proposal, accepted, [tree.tokens[i] for i in accepted], token, full, len(committed) - 1, rows,
                   side_logits)


def side_row_logits(rows, first: int, side: SideRows) -> torch.Tensor:
    """Logits of the side rows (rows first.., those in side.logits_rows when given) of a forward's rows (a
    tensor or RowLogits): (S or len(logits_rows), V)."""
    pick = slice(None) if side.logits_rows is None else side.logits_rows
    return rows.head(rows.hidden[first:][pick]) if isinstance(rows, RowLogits) else rows[first:][pick]


def commit(cache, prefix_len: int, kept: list[int]) -> None:
    """Keep prefix + root + the `kept` nodes (root-to-leaf; node i sat at offset i + 1 after the root)."""
    kv_cache.compact(cache, prefix_len, [0] + [i + 1 for i in kept])


# ---- one tree step by hand (notebooks 02, 03 and 05 teach with these) ------------------------------------------

def tree_logits(target, cache, tree: DraftTree, prefix_len: int, lazy: bool = False):
    """One forward of root + tree against a cache holding exactly `prefix_len` tokens; rows (1 + n, V).

    The cache grows by 1 + n entries (row order); `commit` then keeps the accepted ones."""
    if kv_cache.cache_length(cache) != prefix_len:
        raise ValueError(f"the cache holds {kv_cache.cache_length(cache)} tokens, expected prefix_len="
                         f"{prefix_len} (the root must not be in the cache yet)")
    return forward_proposal(target, cache, Proposal(tree), [tree.root], lazy)


class TreeVerdict(NamedTuple):
    accepted: list[int]  # accepted node indices, root-to-leaf order (may be empty)
    tokens: list[int]  # their tokens
    next_token: int  # the target's own token after the accepted path (the next root): Verdict.next_token
    logits: object  # (1 + n, V): row 0 = root, row i + 1 = node i (a RowLogits when lazy)


def verify_tree(target, cache, tree: DraftTree, prefix_len: int, sampling: SamplingConfig = SamplingConfig(),
                generator: torch.Generator | None = None, compact: bool = True, lazy: bool = False) -> TreeVerdict:
    """One tree forward, the walk, and (compact=True) the commit, by hand."""
    rows = tree_logits(target, cache, tree, prefix_len, lazy)
    accepted, tokens, token = walk_tree(tree, rows, sampling, generator)
    if compact:
        commit(cache, prefix_len, accepted)
    return TreeVerdict(accepted, tokens, token, rows)
