"""Scaled dot-product multi-head attention (Vaswani et al. 2017, §3.2) and the activation registry.

Two paths compute the same thing:

* the fast path calls :func:`torch.nn.functional.scaled_dot_product_attention` (fused kernels);
* the explicit path materialises ``scores = QKᵀ/√d_k + mask`` and ``probs = softmax(scores)``, used when a
  caller asks for ``attentions`` (probabilities, B×heads×T×T), ``attention_scores`` (the unnormalised
  scores TinyBERT distils) or per-head gates ``head_gates`` (Michel et al. 2019 importance ξ_h), shape
  (heads,) or, per example, (B, heads).

The projection of queries, keys and values is one fused ``qkv`` Linear (H → 3·heads·d_k), laid out as
``[Q; K; V]`` along the output dimension so Hugging Face ``query/key/value`` weights concatenate into it.
"""
from __future__ import annotations

import math
import warnings
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError
from .dropout import Dropout, apply_mask, dropout, keep_mask, scaled_keep_mask


def _gelu_new(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _gelu_fast(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def _quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


#: name → activation, with Hugging Face's names (``hidden_act``).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,  # exact erf GELU (Hendrycks & Gimpel 2016), BERT
    "gelu_new": _gelu_new,  # tanh approximation, ALBERT / GPT-2
    "gelu_pytorch_tanh": _gelu_new,
    "gelu_fast": _gelu_fast,
    "quick_gelu": _quick_gelu,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
}


def get_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ConfigError(f"unknown activation {name!r}; choose one of {', '.join(ACTIVATIONS)}") from None


def padding_mask_bias(attention_mask: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    """(B, T_k) mask of 1 = attend / 0 = padding → additive bias (B, 1, 1, T_k) (0 or dtype min).

    Returns ``None`` when nothing is masked, so the fused kernel can use its unmasked fast path.
    """
    if attention_mask is None or bool(attention_mask.all()):
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


def attention_product(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor] = None,
                      dropout_p: float = 0.0, is_causal: bool = False) -> torch.Tensor:
    """``dropout(softmax(QKᵀ/√d_k + bias))·V`` (Vaswani et al. 2017, eq. 1; dropout on the probabilities as
    in BERT). q (B, heads, T_q, d_k), k/v (B, heads, T_k, d_k), bias broadcastable to (B, heads, T_q, T_k)
    → (B, heads, T_q, d_k).

    Without dropout this is :func:`torch.nn.functional.scaled_dot_product_attention` (fused kernels). With
    dropout on CPU, SDPA has no fused kernel and runs its math path; this path is the same math with the
    cheap keep-mask of :mod:`bertforge.models.dropout` and the 1/(1−p) scale applied to the (smaller)
    context instead of the probabilities.
    """
    if dropout_p > 0.0 and q.device.type == "cpu":
        probs = torch.softmax(attention_scores(q, k, bias, is_causal), dim=-1)
        keep, scale = keep_mask(probs.shape, dropout_p, probs.device)
        return torch.matmul(apply_mask(probs, keep), v) * scale
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, is_causal=is_causal)


def _bmm_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, tmp: torch.Tensor, alpha: float = 1.0):
    """out = alpha · a @ b for a strided ``out`` (B, M, N): computed in the contiguous ``tmp`` and copied (with
    a non-contiguous result torch's CPU batched GEMM falls back to one small GEMM per batch entry)."""
    torch.baddbmm(tmp, a, b, beta=0.0, alpha=alpha, out=tmp)
    out.copy_(tmp)


