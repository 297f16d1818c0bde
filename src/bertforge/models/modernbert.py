"""The ModernBERT family (Warner et al. 2024, "Smarter, Better, Faster, Longer", §2.1): :class:`ModernBertEncoder`.

An encoder of its own beside the post-LN :class:`~.encoder.Encoder`, with the same call, the same
:class:`~.output.Features` request and :class:`~.output.EncoderOutput` (both on :class:`~.encoder.EncoderBase`).
What differs from the post-LN BERT block, each a small class here:

* **Embeddings** — token embeddings → LayerNorm → dropout; no absolute positions, no segments (§2.1.1).
* **Rotary positions** (RoPE, Su et al. 2021) on queries and keys, with a base frequency θ per attention kind:
  ``global_rope_theta`` (160,000) on global layers, ``local_rope_theta`` (10,000) on local ones (§2.1.2).
* **Alternating attention** — layer ``i`` attends globally when ``i % global_attn_every_n_layers == 0``, else
  to the positions within ``local_attention // 2`` on either side (|i − j| ≤ w: a 128-token window, §2.1.2).
* **Pre-LN** ``x = x + Attn(LN(x)); x = x + GeGLU(LN(x))`` (no LN before the first layer's attention: the
  embedding norm precedes it), then a **final LayerNorm**; **no biases** in linear layers or norms (§2.1.1).
* **GeGLU** feed-forward ``W_o·(GELU(x·W_a) ⊙ x·W_g)`` (Shazeer 2020), ``W_i = [W_a; W_g]``.
* **Unpadding** (§2.1.3): a padded batch runs every linear layer, norm and FFN on its N real tokens only —
  sequences of similar length are gathered into small padded groups for the attention product alone. Same
  numbers as the padded computation at every real token (:class:`~.unpad.Unpadded`, shared with the CPU kernels; ``ModernBertEncoder.unpad`` switches
  it, speed only).

The Hugging Face reference is ``transformers``' ``modeling_modernbert.py``; weight names map in
:mod:`bertforge.checkpoint.write`. The task heads' transform (Linear → act → LayerNorm,
``ModernBertPredictionHead``) is :class:`PredictionHead`.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from .activations import get_activation
from .attention import MultiHeadAttention, linear, padding_mask_bias, rotate
from .embeddings import init_weights
from .encoder import EncoderBase
from .output import EncoderOutput, Features
from .unpad import Unpadded

GLOBAL, LOCAL = "full_attention", "sliding_attention"


def layer_norm(config: ModelConfig, size: Optional[int] = None) -> nn.LayerNorm:
    return nn.LayerNorm(size or config.hidden_size, eps=config.layer_norm_eps, bias=config.norm_bias)


class ModernBertEmbeddings(nn.Module):
    """``dropout(LN(token(x)))`` (B, T) → (B, T, H): ModernBERT has no position or segment embeddings (RoPE
    acts in the attention). ``token_type_ids`` and ``position_ids`` are accepted and ignored here."""

    token_type_embeddings = None  # no segments

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.norm = layer_norm(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.max_positions = config.max_position_embeddings

    def forward(self, input_ids, token_type_ids=None, position_ids=None, inputs_embeds=None) -> torch.Tensor:
        x = self.token_lookup(input_ids) if inputs_embeds is None else inputs_embeds
        return self.dropout(self.norm(x))

    def token_lookup(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.word_embeddings(input_ids)


class Rotary(nn.Module):
    """cos/sin tables of RoPE for each attention kind: inverse frequencies ``θ^(−2i/d)``, i < d/2 (Su et al.
    2021 eq. 15), computed as transformers does (FP32), so rotations match bit for bit. Not saved."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        d = config.head_dim
        for kind, theta in ((GLOBAL, config.global_rope_theta), (LOCAL, config.local_rope_theta)):
            inv = 1.0 / (float(theta) ** (torch.arange(0, d, 2, dtype=torch.float) / d))
            self.register_buffer(f"{kind}_inv_freq", inv, persistent=False)

    def forward(self, positions: torch.Tensor, kind: str, dtype: torch.dtype) -> tuple:
        """``positions`` (…) integer → ``(cos, sin)`` (…, d_k) in ``dtype``."""
        freqs = positions[..., None].float() * getattr(self, f"{kind}_inv_freq")
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def window_bias(attention_mask: Optional[torch.Tensor], b: int, t: int, half_window: int, dtype, device):
    """Additive bias (B or 1, 1, T, T) of a local layer: 0 where |i − j| ≤ ``half_window`` and key j is a token,
    dtype-min elsewhere. A window that covers the sequence (``half_window ≥ T − 1``) is the global padding bias
    (B, 1, 1, T) or None: exactly global attention."""
    if half_window >= t - 1:
        return padding_mask_bias(attention_mask, dtype)
    pos = torch.arange(t, device=device)
    allowed = ((pos[:, None] - pos[None, :]).abs() <= half_window)[None, None]  # (1, 1, T, T)
    if attention_mask is not None:
        allowed = allowed & attention_mask.bool()[:, None, None, :]
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)


