"""A feature-level draft head (EAGLE, Li et al. 2024): one decoder layer that reads the target's own last hidden state.

A separate draft model has to rebuild, from tokens alone, what the target already computed. EAGLE's head starts
from the target's final hidden state ("feature") f_t at position t instead: given f_t and the embedding of the
token at t + 1, one decoder layer predicts the feature f_{t+1}, and the target's own (frozen) LM head reads a
token distribution out of it. Drafting deeper feeds the head its own predicted feature with the token it chose:

    row at position t:   fc([f_t ; embed(x_{t+1})])  ->  decoder layer  ->  norm  ->  f^_{t+1}  ->  lm_head -> x_{t+2}

The head keeps its own KV cache over the committed text (rows whose features the target computed, exactly), so
each step costs one head forward to catch up on the newly committed tokens plus one per draft depth.
`EagleHead` is that head, built for a given target: the fc (2d -> d, initialised to f + embed), ONE decoder layer
of the target's class and config (warm-started from its last layer), an RMSNorm (from its final norm), its rotary
class; embeddings and LM head are the target's, never copied. `keep_ids` (optional, FR-Spec style): the tokens the
head may draft, so the head's projection costs K rows, not V (the target still scores all).
At decode time `EagleHead.decode` runs the same layer written out (fc, norm, attention, MLP, norm: equal to
`forward`, a test checks) over a `HeadKV` (a kv_cache.GrowableKV plus a rotary table): a drafted depth costs the
layer's arithmetic and weight reads without the framework's per-call work (cache object, rotary and mask modules,
dispatch). Training and `forward` keep the framework's layer.
On disk (`save_head` / `load_head`): eagle.json (the target's fingerprint, the keep set's size, training facts) and
head.safetensors (float16); `head_for(target)` finds the shipped head trained for a target, loaded once per
target object; `attach_head` gives a target one trained here (train_eagle.quick_head).
Simplifications: Llama-family targets (`decode` reads Llama's module names: q/k/v/o_proj, gate/up/down_proj, the
two RMSNorms; transformers 5.x layers); the feature is the target's final *normed* hidden state (what verify's
RowLogits keeps), where EAGLE-1 reads the last layer's output before the norm; batch size 1 at decode time.
"""
from __future__ import annotations

