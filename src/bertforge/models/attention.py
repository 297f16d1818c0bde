"""Scaled dot-product multi-head attention (Vaswani et al. 2017, §3.2).

``Attention(Q, K, V) = softmax(QKᵀ/√d_k + mask)·V`` per head, heads concatenated and projected by W_O.
Dropout acts on the attention probabilities, as in BERT. The usual path is
:func:`torch.nn.functional.scaled_dot_product_attention`; the scores and probabilities are materialised
only when a caller asks for them: ``attentions`` (probabilities, B×heads×T×T), ``attention_scores`` (the
pre-softmax scores TinyBERT distils) or per-head gates ``head_gates`` (the ξ_h of Michel et al. 2019,
shape (heads,) or, per example, (B, heads)).

The projection of queries, keys and values is one ``qkv`` Linear (H → 3·heads·d_k), laid out as
``[Q; K; V]`` along the output dimension so Hugging Face ``query/key/value`` weights concatenate into it.
"""
from __future__ import annotations

import math
import warnings
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


def padding_mask_bias(attention_mask: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    """(B, T_k) mask of 1 = attend / 0 = padding → additive bias (B, 1, 1, T_k) (0 or dtype min).

    Returns ``None`` when nothing is masked, so the fused kernel can use its unmasked fast path (not under
    ``torch.compile``, where reading the mask's values would break the graph).
    """
    if attention_mask is None or (not torch.compiler.is_compiling() and bool(attention_mask.all())):
        return None
    bias = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device)
    bias.masked_fill_(attention_mask == 0, torch.finfo(dtype).min)
    return bias[:, None, None, :]


def causal_mask_bias(t_q: int, t_k: int, dtype: torch.dtype, device) -> torch.Tensor:
    """(1, 1, T_q, T_k) additive bias that hides future positions (decoder self-attention, §3.2.3)."""
    future = torch.ones(t_q, t_k, dtype=torch.bool, device=device).triu(1 + t_k - t_q)
    return torch.zeros(t_q, t_k, dtype=dtype, device=device).masked_fill(
        future, torch.finfo(dtype).min)[None, None]


def attention_scores(q: torch.Tensor, k: torch.Tensor, bias: Optional[torch.Tensor] = None,
                     is_causal: bool = False) -> torch.Tensor:
    """Pre-softmax scores ``QKᵀ/√d_k + bias`` (+ the causal mask): q (B, heads, T_q, d_k), k (B, heads, T_k,
    d_k) → (B, heads, T_q, T_k)."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias
    if is_causal:
        scores = scores + causal_mask_bias(q.shape[-2], k.shape[-2], scores.dtype, scores.device)
    return scores


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (RoFormer, Su et al. 2021, eq. 34) in the half-split layout of GPT-NeoX and
    Hugging Face: ``x·cos + rotate_half(x)·sin`` with ``rotate_half([x₁, x₂]) = [−x₂, x₁]``. ``x`` (…, d_k),
    e.g. (B, heads, T, d_k); ``cos``/``sin`` broadcastable to it, e.g. (B, 1, T, d_k)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def linear(in_features: int, out_features: int, **kw) -> nn.Linear:
    """``nn.Linear(in_features, out_features, **kw)`` without PyTorch's "Initializing zero-element tensors"
    warning: a layer that lost every head or FFN unit to pruning (Michel et al. 2019) has (H, 0) weights,
    with nothing to initialise."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors")
        return nn.Linear(in_features, out_features, **kw)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with output projection.

    Shapes: ``hidden_states`` (B, T_q, H); ``key_value_states`` (B, T_k, H) for cross-attention (else
    self-attention); ``bias`` broadcastable to (B, heads, T_q, T_k), additive. Returns
    ``(output (B, T_q, H), probs, scores, values)``: probabilities and scores (B, heads, T_q, T_k) when
    ``explicit`` or ``head_gates`` (else None), values (B, heads, T_k, d_k).

    ``num_heads`` may be smaller than ``hidden_size // head_dim`` after head pruning, and may be 0: then
    the block outputs zeros (only the output bias remains) and the residual carries the input.
    """

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int, dropout: float = 0.0,
                 cross: bool = False, bias: bool = True):
        super().__init__()
        self.hidden_size, self.num_heads, self.head_dim = hidden_size, num_heads, head_dim
        self.dropout = nn.Dropout(dropout)  # on the attention probabilities
        self.cross = cross
        inner = num_heads * head_dim
        if cross:  # queries from the decoder, keys/values from the encoder memory
            self.q = linear(hidden_size, inner, bias=bias)
            self.kv = linear(hidden_size, 2 * inner, bias=bias)
        else:
            self.qkv = linear(hidden_size, 3 * inner, bias=bias)
        self.out = linear(inner, hidden_size, bias=bias)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, heads·d_k) → (B, heads, T, d_k)."""
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, hidden_states: torch.Tensor, bias: Optional[torch.Tensor] = None,
                key_value_states: Optional[torch.Tensor] = None, explicit: bool = False,
                head_gates: Optional[torch.Tensor] = None, is_causal: bool = False, rope: Optional[tuple] = None):
        b, t, _ = hidden_states.shape
        if self.num_heads == 0:
            if self.out.bias is None:
                return hidden_states.new_zeros(b, t, self.hidden_size), None, None, None
            return self.out.bias.expand(b, t, self.hidden_size).to(hidden_states.dtype), None, None, None
        inner = self.num_heads * self.head_dim
        if self.cross:
            q = self.q(hidden_states)
            k, v = self.kv(key_value_states).split(inner, dim=-1)
        else:
            q, k, v = self.qkv(hidden_states).split(inner, dim=-1)
        q, k, v = self._split(q), self._split(k), self._split(v)
        if rope is not None:  # rotary positions (Su et al. 2021): (cos, sin), each (B or 1, T, d_k)
            cos, sin = rope[0].unsqueeze(1), rope[1].unsqueeze(1)  # broadcast over the heads
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)

        probs = scores = None
        if explicit or head_gates is not None:
            scores = attention_scores(q, k, bias, is_causal)
            probs = torch.softmax(scores, dim=-1)
            context = self.dropout(probs) @ v
            if head_gates is not None:
                # (heads,) one gate per head, or (B, heads) per example (per-example importance)
                g = head_gates.view(-1, self.num_heads, 1, 1) if head_gates.dim() == 2 \
                    else head_gates.view(1, -1, 1, 1)
                context = context * g.to(context.dtype)
        else:
            if bias is not None and bias.dtype != q.dtype:
                bias = bias.to(q.dtype)
            if bias is not None and is_causal:  # SDPA takes a mask or is_causal, not both
                bias = bias + causal_mask_bias(t, k.shape[2], q.dtype, q.device)
                is_causal = False
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=is_causal,
                                                     dropout_p=self.dropout.p if self.training else 0.0)
        context = context.transpose(1, 2).reshape(b, t, inner)
        return self.out(context), probs, scores, v


__all__ = ["MultiHeadAttention", "attention_scores", "causal_mask_bias", "linear", "padding_mask_bias", "rotate"]
