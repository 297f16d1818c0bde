"""The one encoder core of bertforge: a stack of post-LN Transformer blocks (Vaswani et al. 2017, §3.1).

Each block is ``x = LN(x + MHA(x))`` then ``x = LN(x + W₂·act(W₁x))``. Every family (bert, roberta,
albert, electra, distilbert) is this module with a different :class:`~bertforge.config.ModelConfig`;
their differences live in the embeddings and in the weight names (``bertforge.checkpoint.read``).

ModernBERT (``model_type="modernbert"``, Warner et al. 2024) is the same Encoder with its own embeddings,
pre-LN layers (RoPE, GeGLU, local/global attention) and a final norm: :mod:`.modernbert`.

Cross-layer parameter sharing (ALBERT, Lan et al. 2019 §3.1): ``layer_sharing`` = ``none`` |
``attention`` (one attention block reused at every depth) | ``ffn`` | ``all`` (one whole block).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from ..config import ModelConfig
from .activations import get_activation
from .attention import MultiHeadAttention, linear, padding_mask_bias
from .embeddings import Embeddings, init_weights
from . import modernbert


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
    """Position-wise FFN(x) = W₂·act(W₁x + b₁) + b₂ (Vaswani et al. 2017, eq. 2). (…, H) → (…, H)."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str):
        super().__init__()
        self.intermediate = linear(hidden_size, intermediate_size)
        self.output = linear(intermediate_size, hidden_size)
        self.act = get_activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.intermediate.out_features == 0:  # every unit pruned: only the output bias is left
            return self.output.bias.expand_as(x)
        return self.output(self.act(self.intermediate(x)))


class EncoderLayer(nn.Module):
    """One post-LN block: self-attention → add & LayerNorm → FFN → add & LayerNorm.

    ``forward(x (B, T, H), bias (B, 1, 1, T) additive or None, explicit, head_gates)`` →
    ``(x (B, T, H), probs, scores, values)`` as :class:`~.attention.MultiHeadAttention` returns them.
    """

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
                head_gates: Optional[torch.Tensor] = None):
        a, probs, scores, values = self.attention(x, bias, explicit=explicit, head_gates=head_gates)
        x = self.attention_norm(x + self.dropout(a))
        x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, probs, scores, values


