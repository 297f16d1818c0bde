"""The MobileBERT family (Sun et al. 2020, "MobileBERT: a Compact Task-Agnostic BERT for Resource-Limited
Devices", §3.1–3.2): :class:`MobileBertEncoder`.

An encoder of its own beside the post-LN :class:`~.encoder.Encoder`, with the same call, the same
:class:`~.output.Features` request and :class:`~.output.EncoderOutput` (both on :class:`~.encoder.EncoderBase`).
A block is thin inside and wide between blocks:

* **Embedding factorisation with a 3-token convolution** (§3.2 "Embedding factorization"): token embeddings of
  size E; each position is the concatenation ``[e_{t+1}; e_t; e_{t−1}]`` (zeros past either end) projected
  3E → H (``trigram_input``), then positions and segments (H wide) are added and normalised.
* **Bottlenecks** (§3.1, Fig. 1c): a block reads the inter-block state x (B, T, H), projects it to the
  intra-block width B (``intra_bottleneck_size``) — queries and keys from one shared projection
  (``key_query_shared_bottleneck``), values from x itself — and projects its result back B → H with a
  residual on x. ``use_bottleneck_attention`` takes queries, keys and values from the input bottleneck.
* **Stacked FFNs** (§3.2 "Stacked feed-forward networks"): ``num_feedforward_networks`` residual FFNs (B → I →
  B) after the attention, each followed by a norm.
* **NoNorm** (§3.2 "Operational optimizations"): ``x ∘ γ + β`` in place of LayerNorm
  (``normalization_type="no_norm"``), and **ReLU** in place of GELU (``hidden_act="relu"``).
* The **IB-BERT teacher** (§3.1, Fig. 1b) is the same block with a wide bottleneck (e.g. H = 512, B = 1024,
  one FFN, LayerNorm): ``normalization_type="layer_norm"``, ``num_feedforward_networks=1``.

``hidden_states`` are the inter-block states (H wide), embeddings first — the feature maps MobileBERT's
knowledge transfer matches (§3.3); ``attentions`` are (B, heads, T, T) with ``heads`` dividing B.

The Hugging Face reference is ``transformers``' ``modeling_mobilebert.py`` (``MobileBert*``); weight names map
in :mod:`bertforge.checkpoint.write`. As there, the embedding norm and the last FFN's norm use LayerNorm's
default ε (1e-5) and every other norm ``layer_norm_eps``.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from .activations import get_activation
from .attention import attention_scores, linear, padding_mask_bias
from .embeddings import init_weights
from .encoder import EncoderBase
from .output import EncoderOutput, Features

DEFAULT_EPS = 1e-5  # nn.LayerNorm's, which transformers' MobileBERT uses where it passes no eps


class NoNorm(nn.Module):
    """``x ∘ γ + β`` over the last dimension (Sun et al. 2020 §3.2): a LayerNorm without the statistics. (…, n)."""

    def __init__(self, size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.bias = nn.Parameter(torch.zeros(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight + self.bias


def norm(config: ModelConfig, size: int, eps: Optional[float] = None) -> nn.Module:
    """The family's norm of width ``size``: :class:`NoNorm` or ``nn.LayerNorm`` (ε = ``eps`` or 1e-5)."""
    if config.normalization_type == "no_norm":
        return NoNorm(size)
    return nn.LayerNorm(size, eps=DEFAULT_EPS if eps is None else eps)


