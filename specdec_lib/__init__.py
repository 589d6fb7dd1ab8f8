"""specdec_lib: speculative decoding built step by step (the library behind specdec-workbook).

Notation, used the same way in code, notebooks and plots:
- p: the target model's next-token distribution; q: the draft's (both after temperature/top-k/top-p).
- gamma: draft length of a chain; MAT: mean tokens gained per target forward, bonus token included.
- Cacheback: LL leader length, FL follower length, LC leader capacity, FC follower capacity,
  TDL total draft length, CRT tokens reserved for deeper tree levels.

Reading order: models -> sampling -> kv_cache -> decoding (the contract, the registry, the baseline)
-> peers (HF's decoders as methods) -> costs -> bench -> viz; then the mechanisms: ngram_table ->
draft_tree -> tree_attention -> tree_verify (01-02) -> draft_model -> lossless (03) -> cacheback ->
prompt_lookup -> ablation (04); viz_trees, viz_rollback, viz_ablation draw them.
"""
from .models import ModelPair, load_models, check_same_vocab
from .sampling import SamplingConfig
from .decoding import METHODS, GenerationResult, Request, generate, register
from .ngram_table import FrozenNgramTable, NgramTable
from .draft_tree import DraftTree, grow_tree
from .tree_verify import verify_tree
from . import peers as _peers  # noqa: F401  (registers "hf", "hf_prompt_lookup", "hf_assisted")
from . import draft_model as _draft_model  # noqa: F401  (registers "draft_model")
from . import cacheback as _cacheback  # noqa: F401  (registers "cacheback")
from . import prompt_lookup as _prompt_lookup  # noqa: F401  (registers "prompt_lookup")

__all__ = ["METHODS", "DraftTree", "FrozenNgramTable", "GenerationResult", "ModelPair", "NgramTable", "Request",
           "SamplingConfig", "check_same_vocab", "generate", "grow_tree", "load_models", "register", "verify_tree"]
__version__ = "0.1.0"
