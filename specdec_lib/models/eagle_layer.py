"""The decoder layer an EAGLE head copies, written out per family (`layer_layout`, and the pieces of its decode).

`EagleHead.decode` (eagle_head.py) runs its one layer without the framework's per-call work, so it must know what
the layer computes. `layer_layout(layer)` reads that off the module tree once: Llama-style q/k/v/o projections and
a gated MLP, or Phi-3's fused qkv_proj / gate_up_proj (and partial rotary), Qwen3's and Gemma 3's per-head q/k
norms, Gemma's x * (1 + w) RMSNorms (found by probing what each norm computes, not by its class name) with the
four "sandwich" norms, Gemma 2's soft-capped attention logits (eager arithmetic: SDPA has no cap). It returns a
`Layout`, or a sentence naming the part it does not know (a missing norm, an extra module), which `eagle`
turns into a refusal naming the family and what to use instead.

Left out: norms other than RMSNorm; what a layer computes beyond its child modules (a bare parameter its
forward reads, e.g. attention sinks) is not inspected (biases ride in the projections).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class Layout:
    """What `EagleHead.decode` runs of a decoder layer (`layer_layout`): Llama's parts, or the variants below."""
    fused_qkv: bool  # Phi-3's qkv_proj (queries, keys, values stacked), else q_proj, k_proj, v_proj
    fused_mlp: bool  # Phi-3's gate_up_proj (gate, up stacked), else gate_proj, up_proj
    act: str  # the MLP's activation: act_fn, or activation_fn (Phi-3)
    qk_norm: bool  # per-head RMSNorms of queries and keys before the rotary (Qwen3, Gemma 3)
    sandwich: bool  # Gemma's four norms: after attention, before and after the MLP
    plus_one: bool  # the layer's RMSNorms scale by 1 + w (Gemma), else by w
    softcap: float | None  # cap * tanh(score / cap) of the attention logits (Gemma 2), None: plain scores
    final_plus_one: bool = False  # the head's final norm scales by 1 + w (set by EagleHead.layout)


def _rms_norm(norm, x: torch.Tensor, plus_one: bool = False) -> torch.Tensor:
    """An RMSNorm module's output in one fused call: normalised in float32, then scaled by w in x's dtype (Llama)
    or by 1 + w in float32 before the cast (Gemma), as each module does."""
    eps = norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps
    out = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)
    if plus_one:
        return (out * (1.0 + norm.weight.float())).to(x.dtype)
    return norm.weight * out.to(x.dtype)


def _norm_offset(norm) -> bool | None:
    """Whether `norm` scales by 1 + w (True: Gemma's) or by w (False: Llama's), read from what it computes on a
    probe; None where it is neither (a LayerNorm, a norm without weight, ...)."""
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or not (hasattr(norm, "variance_epsilon")
                                                                       or hasattr(norm, "eps")):
        return None
    x = torch.randn(3, weight.numel(), generator=torch.Generator().manual_seed(0)).to(weight)  # (3, d)
    with torch.no_grad():
        got = norm(x)
        for plus_one in (False, True):
            if torch.allclose(got, _rms_norm(norm, x, plus_one), rtol=1e-2, atol=1e-3):
                return plus_one
    return None


def _mlp(mlp, h: torch.Tensor, lay: Layout) -> torch.Tensor:
    """down(act(gate(h)) * up(h)): (R, d) -> (R, d)."""
    if lay.fused_mlp:
        gate, up = mlp.gate_up_proj(h).chunk(2, dim=-1)  # (R, I) each
    else:
        gate, up = mlp.gate_proj(h), mlp.up_proj(h)  # (R, I) each
    return mlp.down_proj(getattr(mlp, lay.act)(gate) * up)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary of x (heads, R, hd) at cos, sin (R, rotary dim): on the first rotary dims only where the rotary
    is partial (Phi-3's partial_rotary_factor), the rest passed through."""
    n = cos.shape[-1]
    if n == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    turned, kept = x[..., :n], x[..., n:]
    return torch.cat([turned * cos + _rotate_half(turned) * sin, kept], dim=-1)


def _softcapped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, sees: torch.Tensor,
                          scale: float, cap: float) -> torch.Tensor:
    """transformers' eager attention with soft-capped logits (Gemma 2), op for op: q (1, nh, R, hd); keys, values
    (1, nkv, K, hd); sees bool (R, K); returns (1, nh, R, hd). SDPA has no cap."""
    groups = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)  # (1, nh, K, hd)
    scores = torch.matmul(q, keys.transpose(2, 3)) * scale  # (1, nh, R, K)
    scores = torch.tanh(scores / cap) * cap
    scores = scores.masked_fill(~sees, torch.finfo(scores.dtype).min)  # eager adds the dtype's min: the same
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)  # eager's float32 softmax
    return torch.matmul(weights, values)


