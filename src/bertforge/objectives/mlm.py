"""Masked language modelling head (Devlin et al. 2018, §3.1 Task #1 and App. A.1).

``logits = LN(act(h·W_t + b_t)) · Eᵀ + b`` where E is the input token-embedding matrix (tied weights,
Press & Wolf 2017) — the transform maps H → embedding size (ALBERT/ELECTRA factorised embeddings).

**Sparse head.** During training only the selected (masked) positions have a label, so the transform
and the (H×V) decoder are applied to the N ≈ 0.15·B·T gathered hidden states only, not to all B·T: the
vocabulary projection — the largest matmul of a small BERT — shrinks ≈ 6.7× (as in NVIDIA's and
cramming's BERT implementations). ``logits`` are then (N, V) in the order of ``labels != -100``.
Without labels the head returns full (B, T, V) logits, as ``…ForMaskedLM``.

Weight names per family (so saved dirs load in ``transformers``): modernbert ``head.*`` + ``decoder.bias``
(its transform has no dense bias), bert ``cls.predictions.*``, roberta
``lm_head.*``, albert ``predictions.*``, electra generator ``generator_predictions.*`` +
``generator_lm_head``, distilbert ``vocab_transform``/``vocab_layer_norm``/``vocab_projector``.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..models.activations import get_activation
from ..models.head import Head
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
        modern = fam == "modernbert"  # ModernBertPredictionHead: no dense bias, its own activation and norm bias
        self.dense = nn.Linear(config.hidden_size, e, bias=not modern)
        self.act = get_activation(config.classifier_activation if modern else
                                  "gelu" if fam in ("roberta", "mpnet", "electra") else config.hidden_act)
        self.norm = nn.LayerNorm(e, eps=config.layer_norm_eps, bias=config.norm_bias or not modern)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        if modern:  # transformers' init of the head's dense ("out": σ/√(2L), truncated at ±2σ)
            std = config.initializer_range / (2.0 * max(1, config.num_hidden_layers)) ** 0.5
            nn.init.trunc_normal_(self.dense.weight, 0.0, std, -2 * std, 2 * std)
        else:
            nn.init.normal_(self.dense.weight, 0.0, config.initializer_range)
            nn.init.zeros_(self.dense.bias)
        self._embedding: tuple = ()

    def tie(self, word_embeddings: nn.Embedding) -> None:
        # a tuple keeps the embedding out of this module's state_dict: one parameter, one name
        self._embedding = (word_embeddings,)

    @property
    def decoder_weight(self) -> torch.Tensor:
        return self._embedding[0].weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(self._transform(h), self.decoder_weight, self.bias)

    def _transform(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(h)))

    def logits_and_cross_entropy(self, h: torch.Tensor, target: torch.Tensor):
        """``h`` (N, H) at the N predicted positions, ``target`` (N,) → ``(logits (N, V), loss per row (N,)
        FP32, correct (N,) bool)``, as ``self(h)`` then :func:`vocab_cross_entropy`."""
        logits = self(h)
        return (logits, *vocab_cross_entropy(logits, target))


class MobileBertMLMPrediction(MLMPrediction):
    """MobileBERT's masked-LM head (Sun et al. 2020; transformers' ``MobileBertLMPredictionHead``): transform
    ``LN(act(W·h))`` H → H, then a decoder of width H made of the tied token embeddings (V, E) and a trained
    block (H − E, V) of its own: ``logits = t · [Eᵀ; W_x] + b``. ``forward(h (…, H)) → logits (…, V)``."""

    def __init__(self, config: ModelConfig):
        nn.Module.__init__(self)
        h, e = config.hidden_size, config.embedding_size
        self.dense = nn.Linear(h, h)
        self.act = get_activation(config.hidden_act)
        self.norm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        #: the decoder's rows past the embedding width, (H − E, V) as transformers' ``cls.predictions.dense``
        self.extra = nn.Parameter(torch.empty(h - e, config.vocab_size))
        for w in (self.dense.weight, self.extra):
            nn.init.normal_(w, 0.0, config.initializer_range)
        nn.init.zeros_(self.dense.bias)
        self._embedding = ()

    @property
    def decoder_weight(self) -> torch.Tensor:
        """(V, H): the token embeddings (V, E) beside ``extra``ᵀ (V, H − E)."""
        return torch.cat([self._embedding[0].weight, self.extra.t()], dim=1)


def mlm_prediction(config: ModelConfig) -> MLMPrediction:
    """The masked-LM prediction module of ``config``'s family (:class:`MobileBertMLMPrediction` for MobileBERT,
    else :class:`MLMPrediction`)."""
    return MobileBertMLMPrediction(config) if config.model_type == "mobilebert" else MLMPrediction(config)


def mlm_hf_keys(config: ModelConfig, prefix: str = "mlm.") -> dict:
    """Our MLM-head parameter names → HF names for ``config.model_type``."""
    fam = config.model_type
    if fam == "mobilebert":  # MobileBertLMPredictionHead: transform H → H, the decoder's extra rows in ``dense``
        return {f"{prefix}dense.weight": "cls.predictions.transform.dense.weight",
                f"{prefix}dense.bias": "cls.predictions.transform.dense.bias",
                f"{prefix}norm.weight": "cls.predictions.transform.LayerNorm.weight",
                f"{prefix}norm.bias": "cls.predictions.transform.LayerNorm.bias",
                f"{prefix}bias": "cls.predictions.bias", f"{prefix}extra": "cls.predictions.dense.weight"}
    if fam == "modernbert":  # ModernBertForMaskedLM: head.dense (no bias), head.norm, decoder (tied) + its bias
        keys = {f"{prefix}dense.weight": "head.dense.weight", f"{prefix}norm.weight": "head.norm.weight",
                f"{prefix}bias": "decoder.bias"}
        if config.norm_bias:
            keys[f"{prefix}norm.bias"] = "head.norm.bias"
        return keys
    roots = {"bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                      "cls.predictions.bias"),
             "roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),
             "mpnet": ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"),  # MPNetLMHead: RoBERTa's names
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


def vocab_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> tuple:
    """Cross-entropy of ``logits`` (N, V) (any float dtype; computed in FP32) against ``target`` (N,) class
    ids. Returns ``(loss_per_row (N,) float32, correct (N,) bool)`` where ``correct`` = the target's logit
    is the row's maximum (its arg-max, but for exact ties)."""
    z = logits.float()
    rows = F.cross_entropy(z, target, reduction="none")
    correct = z.detach().gather(1, target[:, None]).squeeze(1) >= z.detach().amax(-1)
    return rows, correct


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
    gradient of the mean over the global batch (:func:`bertforge.engine.train.distributed.loss_normalizer`).
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


class MaskedLMHead(Head):
    """Masked-LM head (``…ForMaskedLM``): sparse when ``labels`` (B, T) are given (-100 = no target); the
    batch's optional ``loss_normalizer`` divides the summed loss (see :func:`mlm_outputs`).

    With labels, :class:`~bertforge.task_model.TaskModel` runs the encoder's last block only at the N
    masked positions (keys/values from all): same logits and loss, ~12% fewer FLOPs for a 4-layer model;
    the output's ``last_hidden_state`` is then those (N, H) rows (ask for ``output_hidden_states`` to get
    every position)."""

    hf_suffix = "ForMaskedLM"
    masked_lm = True
    labelled_rows_only = True

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.mlm = mlm_prediction(config)

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

__all__ = ["OBJECTIVE", "MLMPrediction", "MobileBertMLMPrediction", "mlm_prediction", "MaskedLMHead", "mlm_outputs", "mlm_hf_keys", "masked_positions", "vocab_cross_entropy",
           "centered_row_chunks", "row_slices",
           "IGNORE_INDEX"]