class _SelfAttentionTrainCPU(torch.autograd.Function):
    """``dropout(softmax(QKᵀ/√d_k + bias))·V`` straight from the fused projection, for CPU training.

    qkv (B, T, 3·heads·d_k) laid out ``[Q; K; V]`` → context (B, T, heads·d_k). Same numbers as
    :func:`attention_product` (tests), computed head by head with batched GEMMs on strided views of ``qkv``:
    no head-layout copies of Q/K/V or of the context, 1/√d_k folded into the GEMM, and the Q/K/V gradients
    written into one (B, T, 3·heads·d_k) tensor instead of being concatenated. Saves ``qkv``, the
    probabilities P (heads, B, T, T) and the dropped ones D = P ⊙ M (M the float dropout mask, 0 or
    1/(1−p), see ``scaled_keep_mask``): the softmax-and-dropout backward is then D ⊙ ∂D − P·Σ(D ⊙ ∂D),
    computed in place in the ∂D buffer, with no mask or second product needed.
    """

    @staticmethod
    def forward(ctx, qkv, bias, heads: int, p: float):
        b, t, width = qkv.shape
        d = width // (3 * heads)
        x = qkv.view(b, t, 3, heads, d)
        alpha = 1.0 / math.sqrt(d)
        scores = qkv.new_empty(heads, b, t, t)
        full_bias = None if bias is None else bias.expand(b, heads, t, t)
        for j in range(heads):
            out = scores[j]
            torch.baddbmm(out if full_bias is None else full_bias[:, j], x[:, :, 0, j],
                          x[:, :, 1, j].transpose(1, 2), beta=0.0 if full_bias is None else 1.0, alpha=alpha,
                          out=out)
        probs = torch.softmax(scores, dim=-1)
        del scores
        # 0 / (1 − p)⁻¹ per element, drawn as attention_product draws its mask; (heads, B, T, T) view
        mask = scaled_keep_mask((b, heads, t, t), p, qkv.dtype).transpose(0, 1)
        dropped = probs * mask  # D = P ⊙ M
        del mask
        context = qkv.new_empty(b, t, heads, d)
        tmp = qkv.new_empty(b, t, d)
        for j in range(heads):
            _bmm_into(context[:, :, j], dropped[j], x[:, :, 2, j], tmp)
        ctx.save_for_backward(qkv, probs, dropped)
        ctx.heads, ctx.alpha = heads, alpha
        return context.view(b, t, heads * d)

    @staticmethod
    def backward(ctx, grad):
        qkv, probs, dropped = ctx.saved_tensors
        heads, alpha = ctx.heads, ctx.alpha
        b, t, width = qkv.shape
        d = width // (3 * heads)
        x = qkv.view(b, t, 3, heads, d)
        g = grad.reshape(b, t, heads, d)
        gx = qkv.new_empty(b, t, 3, heads, d)
        gs = torch.empty_like(probs)
        tmp = qkv.new_empty(b, t, d)
        for j in range(heads):
            _bmm_into(gx[:, :, 2, j], dropped[j].transpose(1, 2), g[:, :, j], tmp)  # ∂/∂V = Dᵀ G
            torch.bmm(g[:, :, j], x[:, :, 2, j].transpose(1, 2), out=gs[j])  # ∂/∂D = G Vᵀ
        # ∂/∂S = P ⊙ (∂P − Σ_row ∂P ⊙ P) with ∂P = ∂D ⊙ M, and P ⊙ M = D:  = D ⊙ ∂D − P · Σ_row (D ⊙ ∂D)
        gs.mul_(dropped)
        gs.addcmul_(probs, gs.sum(-1, keepdim=True), value=-1.0)
        for j in range(heads):
            _bmm_into(gx[:, :, 0, j], gs[j], x[:, :, 1, j], tmp, alpha)  # ∂/∂Q
            _bmm_into(gx[:, :, 1, j], gs[j].transpose(1, 2), x[:, :, 0, j], tmp, alpha)  # ∂/∂K
        return gx.view(b, t, width), None, None, None


