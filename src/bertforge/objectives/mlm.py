"""Masked language modelling head (Devlin et al. 2018, §3.1 Task #1 and App. A.1).

``logits = LN(act(h·W_t + b_t)) · Eᵀ + b`` where E is the input token-embedding matrix (tied weights,
Press & Wolf 2017) — the transform maps H → embedding size (ALBERT/ELECTRA factorised embeddings).

**Sparse head.** During training only the selected (masked) positions have a label, so the transform
and the (H×V) decoder are applied to the N ≈ 0.15·B·T gathered hidden states only, not to all B·T: the
vocabulary projection — the largest matmul of a small BERT — shrinks ≈ 6.7× (as in NVIDIA's and
cramming's BERT implementations). ``logits`` are then (N, V) in the order of ``labels != -100``.
Without labels the head returns full (B, T, V) logits, as ``…ForMaskedLM``.

Weight names per family (so saved dirs load in ``transformers``): bert ``cls.predictions.*``, roberta
``lm_head.*``, albert ``predictions.*``, electra generator ``generator_predictions.*`` +
``generator_lm_head``, distilbert ``vocab_transform``/``vocab_layer_norm``/``vocab_projector``.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..models.attention import get_activation
from ..models.scratch import ReusedBuffer, TiedGradient, share_tied_gradient, tied_gradient
from .spec import Objective

IGNORE_INDEX = -100


class MLMPrediction(nn.Module):
    """Transform (Linear H→E, activation, LayerNorm) + decoder tied to the word embeddings (V, E) + bias.

    ``forward(h (…, H)) → logits (…, V)``. Call :meth:`tie` with the encoder's word-embedding module.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        e = config.embedding_size or config.hidden_size
        fam = config.model_type
        self.dense = nn.Linear(config.hidden_size, e)
        self.act = get_activation("gelu" if fam in ("roberta", "electra") else config.hidden_act)
        self.norm = nn.LayerNorm(e, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        nn.init.normal_(self.dense.weight, 0.0, config.initializer_range)
        nn.init.zeros_(self.dense.bias)
        self._embedding: tuple = ()
        self._logits_buffer = ReusedBuffer()  # scratch memory, not state: never saved

    def tie(self, word_embeddings: nn.Embedding) -> None:
        # a tuple keeps the embedding out of this module's state_dict: one parameter, one name
        self._embedding = (word_embeddings,)
        share_tied_gradient(word_embeddings)

    @property
    def decoder_weight(self) -> torch.Tensor:
        return self._embedding[0].weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self._decode(self._transform(h))

    def _transform(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(h)))

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
        """``h`` (N, H) at the N predicted positions, ``target`` (N,) → ``(logits (N, V), loss per row (N,)
        FP32, correct (N,) bool)``, as ``self(h)`` then :func:`vocab_cross_entropy`. In FP32 CPU training
        the decoder bias is added inside the loss's row chunks (:class:`_BiasedCrossEntropy`)."""
        x = self._transform(h)
        if self._sparse_training_dtype(x) == torch.float32 and self.decoder_weight.dtype == torch.float32:
            rows, correct, logits = _BiasedCrossEntropy.apply(self._decode(x, bias=False), self.bias, target,
                                                              chunk_bytes)
            return logits, rows, correct
        logits = self._decode(x)
        return (logits, *vocab_cross_entropy(logits, target, chunk_bytes))


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


def mlm_hf_keys(config: ModelConfig, prefix: str = "mlm.") -> dict:
    """Our MLM-head parameter names → HF names for ``config.model_type``."""
    fam = config.model_type
    roots = {"bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                      "cls.predictions.bias"),
             "roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
             "albert": ("predictions.dense", "predictions.LayerNorm", "predictions.bias"),
             "electra": ("generator_predictions.dense", "generator_predictions.LayerNorm",
                         "generator_lm_head.bias"),
             "distilbert": ("vocab_transform", "vocab_layer_norm", "vocab_projector.bias")}[fam]
    dense, norm, bias = roots
    return {f"{prefix}dense.weight": f"{dense}.weight", f"{prefix}dense.bias": f"{dense}.bias",
            f"{prefix}norm.weight": f"{norm}.weight", f"{prefix}norm.bias": f"{norm}.bias",
            f"{prefix}bias": bias}


