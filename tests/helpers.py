"""Helpers the tests share (imported as `from helpers import ...`; fixtures live in conftest.py): prompts, small
random float64 models built in memory (random_lm: Llama and Qwen2; family_lm: every family of the family matrix),
an EAGLE head for them, table checks, and a random sliding-window pair written to disk as a user's two model
directories (`sliding_pair_dirs`).

Random-init LMs are nearly uniform; tests that need peaked distributions scale the output layer."""
from __future__ import annotations

import torch


# Two short code prompts for parity runs on the shipped pair.
SHIPPED_PROMPTS = ["import os\nimport sys\n\n\ndef main(argv):\n", "class Stack:\n    def __init__(self):\n"]


def repeating_prompt(length: int, seed: int, vocab: int = 97) -> torch.Tensor:
    """(1, length) random token ids whose first third comes back at the end, so lookups and tables hit."""
    g = torch.Generator().manual_seed(seed)
    chunk = torch.randint(0, vocab, (max(1, length // 3),), generator=g)
    return torch.cat([chunk, torch.randint(0, vocab, (length - 2 * len(chunk),), generator=g), chunk])[None]


def autoregressive_samples(target, ids, max_new_tokens: int, seeds=range(6)):
    """(sampling kwargs, "autoregressive" tokens) for seeded runs at two settings: a method that draws one seeded
    sample per emitted token from p (tables, prompt lookup) must reproduce these tokens exactly."""
    from specdec_lib import generate

    for seed in seeds:
        for temperature, top_k in ((1.0, None), (0.7, 5)):
            kwargs = dict(temperature=temperature, top_k=top_k, seed=seed)
            yield kwargs, generate("autoregressive", target, ids, max_new_tokens, **kwargs).new_tokens


def random_lm(kind: str = "llama", vocab: int = 97, layers: int = 2, hidden: int = 32, seed: int = 0,
              logit_scale: float = 1.0, context: int = 256):
    """A randomly initialised float64 causal LM (real HF class), eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                  tie_word_embeddings=False)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        raise ValueError(kind)
    model = model.to(torch.float64).eval()
    if logit_scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(logit_scale)
    return model


WINDOW = 8  # family_lm's sliding window


def _config(family: str, layers: int, window: int, vocab: int, hidden: int, **extra):
    from transformers import (Gemma2Config, Gemma3TextConfig, LlamaConfig, MistralConfig, Phi3Config, Qwen2Config,
                              Qwen3Config)

    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  tie_word_embeddings=False, bos_token_id=0, eos_token_id=None, pad_token_id=0, **extra)
    head_dim = dict(head_dim=hidden // 4)
    qwen = dict(use_sliding_window=True, sliding_window=window, max_window_layers=1)  # layer 0 full, the rest slide
    return {"llama": lambda: LlamaConfig(**common),
            "qwen2": lambda: Qwen2Config(**common, **qwen),
            "qwen3": lambda: Qwen3Config(**common, **qwen, **head_dim),
            "gemma2": lambda: Gemma2Config(**common, **head_dim, sliding_window=window),
            "gemma3": lambda: Gemma3TextConfig(**common, **head_dim, sliding_window=window, sliding_window_pattern=2),
            "mistral": lambda: MistralConfig(**common, sliding_window=window),
            "phi3": lambda: Phi3Config(**common, sliding_window=window)}[family]()


def family_lm(family: str, layers: int = 3, seed: int = 0, window: int = WINDOW, vocab: int = 128,
              hidden: int = 32, logit_scale: float = 20.0, **config):
    """A random float64 causal LM of `family` (peaked: its output layer scaled), eval mode; `config`: more settings
    of its config (a partial rotary, a logit cap)."""
    from transformers import (Gemma2ForCausalLM, Gemma3ForCausalLM, LlamaForCausalLM, MistralForCausalLM,
                              Phi3ForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)

    classes = dict(llama=LlamaForCausalLM, qwen2=Qwen2ForCausalLM, qwen3=Qwen3ForCausalLM, gemma2=Gemma2ForCausalLM,
                   gemma3=Gemma3ForCausalLM, mistral=MistralForCausalLM, phi3=Phi3ForCausalLM)
    torch.manual_seed(seed)
    model = classes[family](_config(family, layers, window, vocab, hidden, **config)).to(torch.float64).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model


_HEADS: dict[tuple, object] = {}  # heads trained in this process, by the target's weights and the steps


def _fingerprint(target) -> tuple:
    """The same random model built twice (two tests, one seed) has the same config and the same weights."""
    import hashlib

    digest = hashlib.sha256(target.config.to_json_string().encode())
    for tensor in target.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return type(target).__name__, digest.hexdigest()


def with_head(target, steps: int = 150):
    """`target` with an EAGLE head trained here on its own greedy text (random models ship none): trained once per
    model and steps in a process (quick_head is seeded: a second training would give the same head)."""
    from specdec_lib.models.eagle_head import attach_head
    from specdec_lib.training.train_eagle import quick_head

    key = (_fingerprint(target), steps)
    if key not in _HEADS:
        _HEADS[key] = quick_head(target, steps=steps, sequences=8, length=64)
    attach_head(target, _HEADS[key])
    return target


def all_match_hf(table, column: str = "all_match_hf", key: str = "method") -> bool:
    """Every row but hf's reproduced hf's tokens, and hf's own rows are not compared with themselves (None)."""
    reference = table[key] == "hf"
    return bool(table.loc[~reference, column].astype(bool).all()) and bool(table.loc[reference, column].isna().all())


SLIDING_WINDOW = 32  # the sliding pair's window: shorter than the SMOKE prompts, so every run decodes across it


def sliding_pair_dirs(root, seed: int = 0, window: int = SLIDING_WINDOW):
    """(target_dir, draft_dir): a random Gemma 3 pair (Gemma3ForCausalLM, sliding and full attention layers
    alternating, `window` tokens) saved in float32 as two model directories a user would pass as
    MODELS = (target_dir, draft_dir), each with the shipped tiny pair's tokenizer (its 4096 ids: the vocabulary).

    The target has 4 layers of width 64; the draft is its first 2 layers with its embeddings, final norm and output
    layer (an exit draft, as the smol pair's), so it agrees with the target on about a third of the tokens and
    speculation has something to accept. Embeddings are drawn wider (std 0.4) and the output layer scaled by 20 so
    the distributions are peaked (a random LM's are nearly uniform). Seeded: the same seed writes the same weights;
    the global RNG is left as it was."""
    from pathlib import Path

    from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig

    from specdec_lib.env import TINY_DIR

    tokenizer = AutoTokenizer.from_pretrained(TINY_DIR / "target")
    vocab = len(tokenizer)
    special = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)

    def config(layers: int):
        return Gemma3TextConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=window,
                                layer_types=["sliding_attention", "full_attention"] * (layers // 2),
                                max_position_embeddings=1024, tie_word_embeddings=False, bos_token_id=special,
                                eos_token_id=special, pad_token_id=special)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        target = Gemma3ForCausalLM(config(4)).float().eval()
        with torch.no_grad():
            target.model.embed_tokens.weight.normal_(0.0, 0.4)
            target.lm_head.weight.mul_(20.0)
    draft = Gemma3ForCausalLM(config(2)).float().eval()
    draft.load_state_dict({k: v for k, v in target.state_dict().items() if k in draft.state_dict()})
    dirs = Path(root) / "gemma3-sliding-target", Path(root) / "gemma3-sliding-draft"
    for model, folder in zip((target, draft), dirs):
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return tuple(str(d) for d in dirs)
