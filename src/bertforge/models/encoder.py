"""The one encoder core of bertforge: a stack of post-LN Transformer blocks (Vaswani et al. 2017, §3.1).

Each block is ``x = LN(x + MHA(x))`` then ``x = LN(x + W₂·act(W₁x))``. Every family (bert, roberta,
albert, electra, distilbert) is this module with a different :class:`~bertforge.config.ModelConfig`;
their differences live in the embeddings and in the weight names (``bertforge.hf``).

Cross-layer parameter sharing (ALBERT, Lan et al. 2019 §3.1): ``layer_sharing`` = ``none`` |
``attention`` (one attention block reused at every depth) | ``ffn`` | ``all`` (one whole block).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
import torch.nn.functional as F

from ..config import ModelConfig
from .attention import (MultiHeadAttention, _gelu_new, attention_product, get_activation, linear,
                        padding_mask_bias)
from .dropout import Dropout
from .embeddings import Embeddings, init_weights
from .scratch import ReusedBuffer


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


@dataclass
class Packing:
    """Where the real tokens of a right-padded (B, T) batch are: ``idx`` (N,) flat indices into B·T;
    ``starts`` (B,) packed index of each sequence's first token. Linear layers, LayerNorm and the FFN then
    run on (N, H) instead of (B, T, H): padding costs nothing (the idea of "unpadding", as in
    ModernBERT, Warner et al. 2024 §2.1.3). Results equal the padded computation at every real token."""

    idx: torch.Tensor
    starts: torch.Tensor
    batch: int
    length: int

    @staticmethod
    def from_mask(attention_mask: torch.Tensor) -> Optional["Packing"]:
        b, t = attention_mask.shape
        if not bool(attention_mask[:, 0].all()):
            return None  # left padding: keep the padded path
        flat = attention_mask.reshape(-1).bool()
        idx = flat.nonzero(as_tuple=True)[0]
        pos = torch.cumsum(flat.long(), 0) - 1
        starts = pos[torch.arange(b, device=flat.device) * t]
        return Packing(idx, starts, b, t)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, H) → (B, T, H) with zeros at padding."""
        out = x.new_zeros(self.batch * self.length, x.shape[-1]).index_copy(0, self.idx, x)
        return out.view(self.batch, self.length, -1)