def masked_positions(labels: torch.Tensor) -> torch.Tensor:
    """(B, T) labels → (B, T) bool, True where a label is set (≠ -100)."""
    return labels != IGNORE_INDEX


#: exp() arguments are clamped here first: torch's CPU exp takes a ~100× slower path for arguments whose
#: result underflows (below ≈ −87.3 in FP32), and exp(−87) ≈ 1.6e-38 changes no FP32 sum it is added to
EXP_FLOOR = -87.0


def row_slices(n_rows: int, n_cols: int, chunk_bytes: int = 1 << 21):
    """Yield slices of ``n_rows`` rows, each about ``chunk_bytes`` of FP32 (``n_cols`` per row) so that a
    chunk stays in the L2 cache."""
    step = max(1, chunk_bytes // (4 * max(1, n_cols)))
    for s in range(0, n_rows, step):
        yield slice(s, min(s + step, n_rows))


def centered_row_chunks(x: torch.Tensor, chunk_bytes: int = 1 << 21, out: Optional[torch.Tensor] = None,
                        bias: Optional[torch.Tensor] = None):
    """Yield ``(rows, chunk, m)``: a slice of the rows of ``x`` (N, V) (see :func:`row_slices`), the FP32
    chunk ``x[rows] − m`` (safe to modify in place) and ``m`` (r,) FP32, the row maxima. One buffer serves
    every chunk (no fresh allocation, hence no page faults, per chunk): use a chunk before asking for the
    next. With ``out`` (N, V) FP32, each chunk is ``out[rows]`` instead (kept after the loop). FP32 ``x`` is
    subtracted straight into the chunk; other dtypes are copied to FP32 first (torch's ``amax`` is ~1.7×
    slower on bf16 rows than on FP32 ones). Maxima are taken without indices (torch's max-with-indices
    kernel is ~10× slower here). With ``bias`` (V,), each row chunk of ``x`` first gets ``bias`` added in
    place (while the chunk is in cache), so ``x`` ends as ``x + bias``."""
    buf = None
    for rows in row_slices(x.shape[0], x.shape[-1], chunk_bytes):
        part = x[rows]
        if bias is not None:
            part.add_(bias)
        if out is not None:
            chunk = out[rows]
        else:
            if buf is None:
                buf = torch.empty(part.shape, dtype=torch.float32, device=x.device)
            chunk = buf[: part.shape[0]]
        if x.dtype == torch.float32:
            m = part.amax(-1)
            torch.sub(part, m[:, None], out=chunk)
        else:
            m = chunk.copy_(part).amax(-1)
            chunk.sub_(m[:, None])
        yield rows, chunk, m


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
    dtype (exp arguments clamped at :data:`EXP_FLOOR`). The gradient softmax − one-hot is written in the
    logits' dtype, never as an (N, V) FP32 copy under bf16 (the idea of fused/chunked vocabulary losses,
    e.g. Wijmans et al. 2024 "Cut your losses in large-vocabulary language models"):

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


_DECODER_GRAD_BUFFER = ReusedBuffer()  # the tied decoder's weight gradient of the previous step, once freed
_CE_GRAD_BUFFER = ReusedBuffer()  # the (N, V) logits gradient of the previous step, once freed


def vocab_cross_entropy(logits: torch.Tensor, target: torch.Tensor, chunk_bytes: int = 1 << 21) -> tuple:
    """Cross-entropy of ``logits`` (N, V) (any float dtype; computed in FP32) against ``target`` (N,) class
    ids. Returns ``(loss_per_row (N,) float32, correct (N,) bool)`` where ``correct`` = arg-max equals
    target. Equal to ``F.cross_entropy(logits.float(), target, reduction="none")`` and its gradient (tests),
    with rows processed ``chunk_bytes`` of FP32 at a time."""
    return _ChunkedCrossEntropy.apply(logits, target, chunk_bytes)


