"""The ModernBERT family (Warner et al. 2024, "Smarter, Better, Faster, Longer", §2.1) on the one encoder core.

What differs from the post-LN BERT block of :mod:`.encoder`, each a small class here:

* **Embeddings** — token embeddings → LayerNorm → dropout; no absolute positions, no segments (§2.1.1).
* **Rotary positions** (RoPE, Su et al. 2021) on queries and keys, with a base frequency θ per attention kind:
  ``global_rope_theta`` (160,000) on global layers, ``local_rope_theta`` (10,000) on local ones (§2.1.2).
* **Alternating attention** — layer ``i`` attends globally when ``i % global_attn_every_n_layers == 0``, else
  to the positions within ``local_attention // 2`` on either side (|i − j| ≤ w: a 128-token window, §2.1.2).
* **Pre-LN** ``x = x + Attn(LN(x)); x = x + GeGLU(LN(x))`` (no LN before the first layer's attention: the
  embedding norm precedes it), then a **final LayerNorm**; **no biases** in linear layers or norms (§2.1.1).
* **GeGLU** feed-forward ``W_o·(GELU(x·W_a) ⊙ x·W_g)`` (Shazeer 2020), ``W_i = [W_a; W_g]``.
* **Unpadding** (§2.1.3): a padded batch runs every linear layer, norm and FFN on its N real tokens only —
  sequences of similar length are gathered into small padded groups for the attention product alone. Same numbers as the padded computation at
  every real token (:class:`Unpadded`; ``Encoder.unpad`` switches it, speed only).

The Hugging Face reference is ``transformers``' ``modeling_modernbert.py``; weight names map in
:mod:`bertforge.checkpoint.write`. The task heads' transform (Linear → act → LayerNorm,
``ModernBertPredictionHead``) is :class:`PredictionHead`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from .activations import get_activation
from .attention import MultiHeadAttention, linear, padding_mask_bias, rotate

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


@dataclass
class Unpadded:
    """Where the real tokens of a padded (B, T) batch are, and how attention runs on them.

    ``idx`` (N,): flat indices into B·T (row-major), so ``x.reshape(B·T, H)[idx]`` is the (N, H) packed batch
    and :meth:`pad` puts it back. For attention, sequences of similar length are grouped
    (:meth:`from_mask`): each group gathers its tokens into (n, T_g) with T_g its longest, so the product
    costs Σ n·T_g² instead of B·T² and most groups need no padding mask. ``groups``: per group
    ``(gather (n·T_g,) indices into the N packed rows + one zero row, slots (N_g,) of the real tokens
    among the n·T_g, their packed rows (N_g,), n, T_g, valid (n, T_g) bool or None)``. Any padding side."""

    idx: torch.Tensor
    batch: int
    length: int
    groups: list

    @staticmethod
    def from_mask(attention_mask: torch.Tensor, slack: float = 0.8) -> "Unpadded":
        """Groups: sequences sorted by length, longest first; a group takes the next sequence while it is at
        least ``slack`` × the group's longest (padding inside a group ≤ 1 − ``slack`` per sequence)."""
        b, t = attention_mask.shape
        flat = attention_mask.reshape(-1).bool()
        idx = flat.nonzero(as_tuple=True)[0]
        lengths = attention_mask.sum(1).tolist()
        starts = [0]
        for n in lengths[:-1]:
            starts.append(starts[-1] + n)
        order = sorted(range(b), key=lambda i: -lengths[i])
        groups, cur = [], []
        for i in order:
            if lengths[i] == 0:
                continue
            if cur and lengths[i] < slack * lengths[cur[0]]:
                groups.append(cur)
                cur = []
            cur.append(i)
        if cur:
            groups.append(cur)
        n_tok = int(idx.numel())
        dev = attention_mask.device
        plan = []
        for g in groups:
            tg = lengths[g[0]]
            pos = torch.arange(tg)
            gather = torch.full((len(g), tg), n_tok, dtype=torch.long)  # n_tok = the zero row
            for r, i in enumerate(g):
                gather[r, :lengths[i]] = starts[i] + pos[:lengths[i]]
            valid = gather != n_tok
            slots = valid.reshape(-1).nonzero(as_tuple=True)[0]
            rows = gather.reshape(-1)[slots]
            plan.append((gather.reshape(-1).to(dev), slots.to(dev), rows.to(dev), len(g), tg,
                         None if bool(valid.all()) else valid.to(dev)))
        return Unpadded(idx, b, t, plan)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, …) → (N, …)."""
        return x.reshape(self.batch * self.length, *x.shape[2:]).index_select(0, self.idx)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, …) → (B, T, …), zeros at padding."""
        out = x.new_zeros(self.batch * self.length, *x.shape[1:]).index_copy_(0, self.idx, x)
        return out.view(self.batch, self.length, *x.shape[1:])

    def group_biases(self, half_window: Optional[int], dtype) -> list:
        """Per group, the additive bias of its attention: padding inside the group, and for a local layer
        (``half_window``) the window; None where nothing is masked."""
        out = []
        for *_, n, tg, valid in self.groups:
            if half_window is None:
                out.append(padding_mask_bias(valid, dtype) if valid is not None else None)
            else:
                out.append(window_bias(valid, n, tg, half_window, dtype, self.idx.device))
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
        (:meth:`Unpadded.group_biases`) → (N, H). Q/K/V are projected and rotated on the N tokens; each group
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
        for (gather, slots, rows, m, tg, _), bias in zip(un.groups, biases):
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
    each attention kind to ``(bias, (cos, sin))`` (see :func:`encode`) → ``(x, probs, scores, values)``.
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
            bias = un.group_biases(None if kind == GLOBAL else half, dtype)
        elif kind == GLOBAL:
            bias = padding_mask_bias(attention_mask, dtype)
        else:
            bias = window_bias(attention_mask, b, t, half, dtype, device)
        out[kind] = (bias, encoder.rotary(positions, kind, dtype))
    return out


