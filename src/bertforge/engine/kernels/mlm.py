"""CPU kernels for the masked-LM head: :class:`CpuMLMPrediction`, the same function as
:class:`~bertforge.objectives.mlm.MLMPrediction`, with less memory traffic and page faulting on a CPU.

* the sparse decoder's (N, V) logits and weight gradient in memory reused from the previous step, the weight
  gradient shared with the tied token lookup (:class:`_DecoderLinear`, :class:`~.scratch.TiedGradient`);
* the cross-entropy over the vocabulary in cache-sized FP32 row chunks with the decoder bias added inside them
  (:class:`_BiasedCrossEntropy`; the idea of fused vocabulary losses, Wijmans et al. 2024).

Swapped in by :func:`bertforge.engine.kernels.apply_kernels` as the encoder's kernels of :mod:`.cpu` are; equal
to the plain computation in values and gradients (``tests/test_training_kernels.py``).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ...objectives.mlm import EXP_FLOOR, MLMPrediction, centered_row_chunks, row_slices
from .scratch import ReusedBuffer, TiedGradient, share_tied_gradient, tied_gradient

compiling = torch.compiler.is_compiling


_DECODER_GRAD_BUFFER = ReusedBuffer()  # the tied decoder's weight gradient of the previous step, once freed
_CE_GRAD_BUFFER = ReusedBuffer()  # the (N, V) logits gradient of the previous step, once freed


class _DecoderLinear(torch.autograd.Function):
    """logits = x Wᵀ + b (x (N, E), W (V, E), b (V,) or None → (N, V)) written into a :class:`ReusedBuffer`;
    gradients as ``F.linear``'s. With ``tied`` (the word embedding's :class:`TiedGradient`), the weight
    gradient is offered as the pass's dense gradient, or, when one was offered already (by an embedding
    lookup), deferred into it: one V×E gradient per step instead of a sum of two."""

    @staticmethod
    def forward(ctx, x, weight, bias, buffer: ReusedBuffer, tied: Optional[TiedGradient] = None):
        ctx.save_for_backward(x, weight)
        ctx.tied = tied
        out = buffer.empty((x.shape[0], weight.shape[0]), x.dtype, x.device)
        with torch.autocast("cpu", enabled=False):
            if bias is None:
                return torch.mm(x, weight.t(), out=out)
            return torch.addmm(bias, x, weight.t(), out=out)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        gx = grad @ weight if ctx.needs_input_grad[0] else None
        gw = None
        if ctx.needs_input_grad[1]:  # (V, E): becomes (or is added to) weight.grad; reused once that is freed
            if ctx.tied is not None and ctx.tied.offered():  # add gradᵀ·x into the dense gradient offered
                ctx.tied.defer(lambda g: g.addmm_(grad.t(), x))
            else:
                gw = torch.mm(grad.t(), x, out=_DECODER_GRAD_BUFFER.empty(weight.shape, grad.dtype, grad.device))
                if ctx.tied is not None:
                    ctx.tied.offer(gw)
        gb = grad.sum(0) if ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None


def _ce_forward(ctx, logits, target, chunk_bytes: int, bias=None):
    n = logits.shape[0]
    lse = torch.empty(n, dtype=torch.float32, device=logits.device)
    row_max = torch.empty(n, dtype=torch.float32, device=logits.device)
    keep = logits.dtype == torch.float32 and ctx.needs_input_grad[0]
    exps = _CE_GRAD_BUFFER.empty(logits.shape, logits.dtype, logits.device) if keep else None
    for rows, centered, m in centered_row_chunks(logits, chunk_bytes, out=exps, bias=bias):
        row_max[rows] = m
        lse[rows] = centered.clamp_(min=EXP_FLOOR).exp_().sum(-1).log_().add_(m)
    target_logit = logits.gather(1, target[:, None]).squeeze(1).float()
    correct = target_logit >= row_max  # the target holds the row's maximum (= arg-max but for exact ties)
    # kept: exp(x − max) rows and Σexp = exp(lse − max), consumed by the first backward; logits and lse
    # rebuild the gradient for any further one (backward with retain_graph=True)
    ctx.exps, ctx.sum_exp = (exps, (lse - row_max).exp_()) if keep else (None, None)
    ctx.save_for_backward(target, logits, lse)
    ctx.chunk_bytes = chunk_bytes
    ctx.mark_non_differentiable(correct)
    return lse - target_logit, correct


def _ce_backward(ctx, grad_rows, grad_logits=None, bias_grad: bool = False):
    """(N, V) gradient of the logits (plus ``grad_logits`` from other uses of them) and, with ``bias_grad``,
    its column sums (V,) FP32 — the gradient of a bias added to every row."""
    gb = None
    target, logits, lse = ctx.saved_tensors
    if ctx.exps is not None:
        grad, ctx.exps = ctx.exps, None
        scale = grad_rows.float() / ctx.sum_exp
        if bias_grad:
            gb = torch.zeros(grad.shape[-1], dtype=torch.float32, device=grad.device)
        for rows in row_slices(grad.shape[0], grad.shape[-1], ctx.chunk_bytes):
            p = grad[rows]
            p.mul_(scale[rows, None])
            p.scatter_add_(1, target[rows, None], -grad_rows[rows].float()[:, None])
            if grad_logits is not None:
                p.add_(grad_logits[rows])
            if gb is not None:
                gb.add_(p.sum(0))
        return grad, gb
    grad = _CE_GRAD_BUFFER.empty(logits.shape, logits.dtype, logits.device)
    buf = None  # each chunk in FP32, then cast into the gradient
    for rows in row_slices(logits.shape[0], logits.shape[-1], ctx.chunk_bytes):
        if buf is None:
            buf = torch.empty((rows.stop - rows.start, logits.shape[-1]), dtype=torch.float32, device=logits.device)
        p = buf[: rows.stop - rows.start]
        g = grad_rows[rows].float()[:, None]
        torch.sub(logits[rows], lse[rows, None], out=p).clamp_(min=EXP_FLOOR).exp_().mul_(g)
        p.scatter_add_(1, target[rows, None], -g)
        if grad_logits is not None:
            p.add_(grad_logits[rows])
        grad[rows] = p
    if bias_grad:
        gb = grad.float().sum(0)
    return grad, gb


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Per-row softmax cross-entropy over a large vocabulary, computed in FP32 row chunks from logits of any
    dtype (exp arguments clamped at :data:`~bertforge.objectives.mlm.EXP_FLOOR`). The gradient
    softmax − one-hot is written in the logits' dtype, never as an (N, V) FP32 copy under bf16 (the idea of
    fused/chunked vocabulary losses, e.g. Wijmans et al. 2024 "Cut your losses in large-vocabulary language
    models"):

    * FP32 logits that need a gradient: forward writes exp(x − max) of each chunk straight into the
      gradient's memory (a :class:`ReusedBuffer`), so backward only scales each row by g / Σexp and
      subtracts g at the target — no second pass of exp;
    * otherwise forward keeps only the (N,) log-sum-exp, and backward rebuilds exp(x − lse) chunk by chunk.

    Also returns, without gradient, whether each row's target holds the row maximum (its arg-max, but for
    exact ties)."""

    @staticmethod
    def forward(ctx, logits, target, chunk_bytes: int):
        return _ce_forward(ctx, logits, target, chunk_bytes)

    @staticmethod
    def backward(ctx, grad_rows, _grad_correct):
        return _ce_backward(ctx, grad_rows)[0], None, None