def group_biases(un: Unpadded, half_window: Optional[int], dtype) -> list:
    """Per group of :meth:`Unpadded.groups`, the additive bias of its attention: padding inside the group, and
    for a local layer (``half_window``) the window; None where nothing is masked."""
    out = []
    for *_, n, tg, valid in un.groups():
        if half_window is None:
            out.append(padding_mask_bias(valid, dtype) if valid is not None else None)
        else:
            out.append(window_bias(valid, n, tg, half_window, dtype, un.idx.device))
    return out


class RotaryAttention(MultiHeadAttention):
    """Self-attention without biases whose queries and keys are rotated (RoPE). ``forward`` is
    :class:`~.attention.MultiHeadAttention`'s with ``rope=(cos, sin)``; :meth:`forward_unpadded` takes the
    packed (N, H) tokens of :class:`Unpadded`. Its output dropout is ModernBERT's ``out_drop``."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__(config.hidden_size, config.heads_of(layer), config.head_dim,
                         config.attention_probs_dropout_prob, bias=False)

    def forward_unpadded(self, x: torch.Tensor, biases: list, rope: tuple, un: Unpadded) -> torch.Tensor:
        """``x`` (N, H) packed tokens, ``rope`` (cos, sin) each (N, d_k), ``biases`` one per group of ``un``
        (:func:`group_biases`) → (N, H). Q/K/V are projected and rotated on the N tokens; each group
        of similar-length sequences is gathered to (n, heads, T_g, d_k) for its attention product."""
        n = x.shape[0]
        if self.num_heads == 0:
            return x.new_zeros(n, self.hidden_size)
        h, d = self.num_heads, self.head_dim
        qkv = self.qkv(x).view(n, 3, h, d)
        cos, sin = rope[0][:, None, None], rope[1][:, None, None]  # (N, 1, 1, d_k)
        qkv = torch.cat((rotate(qkv[:, :2], cos, sin), qkv[:, 2:]), dim=1)  # queries and keys rotated
        qkv = torch.cat((qkv, qkv.new_zeros(1, 3, h, d)))  # row N: zeros for the slots past a sequence's end
        ctx = qkv.new_empty(n, h * d)
        p = self.dropout.p if self.training else 0.0
        for (gather, slots, rows, m, tg, _), bias in zip(un.groups(), biases):
            q, k, v = qkv.index_select(0, gather).view(m, tg, 3, h, d).permute(2, 0, 3, 1, 4).unbind(0)
            if bias is not None and bias.dtype != q.dtype:
                bias = bias.to(q.dtype)
            c = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p)  # (m, heads, T_g, d_k)
            c = c.transpose(1, 2).reshape(m * tg, h * d)
            ctx = ctx.index_copy(0, rows, c.index_select(0, slots))
        return self.out(ctx)


class GatedFeedForward(nn.Module):
    """GeGLU: ``W_o·drop(act(x·W_a) ⊙ x·W_g)`` with ``wi = [W_a; W_g]`` (H → 2I) and ``wo`` (I → H), no biases
    (Shazeer 2020, eq. 6; ModernBERT §2.1.1). (…, H) → (…, H)."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str, dropout: float):
        super().__init__()
        self.wi = linear(hidden_size, 2 * intermediate_size, bias=False)
        self.wo = linear(intermediate_size, hidden_size, bias=False)
        self.act = get_activation(act)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, gate = self.wi(x).chunk(2, dim=-1)
        return self.wo(self.dropout(self.act(a) * gate))