import copy
import hashlib
import json
import weakref
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from .. import compat
from ..mechanisms.kv_cache import GrowableKV

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

    def __init__(self, config, layer_cls, norm_cls, rotary_cls, keep_ids: torch.Tensor | None = None):
        super().__init__()
        config = copy.deepcopy(config)
        config.num_hidden_layers = 1
        config._attn_implementation = "sdpa"  # the head's own attention: plain SDPA with an explicit mask
        d = config.hidden_size
        self.config = config
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
        head = cls(target.config, type(inner.layers[0]), type(inner.norm), type(inner.rotary_emb), keep_ids)
        head.layer.load_state_dict(inner.layers[-1].state_dict())
        head.norm.load_state_dict(inner.norm.state_dict())
        d = target.config.hidden_size
        with torch.no_grad():  # start as "feature + embedding": the residual stream the layer was trained on
            head.fc.weight.copy_(torch.cat([torch.eye(d), torch.eye(d)], dim=1))
        return head.to(next(target.parameters()).dtype)

    def forward(self, features: torch.Tensor, embeds: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        """features, embeds (B, R, d); position_ids (B, R); attention_mask bool (B, 1, R, K) or None (causal,
        no cache); returns the predicted normed features (B, R, d)."""
        x = self.fc(torch.cat([features, embeds], dim=-1))  # (B, R, d)
        position_embeddings = self.rotary(x, position_ids)  # (cos, sin), each (B, R, head_dim)
        out = compat.forward(self.layer, cache=cache, hidden_states=x, attention_mask=attention_mask,
                             position_ids=position_ids, use_cache=cache is not None,
                             position_embeddings=position_embeddings)
        out = out[0] if isinstance(out, tuple) else out  # older decoder layers return a tuple
        return self.norm(out)

    def check_decodable(self) -> None:
        """A clear error where `decode` would not compute `forward` (a layer with parts it does not run)."""
        problem = decode_problem(self.layer)
        if problem:
            raise ValueError(problem)

    def decode(self, features: torch.Tensor, embeds: torch.Tensor, positions: list[int], sees: torch.Tensor,
               kv: "HeadKV") -> torch.Tensor:
        """`forward` at decode time, written out: features, embeds (R, d); the rows' positions; sees bool
        (R, kv.length + R), what each row attends to (the rows' own keys last); appends the rows' keys and values
        to `kv`; returns the predicted normed features (R, d). The same layer, weights and math as `forward` (a
        test compares them), without the framework's per-call work (cache objects, mask and rotary modules,
        dispatch: the module doc)."""
        layer, attn, mlp = self.layer, self.layer.self_attn, self.layer.mlp
        R, (nh, nkv, hd) = features.shape[0], kv.heads
        x = self.fc(torch.cat([features, embeds], dim=-1))  # (R, d)
        h = _rms_norm(layer.input_layernorm, x)
        q = attn.q_proj(h).view(R, nh, hd).transpose(0, 1)  # (nh, R, hd)
        k = attn.k_proj(h).view(R, nkv, hd).transpose(0, 1)  # (nkv, R, hd)
        v = attn.v_proj(h).view(R, nkv, hd).transpose(0, 1)  # (nkv, R, hd)
        cos, sin = kv.rotary(self, positions)  # (R, hd) each
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        keys, values = kv.append(k, v)  # (nkv, L + R, hd): the cache with these rows last
        out = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=sees[None, None],
                                             scale=attn.scaling, enable_gqa=nkv != nh)  # (1, nh, R, hd)
        x = x + attn.o_proj(out[0].transpose(0, 1).reshape(R, nh * hd))
        h = _rms_norm(layer.post_attention_layernorm, x)
        x = x + mlp.down_proj(mlp.act_fn(mlp.gate_proj(h)) * mlp.up_proj(h))
        return _rms_norm(self.norm, x)

    def logits(self, target, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits over the kept tokens or all V, the kept ids or None) of predicted features (..., d)."""
        weight = target.get_output_embeddings().weight  # (V, d), the target's frozen head
        if not len(self.keep_ids):
            return hidden @ weight.T, None  # (..., V)
        if torch.is_grad_enabled():
            return hidden @ weight[self.keep_ids].T, self.keep_ids  # (..., K)
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
        return readout[1](hidden), self.keep_ids  # (..., K)


def _rms_norm(norm, x: torch.Tensor) -> torch.Tensor:
    """A Llama RMSNorm module's output (normalised in float32, scaled in x's dtype) in one fused call."""
    out = F.rms_norm(x.float(), (x.shape[-1],), eps=norm.variance_epsilon)
    return norm.weight * out.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def decode_problem(layer) -> str | None:
    """Why `EagleHead.decode` cannot run a head whose layer is `layer` (a decoder layer; a head is one of its
    target's family: `for_target`), or None: it runs Llama-style layers only."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    need = [(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "scaling")] + \
        [(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")] + \
        [(layer, n) for n in ("input_layernorm", "post_attention_layernorm")]
    missing = [n for obj, n in need if not hasattr(obj, n)]
    extra = [n for n in ("q_norm", "k_norm") if hasattr(attn, n)]  # Qwen3-style per-head norms
    if missing or extra:
        return (f"EagleHead.decode runs Llama-style decoder layers; {type(layer).__name__} "
                f"{'lacks ' + ', '.join(missing) if missing else 'has ' + ', '.join(extra)}")
    return None


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
        """(cos, sin) (R, hd) of the R `positions`, from the head's own rotary module, tabled."""
        top = max(positions) + 1
        if top > self.cos.shape[0]:
            size = max(top, 2 * self.cos.shape[0], 256)
            ids = torch.arange(size, device=self.keys.device)[None]  # (1, size)
            cos, sin = head.rotary(self.keys[:, :1, :1], ids)  # (1, size, hd) each
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