class MobileBertEmbeddings(nn.Module):
    """``norm(W·[e_{t+1}; e_t; e_{t−1}] + P_t + S_t)`` then dropout: (B, T) ids → (B, T, H) (§3.2)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        e, h = config.embedding_size, config.hidden_size
        self.trigram = config.trigram_input
        self.word_embeddings = nn.Embedding(config.vocab_size, e, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, h)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, h) if config.type_vocab_size else None
        self.transformation = nn.Linear(3 * e if self.trigram else e, h)
        self.project = self.trigram or e != h  # transformers applies the projection only then
        self.norm = norm(config, h)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.max_positions = config.max_position_embeddings

    def token_lookup(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.word_embeddings(input_ids)

    def forward(self, input_ids, token_type_ids=None, position_ids=None, inputs_embeds=None) -> torch.Tensor:
        x = self.token_lookup(input_ids) if inputs_embeds is None else inputs_embeds
        if self.trigram:  # the 3-token convolution: next, this, previous token (zero past the ends)
            x = torch.cat([F.pad(x[:, 1:], (0, 0, 0, 1)), x, F.pad(x[:, :-1], (0, 0, 1, 0))], dim=2)
        if self.project:
            x = self.transformation(x)
        t = x.shape[1]
        if position_ids is None:
            position_ids = torch.arange(t, device=x.device)[None]
        x = x + self.position_embeddings(position_ids)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros(x.shape[:2], dtype=torch.long, device=x.device)
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.norm(x))


class Bottleneck(nn.Module):
    """``norm(W·x)``: the inter-block state (…, H) → the intra-block width (…, B) (§3.1)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intra_bottleneck_size)
        self.norm = norm(config, config.intra_bottleneck_size, config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.dense(x))


class BottleneckAttention(nn.Module):
    """Multi-head attention whose queries, keys and values may come from different inputs (queries and keys
    from the shared bottleneck, values from the inter-block state), with the output projection back to the
    intra-block width. ``forward(q_in, k_in, v_in (B, T, ·), bias, explicit, head_gates)`` →
    ``(output (B, T, B), probs, scores, values (B, heads, T, d_k))`` as :class:`~.attention.MultiHeadAttention`."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        inner_in = config.inner_size
        self.num_heads, self.head_dim = config.heads_of(layer), config.head_dim
        inner = self.num_heads * self.head_dim
        v_in = inner_in if (config.use_bottleneck_attention or not config.use_bottleneck) else config.hidden_size
        self.query, self.key = linear(inner_in, inner), linear(inner_in, inner)
        self.value = linear(v_in, inner)
        self.out = linear(inner, inner_in)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, q_in, k_in, v_in, bias=None, explicit: bool = False, head_gates=None):
        b, t, _ = q_in.shape
        if self.num_heads == 0:
            return self.out.bias.expand(b, t, -1).to(q_in.dtype), None, None, None
        q, k, v = self._split(self.query(q_in)), self._split(self.key(k_in)), self._split(self.value(v_in))
        probs = scores = None
        if explicit or head_gates is not None:
            scores = attention_scores(q, k, bias)
            probs = torch.softmax(scores, dim=-1)
            context = self.dropout(probs) @ v
            if head_gates is not None:
                g = head_gates.view(-1, self.num_heads, 1, 1) if head_gates.dim() == 2 \
                    else head_gates.view(1, -1, 1, 1)
                context = context * g.to(context.dtype)
        else:
            if bias is not None and bias.dtype != q.dtype:
                bias = bias.to(q.dtype)
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias,
                                                     dropout_p=self.dropout.p if self.training else 0.0)
        context = context.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)
        return self.out(context), probs, scores, v


class StackedFFN(nn.Module):
    """One of the stacked FFNs: ``norm(x + W₂·act(W₁·x))``, (…, B) → (…, B) (§3.2)."""

    def __init__(self, config: ModelConfig, intermediate: int, eps: Optional[float]):
        super().__init__()
        self.intermediate = linear(config.inner_size, intermediate)
        self.output = linear(intermediate, config.inner_size)
        self.act = get_activation(config.hidden_act)
        self.norm = norm(config, config.inner_size, eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.output(self.act(self.intermediate(x))))


class MobileBertLayer(nn.Module):
    """One block (§3.1, Fig. 1c): bottleneck in, attention (+ norm with the bottlenecked input as residual),
    ``num_feedforward_networks`` FFNs, bottleneck out (B → H) + norm with the block's input as residual.

    ``forward(x (B, T, H), bias, explicit, head_gates)`` → ``(x (B, T, H), probs, scores, values)``."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.use_bottleneck = config.use_bottleneck
        self.shared_qk = config.key_query_shared_bottleneck
        self.bottleneck_attention_input = config.use_bottleneck_attention
        if self.use_bottleneck:
            self.bottleneck_input = Bottleneck(config)
            self.bottleneck_qk = Bottleneck(config) if self.shared_qk else None
        self.attention = BottleneckAttention(config, layer)
        self.attention_norm = norm(config, config.inner_size, config.layer_norm_eps)
        inter = config.intermediate_of(layer)
        eps = config.layer_norm_eps
        self.ffns = nn.ModuleList(StackedFFN(config, inter, eps) for _ in range(config.num_feedforward_networks - 1))
        self.ffn = StackedFFN(config, inter, None)  # the last FFN: transformers gives its norm the default ε
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        if self.use_bottleneck:
            self.output_bottleneck = nn.Linear(config.inner_size, config.hidden_size)
            self.output_norm = norm(config, config.hidden_size, config.layer_norm_eps)

    def _inputs(self, x: torch.Tensor) -> tuple:
        """(queries' input, keys' input, values' input, the attention's residual)."""
        if not self.use_bottleneck:
            return x, x, x, x
        inner = self.bottleneck_input(x)
        if self.bottleneck_attention_input:
            return inner, inner, inner, inner
        if self.shared_qk:
            qk = self.bottleneck_qk(x)
            return qk, qk, x, inner
        return x, x, x, inner

    def forward(self, x: torch.Tensor, bias: Optional[torch.Tensor], explicit: bool = False,
                head_gates: Optional[torch.Tensor] = None):
        q_in, k_in, v_in, residual = self._inputs(x)
        a, probs, scores, values = self.attention(q_in, k_in, v_in, bias, explicit=explicit, head_gates=head_gates)
        if not self.use_bottleneck:
            a = self.dropout(a)
        h = self.attention_norm(a + residual)
        for ffn in self.ffns:
            h = ffn(h)
        f = self.ffn
        y = f.output(f.act(f.intermediate(h)))
        if not self.use_bottleneck:
            return f.norm(self.dropout(y) + h), probs, scores, values
        y = f.norm(y + h)
        return self.output_norm(self.dropout(self.output_bottleneck(y)) + x), probs, scores, values