class ModernBertLayer(nn.Module):
    """One pre-LN block: ``x + drop(Attn(LN(x)))`` then ``x + GeGLU(LN(x))``; layer 0 has no attention norm.

    ``forward(x (B, T, H) or packed (N, H), inputs, explicit, head_gates, unpadded)`` where ``inputs`` maps
    each attention kind to ``(bias, (cos, sin))`` (see :func:`layer_inputs`) → ``(x, probs, scores, values)``.
    """

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.attention_type = config.layer_type(layer)
        self.attention_norm = nn.Identity() if layer == 0 else layer_norm(config)
        self.attention = RotaryAttention(config, layer)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)
        self.ffn_norm = layer_norm(config)
        self.ffn = GatedFeedForward(config.hidden_size, config.intermediate_of(layer), config.hidden_act,
                                    config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, inputs: dict, explicit: bool = False,
                head_gates: Optional[torch.Tensor] = None, unpadded: Optional[Unpadded] = None):
        bias, rope = inputs[self.attention_type]
        if unpadded is not None:
            a, probs, scores, values = self.attention.forward_unpadded(self.attention_norm(x), bias, rope,
                                                                       unpadded), None, None, None
        else:
            a, probs, scores, values = self.attention(self.attention_norm(x), bias, explicit=explicit,
                                                      head_gates=head_gates, rope=rope)
        x = x + self.dropout(a)
        x = x + self.ffn(self.ffn_norm(x))
        return x, probs, scores, values