def encode(encoder, x: torch.Tensor, attention_mask: Optional[torch.Tensor], position_ids: Optional[torch.Tensor],
           output_hidden_states: bool = False, output_attentions: bool = False,
           output_attention_scores: bool = False, output_values: bool = False,
           head_gates: Optional[torch.Tensor] = None, cls_only: bool = False,
           output_rows: Optional[torch.Tensor] = None):
    """The layers of a ModernBERT :class:`~.encoder.Encoder` on embeddings ``x`` (B, T, H), then the final
    norm; arguments as :meth:`Encoder.forward`. Returns ``(last_hidden_state, hidden_states, attentions,
    attention_scores, values)``, each per-layer tuple None unless asked for (``hidden_states[-1]`` is the
    normed last state, as ``last_hidden_state``). A padded batch runs unpadded (:class:`Unpadded`) when ``encoder.unpad`` is
    True and no per-layer output is asked for (not while tracing for export); positions default to 0…T−1
    in every row (right padding), as transformers'."""
    b, t, _ = x.shape
    explicit = output_attentions or output_attention_scores
    per_layer = explicit or output_hidden_states or output_values or head_gates is not None
    if per_layer or cls_only:
        output_rows = None
    if position_ids is None:
        position_ids = torch.arange(t, device=x.device)[None, :].expand(b, t)
    un = None
    if (encoder.unpad and attention_mask is not None and not per_layer and not torch.jit.is_tracing()
            and not torch.compiler.is_compiling() and not torch.onnx.is_in_onnx_export()
            and not bool(attention_mask.all())):
        un = Unpadded.from_mask(attention_mask)
        x, positions = un.pack(x), un.pack(position_ids)
    else:
        positions = position_ids
    inputs = layer_inputs(encoder, attention_mask, positions, b, t, x.dtype, x.device, un)
    hidden, attns, scores, values = [x], [], [], []
    for i, layer in enumerate(encoder.layers):
        gates = head_gates[i] if head_gates is not None else None
        x, p, s, v = layer(x, inputs, explicit=explicit, head_gates=gates, unpadded=un)
        hidden.append(x)
        attns.append(p)
        scores.append(s)
        values.append(v)
    if un is not None:
        x = un.pad(x)
    if cls_only and not explicit and head_gates is None:
        x = x[:, :1]
    elif output_rows is not None:
        x = x[output_rows]
    x = hidden[-1] = encoder.final_norm(x)
    return (x, tuple(hidden) if output_hidden_states else None, tuple(attns) if output_attentions else None,
            tuple(scores) if output_attention_scores else None, tuple(values) if output_values else None)


__all__ = ["ModernBertEmbeddings", "ModernBertLayer", "RotaryAttention", "GatedFeedForward", "PredictionHead",
           "Rotary", "Unpadded", "encode", "init_modernbert", "layer_inputs", "window_bias", "GLOBAL", "LOCAL"]