class MobileBertEncoder(EncoderBase):
    """MobileBERT / IB-BERT: factorised trigram embeddings + L bottleneck blocks + optional pooler
    (``tanh(W·h_[CLS])``). The call is :class:`~.encoder.EncoderBase`'s; every position is computed and the
    ``cls_only`` / ``rows`` positions of a request are then selected. Initialised as transformers' (normal
    σ = ``initializer_range``, biases 0, norms 1/0, the padding embedding 0)."""

    families = ("mobilebert",)

    def __init__(self, config: ModelConfig):
        super().__init__(config)
        self.embeddings = MobileBertEmbeddings(config)
        self.layers = nn.ModuleList(MobileBertLayer(config, i) for i in range(config.num_hidden_layers))
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if config.add_pooling_layer else None
        init_weights(self, config.initializer_range)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, position_ids: Optional[torch.Tensor] = None,
                features: Optional[Features] = None) -> EncoderOutput:
        req = features or Features()
        self._check_inputs(input_ids, attention_mask, token_type_ids)
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        bias = padding_mask_bias(attention_mask, x.dtype)
        hidden, attns, scores, values = [x], [], [], []
        for i, layer in enumerate(self.layers):
            x, p, s, v = layer(x, bias, explicit=req.explicit, head_gates=req.gates(i))
            hidden.append(x)
            attns.append(p)
            scores.append(s)
            values.append(v)
        rows = req.last_rows
        if self.layers and req.last_cls:
            x = hidden[-1] = x[:, :1]
        elif self.layers and rows is not None:
            x = hidden[-1] = x[rows]
        pooled = torch.tanh(self.pooler(x[:, 0])) if (self.pooler is not None and rows is None and req.pooler) \
            else None
        return req.output(x, pooled, hidden, attns, scores, values)


__all__ = ["MobileBertEncoder", "MobileBertEmbeddings", "MobileBertLayer", "BottleneckAttention", "NoNorm",
           "StackedFFN"]
