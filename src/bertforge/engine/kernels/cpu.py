"""CPU kernels for the encoder: the same functions as the plain modules of :mod:`bertforge.models`, computed with
less work, memory traffic and page faulting on a CPU (the MLM head's are in :mod:`.mlm`).

Each class here subclasses a plain module and replaces its ``forward`` (and nothing in its state):
:func:`bertforge.engine.kernels.apply_kernels` swaps a module's class in place, so parameters, ``state_dict`` and
hooks stay as they are. Under ``torch.compile`` every kernel steps aside and the plain ``forward`` runs.

* :class:`CpuEncoder` — *unpadding* (as in ModernBERT, Warner et al. 2024 §2.1.3): on a right-padded batch
  the linear layers, LayerNorms and FFNs run on the N real tokens only (:class:`~bertforge.models.unpad.Unpadded`,
  the helper ModernBERT uses too); and the last block computes only the positions a head reads (the request's
  :class:`~bertforge.models.output.Features`): [CLS] (``cls_only``) or the masked tokens (``rows``; keys and
  values still come from every position).
* :class:`CpuMultiHeadAttention` — in training, attention with dropout straight from the fused QKV
  projection (:class:`_SelfAttentionTrainCPU`: batched GEMMs per head on strided views, no head-layout
  copies, the softmax-and-dropout backward in one buffer); dropout masks from :mod:`.dropout`.
* :class:`CpuFeedForward` — the GELU input gradient written into reused memory in training; the activation
  in place in inference.
* :class:`CpuEmbeddings` — the token-embedding gradient built in reused memory and, when an MLM decoder is
  tied to it, in the decoder's weight gradient (:class:`~.scratch.TiedGradient`).

Each kernel class says ``kernels = "cpu"`` (the plain encoder says ``none``): the model's ``kernels`` attribute
and ``repr`` read it.

Each kernel equals the plain computation in values and gradients (``tests/test_kernels.py``,
``tests/test_training_kernels.py``); dropout masks are drawn from another stream than torch's.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ...models.activations import gelu_tanh
from ...models.attention import MultiHeadAttention, attention_scores, causal_mask_bias, padding_mask_bias
from ...models.embeddings import Embeddings
from ...models.encoder import Encoder, EncoderLayer, FeedForward
from ...models.output import EncoderOutput, Features
from ...models.unpad import Unpadded
from .dropout import apply_mask, dropout, keep_mask, scaled_keep_mask
from .scratch import ReusedBuffer, tied_gradient

compiling = torch.compiler.is_compiling


# ----------------------------------------------------------------------------------------------- attention

def attention_product(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor] = None,
                      dropout_p: float = 0.0, is_causal: bool = False) -> torch.Tensor:
    """``dropout(softmax(QKᵀ/√d_k + bias))·V`` (Vaswani et al. 2017, eq. 1; dropout on the probabilities as
    in BERT). q (B, heads, T_q, d_k), k/v (B, heads, T_k, d_k), bias broadcastable to (B, heads, T_q, T_k)
    → (B, heads, T_q, d_k).

    Without dropout this is :func:`torch.nn.functional.scaled_dot_product_attention` (fused kernels). With
    dropout on CPU, SDPA has no fused kernel and runs its math path; this path is the same math with the
    cheap keep-mask of :mod:`bertforge.engine.kernels.dropout` and the 1/(1−p) scale applied to the (smaller)
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


class CpuMultiHeadAttention(MultiHeadAttention):
    """:class:`~bertforge.models.attention.MultiHeadAttention` with :func:`fused_self_attention` in
    training and :func:`attention_product` (cheap dropout masks) otherwise."""

    kernels = "cpu"

    def forward(self, hidden_states: torch.Tensor, bias: Optional[torch.Tensor] = None,
                key_value_states: Optional[torch.Tensor] = None, explicit: bool = False,
                head_gates: Optional[torch.Tensor] = None, is_causal: bool = False):
        if compiling():
            return super().forward(hidden_states, bias, key_value_states, explicit, head_gates, is_causal)
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


# ----------------------------------------------------------------------------------------------- embeddings