class Encoder(nn.Module):
    """Embeddings + L encoder blocks + optional pooler (tanh(W·h_[CLS]), Devlin et al. 2018 §3).

    ``forward(input_ids (B,T), attention_mask (B,T) 1=token/0=pad, token_type_ids (B,T))`` →
    :class:`EncoderOutput`. Two arguments serve heads that read only some positions of the last block:
    ``cls_only=True`` returns ``last_hidden_state`` at position 0 only, (B, 1, H) (a head on [CLS]; ignored
    when attentions, scores or head gates are asked for); ``output_rows`` (B, T) bool returns it at those
    positions only, (N, H) in row-major order, with no pooler output (the masked tokens of MLM; ignored
    with ``cls_only`` or any per-layer output). Here every position is computed and then selected; a faster
    implementation of the layers may compute only what is returned. Positions where ``attention_mask`` is 0
    hold no defined value.
    """

    #: ModernBERT: run a padded batch on its real tokens only (:class:`.modernbert.Unpadded`; speed only)
    unpad = True

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        modern = config.model_type == "modernbert"
        self.embeddings = modernbert.ModernBertEmbeddings(config) if modern else Embeddings(config)
        layer_class = modernbert.ModernBertLayer if modern else EncoderLayer
        layers = [layer_class(config, i) for i in range(config.num_hidden_layers)]
        s = config.layer_sharing
        for lyr in layers[1:]:
            if s in ("attention", "all"):
                lyr.attention, lyr.attention_norm = layers[0].attention, layers[0].attention_norm
            if s in ("ffn", "all"):
                lyr.ffn, lyr.ffn_norm = layers[0].ffn, layers[0].ffn_norm
        self.layers = nn.ModuleList(layers)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if config.add_pooling_layer else None
        self.rotary = modernbert.Rotary(config) if modern else None
        self.final_norm = modernbert.layer_norm(config) if modern else None
        init_weights(self, config.initializer_range)
        if modern:
            modernbert.init_modernbert(self, config)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, position_ids: Optional[torch.Tensor] = None,
                inputs_embeds: Optional[torch.Tensor] = None,
                output_hidden_states: bool = False, output_attentions: bool = False,
                output_attention_scores: bool = False, output_values: bool = False,
                head_gates: Optional[torch.Tensor] = None, cls_only: bool = False,
                output_rows: Optional[torch.Tensor] = None) -> EncoderOutput:
        if inputs_embeds is None:
            self._check_inputs(input_ids, attention_mask, token_type_ids)
        x = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        if self.rotary is not None:  # ModernBERT: RoPE, local/global pre-LN layers, final norm, unpadding
            last, hidden, attns, scores, values = modernbert.encode(
                self, x, attention_mask, position_ids, output_hidden_states, output_attentions,
                output_attention_scores, output_values, head_gates, cls_only, output_rows)
            return EncoderOutput(last_hidden_state=last, hidden_states=hidden, attentions=attns,
                                 attention_scores=scores, values=values)
        bias = padding_mask_bias(attention_mask, x.dtype)
        explicit = output_attentions or output_attention_scores
        per_layer = explicit or output_hidden_states or output_values or head_gates is not None
        hidden, attns, scores, values = [x], [], [], []
        for i, layer in enumerate(self.layers):
            gates = head_gates[i] if head_gates is not None else None
            x, p, s, v = layer(x, bias, explicit=explicit, head_gates=gates)
            hidden.append(x)
            attns.append(p)
            scores.append(s)
            values.append(v)
        # a head that reads only [CLS] (cls_only) or only some rows (output_rows) gets just those
        if per_layer or cls_only:
            output_rows = None
        if self.layers and cls_only and not explicit and head_gates is None:
            x = hidden[-1] = x[:, :1]
        elif self.layers and output_rows is not None:
            x = hidden[-1] = x[output_rows]
        pooled = torch.tanh(self.pooler(x[:, 0])) if (self.pooler is not None and output_rows is None) else None
        return EncoderOutput(
            last_hidden_state=x, pooler_output=pooled,
            hidden_states=tuple(hidden) if output_hidden_states else None,
            attentions=tuple(attns) if output_attentions else None,
            attention_scores=tuple(scores) if output_attention_scores else None,
            values=tuple(values) if output_values else None)

    def _check_inputs(self, input_ids, attention_mask, token_type_ids=None) -> None:
        """ValueError, naming the fix, for ids that are not a (B, T) integer tensor, a mask or segment ids
        of another shape, T = 0 or beyond the position embeddings, and (on CPU, outside tracing / compiling)
        ids outside the vocabulary or segment ids outside ``type_vocab_size`` (a bare IndexError otherwise)."""
        if not torch.is_tensor(input_ids) or input_ids.dim() != 2 or input_ids.is_floating_point():
            what = (f"a {input_ids.dim()}-D {input_ids.dtype} tensor" if torch.is_tensor(input_ids)
                    else type(input_ids).__name__)
            raise ValueError(f"input_ids must be an integer tensor of shape (batch, seq_len), got {what}; "
                             f"e.g. torch.tensor([[101, 2023, 102]])")
        if attention_mask is not None and tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids "
                             f"{tuple(input_ids.shape)}; give one 0/1 per token")
        tracing = torch.jit.is_tracing()  # shapes are traced tensors there: the export checked them already
        if not tracing and token_type_ids is not None and tuple(token_type_ids.shape) != tuple(input_ids.shape):
            raise ValueError(f"token_type_ids has shape {tuple(token_type_ids.shape)} but input_ids "
                             f"{tuple(input_ids.shape)}; give one segment id per token")
        limit = self.embeddings.max_positions
        if input_ids.shape[1] > limit:
            raise ValueError(f"sequence length {input_ids.shape[1]} exceeds the model's {limit} positions; "
                             f"truncate the input to {limit} tokens")
        if not tracing and input_ids.shape[1] == 0:
            raise ValueError(f"input_ids of shape {tuple(input_ids.shape)} hold no token; give at least one")
        if tracing or torch.compiler.is_compiling() or input_ids.device.type != "cpu" or input_ids.numel() == 0:
            return  # value checks read the data: not in an exported/compiled graph, no accelerator sync
        vocab = self.embeddings.word_embeddings.num_embeddings
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(f"input_ids hold id {hi if hi >= vocab else lo}, outside the vocabulary 0…{vocab - 1}; "
                             f"encode the text with the model's own tokenizer")
        types = self.embeddings.token_type_embeddings
        if token_type_ids is not None and types is not None:
            lo, hi = int(token_type_ids.min()), int(token_type_ids.max())
            if lo < 0 or hi >= types.num_embeddings:
                raise ValueError(f"token_type_ids hold {hi if hi >= types.num_embeddings else lo}; this model "
                                 f"has segment ids 0…{types.num_embeddings - 1}")

    def unique_layers(self) -> list:
        return list(dict.fromkeys(self.layers))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


__all__ = ["Encoder", "EncoderLayer", "EncoderOutput", "FeedForward"]