class _BiasedCrossEntropy(torch.autograd.Function):
    """:class:`_ChunkedCrossEntropy` of ``logits + bias``, the bias added in place into ``logits`` (N, V)
    chunk by chunk as the loss reads them (returned as the third output, for other uses), and its gradient
    summed from the same chunks: the decoder's GEMM then runs without its bias — no (N, V) bias broadcast
    before it and no separate column-sum pass after it."""

    @staticmethod
    def forward(ctx, logits, bias, target, chunk_bytes: int):
        ctx.set_materialize_grads(False)  # logits often have no other use: no (N, V) zero gradient for them
        rows, correct = _ce_forward(ctx, logits, target, chunk_bytes, bias=bias)
        ctx.mark_dirty(logits)
        return rows, correct, logits

    @staticmethod
    def backward(ctx, grad_rows, _grad_correct, grad_logits):
        if grad_rows is None:
            grad_rows = torch.zeros_like(ctx.saved_tensors[2])  # the loss itself unused: its gradient is 0
        grad, gb = _ce_backward(ctx, grad_rows, grad_logits, bias_grad=ctx.needs_input_grad[1])
        return grad, gb, None, None


def vocab_cross_entropy(logits: torch.Tensor, target: torch.Tensor, chunk_bytes: int = 1 << 21) -> tuple:
    """Cross-entropy of ``logits`` (N, V) (any float dtype; computed in FP32) against ``target`` (N,) class
    ids, in row chunks of ``chunk_bytes`` of FP32 (:class:`_ChunkedCrossEntropy`). Returns
    ``(loss_per_row (N,) float32, correct (N,) bool)`` as :func:`bertforge.objectives.mlm.vocab_cross_entropy`
    does; equal to ``F.cross_entropy(logits.float(), target, reduction="none")`` and its gradient (tests)."""
    return _ChunkedCrossEntropy.apply(logits, target, chunk_bytes)