class FeedForward(nn.Module):
    """Position-wise FFN(x) = W₂·act(W₁x + b₁) + b₂ (Vaswani et al. 2017, eq. 2). (B, T, H) → (B, T, H)."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str):
        super().__init__()
        self.intermediate = linear(hidden_size, intermediate_size)
        self.output = linear(intermediate_size, hidden_size)
        self.act = get_activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.intermediate.out_features == 0:
            return self.output.bias.expand_as(x)
        h = self.intermediate(x)
        if not torch.is_grad_enabled() and self.act in _IN_PLACE and not torch.jit.is_tracing() \
                and not torch.onnx.is_in_onnx_export():  # eager inference: no graph to keep, so the
            return self.output(_IN_PLACE[self.act](h))  # activation reuses h (no fresh T×I buffer)
        if torch.is_grad_enabled() and h.device.type == "cpu" and self.act in _GELU_APPROXIMATE:
            return self.output(_GELUTrainCPU.apply(h, _GELU_APPROXIMATE[self.act]))
        return self.output(self.act(h))


#: in-place forms of activations, used when no autograd graph is recorded (same values)
_IN_PLACE = {F.gelu: torch.ops.aten.gelu_, F.relu: torch.relu_}
_GELU_APPROXIMATE = {F.gelu: "none", _gelu_new: "tanh"}
_GELU_GRAD = ReusedBuffer()  # the (B, T, I) GELU input gradient; free again once the W₁ backward used it


class _GELUTrainCPU(torch.autograd.Function):
    """GELU (exact erf, or the tanh form) whose input gradient is written into reused memory: same values as
    ``F.gelu``'s backward (``gelu_backward``), without page-faulting a fresh (B, T, I) block per layer."""

    @staticmethod
    def forward(ctx, x, approximate: str):
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        return F.gelu(x, approximate=approximate)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        out = _GELU_GRAD.empty(x.shape, grad.dtype, grad.device)
        return torch.ops.aten.gelu_backward.grad_input(grad, x, approximate=ctx.approximate, grad_input=out), None


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
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor, bias: Optional[torch.Tensor], explicit: bool = False,
                head_gates: Optional[torch.Tensor] = None, query_index: Optional[torch.Tensor] = None,
                packing: Optional["Packing"] = None, cls_only: bool = False,
                output_rows: Optional[torch.Tensor] = None):
        if output_rows is not None:  # only these (B, T) positions are needed downstream → x becomes (N, H)
            a = self._attend_rows(x, output_rows, bias)
            x = x[output_rows]
            probs = scores = values = None
        elif packing is not None:  # x is (N, H): only real tokens (see Packing)
            a = self._attend_packed(x, bias, packing, cls_only)
            if cls_only:
                x = x.index_select(0, packing.starts)
            probs = scores = values = None
        elif query_index is None:
            a, probs, scores, values = self.attention(x, bias, explicit=explicit, head_gates=head_gates)
        else:  # only these query positions are needed downstream (e.g. [CLS] in the last block)
            a, probs, scores, values = self._attend_subset(x, query_index, bias)
            x = x[:, query_index]
        x = self.attention_norm(x + self.dropout(a))
        x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, probs, scores, values

    def _product(self, q, k, v, bias) -> torch.Tensor:
        """SDPA on (B, T, heads·d_k) projections → context (B, heads, T_q, d_k)."""
        att = self.attention
        q, k, v = att._split(q), att._split(k), att._split(v)
        if bias is not None and bias.dtype != q.dtype:
            bias = bias.to(q.dtype)
        return attention_product(q, k, v, bias, att.dropout.p if self.training else 0.0)

    def _attend_packed(self, x: torch.Tensor, bias, pk: "Packing", cls_only: bool) -> torch.Tensor:
        """Attention on packed tokens: the projections run on the N real tokens only; Q/K/V are scattered
        to (B, T) for the attention product itself. Returns (N, H), or (B, H) for ``cls_only``."""
        att = self.attention
        if att.num_heads == 0:
            rows = pk.starts.numel() if cls_only else x.shape[0]
            return att.out.bias.expand(rows, att.hidden_size).to(x.dtype)
        inner = att.num_heads * att.head_dim
        qkv = att.qkv(x)
        full = qkv.new_zeros(pk.batch * pk.length, 3 * inner).index_copy(0, pk.idx, qkv)
        q, k, v = full.view(pk.batch, pk.length, 3 * inner).split(inner, dim=-1)
        ctx = self._product(q[:, :1] if cls_only else q, k, v, bias)
        if cls_only:
            ctx = ctx.reshape(pk.batch, inner)
        else:
            ctx = ctx.transpose(1, 2).reshape(pk.batch * pk.length, inner).index_select(0, pk.idx)
        return att.out(ctx)

    def _attend_rows(self, x: torch.Tensor, rows: torch.Tensor, bias) -> torch.Tensor:
        """Self-attention output only at the positions where ``rows`` (B, T) bool is True, in row-major
        order → (N, H); keys and values come from every position. Queries are grouped per sequence and
        padded to the largest count M, so the product is one (B, heads, M, T) attention."""
        att = self.attention
        b, t, _ = x.shape
        counts = rows.sum(1)
        if att.num_heads == 0:
            return att.out.bias.expand(int(counts.sum()), att.hidden_size).to(x.dtype)
        inner = att.num_heads * att.head_dim
        if type(att.qkv) is nn.Linear:  # queries only at the N rows; keys and values at all B·T
            w, bq = att.qkv.weight, att.qkv.bias
            parts = [slice(i * inner, (i + 1) * inner) for i in range(3)]  # Q, K, V rows of the fused weight
            q_sel, k, v = (F.linear(inp, w[part], None if bq is None else bq[part])
                           for inp, part in zip((x[rows], x, x), parts))  # (N, inner), (B, T, inner) × 2
        else:  # a quantized or packed projection: one call on every row
            q_sel, k, v = att.qkv(x).split(inner, dim=-1)
            q_sel = q_sel[rows]  # (N, inner)
        m = max(1, int(counts.max()))
        valid = torch.arange(m, device=x.device)[None, :] < counts[:, None]  # (B, M)
        slot = valid.reshape(-1).nonzero(as_tuple=True)[0]  # row-major (b, m) slots = row-major selections
        q = q_sel.new_zeros(b * m, inner).index_copy(0, slot, q_sel).view(b, m, inner)
        ctx = self._product(q, k, v, bias)  # (B, heads, M, d_k)
        ctx = ctx.transpose(1, 2).reshape(b * m, inner).index_select(0, slot)
        return att.out(ctx)

    def _attend_subset(self, x: torch.Tensor, query_index: torch.Tensor, bias):
        """Self-attention whose output is needed only at ``query_index`` (keys/values from all positions).
        Goes through the ``qkv`` module, so a quantized Linear works here too."""
        att = self.attention
        b = x.shape[0]
        if att.num_heads == 0:
            return att.out.bias.expand(b, query_index.numel(), att.hidden_size), None, None, None
        inner = att.num_heads * att.head_dim
        q, k, v = att.qkv(x).split(inner, dim=-1)
        ctx = self._product(q[:, query_index], k, v, bias)
        ctx = ctx.transpose(1, 2).reshape(b, query_index.numel(), inner)
        return att.out(ctx), None, None, att._split(v)


