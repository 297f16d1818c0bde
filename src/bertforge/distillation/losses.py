"""Distillation losses, by name (:data:`LOSSES`, the table at the end of this file), each with its paper reference.

Naming follows TextBrewer: ``_S`` is the student's tensor, ``_T`` the teacher's. Shapes:
``logits`` (B, C); ``hidden`` (B, T, H); attention ``scores``/``probs`` (B, heads, T, T); ``values``
(B, heads, T, d_k); ``mask`` (B, T) with 1 = token, 0 = padding (padding never contributes).
Every loss returns a scalar tensor (float32) averaged over the batch as documented per function.

=====================  ==========================================================================
name                   source
=====================  ==========================================================================
``kd``                 Hinton et al. 2015 §2: α·T²·KL(p_T^τ ‖ p_S^τ) + (1 − α)·CE(z_S, y); multi-label:
                       per-label sigmoids, α·T²·BCE(σ(z_S/τ), σ(z_T/τ)) + (1 − α)·BCE(σ(z_S), y)
``soft_ce``            TinyBERT (Jiao et al. 2020) eq. 10: −Σ softmax(z_T/t)·log softmax(z_S/t)
``cosine``             DistilBERT (Sanh et al. 2019) §3: L_cos = 1 − cos(h_S, h_T) per token
``hidden_mse``         TinyBERT eq. 8: MSE(H_S W_h, H_T), W_h learned (d_S → d_T)
``embedding_mse``      TinyBERT eq. 9: MSE(E_S W_e, E_T)
``attention_mse``      TinyBERT eq. 7: MSE(A_S, A_T) on the unnormalised scores QKᵀ/√d
``attention_kl``       MiniLM (Wang et al. 2020) eq. 4: KL(A_T ‖ A_S) per query row
``pkd``                BERT-PKD (Sun et al. 2019) eq. 3: ‖h_S/‖h_S‖₂ − h_T/‖h_T‖₂‖² on [CLS]
``value_relation_kl``  MiniLM eq. 6 (relation heads as MiniLMv2, Wang et al. 2021 §3.1)
``feature_map_mse``    MobileBERT (Sun et al. 2020) §3.3 FMT: MSE(LN(h_S), LN(h_T)), LN without affine
``mlm_soft``           DistilBERT L_ce: T²·KL of MLM distributions at masked (or all) positions
``mlm``                DistilBERT L_mlm: the student's own masked-LM cross-entropy (no teacher)
``pooled_mse``         Reimers & Gurevych 2020 eq. 1: MSE(W e_S, e_T) on pooled sentence embeddings
``margin_mse``         Hofstätter et al. 2020 eq. 1: MSE of the score margins s(q, p⁺) − s(q, p⁻)
``inbatch_kl``         Lin et al. 2021 (TCT-ColBERT) §3: KL of each query's score distribution over the
                       batch's passages, the teacher's against the student's (+ (1 − α)·CE on the gold)
=====================  ==========================================================================

``attention_mse``/``attention_kl`` need equal head counts; when they differ, both sides are averaged over
heads first (documented fallback). ``value_relation_kl`` works with any head counts: the concatenated
values are re-split into ``relation_heads`` heads on both sides (MiniLMv2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..errors import ConfigError


@dataclass(frozen=True)
class LossSpec:
    """``feature``: what the loss reads, the name of its row in :data:`bertforge.distillation.features.FEATURES`
    (``logits`` | ``hidden`` | ``attention_scores`` | ``attentions`` | ``values`` | ``mlm_logits`` |
    ``student_mlm``: the student's MLM logits only | ``embedding``: pooled sentence embeddings | ``margin``: score
    margins of (query, positive, negative) triples | ``columns``: pooled embeddings of each (query, positive,
    negatives…) row's columns), which says how it is requested, read and cached;
    ``layerwise``: True when it is applied to layer pairs of a map; ``projects``: True when a learned W
    (student H → teacher H) is inserted when the widths differ."""

    name: str
    fn: Callable
    feature: str
    layerwise: bool
    projects: bool = False


def get_loss(name: str) -> LossSpec:
    try:
        return LOSSES[name]
    except KeyError:
        raise ConfigError(f"unknown distillation loss {name!r}; choose one of {', '.join(LOSSES)}") from None


def _token_mask(mask: Optional[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """(B, T) float mask of valid tokens (all ones when ``mask`` is None)."""
    if mask is None:
        return torch.ones(like.shape[0], like.shape[1], dtype=torch.float32, device=like.device)
    return mask.to(torch.float32)


# ------------------------------------------------------------------------------------ prediction layer
def _mean_per_distribution(values: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Mean of a per-distribution loss ``values`` (the logits' shape without its last axis): over the
    batch for (B, C) logits, over the real tokens for a tagger's (B, T, C) (``mask`` (B, T)), over the
    B × 2 start/end distributions for QA's (B, 2, T) — so a soft loss has the scale of the per-token hard
    loss it is mixed with, whatever the sequence length."""
    if values.dim() == 2 and mask is not None and tuple(values.shape) == tuple(mask.shape):
        m = mask.to(values.dtype)
        return (values * m).sum() / m.sum().clamp_min(1.0)
    return values.mean()


def multi_label_kd_loss(logits_S: torch.Tensor, logits_T: torch.Tensor, temperature: float = 1.0,
                        labels: Optional[torch.Tensor] = None, alpha: float = 1.0) -> torch.Tensor:
    """KD for multi-label heads (C independent sigmoids): Hinton et al. 2015 §2 applied per label, each label a
    two-class distribution (σ(z/T), 1 − σ(z/T)):

    ``α · T² · BCE(σ(z_S/T), σ(z_T/T)) + (1 − α) · BCE(σ(z_S), y)``, both averaged over B × C. The soft term is
    the binary cross-entropy against the teacher's per-label probabilities at temperature T (its gradient,
    ``(σ(z_S/T) − σ(z_T/T))/T`` per logit, vanishes exactly when the student's probabilities equal the
    teacher's); T² keeps its gradient scale independent of T, as in the softmax case. ``labels`` (B, C) 0/1
    are used only when ``α < 1``. Raises ConfigError: α < 1 without labels."""
    t = float(temperature)
    zs, zt = logits_S.float(), logits_T.float()
    soft = F.binary_cross_entropy_with_logits(zs / t, torch.sigmoid(zt / t)) * t * t
    if alpha >= 1.0:
        return soft
    if labels is None:
        raise ConfigError("kd alpha < 1 mixes in the hard-label loss but the batch has no labels; "
                          "set alpha=1 or distil on labelled data")
    return alpha * soft + (1.0 - alpha) * F.binary_cross_entropy_with_logits(zs, labels.float())


def kd_loss(logits_S: torch.Tensor, logits_T: torch.Tensor, temperature: float = 1.0,
            labels: Optional[torch.Tensor] = None, alpha: float = 1.0, mask: Optional[torch.Tensor] = None,
            multi_label: bool = False, **_) -> torch.Tensor:
    """Hinton et al. 2015 ("Distilling the Knowledge in a Neural Network", §2):

    ``α · T² · KL(softmax(z_T/T) ‖ softmax(z_S/T)) + (1 − α) · CE(z_S, y)``, KL summed over classes and
    averaged over the batch (token classification: over the real tokens of ``mask`` (B, T); QA: over the
    start and end distributions), as the hard CE is. The T² factor keeps the soft-target gradient
    magnitude independent of T (the gradient of the KL term scales as 1/T²). ``labels`` (B,) or (B, T)
    are used only when ``α < 1``. A regression head (C = 1) distils by ``MSE(z_S, z_T)`` (TinyBERT's
    STS-B choice), mixed with ``MSE(z_S, y)`` by α. ``multi_label``: per-label sigmoid KD
    (:func:`multi_label_kd_loss`).
    Raises:
        ConfigError: α < 1 without labels.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"kd alpha={alpha} must be in [0, 1] (weight of the soft targets)")
    if multi_label:
        return multi_label_kd_loss(logits_S, logits_T, temperature, labels, alpha)
    zs, zt = logits_S.float(), logits_T.float()
    if zs.shape[-1] == 1:
        soft = F.mse_loss(zs.squeeze(-1), zt.squeeze(-1))
    else:
        t = float(temperature)
        lt = F.log_softmax(zt / t, -1)
        kl = (lt.exp() * (lt - F.log_softmax(zs / t, -1))).sum(-1)
        soft = _mean_per_distribution(kl, mask) * t * t
    if alpha >= 1.0:
        return soft
    if labels is None:
        raise ConfigError("kd alpha < 1 mixes in the hard-label loss but the batch has no labels; "
                          "set alpha=1 or distil on labelled data")
    if zs.shape[-1] == 1:
        hard = F.mse_loss(zs.squeeze(-1), labels.float())
    else:
        # (B, C) / (B,) or per token (B, T, C) / (B, T) with −100 = ignored (token classification)
        hard = F.cross_entropy(zs.reshape(-1, zs.shape[-1]), labels.long().reshape(-1), ignore_index=-100)
    return alpha * soft + (1.0 - alpha) * hard


def soft_ce_loss(logits_S: torch.Tensor, logits_T: torch.Tensor, temperature: float = 1.0,
                 mask: Optional[torch.Tensor] = None, multi_label: bool = False, **_) -> torch.Tensor:
    """TinyBERT prediction-layer loss (Jiao et al. 2020, eq. 10): ``−Σ_c softmax(z_T/t)_c ·
    log softmax(z_S/t)_c``, averaged over the batch (token classification: over the real tokens of
    ``mask``; no T² factor, as the paper; t = 1 there). A regression head (C = 1) uses ``MSE(z_S, z_T)``;
    a multi-label head (``multi_label``) the per-label binary cross-entropy against σ(z_T/t), averaged over
    B × C (:func:`multi_label_kd_loss` without T²)."""
    zs, zt = logits_S.float(), logits_T.float()
    if multi_label:
        t = float(temperature)
        return F.binary_cross_entropy_with_logits(zs / t, torch.sigmoid(zt / t))
    if zs.shape[-1] == 1:
        return F.mse_loss(zs.squeeze(-1), zt.squeeze(-1))
    t = float(temperature)
    return _mean_per_distribution(-(F.softmax(zt / t, -1) * F.log_softmax(zs / t, -1)).sum(-1), mask)


def mlm_soft_loss(logits_S: torch.Tensor, logits_T: torch.Tensor, temperature: float = 1.0,
                  mask: Optional[torch.Tensor] = None, mlm_labels: Optional[torch.Tensor] = None,
                  **_) -> torch.Tensor:
    """Soft-target MLM distillation (DistilBERT's L_ce, Sanh et al. 2019 §3; TextBrewer ``kd_ce``):
    ``T² · KL(softmax(z_T/T) ‖ softmax(z_S/T))`` over the vocabulary, averaged over the positions that
    were masked (``mlm_labels != -100``) or, without MLM labels, over every valid token.
    Shapes: logits (B, T, V); mask/mlm_labels (B, T)."""
    if mlm_labels is not None:
        sel = mlm_labels != -100
    else:
        sel = _token_mask(mask, logits_S).bool()
    if not bool(sel.any()):
        return logits_S.sum() * 0.0
    t = float(temperature)
    zs, zt = logits_S[sel].float() / t, logits_T[sel].float() / t
    return F.kl_div(F.log_softmax(zs, -1), F.log_softmax(zt, -1), reduction="batchmean",
                    log_target=True) * t * t


def mlm_loss(logits_S: torch.Tensor, logits_T: Optional[torch.Tensor] = None,
             mlm_labels: Optional[torch.Tensor] = None, **_) -> torch.Tensor:
    """DistilBERT's L_mlm (Sanh et al. 2019 §3): the student's own masked-LM loss as in BERT pretraining
    (Devlin et al. 2019 §3.1), cross-entropy of its logits (B, T, V) against ``mlm_labels`` (B, T), averaged
    over the masked positions (label ≠ −100); the teacher is not read. 0 for a batch without masked tokens.

    Raises:
        ConfigError: no ``mlm_labels`` (inputs were not MLM-corrupted: ``--mlm-prob 0``)."""
    if mlm_labels is None:
        raise ConfigError("loss mlm predicts masked tokens, but the inputs are not masked; set --mlm-prob "
                          "(e.g. 0.15) or drop the mlm term")
    sel = mlm_labels != -100
    if not bool(sel.any()):
        return logits_S.sum() * 0.0
    return F.cross_entropy(logits_S[sel].float(), mlm_labels[sel])


# ------------------------------------------------------------------------------------- hidden states
def cosine_loss(hidden_S: torch.Tensor, hidden_T: torch.Tensor, mask: Optional[torch.Tensor] = None,
                proj: Optional[Callable] = None, **_) -> torch.Tensor:
    """DistilBERT cosine embedding loss (Sanh et al. 2019, §3 "L_cos"): ``1 − cos(h_S, h_T)`` per
    token, averaged over the valid tokens. hidden_S (B, T, H_S), hidden_T (B, T, H_T); ``proj`` is the
    learned W (H_S → H_T) the distiller inserts when the widths differ (as for TinyBERT's eq. 8)."""
    if proj is not None:
        hidden_S = proj(hidden_S)
    m = _token_mask(mask, hidden_S)
    cos = F.cosine_similarity(hidden_S.float(), hidden_T.float(), dim=-1, eps=1e-8)
    return ((1.0 - cos) * m).sum() / m.sum().clamp_min(1.0)


def _masked_mse(a: torch.Tensor, b: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the valid tokens and all features: Σ m·(a−b)² / (Σm · H)."""
    sq = (a.float() - b.float()).pow(2).sum(-1)
    return (sq * m).sum() / (m.sum().clamp_min(1.0) * a.shape[-1])


def hidden_mse_loss(hidden_S: torch.Tensor, hidden_T: torch.Tensor, mask: Optional[torch.Tensor] = None,
                    proj: Optional[Callable] = None, **_) -> torch.Tensor:
    """TinyBERT hidden-state loss (Jiao et al. 2020, eq. 8): ``MSE(H_S W_h, H_T)``; ``proj`` is the
    learned W_h (a Linear d_S → d_T) or None when the widths agree. Averaged over valid tokens × d_T."""
    if proj is not None:
        hidden_S = proj(hidden_S)
    return _masked_mse(hidden_S, hidden_T, _token_mask(mask, hidden_S))


def embedding_mse_loss(hidden_S: torch.Tensor, hidden_T: torch.Tensor, mask: Optional[torch.Tensor] = None,
                       proj: Optional[Callable] = None, **_) -> torch.Tensor:
    """TinyBERT embedding-layer loss (eq. 9): ``MSE(E_S W_e, E_T)``, applied to hidden_states[0] of both
    models (the layer map of this loss is forced to (0, 0)). Same averaging as ``hidden_mse``."""
    return hidden_mse_loss(hidden_S, hidden_T, mask, proj)


def feature_map_mse_loss(hidden_S: torch.Tensor, hidden_T: torch.Tensor, mask: Optional[torch.Tensor] = None,
                         **_) -> torch.Tensor:
    """MobileBERT feature-map transfer (Sun et al. 2020, §3.3 eq. 1): ``MSE(LN(H_S), LN(H_T))`` of two layers'
    outputs (B, T, H) of the same width H, each first normalised over H by a layer norm without affine
    parameters (the paper's normalisation of the feature maps, which keeps the loss on the maps' shape rather
    than their scale). Averaged over valid tokens × H. No projection: the widths must agree (the
    ``feature_maps`` feature checks it)."""
    h = hidden_S.shape[-1]
    s = F.layer_norm(hidden_S.float(), (h,))
    t = F.layer_norm(hidden_T.float(), (h,))
    return _masked_mse(s, t, _token_mask(mask, hidden_S))


def pooled_mse_loss(emb_S: torch.Tensor, emb_T: torch.Tensor, proj=None, normalize: bool = False,
                    **_) -> torch.Tensor:
    """Embedding distillation (Reimers & Gurevych 2020, "Making Monolingual Sentence Embeddings Multilingual
    using Knowledge Distillation", eq. 1): ``MSE(W e_S, e_T)`` between the student's and the teacher's pooled
    sentence embeddings (B, H_S) and (B, H_T), averaged over batch and features; ``proj`` is the learned
    W (H_S → H_T) when the widths differ (None: identity). ``normalize``: the teacher's embeddings are unit
    vectors (a teacher whose pipeline normalises, as sentence-transformers then distils) and ``W e_S`` is
    normalised too, so the loss is ``(2 − 2 cos(W e_S, e_T)) / H_T``: direction, what cosine search reads."""
    s = emb_S.float()
    if proj is not None:
        s = proj(s)
    if normalize:
        s = F.normalize(s, dim=-1)
    return F.mse_loss(s, emb_T.float())


def margin_mse_loss(q_S: torch.Tensor, pos_S: torch.Tensor, neg_S: torch.Tensor, margin_T: torch.Tensor,
                    sim: str = "dot", **_) -> torch.Tensor:
    """Margin-MSE ranking distillation (Hofstätter et al. 2020, "Improving Efficient Neural Ranking Models
    with Cross-Architecture Knowledge Distillation", eq. 1): the student's embeddings of query, positive and
    negative (B, H) score ``s(q, p⁺) − s(q, p⁻)`` (dot product, or cosine with ``sim="cos"``), regressed on
    the teacher's margin ``margin_T`` (B,) — from a cross-encoder, a bi-encoder or scores in the data.
    Delegates to :func:`bertforge.tasks.retrieval.margin_mse_loss`."""
    from ..tasks.retrieval import margin_mse_loss as margin
    return margin(q_S, pos_S, neg_S, margin_T.reshape(-1), sim)


def inbatch_kl_loss(emb_S: torch.Tensor, emb_T: torch.Tensor, sim: str = "cos", temperature: float = 1.0,
                    alpha: float = 1.0, **_) -> torch.Tensor:
    """In-batch listwise score distillation (Lin, Yang & Lin 2021, "In-Batch Negatives for Knowledge
    Distillation with Tightly-Coupled Teachers for Dense Retrieval", §3; RocketQAv2, Ren et al. 2021, eq. 4):
    every query of the batch scores every passage of the batch (its positive, the other rows' positives and
    every row's negatives), on the teacher and on the student, and the student's distribution over those
    passages is pulled to the teacher's:

        L = α · T² · (1/B) Σ_i KL(softmax(s_T(q_i, ·)/T) ‖ softmax(s_S(q_i, ·)/T)) + (1 − α) · CE(s_S(q_i, ·), i)

    ``emb_S`` (B, C, H_S) and ``emb_T`` (B, C, H_T) are the pooled embeddings of each row's columns (query,
    positive, negatives…); the widths may differ (scores are compared, not vectors, so no projection). Scores:
    ``sim="cos"`` → 20 · cosine (sentence-transformers' MultipleNegativesRankingLoss scale, τ = 0.05, what a
    normalising teacher was trained with), ``"dot"`` → the dot product. The gold passage of query i is column 1
    of row i, so ``α < 1`` adds the in-batch-negatives cross-entropy (Henderson et al. 2017). Returns a float32
    scalar."""
    def scores(e: torch.Tensor) -> torch.Tensor:
        e = e.float()
        if sim == "cos":
            e = F.normalize(e, dim=-1)
        q, docs = e[:, 0], e[:, 1:].transpose(0, 1).reshape(-1, e.shape[-1])  # docs: positives, then negatives
        return (q @ docs.T) * (20.0 if sim == "cos" else 1.0)

    t = float(temperature)
    s_S, s_T = scores(emb_S) / t, scores(emb_T) / t
    kl = F.kl_div(F.log_softmax(s_S, -1), F.log_softmax(s_T, -1), log_target=True, reduction="batchmean")
    loss = alpha * t * t * kl
    if alpha < 1.0:
        gold = torch.arange(s_S.shape[0], device=s_S.device)
        loss = loss + (1.0 - alpha) * F.cross_entropy(s_S * t, gold)
    return loss


def pkd_loss(hidden_S: torch.Tensor, hidden_T: torch.Tensor, mask: Optional[torch.Tensor] = None,
             proj: Optional[Callable] = None, **_) -> torch.Tensor:
    """BERT-PKD patient loss (Sun et al. 2019, eq. 3) for one layer pair: ``‖h_S/‖h_S‖₂ − h_T/‖h_T‖₂‖₂²``
    on the [CLS] state (position 0), averaged over the batch. Input (B, T, H) or (B, H)."""
    if hidden_S.dim() == 3:
        hidden_S, hidden_T = hidden_S[:, 0], hidden_T[:, 0]
    if proj is not None:
        hidden_S = proj(hidden_S)
    s = F.normalize(hidden_S.float(), dim=-1, eps=1e-12)
    t = F.normalize(hidden_T.float(), dim=-1, eps=1e-12)
    return (s - t).pow(2).sum(-1).mean()


# ----------------------------------------------------------------------------------------- attention
def _match_heads(a_S: torch.Tensor, a_T: torch.Tensor):
    if a_S.shape[1] != a_T.shape[1]:  # different head counts: compare head-averaged maps
        return a_S.mean(1, keepdim=True), a_T.mean(1, keepdim=True)
    return a_S, a_T


def _pair_mask(mask: Optional[torch.Tensor], a: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) float mask of valid (query, key) pairs."""
    if mask is None:
        return torch.ones(a.shape[0], 1, a.shape[2], a.shape[3], device=a.device)
    m = mask.to(torch.float32)
    return (m[:, :, None] * m[:, None, :])[:, None]


def attention_mse_loss(scores_S: torch.Tensor, scores_T: torch.Tensor, mask: Optional[torch.Tensor] = None,
                       **_) -> torch.Tensor:
    """TinyBERT attention loss (Jiao et al. 2020, eq. 7): ``MSE(A_S, A_T)`` on the *unnormalised*
    scores QKᵀ/√d_k (B, heads, T, T), averaged over heads and valid (query, key) pairs; padded pairs
    (where the mask bias was added) are excluded, as TinyBERT zeroes them."""
    pm = _pair_mask(mask, scores_S)
    # zero the masked pairs first (they hold the dtype minimum; (min − min)² would overflow to inf)
    s = scores_S.float().masked_fill(pm == 0, 0.0)
    t = scores_T.float().masked_fill(pm == 0, 0.0)
    s, t = _match_heads(s, t)
    sq = (s - t).pow(2) * pm
    return sq.sum() / (pm.sum().clamp_min(1.0) * s.shape[1])


def attention_kl_loss(probs_S: torch.Tensor, probs_T: torch.Tensor, mask: Optional[torch.Tensor] = None,
                      **_) -> torch.Tensor:
    """MiniLM self-attention distribution transfer (Wang et al. 2020, eq. 4):
    ``KL(A_T ‖ A_S) = Σ_j A_T[i,j]·(log A_T[i,j] − log A_S[i,j])`` per head and query row i, averaged
    over heads and valid queries. Probabilities (B, heads, T, T)."""
    s, t = _match_heads(probs_S.float(), probs_T.float())
    eps = 1e-12
    kl = (t * (torch.log(t + eps) - torch.log(s + eps))).sum(-1)  # (B, h, T)
    m = _token_mask(mask, s[:, 0])[:, None, :]
    return (kl * m).sum() / (m.sum().clamp_min(1.0) * s.shape[1])


def value_relation(values: torch.Tensor, mask: Optional[torch.Tensor] = None,
                   relation_heads: Optional[int] = None) -> torch.Tensor:
    """MiniLM value relation ``VR = softmax(V Vᵀ / √d_r)`` (Wang et al. 2020, eq. 5), (B, R, T, T).

    ``values`` (B, heads, T, d_k) are concatenated to (B, T, heads·d_k) and re-split into
    ``relation_heads`` R heads of size d_r (MiniLMv2 §3.1); R = heads when None. Padded keys get
    probability 0. Raises ConfigError when R does not divide heads·d_k.
    """
    b, h, t, d = values.shape
    inner = h * d
    r = relation_heads or h
    if inner % r:
        raise ConfigError(f"relation_heads={r} does not divide the value width {inner}; pick a divisor")
    v = values.float().transpose(1, 2).reshape(b, t, r, inner // r).transpose(1, 2)  # (B, R, T, d_r)
    rel = v @ v.transpose(-1, -2) / math.sqrt(inner // r)
    if mask is not None:
        rel = rel.masked_fill(mask[:, None, None, :] == 0, torch.finfo(rel.dtype).min)
    return torch.softmax(rel, -1)


def value_relation_kl_loss(values_S: torch.Tensor, values_T: torch.Tensor,
                           mask: Optional[torch.Tensor] = None, relation_heads: Optional[int] = None,
                           **_) -> torch.Tensor:
    """MiniLM value-relation transfer (Wang et al. 2020, eq. 6): ``KL(VR_T ‖ VR_S)`` per relation head
    and valid query row, averaged. Values (B, heads_S, T, d_S) and (B, heads_T, T, d_T) may differ in
    head count and width: both are re-split into ``relation_heads`` heads (default: the teacher's head
    count when it divides the student's value width, else the gcd of the head counts)."""
    hs, ht = values_S.shape[1], values_T.shape[1]
    if relation_heads is None:
        relation_heads = ht if (values_S.shape[1] * values_S.shape[3]) % ht == 0 else math.gcd(hs, ht)
    vr_s = value_relation(values_S, mask, relation_heads)
    vr_t = value_relation(values_T, mask, relation_heads)
    return attention_kl_loss(vr_s, vr_t, mask)


#: loss name → :class:`LossSpec`: the one place a distillation loss is registered (docs/extending.md)
LOSSES: dict[str, LossSpec] = {spec.name: spec for spec in [
    LossSpec("kd", kd_loss, "logits", layerwise=False),
    LossSpec("soft_ce", soft_ce_loss, "logits", layerwise=False),
    LossSpec("mlm_soft", mlm_soft_loss, "mlm_logits", layerwise=False),
    LossSpec("mlm", mlm_loss, "student_mlm", layerwise=False),
    LossSpec("cosine", cosine_loss, "hidden", layerwise=True, projects=True),
    LossSpec("hidden_mse", hidden_mse_loss, "hidden", layerwise=True, projects=True),
    LossSpec("embedding_mse", embedding_mse_loss, "hidden", layerwise=True, projects=True),
    LossSpec("pkd", pkd_loss, "hidden", layerwise=True, projects=True),
    LossSpec("feature_map_mse", feature_map_mse_loss, "feature_maps", layerwise=True),
    LossSpec("attention_mse", attention_mse_loss, "attention_scores", layerwise=True),
    LossSpec("attention_kl", attention_kl_loss, "attentions", layerwise=True),
    LossSpec("value_relation_kl", value_relation_kl_loss, "values", layerwise=True),
    LossSpec("pooled_mse", pooled_mse_loss, "embedding", layerwise=False, projects=True),
    LossSpec("margin_mse", margin_mse_loss, "margin", layerwise=False),
    LossSpec("inbatch_kl", inbatch_kl_loss, "columns", layerwise=False),
]}
