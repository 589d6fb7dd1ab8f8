"""A feature-level draft head (EAGLE, Li et al. 2024): one decoder layer that reads the target's own last hidden state.

A separate draft model has to rebuild, from tokens alone, what the target already computed. EAGLE's head starts
from the target's final hidden state ("feature") f_t at position t instead: given f_t and the embedding of the
token at t + 1, one decoder layer predicts the feature f_{t+1}, and the target's own (frozen) LM head reads a
token distribution out of it. Drafting deeper feeds the head its own predicted feature with the token it chose:

    row at position t:   fc([f_t ; embed(x_{t+1})])  ->  decoder layer  ->  norm  ->  f^_{t+1}  ->  lm_head -> x_{t+2}

`EagleHead` is that head, built for a given target: the fc (2d -> d, initialised to f + embed), ONE decoder layer
of the target's class and config (warm-started from its last layer, rope of that layer's kind), a norm (from its
final norm); the embedding (Gemma's sqrt(d) scale included) and the LM head (soft-capped where the target caps:
verify.output_head) are the target's, never copied. `keep_ids` (optional, FR-Spec): the tokens it may draft.
The head's layer attends to every row of its cache, even where the copied layer slides: the window is a cost
device of the target (whose features carry the text beyond it), the head is trained on sequences shorter than
a real window, and one attention kind keeps `forward`, `decode` and `HeadKV` alike.
At decode time `EagleHead.decode` runs the same layer written out over a `HeadKV` (a kv_cache.GrowableKV plus a
rotary table), without the framework's per-call work (cache object, rotary and mask modules, dispatch): equal to
`forward` (a test checks, per family). It reads a `Layout` of the layer: Llama-style parts, Qwen3's and Gemma 3's
per-head q/k norms, Phi-3's fused qkv_proj / gate_up_proj and partial rotary, Gemma's x * (1 + w) norms and
sandwich norms, Gemma 2's soft-capped attention (eager arithmetic); a layer with other parts is refused by name.
On disk (`save_head` / `load_head`): eagle.json (the target's fingerprint, facts) and head.safetensors (float16);
`head_for(target)` finds the shipped head trained for a target; `attach_head` gives a target one trained here.
Simplifications: the feature is the target's final *normed* hidden state (EAGLE-1 reads it before the norm);
batch size 1 at decode time; transformers 5.x layers.
"""
from __future__ import annotations

import copy
import hashlib
import json
import weakref
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from .. import compat
from ..mechanisms.kv_cache import GrowableKV
from ..mechanisms.verify import logit_softcap, softcap
from .eagle_layer import (Layout, _mlp, _norm_offset, _rms_norm, _rotate, _softcapped_attention, decode_problem,
                          layer_layout)

HEAD_JSON, HEAD_WEIGHTS = "eagle.json", "head.safetensors"


# config keys that do not change the weights a head reads: names, dtypes, the attention kernel, and the context
# settings (the same model read at a longer context through YaRN, "tiny-long", keeps its head)
_NOT_IDENTITY = ("name_or_path", "_name_or_path", "dtype", "torch_dtype", "transformers_version",
                 "_attn_implementation", "_attn_implementation_internal", "architectures", "rope_parameters",
                 "rope_scaling", "rope_theta", "max_position_embeddings")


