"""specdec_lib: speculative decoding built step by step (the library behind specdec-workbook).

Notation, the same in code, notebooks and plots: p is the target's next-token distribution, q the draft's (both
after temperature/top-k/top-p; a forward's rows are "rows"); gamma a chain's draft length; MAT the mean tokens
gained per target forward, the next token included (a *bonus* when every draft of the path was accepted, else a
*correction*); Cacheback's LL/FL leader/follower length, LC/FC their capacities, TDL the total draft length,
CRT the tokens reserved for deeper tree levels.

The folders are the architecture; read them in this order:
- root: compat (transformers' and torch's moving parts) -> env (paths, device/dtype, the machine's name,
  check_int, the one timer `median_ms`) -> sampling (p and q) -> decoding (`generate`, `METHODS`,
  `GenerationResult`) -> loop (THE decoding loop: every method is a proposer plugged into it); beside them
  corpus (the standard-library corpus) and tables (frozen n-gram tables as files);
- models/: loading (`load_models`, `ModelPair`), smol, exit_draft, eagle_head, prepack;
- mechanisms/: pure pieces the loop uses (ngram_table, draft_tree, dynamic_tree, masks, kv_cache, verify; budget/,
  store/ (FAFO's KV store), card/ (CARD's drafter)); they import neither methods/, bench/, tools/ nor viz/;
- methods/: the proposers (autoregressive, prompt_lookup, cacheback, draft_model, card, lookahead, fafo, eagle)
  and peers (HF's own decoders); each registers itself, none imports another;
- bench/: measuring (harness: `python -m specdec_lib.bench`, ablation, costs, compare, lossless, acceptance,
  timeline, flex_layout, long_context);
- viz/: figures and explorers by subject (plotly and ipywidgets are imported only there);
- training/: the training loop and what it trains (the tiny pair, distilled and exit drafts, EAGLE heads);
- workbook/: what the notebooks run on (notebook helpers, claims, run_notebooks, offline_views, colab);
- tools/: command-line tools (frozen_tables, make_prompts, model_card, gpu_report).
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