class CpuMLMPrediction(MLMPrediction):
    """:class:`~bertforge.objectives.mlm.MLMPrediction` whose sparse (N, E) → (N, V) decoder writes into
    memory reused from the previous step and shares the tied weight's gradient with the token lookup
    (:class:`_DecoderLinear`), and whose cross-entropy adds the decoder bias inside its row chunks in FP32
    training (:class:`_BiasedCrossEntropy`)."""

    kernels = "cpu"

    def kernel_setup(self) -> None:
        """Called by :func:`bertforge.engine.kernels.apply_kernels` after the class swap."""
        if "_logits_buffer" not in self.__dict__:
            self._logits_buffer = ReusedBuffer()  # scratch memory, not state: never saved
        if self._embedding:
            share_tied_gradient(self._embedding[0])

    def kernel_teardown(self) -> None:
        """Called by :func:`bertforge.engine.kernels.apply_kernels` before the class is swapped back."""
        self.__dict__.pop("_logits_buffer", None)

    def tie(self, word_embeddings: nn.Embedding) -> None:
        super().tie(word_embeddings)
        share_tied_gradient(word_embeddings)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if compiling():
            return super().forward(h)
        return self._decode(self._transform(h))

    @staticmethod
    def _sparse_training_dtype(x: torch.Tensor) -> Optional[torch.dtype]:
        """The compute dtype (autocast's, else ``x``'s) of the sparse CPU training path for (N, E) ``x``;
        None when that path does not apply."""
        if x.dim() == 2 and x.device.type == "cpu" and torch.is_grad_enabled():
            return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
        return None

    def _decode(self, x: torch.Tensor, bias: bool = True) -> torch.Tensor:
        dt = self._sparse_training_dtype(x)
        if dt is None:
            return F.linear(x, self.decoder_weight, self.bias)
        # sparse training path: (N, V) logits in memory reused from the previous step (see ReusedBuffer)
        w = self.decoder_weight
        tied = tied_gradient(self._embedding[0]) if w.dtype == dt else None
        return _DecoderLinear.apply(x.to(dt), w.to(dt), self.bias.to(dt) if bias else None, self._logits_buffer,
                                    tied)

    def logits_and_cross_entropy(self, h: torch.Tensor, target: torch.Tensor, chunk_bytes: int = 1 << 21):
        """As :meth:`MLMPrediction.logits_and_cross_entropy`, the loss in row chunks of ``chunk_bytes``."""
        if compiling():
            return super().logits_and_cross_entropy(h, target)
        x = self._transform(h)
        if self._sparse_training_dtype(x) == torch.float32 and self.decoder_weight.dtype == torch.float32:
            rows, correct, logits = _BiasedCrossEntropy.apply(self._decode(x, bias=False), self.bias, target,
                                                              chunk_bytes)
            return logits, rows, correct
        logits = self._decode(x)
        return (logits, *vocab_cross_entropy(logits, target, chunk_bytes))


__all__ = ["CpuMLMPrediction", "vocab_cross_entropy"]