class Encoder(nn.Module):
    """Embeddings + L encoder blocks + optional pooler (tanh(W·h_[CLS]), Devlin et al. 2018 §3).

    ``forward(input_ids (B,T), attention_mask (B,T) 1=token/0=pad, token_type_ids (B,T))`` →
    :class:`EncoderOutput`. ``cls_only=True`` computes the last block only for position 0 (enough for a
    head on [CLS]; the returned ``last_hidden_state`` is then (B, 1, H)). ``output_rows`` (B, T) bool computes
    the last block's queries, output projection and FFN only at those positions (e.g. the masked tokens of
    MLM, whose head reads nothing else); ``last_hidden_state`` is then (N, H) in row-major order and there
    is no pooler output.
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
        #: run linear layers on real tokens only when the batch is padded (an ``impl`` choice: same numbers)
        self.unpad = True
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if config.add_pooling_layer else None
        init_weights(self, config.initializer_range)

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
        bias = padding_mask_bias(attention_mask, x.dtype)
        explicit = output_attentions or output_attention_scores
        per_layer = explicit or output_hidden_states or output_values or head_gates is not None
        if per_layer or cls_only:
            output_rows = None
        packing = Packing.from_mask(attention_mask) if (self.unpad and bias is not None and not per_layer
                                                         and output_rows is None) else None
        if packing is not None:
            return self._forward_packed(x, bias, packing, cls_only)
        hidden, attns, scores, values = [x], [], [], []
        n = len(self.layers)
        for i, layer in enumerate(self.layers):
            gates = head_gates[i] if head_gates is not None else None
            qi = torch.zeros(1, dtype=torch.long, device=x.device) \
                if (cls_only and i == n - 1 and not explicit and gates is None) else None
            rows = output_rows if i == n - 1 else None
            x, p, s, v = layer(x, bias, explicit=explicit, head_gates=gates, query_index=qi, output_rows=rows)
            hidden.append(x)
            attns.append(p)
            scores.append(s)
            values.append(v)
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

    def _forward_packed(self, x: torch.Tensor, bias, pk: Packing, cls_only: bool) -> EncoderOutput:
        b, t, h = x.shape
        x = x.reshape(b * t, h).index_select(0, pk.idx)
        n = len(self.layers)
        for i, layer in enumerate(self.layers):
            x, *_ = layer(x, bias, packing=pk, cls_only=cls_only and i == n - 1)
        if cls_only:
            last = x[:, None, :]
        else:
            last = pk.pad(x)
        pooled = torch.tanh(self.pooler(last[:, 0])) if self.pooler is not None else None
        return EncoderOutput(last_hidden_state=last, pooler_output=pooled)

    def unique_layers(self) -> list:
        return list(dict.fromkeys(self.layers))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


__all__ = ["Encoder", "EncoderLayer", "EncoderOutput", "FeedForward", "Packing"]