def fused_self_attention(qkv: torch.Tensor, heads: int, bias: Optional[torch.Tensor], dropout_p: float
                         ) -> Optional[torch.Tensor]:
    """Self-attention context (B, T, heads·d_k) from the fused projection ``qkv`` (B, T, 3·heads·d_k), or
    ``None`` when the fused CPU training kernel does not apply (not a contiguous CPU FP32 tensor, no dropout,
    no autograd, or autocast on); the caller then takes :func:`attention_product`. ``bias``: additive,
    broadcastable to (B, heads, T, T)."""
    if (dropout_p <= 0.0 or qkv.device.type != "cpu" or qkv.dtype != torch.float32 or qkv.dim() != 3
            or not qkv.is_contiguous() or torch.is_autocast_enabled("cpu") or not torch.is_grad_enabled()
            or (bias is not None and bias.dtype != qkv.dtype)):
        return None
    return _SelfAttentionTrainCPU.apply(qkv, bias, heads, dropout_p)


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
    self-attention); ``bias`` broadcastable to (B, heads, T_q, T_k), additive. Returns the context
    (B, T_q, H) and, on the explicit path, probabilities / scores (B, heads, T_q, T_k) and values
    (B, heads, T_k, d_k).

    ``num_heads`` may be smaller than ``hidden_size // head_dim`` after head pruning, and may be 0: then
    the block outputs zeros (only the output bias remains) and the residual carries the input.
    """

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int, dropout: float = 0.0,
                 cross: bool = False):
        super().__init__()
        self.hidden_size, self.num_heads, self.head_dim = hidden_size, num_heads, head_dim
        self.dropout = Dropout(dropout)  # on attention probabilities; its p feeds attention_product
        self.cross = cross
        inner = num_heads * head_dim
        if cross:  # queries from the decoder, keys/values from the encoder memory
            self.q = linear(hidden_size, inner)
            self.kv = linear(hidden_size, 2 * inner)
        else:
            self.qkv = linear(hidden_size, 3 * inner)
        self.out = linear(inner, hidden_size)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, hidden_states: torch.Tensor, bias: Optional[torch.Tensor] = None,
                key_value_states: Optional[torch.Tensor] = None, explicit: bool = False,
                head_gates: Optional[torch.Tensor] = None, is_causal: bool = False):
        b, t, _ = hidden_states.shape
        if self.num_heads == 0:
            return self.out.bias.expand(b, t, self.hidden_size).to(hidden_states.dtype), None, None, None
        inner = self.num_heads * self.head_dim
        if self.cross:
            q = self._split(self.q(hidden_states))
            k, v = self.kv(key_value_states).split(inner, dim=-1)
            k, v = self._split(k), self._split(v)
        else:
            qkv = self.qkv(hidden_states)
            if not (explicit or head_gates is not None or is_causal) and self.training:
                ctx = fused_self_attention(qkv, self.num_heads, bias, self.dropout.p)
                if ctx is not None:  # values (B, heads, T, d_k) as a view, for callers that read them
                    return self.out(ctx), None, None, self._split(qkv[..., 2 * inner:])
            q, k, v = qkv.split(inner, dim=-1)
            q, k, v = self._split(q), self._split(k), self._split(v)
        p_drop = self.dropout.p if self.training else 0.0
        probs = scores = None
        if explicit or head_gates is not None:
            scores = attention_scores(q, k, bias, is_causal)
            probs = torch.softmax(scores, dim=-1)
            ctx = dropout(probs, p_drop, self.training) @ v
            if head_gates is not None:
                # (heads,) one gate per head, or (B, heads) per example (per-example importance)
                g = head_gates.view(-1, self.num_heads, 1, 1) if head_gates.dim() == 2 \
                    else head_gates.view(1, -1, 1, 1)
                ctx = ctx * g.to(ctx.dtype)
        else:
            if bias is not None and bias.dtype != q.dtype:
                bias = bias.to(q.dtype)
            if bias is not None and is_causal:
                bias = bias + causal_mask_bias(t, k.shape[2], q.dtype, q.device)
                is_causal = False
            ctx = attention_product(q, k, v, bias, p_drop, is_causal)
        ctx = ctx.transpose(1, 2).reshape(b, t, inner)
        return self.out(ctx), probs, scores, v