class PredictionHead(nn.Module):
    """ModernBERT's head transform ``LN(act(W·h))`` (H → H, no bias; ``ModernBertPredictionHead``), read by
    the masked-LM, sequence and token classification heads. (…, H) → (…, H)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.act = get_activation(config.classifier_activation)
        self.norm = layer_norm(config)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(h)))

    @staticmethod
    def hf_keys(config: ModelConfig, ours: str = "transform.", theirs: str = "head.") -> dict:
        keys = {f"{ours}dense.weight": f"{theirs}dense.weight", f"{ours}norm.weight": f"{theirs}norm.weight"}
        if config.norm_bias:
            keys[f"{ours}norm.bias"] = f"{theirs}norm.bias"
        return keys


def init_modernbert(module: nn.Module, config: ModelConfig) -> None:
    """ModernBERT's initialisation (transformers' ``_init_weights``): truncated normals at ±2σ, σ =
    ``initializer_range`` for embeddings and input projections, σ/√(2L) for the output projections
    (attention ``out``, FFN ``wo``, head ``dense``); LayerNorms at 1 (bias 0)."""
    std = config.initializer_range
    out_std = std / math.sqrt(2.0 * max(1, config.num_hidden_layers))

    def trunc(w, s):
        nn.init.trunc_normal_(w, 0.0, s, -2 * s, 2 * s)

    for m in module.modules():
        if isinstance(m, ModernBertEmbeddings):
            trunc(m.word_embeddings.weight, std)
            if m.word_embeddings.padding_idx is not None:
                with torch.no_grad():
                    m.word_embeddings.weight[m.word_embeddings.padding_idx].zero_()
        elif isinstance(m, RotaryAttention):
            trunc(m.qkv.weight, std)
            trunc(m.out.weight, out_std)
        elif isinstance(m, GatedFeedForward):
            trunc(m.wi.weight, std)
            trunc(m.wo.weight, out_std)
        elif isinstance(m, PredictionHead):
            trunc(m.dense.weight, out_std)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def layer_inputs(encoder, attention_mask, positions: torch.Tensor, b: int, t: int, dtype, device,
                 un: Optional[Unpadded] = None) -> dict:
    """Attention kind → ``(bias, (cos, sin))`` for the layers of ``encoder``: the global layers' padding bias
    and the local layers' window bias (:func:`window_bias`) — unpadded (``un``), one bias per group of
    :class:`Unpadded` —, each with the RoPE tables of its θ at ``positions`` ((B, T), or (N,) unpadded)."""
    kinds = {layer.attention_type for layer in encoder.layers}
    half = encoder.config.local_attention // 2
    out = {}
    for kind in kinds:
        if un is not None:
            bias = group_biases(un, None if kind == GLOBAL else half, dtype)
        elif kind == GLOBAL:
            bias = padding_mask_bias(attention_mask, dtype)
        else:
            bias = window_bias(attention_mask, b, t, half, dtype, device)
        out[kind] = (bias, encoder.rotary(positions, kind, dtype))
    return out


class ModernBertEncoder(EncoderBase):
    """ModernBERT: embeddings (LN, no positions) + L pre-LN layers alternating global and local attention, each
    rotating queries and keys (RoPE), + a final LayerNorm. The call is :class:`~.encoder.EncoderBase`'s; a
    ``cls_only`` / ``rows`` request selects after the final norm, and ``hidden_states[-1]`` is the normed last
    state, as ``last_hidden_state``. No pooler output (ModernBERT's heads pool themselves).

    A padded batch runs unpadded (:class:`~.unpad.Unpadded`: linear layers, norms and GeGLU on the N real
    tokens, attention in groups of similar length) when :attr:`unpad` is True and no per-layer output is asked
    for (not while tracing, compiling or exporting); positions default to 0…T−1 in every row (right padding),
    as transformers'. Same numbers as the padded computation at every real token.
    """

    families = ("modernbert",)

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.embeddings = ModernBertEmbeddings(config)
        layers = [ModernBertLayer(config, i) for i in range(config.num_hidden_layers)]
        self.layers = nn.ModuleList(self.share_layers(layers, config.layer_sharing))
        # built as transformers' checkpoints may carry one (add_pooling_layer); ModernBERT's heads never read it
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if config.add_pooling_layer else None
        self.rotary = Rotary(config)
        self.final_norm = layer_norm(config)
        init_weights(self, config.initializer_range)
        init_modernbert(self, config)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, position_ids: Optional[torch.Tensor] = None,
                features: Optional[Features] = None) -> EncoderOutput:
        req = features or Features()
        self._check_inputs(input_ids, attention_mask, token_type_ids)
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        b, t, _ = x.shape
        if position_ids is None:
            position_ids = torch.arange(t, device=x.device)[None, :].expand(b, t)
        un = None
        if (self.unpad and attention_mask is not None and not req.per_layer and not torch.jit.is_tracing()
                and not torch.compiler.is_compiling() and not torch.onnx.is_in_onnx_export()
                and not bool(attention_mask.all())):
            un = Unpadded.from_mask(attention_mask)
            x, positions = un.pack(x), un.pack(position_ids)
        else:
            positions = position_ids
        inputs = layer_inputs(self, attention_mask, positions, b, t, x.dtype, x.device, un)
        hidden, attns, scores, values = [x], [], [], []
        for i, layer in enumerate(self.layers):
            x, p, s, v = layer(x, inputs, explicit=req.explicit, head_gates=req.gates(i), unpadded=un)
            hidden.append(x)
            attns.append(p)
            scores.append(s)
            values.append(v)
        if un is not None:
            x = un.pad(x)
        rows = req.last_rows
        if req.last_cls:
            x = x[:, :1]
        elif rows is not None:
            x = x[rows]
        x = hidden[-1] = self.final_norm(x)
        return req.output(x, None, hidden, attns, scores, values)


__all__ = ["ModernBertEmbeddings", "ModernBertEncoder", "ModernBertLayer", "RotaryAttention", "GatedFeedForward",
           "PredictionHead", "Rotary", "group_biases", "init_modernbert", "layer_inputs", "window_bias", "GLOBAL",
           "LOCAL"]