def target_fingerprint(target) -> str:
    """The target's identity a head is valid for: its config (minus _NOT_IDENTITY) and parameter count."""
    config = {k: v for k, v in target.config.to_dict().items() if k not in _NOT_IDENTITY}
    params = sum(p.numel() for p in target.parameters())
    text = json.dumps(config, sort_keys=True, default=str) + f":{params}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class EagleHead(nn.Module):
    """fc([feature; embedding]) -> one decoder layer -> norm: the predicted next feature (see the module doc)."""

    def __init__(self, config, layer_cls, norm_cls, rotary_cls, keep_ids: torch.Tensor | None = None,
                 layer_type: str | None = None):
        super().__init__()
        config = copy.deepcopy(config)
        config.num_hidden_layers = 1
        if getattr(config, "layer_types", None) is not None:  # the copied layer's kind: its rope (Gemma 3's local
            layer_type = layer_type or config.layer_types[-1]  # or global one); its window is not used
            config.layer_types = [layer_type]
        # the head's own attention: plain SDPA with an explicit mask; eager where the layer soft-caps its attention
        # logits (Gemma 2: SDPA has no cap and would silently drop it)
        config._attn_implementation = "eager" if getattr(config, "attn_logit_softcapping", None) else "sdpa"
        d = config.hidden_size
        self.config, self.layer_type = config, layer_type
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.layer = layer_cls(config, layer_idx=0)
        self.norm = norm_cls(d, eps=config.rms_norm_eps)
        self.rotary = rotary_cls(config=config)
        self.register_buffer("keep_ids", keep_ids.to(torch.long).clone() if keep_ids is not None else
                             torch.zeros(0, dtype=torch.long))

    @classmethod
    def for_target(cls, target, keep_ids: torch.Tensor | None = None) -> "EagleHead":
        """A fresh head shaped for `target`, warm-started from its last layer and final norm."""
        inner = target.model
        kind = compat.attention_layers(target.config).types[-1]
        head = cls(target.config, type(inner.layers[-1]), type(inner.norm), type(inner.rotary_emb), keep_ids, kind)
        head.layer.load_state_dict(inner.layers[-1].state_dict())
        head.norm.load_state_dict(inner.norm.state_dict())
        d = target.config.hidden_size
        with torch.no_grad():  # start as "feature + embedding": the residual stream the layer was trained on
            head.fc.weight.copy_(torch.cat([torch.eye(d), torch.eye(d)], dim=1))
        return head.to(next(target.parameters()).dtype)

    def new_cache(self):
        """An empty transformers cache for `forward`: full-width, as the head's attention is (the module doc)."""
        return compat.new_dynamic_cache()

    def rope(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each (B, R, rotary dim), of the head's rotary at position_ids (B, R)."""
        return compat.rotary_embeddings(self.rotary, x, position_ids, self.layer_type)

    def forward(self, features: torch.Tensor, embeds: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        """features, embeds (B, R, d); position_ids (B, R); attention_mask bool (B, 1, R, K) or None (causal,
        no cache); returns the predicted normed features (B, R, d)."""
        x = self.fc(torch.cat([features, embeds], dim=-1))  # (B, R, d)
        position_embeddings = self.rope(x, position_ids)  # (cos, sin), each (B, R, rotary dim)
        if self.config._attn_implementation == "eager":  # eager attention adds a float mask, and has no causal default
            if attention_mask is None:
                R = x.shape[1]
                attention_mask = torch.ones(R, R, dtype=torch.bool, device=x.device).tril()[None, None]  # (1, 1, R, R)
            attention_mask = torch.zeros(attention_mask.shape, dtype=x.dtype, device=x.device).masked_fill(
                ~attention_mask, torch.finfo(x.dtype).min)  # (B, 1, R, K)
        out = compat.forward(self.layer, cache=cache, hidden_states=x, attention_mask=attention_mask,
                             position_ids=position_ids, use_cache=cache is not None,
                             position_embeddings=position_embeddings)
        out = out[0] if isinstance(out, tuple) else out  # older decoder layers return a tuple
        return self.norm(out)

    def layout(self) -> "Layout":
        """What `decode` runs of this head's layer and norm (read once); a clear error where it cannot run them."""
        found = self.__dict__.get("_layout")
        if found is None:
            found = layer_layout(self.layer)
            if isinstance(found, str):
                raise ValueError(found)
            final = _norm_offset(self.norm)
            if final is None:
                raise ValueError(f"EagleHead.decode cannot run the head's {type(self.norm).__name__}: not an RMSNorm "
                                 "scaling by w or 1 + w")
            found = self.__dict__["_layout"] = replace(found, final_plus_one=final)
        return found

    def check_decodable(self) -> None:
        """A clear error where `decode` would not compute `forward` (a layer with parts it does not run)."""
        self.layout()

    def decode(self, features: torch.Tensor, embeds: torch.Tensor, positions: list[int], sees: torch.Tensor,
               kv: "HeadKV") -> torch.Tensor:
        """`forward` at decode time, written out: features, embeds (R, d); the rows' positions; sees bool
        (R, kv.length + R), what each row attends to (the rows' own keys last); appends the rows' keys and values
        to `kv`; returns the predicted normed features (R, d). The same layer, weights and math as `forward` (a
        test compares them, per family), without the framework's per-call work (the module doc)."""
        lay, layer, attn, mlp = self.layout(), self.layer, self.layer.self_attn, self.layer.mlp
        R, (nh, nkv, hd) = features.shape[0], kv.heads
        x = self.fc(torch.cat([features, embeds], dim=-1))  # (R, d)
        h = _rms_norm(layer.input_layernorm, x, lay.plus_one)
        if lay.fused_qkv:  # Phi-3: one projection, queries then keys then values
            q, k, v = attn.qkv_proj(h).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        else:
            q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
        q = q.view(R, nh, hd).transpose(0, 1)  # (nh, R, hd)
        k = k.view(R, nkv, hd).transpose(0, 1)  # (nkv, R, hd)
        v = v.view(R, nkv, hd).transpose(0, 1)  # (nkv, R, hd)
        if lay.qk_norm:  # Qwen3, Gemma 3: an RMSNorm over each head's dims, before the rotary
            q, k = _rms_norm(attn.q_norm, q, lay.plus_one), _rms_norm(attn.k_norm, k, lay.plus_one)
        cos, sin = kv.rotary(self, positions)  # (R, rotary dim) each
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        keys, values = kv.append(k, v)  # (nkv, L + R, hd): the cache with these rows last
        if lay.softcap is None:
            out = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=sees[None, None],
                                                 scale=attn.scaling, enable_gqa=nkv != nh)  # (1, nh, R, hd)
        else:
            out = _softcapped_attention(q[None], keys[None], values[None], sees, attn.scaling, lay.softcap)
        a = attn.o_proj(out[0].transpose(0, 1).reshape(R, nh * hd))  # (R, d)
        if lay.sandwich:  # Gemma: the attention's and the MLP's outputs are normed before the residual adds
            x = x + _rms_norm(layer.post_attention_layernorm, a, lay.plus_one)
            h = _rms_norm(layer.pre_feedforward_layernorm, x, lay.plus_one)
            x = x + _rms_norm(layer.post_feedforward_layernorm, _mlp(mlp, h, lay), lay.plus_one)
        else:
            x = x + a
            x = x + _mlp(mlp, _rms_norm(layer.post_attention_layernorm, x, lay.plus_one), lay)
        return _rms_norm(self.norm, x, lay.final_plus_one)

    def logits(self, target, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits over the kept tokens or all V, the kept ids or None) of predicted features (..., d), as the
        target computes its own (soft-capped where it caps: the draft's probabilities are the target's kind)."""
        weight, cap = target.get_output_embeddings().weight, logit_softcap(target)  # (V, d), the target's frozen head
        if not len(self.keep_ids):
            return softcap(hidden @ weight.T, cap), None  # (..., V)
        if torch.is_grad_enabled():
            return softcap(hidden @ weight[self.keep_ids].T, cap), self.keep_ids  # (..., K)
        # decoding: the kept rows gathered once per target weight, as a linear layer (packed like the target's)
        key = (weight.data_ptr(), weight.dtype, -1 if weight.is_inference() else weight._version)
        readout = self.__dict__.get("_readout")
        if readout is None or readout[0] != key:
            layer = nn.Linear(weight.shape[1], len(self.keep_ids), bias=False, device=weight.device, dtype=weight.dtype)
            layer.weight.data = weight.detach()[self.keep_ids].clone()  # (K, d)
            from .prepack import is_prepacked, prepack
            if is_prepacked(target):
                prepack(layer)
            readout = self.__dict__["_readout"] = (key, layer)
        return softcap(readout[1](hidden), cap), self.keep_ids  # (..., K)


class HeadKV(GrowableKV):
    """The head's KV cache at decode time (`EagleHead.decode`): its one layer's keys and values in a GrowableKV
    (buffers that grow by doubling, cut back by a length: `crop` copies nothing), and a table of the rotary's cos
    and sin per position, grown the same way (the rotary module recomputes them on every call)."""

    def __init__(self, head: "EagleHead", capacity: int = 256):
        config, param = head.config, next(head.parameters())
        nh, nkv = config.num_attention_heads, config.num_key_value_heads
        hd = getattr(config, "head_dim", None) or config.hidden_size // nh
        super().__init__(capacity, (1, nkv, hd), param.dtype, param.device)  # keys, values (1, nkv, capacity, hd)
        self.heads = (nh, nkv, hd)
        self.cos = self.sin = torch.zeros(0, hd, device=param.device, dtype=param.dtype)  # (positions, hd)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (nkv, R, hd) after the first `length` rows; the cache's rows up to them (views)."""
        keys, values = self.write(self.length, k[None], v[None])  # (1, nkv, length + R, hd)
        return keys[0], values[0]

    def rotary(self, head: "EagleHead", positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) (R, rotary dim) of the R `positions`, from the head's own rotary module, tabled."""
        top = max(positions) + 1
        if top > self.cos.shape[0]:
            size = max(top, 2 * self.cos.shape[0], 256)
            ids = torch.arange(size, device=self.keys.device)[None]  # (1, size)
            cos, sin = head.rope(self.keys[:, :1, :1], ids)  # (1, size, rotary dim) each
            self.cos, self.sin = cos[0], sin[0]
        if positions == list(range(positions[0], top)):  # consecutive (a catch-up): slices, no gather
            return self.cos[positions[0]:top], self.sin[positions[0]:top]
        index = torch.tensor(positions, device=self.keys.device)  # (R,)
        return self.cos[index], self.sin[index]


def save_head(head: EagleHead, out, target, extra: dict | None = None) -> Path:
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: (v.detach().to(torch.float16) if v.is_floating_point() else v.detach()).contiguous()
             for k, v in head.state_dict().items()
             if not k.startswith("rotary.")}  # float16 on disk (half the size); the rotary is rebuilt from the config
    save_file(state, str(out / HEAD_WEIGHTS))
    meta = dict(kind="eagle_head", target=target_fingerprint(target), hidden_size=head.config.hidden_size,
                keep=int(len(head.keep_ids)), **(extra or {}))
    (out / HEAD_JSON).write_text(json.dumps(meta, indent=1) + "\n")
    return out