_LAYER = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
_SANDWICH = {"pre_feedforward_layernorm", "post_feedforward_layernorm"}


def layer_layout(layer) -> "Layout | str":
    """The `Layout` of a decoder layer (a head's is one of its target's family: `for_target`), or why
    `EagleHead.decode` cannot run it: a part missing, or one it does not run (any other child module but
    dropouts, which decode, run in eval mode, skips as forward does)."""
    def parts(module) -> set[str]:
        return {n for n, c in module.named_children() if not isinstance(c, nn.Dropout)} if module is not None else set()

    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    have_layer, have_attn, have_mlp = parts(layer), parts(attn), parts(mlp)
    fused_qkv, fused_mlp = "qkv_proj" in have_attn, "gate_up_proj" in have_mlp
    qk_norm = bool({"q_norm", "k_norm"} & have_attn)
    act = "activation_fn" if "activation_fn" in have_mlp else "act_fn"
    need = {"layer": _LAYER | (_SANDWICH if _SANDWICH & have_layer else set()),
            "attn": ({"qkv_proj"} if fused_qkv else {"q_proj", "k_proj", "v_proj"}) | {"o_proj"}
            | ({"q_norm", "k_norm"} if qk_norm else set()),
            "mlp": ({"gate_up_proj"} if fused_mlp else {"gate_proj", "up_proj"}) | {"down_proj", act}}
    have = dict(layer=have_layer, attn=have_attn, mlp=have_mlp)
    inner = dict(layer="", attn="self_attn.", mlp="mlp.")
    missing = [inner[m] + n for m in need for n in sorted(need[m] - have[m])]
    extra = [inner[m] + n for m in need for n in sorted(have[m] - need[m] - {"self_attn", "mlp"})]
    if attn is not None and not hasattr(attn, "scaling"):
        missing.append("self_attn.scaling")
    why = []
    if missing:
        why.append("it lacks " + ", ".join(missing))
    if extra:
        why.append("it has " + ", ".join(extra) + ", which decode does not run")
    if not why and not getattr(attn, "is_causal", True):
        why.append("its attention is bidirectional")
    if not why and qk_norm:
        hd = getattr(attn, "head_dim", None)
        if any(getattr(norm, "weight", torch.zeros(0)).numel() != hd for norm in (attn.q_norm, attn.k_norm)):
            why.append("its q_norm, k_norm span the whole projection, not one head")
    if not why:
        norms = [getattr(layer, n) for n in sorted(need["layer"] - {"self_attn", "mlp"})]
        norms += [attn.q_norm, attn.k_norm] if qk_norm else []
        styles = {_norm_offset(norm) for norm in norms}
        if None in styles or len(styles) > 1:
            why.append("its norms are not RMSNorms scaling alike by w or by 1 + w")
    if why:
        return f"EagleHead.decode cannot run {type(layer).__name__}: {'; '.join(why)}"
    return Layout(fused_qkv, fused_mlp, act, qk_norm, bool(_SANDWICH & have_layer), styles.pop(),
                  getattr(attn, "attn_logit_softcapping", None))


def decode_problem(layer) -> str | None:
    """Why `EagleHead.decode` cannot run a head whose layer is `layer` (`layer_layout`), or None."""
    found = layer_layout(layer)
    return found if isinstance(found, str) else None