def mlm_outputs(head: MLMPrediction, hidden: torch.Tensor, labels: Optional[torch.Tensor],
                loss_normalizer: Optional[torch.Tensor] = None) -> dict:
    """Sparse MLM: gather (N, H) states where ``labels`` (B, T) ≠ -100 (or take ``hidden`` as those rows when
    it is already (N, H)), project, cross-entropy.

    Returns ``logits`` (N, V) and ``loss`` = (sum of the N targets' CE, float32) / ``loss_normalizer`` and
    ``terms`` (``mlm_loss``, ``mlm_acc``: top-1 accuracy on the masked tokens, ``mlm_count``: N); without
    labels, full logits (B, T, V).

    ``loss_normalizer`` (a number or 0-d tensor; default N, the mean over this batch's targets) is the
    divisor of the summed loss. A data-parallel trainer whose ranks each see a shard of one global batch
    passes ``global target count / world size``, so that the average of the ranks' gradients is the
    gradient of the mean over the global batch (:func:`bertforge.train.distributed.loss_normalizer`).
    """
    if labels is None:
        return {"logits": head(hidden)}
    sel = masked_positions(labels)
    target = labels[sel]
    # (N, H): the encoder already returned only the masked rows (``output_rows``), in the same order
    h = hidden if hidden.dim() == 2 else hidden[sel]
    if target.numel() == 0:
        logits = head(h)
        loss = logits.sum() * 0.0
        acc = torch.zeros((), device=hidden.device)
    else:
        logits, rows, correct = head.logits_and_cross_entropy(h, target)
        loss = rows.sum() / (float(target.numel()) if loss_normalizer is None else loss_normalizer)
        acc = correct.float().mean()
    return {"logits": logits, "loss": loss, "terms": {"mlm_loss": loss.detach(), "mlm_acc": acc,
                                                      "mlm_count": float(target.numel())}}


class MaskedLMHead(nn.Module):
    """Masked-LM head (``…ForMaskedLM``): sparse when ``labels`` (B, T) are given (-100 = no target); the
    batch's optional ``loss_normalizer`` divides the summed loss (see :func:`mlm_outputs`).

    With labels, :class:`~bertforge.task_model.TaskModel` runs the encoder's last block only at the N
    masked positions (keys/values from all): same logits and loss, ~12% fewer FLOPs for a 4-layer model;
    the output's ``last_hidden_state`` is then those (N, H) rows (ask for ``output_hidden_states`` to get
    every position)."""

    hf_suffix = "ForMaskedLM"
    cls_only = False
    masked_lm = True
    labelled_rows_only = True

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.mlm = MLMPrediction(config)

    def tie_weights(self, encoder) -> None:
        self.mlm.tie(encoder.embeddings.word_embeddings)

    def forward(self, enc, batch: dict) -> dict:
        return mlm_outputs(self.mlm, enc.last_hidden_state, batch.get("labels"), batch.get("loss_normalizer"))

    @staticmethod
    def hf_keys(config: ModelConfig) -> dict:
        return mlm_hf_keys(config)


#: RoBERTa: MLM alone on FULL-SENTENCES (packed across documents), a fresh mask each time a sequence is served
OBJECTIVE = Objective(name="roberta", family="roberta", head="mlm", mode="full", masking="dynamic", scheme="token",
                      train={"adam_betas": [0.9, 0.98], "adam_eps": 1.0e-6},  # Liu et al. 2019 §3.1, App. Table 9
                      tokenizer="bpe",  # byte-level BPE (§4.4)
                      source="Liu et al. 2019 §4.1-4.2")

__all__ = ["OBJECTIVE", "MLMPrediction", "MaskedLMHead", "mlm_outputs", "mlm_hf_keys", "masked_positions", "vocab_cross_entropy",
           "centered_row_chunks", "row_slices",
           "IGNORE_INDEX"]