def load_head(folder, target) -> EagleHead:
    """The head saved in `folder`, for `target` (refused when it was trained for another target), on its device
    and dtype, its linears packed where the target's are."""
    from safetensors.torch import load_file

    folder = Path(folder)
    meta = json.loads((folder / HEAD_JSON).read_text())
    if meta.get("target") != target_fingerprint(target):
        raise ValueError(f"the EAGLE head in {folder} was trained for another target (fingerprint "
                         f"{meta.get('target')}, this target's is {target_fingerprint(target)})")
    state = load_file(str(folder / HEAD_WEIGHTS))
    head = EagleHead.for_target(target, keep_ids=state["keep_ids"] if meta.get("keep") else None)
    missing, unexpected = head.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if not k.startswith("rotary.")]:
        raise ValueError(f"{folder}: head weights do not match (missing {missing}, unexpected {unexpected})")
    param = next(target.parameters())
    head = head.to(device=param.device, dtype=param.dtype).eval()
    from .prepack import is_prepacked, prepack
    if is_prepacked(target):
        prepack(head)  # the head reads its weights as the target does (prepack.py)
    return head


_LOADED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def attach_head(target, head: EagleHead) -> EagleHead:
    """Make `head` the one `head_for(target)` returns (a head trained here, for a pair with none shipped)."""
    _LOADED[target] = head
    return head


def head_for(target, search=None) -> EagleHead:
    """The shipped head trained for `target` (any data/models/*/eagle.json whose fingerprint matches), loaded
    once per target object; a clear error when none was trained for it."""
    from ..env import TINY_DIR

    if target in _LOADED:
        return _LOADED[target]
    mine = target_fingerprint(target)
    folders = sorted(Path(search or TINY_DIR).glob(f"*/{HEAD_JSON}"))
    for meta_file in folders:
        if json.loads(meta_file.read_text()).get("target") == mine:
            with torch.inference_mode(False):  # generate runs in inference mode: load ordinary tensors
                head = _LOADED[target] = load_head(meta_file.parent, target)
            return head
    raise ValueError(f"no EAGLE head was trained for this target (fingerprint {mine}; looked in "
                     f"{[str(f.parent) for f in folders] or str(search or TINY_DIR)}): train one with "
                     "`python -m specdec_lib.training.train_eagle --models <pair> --out data/models/<name>`, "
                     "or attach one: eagle_head.attach_head(target, train_eagle.quick_head(target))")