_EMBEDDING_GRAD = ReusedBuffer()  # the token-embedding gradient of the previous step, once freed


class _TokenLookup(torch.autograd.Function):
    """``F.embedding(ids, weight, padding_idx)`` whose (V, E) weight gradient is built in reused memory
    (zeroed, then ``index_add_`` of the (B·T, E) output gradient; the padding row stays 0) — the same values
    as ``embedding_dense_backward``, without page-faulting a fresh V×E block every step. With ``tied`` (a
    decoder shares the weight, :class:`~.scratch.TiedGradient`) and a dense gradient already offered in
    this backward pass, the rows are deferred into that gradient and no second gradient is returned."""

    @staticmethod
    def forward(ctx, ids, weight, padding_idx, tied):
        ctx.save_for_backward(ids)
        ctx.shape, ctx.padding_idx, ctx.tied = weight.shape, padding_idx, tied
        return torch.nn.functional.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad):
        (ids,) = ctx.saved_tensors
        ids, rows, pad = ids.reshape(-1), grad.reshape(-1, ctx.shape[1]), ctx.padding_idx
        if ctx.tied is not None and ctx.tied.offered():  # a dense gradient exists: add these rows into it
            ctx.tied.defer(lambda g: _add_rows(g, ids, rows, pad))
            return None, None, None, None
        gw = _EMBEDDING_GRAD.empty(ctx.shape, grad.dtype, grad.device).zero_()
        gw.index_add_(0, ids, rows)
        if pad is not None:
            gw[pad] = 0
        if ctx.tied is not None:
            ctx.tied.offer(gw)
        return None, gw, None, None


def _add_rows(g: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, padding_idx) -> None:
    """``g[ids] += rows`` (repeated ids summed), leaving the padding row as it was."""
    keep = g[padding_idx].clone() if padding_idx is not None else None
    g.index_add_(0, ids, rows)
    if keep is not None:
        g[padding_idx] = keep


