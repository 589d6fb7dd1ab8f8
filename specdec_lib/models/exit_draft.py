"""A draft built from the target itself: its first layers, a trained exit, and a head over the frequent tokens.

A real target rarely comes with a small model of the same tokenizer. Three known ways to make one cheaply:
- early exit (LayerSkip, Elhoushi et al. 2024; SWIFT, Xia et al. 2024; HF's `assistant_early_exit`): run the
  target's first k layers and read the result through its own norm and LM head. Untrained, this rarely agrees
  with the target's next token (notes/real-model-offline.md): the middle layers' states are not yet in the
  head's space, so an exit needs training;
- a small distilled draft: a few decoder layers of the target's width trained to match its distribution;
- a reduced-vocabulary head (FR-Spec, Zhao et al. 2025): with a large vocabulary the tied LM head is a large share
  of a small target's arithmetic (a fifth of SmolLM2-135M's), so a draft that scores every token costs at least
  that share of a target step; scoring only the K tokens the target predicts most often keeps verification exact
  (the target still scores all tokens; a token outside the K is simply never drafted).

`ExitDraft` spans that family: the target's first `frozen` decoder layers as they are, then `trained` decoder
layers (initialised from the target's next ones and fine-tuned, the "exit adapter"), a fine-tuned final norm, and
`SubsetHead`: the target's own (frozen) output rows of `keep` token ids. frozen=0 is a small distilled draft
starting from the target's embeddings; frozen > 0 an early exit with a trained adapter. It is an ordinary
`LlamaForCausalLM` (real DynamicCache, real `generate`, usable as HF's assistant) whose head scatters its K logits
into the full vocabulary (-inf elsewhere), so every method and check comparing draft and target ids works as is.

On disk (data/models/smol-draft): `draft.json` (frozen, trained, the target it was trained for) and
`adapter.safetensors` (the trained layers, the norm, the kept ids); the rest is read from the target at load time.

Simplifications: Llama-family targets only (their decoder layers are copied by index); the head's rows are
frozen (only the layers and the norm learn); batch size 1 at decode time, as everywhere in the loop.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

DRAFT_FILE, ADAPTER_FILE = "draft.json", "adapter.safetensors"


class SubsetHead(nn.Module):
    """Logits over `ids` only (K of the V tokens), written into a full (…, V) row with -inf elsewhere.

    weight: (K, d), the target's output rows of `ids`; out_features = V, so the model's vocabulary is the
    target's (`models.vocab_size`)."""

    def __init__(self, weight: torch.Tensor, ids: torch.Tensor, vocab: int):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)  # (K, d)
        self.register_buffer("ids", ids.to(torch.long).clone())  # (K,)
        self.out_features, self.in_features = int(vocab), int(weight.shape[1])

    def subset_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.weight.T  # (..., K)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        small = self.subset_logits(hidden)  # (..., K)
        full = small.new_full((*small.shape[:-1], self.out_features), float("-inf"))  # (..., V)
        full[..., self.ids] = small
        return full


def build_exit_draft(target, frozen: int, trained: int, keep: torch.Tensor):
    """A draft of `frozen` copied + `trained` trainable decoder layers of `target`, its norm and a SubsetHead
    over the token ids `keep` (a fresh model: nothing is shared with the target)."""
    from transformers import AutoModelForCausalLM

    layers = len(target.model.layers)
    if frozen < 0 or trained < 1 or frozen + trained > layers:
        raise ValueError(f"an exit draft needs 0 <= frozen and trained >= 1 with frozen + trained <= {layers} "
                         f"(the target's layers), got frozen={frozen}, trained={trained}")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = frozen + trained
    config.tie_word_embeddings = False
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:frozen + trained]
    dtype = next(target.parameters()).dtype
    draft = AutoModelForCausalLM.from_config(config, dtype=dtype)
    draft.model.embed_tokens.load_state_dict(target.model.embed_tokens.state_dict())
    for i in range(frozen + trained):  # the next layers of the target are the adapter's starting point
        draft.model.layers[i].load_state_dict(target.model.layers[i].state_dict())
    draft.model.norm.load_state_dict(target.model.norm.state_dict())
    rows = target.get_output_embeddings().weight[keep.to(target.device)]  # (K, d)
    draft.lm_head = SubsetHead(rows, keep, vocab=target.get_output_embeddings().weight.shape[0])
    draft.config.exit_draft = dict(frozen=frozen, trained=trained, keep=int(len(keep)))
    for p in draft.parameters():
        p.requires_grad_(False)
    for p in trained_parameters(draft):
        p.requires_grad_(True)
    return draft.to(target.device).eval()


def trained_parameters(draft) -> list[nn.Parameter]:
    """What training changes: the last `trained` layers and the final norm."""
    frozen = draft.config.exit_draft["frozen"]
    params = [p for layer in draft.model.layers[frozen:] for p in layer.parameters()]
    return params + list(draft.model.norm.parameters())


def adapter_state(draft) -> dict[str, torch.Tensor]:
    """The trained weights and the kept ids: what `save_exit_draft` writes."""
    frozen = draft.config.exit_draft["frozen"]
    state = {f"layers.{i}.{k}": v for i, layer in enumerate(draft.model.layers) if i >= frozen
             for k, v in layer.state_dict().items()}
    state.update({f"norm.{k}": v for k, v in draft.model.norm.state_dict().items()})
    state["keep"] = draft.lm_head.ids
    return state


def save_exit_draft(draft, out: str | Path, target_name: str, dtype=torch.float16, extra: dict | None = None):
    """Write draft.json and adapter.safetensors (the trained weights in `dtype`: half the bytes, the draft's
    quality does not depend on the last bits; verification stays exact whatever the draft computes)."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: (v if k == "keep" else v.to(dtype)).contiguous().cpu() for k, v in adapter_state(draft).items()}
    save_file(state, str(out / ADAPTER_FILE))
    meta = dict(kind="exit_draft", target=target_name, **draft.config.exit_draft, dtype=str(dtype).split(".")[-1],
                **(extra or {}))
    (out / DRAFT_FILE).write_text(json.dumps(meta, indent=1) + "\n")


def load_exit_draft(target, folder: str | Path):
    """The draft saved in `folder`, rebuilt on `target` (its frozen layers, embeddings and head rows)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / DRAFT_FILE).is_file():
        raise FileNotFoundError(f"no exit draft in {folder} (missing {DRAFT_FILE}); rebuild it with "
                                "`make smol-draft`")
    meta = json.loads((folder / DRAFT_FILE).read_text())
    state = load_file(str(folder / ADAPTER_FILE))
    draft = build_exit_draft(target, meta["frozen"], meta["trained"], state.pop("keep"))
    dtype = next(target.parameters()).dtype
    for key, value in state.items():
        module, _, name = key.partition(".")
        if module == "layers":
            index, _, name = name.partition(".")
            holder = draft.model.layers[int(index)]
        else:
            holder = draft.model.norm
        holder.get_parameter(name).data.copy_(value.to(dtype))
    for p in draft.parameters():
        p.requires_grad_(False)
    draft.config.exit_draft.update({k: v for k, v in meta.items() if k not in ("frozen", "trained", "keep")})
    return draft.eval()
