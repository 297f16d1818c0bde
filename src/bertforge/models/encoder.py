"""The one encoder core of bertforge: a stack of post-LN Transformer blocks (Vaswani et al. 2017, §3.1).

Each block is ``x = LN(x + MHA(x))`` then ``x = LN(x + W₂·act(W₁x))``. Every family (bert, roberta,
albert, electra, distilbert) is this module with a different :class:`~bertforge.config.ModelConfig`;
their differences live in the embeddings and in the weight names (``bertforge.hf``).

Cross-layer parameter sharing (ALBERT, Lan et al. 2019 §3.1): ``layer_sharing`` = ``none`` |
``attention`` (one attention block reused at every depth) | ``ffn`` | ``all`` (one whole block).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from ..config import ModelConfig
from .attention import MultiHeadAttention, get_activation, padding_mask_bias
from .embeddings import Embeddings, init_weights


@dataclass
class EncoderOutput:
    """``last_hidden_state`` (B, T, H); ``pooler_output`` (B, H) or None; ``hidden_states``: L+1 tensors
    (B, T, H), embeddings first; ``attentions``: L tensors (B, heads, T, T) of probabilities;
    ``attention_scores``: L tensors of pre-softmax scores (mask added); ``values``: L tensors
    (B, heads, T, d_k)."""

    last_hidden_state: torch.Tensor
    pooler_output: Optional[torch.Tensor] = None
    hidden_states: Optional[tuple] = None
    attentions: Optional[tuple] = None
    attention_scores: Optional[tuple] = None
    values: Optional[tuple] = None


class FeedForward(nn.Module):
    """Position-wise FFN(x) = W₂·act(W₁x + b₁) + b₂ (Vaswani et al. 2017, eq. 2). (B, T, H) → (B, T, H)."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str):
        super().__init__()
        self.intermediate = nn.Linear(hidden_size, intermediate_size)
        self.output = nn.Linear(intermediate_size, hidden_size)
        self.act = get_activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.intermediate.out_features == 0:
            return self.output.bias.expand_as(x)
        return self.output(self.act(self.intermediate(x)))


class EncoderLayer(nn.Module):
    """One post-LN block: self-attention → add & LayerNorm → FFN → add & LayerNorm."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        h = config.hidden_size
        self.attention = MultiHeadAttention(h, config.heads_of(layer), config.head_dim,
                                            config.attention_probs_dropout_prob)
        self.attention_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.ffn = FeedForward(h, config.intermediate_of(layer), config.hidden_act)
        self.ffn_norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, bias: Optional[torch.Tensor], explicit: bool = False,
                head_gates: Optional[torch.Tensor] = None, query_index: Optional[torch.Tensor] = None):
        if query_index is None:
            a, probs, scores, values = self.attention(x, bias, explicit=explicit, head_gates=head_gates)
        else:  # only these query positions are needed downstream (e.g. [CLS] in the last block)
            a, probs, scores, values = self._attend_subset(x[:, query_index], x, bias)
            x = x[:, query_index]
        x = self.attention_norm(x + self.dropout(a))
        x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, probs, scores, values

    def _attend_subset(self, q_in, kv_in, bias):
        """Self-attention where only some query rows are computed (keys/values from all positions)."""
        att = self.attention
        inner = att.num_heads * att.head_dim
        if att.num_heads == 0:
            b, t, _ = q_in.shape
            return att.out.bias.expand(b, t, att.hidden_size), None, None, None
        w_q, w_kv = att.qkv.weight[:inner], att.qkv.weight[inner:]
        b_q, b_kv = att.qkv.bias[:inner], att.qkv.bias[inner:]
        q = att._split(nn.functional.linear(q_in, w_q, b_q))
        k, v = nn.functional.linear(kv_in, w_kv, b_kv).split(inner, dim=-1)
        k, v = att._split(k), att._split(v)
        if bias is not None and bias.dtype != q.dtype:
            bias = bias.to(q.dtype)
        ctx = nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=bias, dropout_p=att.dropout if self.training else 0.0)
        b, t = q_in.shape[:2]
        ctx = ctx.transpose(1, 2).reshape(b, t, inner)
        return att.out(ctx), None, None, v


class Encoder(nn.Module):
    """Embeddings + L encoder blocks + optional pooler (tanh(W·h_[CLS]), Devlin et al. 2018 §3).

    ``forward(input_ids (B,T), attention_mask (B,T) 1=token/0=pad, token_type_ids (B,T))`` →
    :class:`EncoderOutput`. ``cls_only=True`` computes the last block only for position 0 (enough for a
    head on [CLS]; the returned ``last_hidden_state`` is then (B, 1, H)).
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        layers = [EncoderLayer(config, i) for i in range(config.num_hidden_layers)]
        s = config.layer_sharing
        for lyr in layers[1:]:
            if s in ("attention", "all"):
                lyr.attention, lyr.attention_norm = layers[0].attention, layers[0].attention_norm
            if s in ("ffn", "all"):
                lyr.ffn, lyr.ffn_norm = layers[0].ffn, layers[0].ffn_norm
        self.layers = nn.ModuleList(layers)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if config.add_pooling_layer else None
        init_weights(self, config.initializer_range)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, position_ids: Optional[torch.Tensor] = None,
                inputs_embeds: Optional[torch.Tensor] = None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                output_attention_scores: bool = False, output_values: bool = False,
                head_gates: Optional[torch.Tensor] = None, cls_only: bool = False) -> EncoderOutput:
        x = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        bias = padding_mask_bias(attention_mask, x.dtype)
        explicit = output_attentions or output_attention_scores
        hidden, attns, scores, values = [x], [], [], []
        n = len(self.layers)
        for i, layer in enumerate(self.layers):
            gates = head_gates[i] if head_gates is not None else None
            qi = torch.zeros(1, dtype=torch.long, device=x.device) \
                if (cls_only and i == n - 1 and not explicit and gates is None) else None
            x, p, s, v = layer(x, bias, explicit=explicit, head_gates=gates, query_index=qi)
            hidden.append(x)
            attns.append(p)
            scores.append(s)
            values.append(v)
        pooled = torch.tanh(self.pooler(x[:, 0])) if self.pooler is not None else None
        return EncoderOutput(
            last_hidden_state=x, pooler_output=pooled,
            hidden_states=tuple(hidden) if output_hidden_states else None,
            attentions=tuple(attns) if output_attentions else None,
            attention_scores=tuple(scores) if output_attention_scores else None,
            values=tuple(values) if output_values else None)

    def unique_layers(self) -> list:
        return list(dict.fromkeys(self.layers))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


__all__ = ["Encoder", "EncoderLayer", "EncoderOutput", "FeedForward", "field"]