def token_embedding(emb: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    """``emb(ids)`` (B, T) → (B, T, E); when training on CPU the weight gradient uses :class:`_TokenLookup`
    (and, when a decoder is tied to ``emb``, its :class:`~.scratch.TiedGradient`)."""
    if (torch.is_grad_enabled() and emb.weight.requires_grad and emb.weight.device.type == "cpu"
            and not emb.sparse and emb.max_norm is None and not emb.scale_grad_by_freq):
        return _TokenLookup.apply(ids, emb.weight, emb.padding_idx, tied_gradient(emb))
    return emb(ids)


class CpuEmbeddings(Embeddings):
    """:class:`~bertforge.models.embeddings.Embeddings` with the token lookup of :func:`token_embedding`."""

    kernels = "cpu"

    def token_lookup(self, input_ids: torch.Tensor) -> torch.Tensor:
        if compiling():
            return super().token_lookup(input_ids)
        return token_embedding(self.word_embeddings, input_ids)


# ------------------------------------------------------------------------------------------- feed-forward

#: in-place forms of activations, used when no autograd graph is recorded (same values)
_IN_PLACE = {F.gelu: torch.ops.aten.gelu_, F.relu: torch.relu_}
_GELU_APPROXIMATE = {F.gelu: "none", gelu_tanh: "tanh"}
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


class CpuFeedForward(FeedForward):
    """:class:`~bertforge.models.encoder.FeedForward` with :class:`_GELUTrainCPU` in CPU training and the
    activation in place (no fresh (B, T, I) buffer) in eager inference."""

    kernels = "cpu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if compiling():
            return super().forward(x)
        if self.intermediate.out_features == 0:
            return self.output.bias.expand_as(x)
        h = self.intermediate(x)
        if not torch.is_grad_enabled() and self.act in _IN_PLACE and not torch.jit.is_tracing() \
                and not torch.onnx.is_in_onnx_export():  # eager inference: no graph to keep, so the
            return self.output(_IN_PLACE[self.act](h))  # activation reuses h (no fresh T×I buffer)
        if torch.is_grad_enabled() and h.device.type == "cpu" and self.act in _GELU_APPROXIMATE:
            return self.output(_GELUTrainCPU.apply(h, _GELU_APPROXIMATE[self.act]))
        return self.output(self.act(h))


# ---------------------------------------------------------------------------------- unpadded encoder layers

class CpuEncoderLayer(EncoderLayer):
    """:class:`~bertforge.models.encoder.EncoderLayer` that can also compute its output only where it is
    needed: at ``output_rows`` (B, T) bool (→ (N, H)), at the ``query_index`` positions, or on packed
    tokens (``packing``, :class:`~bertforge.models.unpad.Unpadded`; ``x`` is then (N, H), and with ``cls_only``
    only each sequence's first token is returned, (B, H)). Keys and values always come from every real
    position."""

    kernels = "cpu"

    def forward(self, x: torch.Tensor, bias: Optional[torch.Tensor], explicit: bool = False,
                head_gates: Optional[torch.Tensor] = None, query_index: Optional[torch.Tensor] = None,
                packing: Optional[Unpadded] = None, cls_only: bool = False,
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

    def _attend_packed(self, x: torch.Tensor, bias, pk: Unpadded, cls_only: bool) -> torch.Tensor:
        """Attention on packed tokens: the projections run on the N real tokens only; Q/K/V are padded back
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


class CpuEncoder(Encoder):
    """:class:`~bertforge.models.encoder.Encoder` that runs a right-padded batch unpadded
    (:class:`~bertforge.models.unpad.Unpadded`, when ``unpad`` is True and no per-layer output is asked for)
    and its last block only where the head reads (a ``cls_only`` or ``rows`` request); layers must be
    :class:`CpuEncoderLayer`. Same outputs as the plain encoder at every real token; padding positions of
    ``last_hidden_state`` are 0 when unpadded."""

    kernels = "cpu"

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, position_ids: Optional[torch.Tensor] = None,
                features: Optional[Features] = None) -> EncoderOutput:
        if compiling() or self.relative_attention_bias is not None:
            # MPNet's (heads, T, T) position bias: the plain path (every query row), on the kernels' layers
            return super().forward(input_ids, attention_mask, token_type_ids, position_ids, features)
        req = features or Features()
        self._check_inputs(input_ids, attention_mask, token_type_ids)
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        bias = padding_mask_bias(attention_mask, x.dtype)
        rows = req.last_rows
        packing = Unpadded.from_mask(attention_mask, right_padded=True) \
            if (self.unpad and bias is not None and not req.per_layer and rows is None) else None
        if packing is not None:
            return self._forward_packed(x, bias, packing, req.cls_only, req.pooler)
        hidden, attns, scores, values = [x], [], [], []
        n = len(self.layers)
        for i, layer in enumerate(self.layers):
            last = i == n - 1
            qi = torch.zeros(1, dtype=torch.long, device=x.device) if (last and req.last_cls) else None
            x, p, s, v = layer(x, bias, explicit=req.explicit, head_gates=req.gates(i), query_index=qi,
                               output_rows=rows if last else None)
            hidden.append(x)
            attns.append(p)
            scores.append(s)
            values.append(v)
        pooled = torch.tanh(self.pooler(x[:, 0])) if (self.pooler is not None and rows is None and req.pooler) \
            else None
        return req.output(x, pooled, hidden, attns, scores, values)

    def _forward_packed(self, x: torch.Tensor, bias, pk: Unpadded, cls_only: bool,
                        pooler: bool = True) -> EncoderOutput:
        x = pk.pack(x)
        n = len(self.layers)
        for i, layer in enumerate(self.layers):
            x, *_ = layer(x, bias, packing=pk, cls_only=cls_only and i == n - 1)
        last = x[:, None, :] if cls_only else pk.pad(x)
        pooled = torch.tanh(self.pooler(last[:, 0])) if (self.pooler is not None and pooler) else None
        return EncoderOutput(last_hidden_state=last, pooler_output=pooled)


__all__ = ["CpuEmbeddings", "CpuEncoder", "CpuEncoderLayer", "CpuFeedForward", "CpuMultiHeadAttention",
           "attention_product", "fused_self_attention", "token_embedding"]
