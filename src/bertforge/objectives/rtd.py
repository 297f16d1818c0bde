"""ELECTRA replaced-token detection (Clark et al. 2020, §2).

A small generator G (an MLM, hidden size ¼ of the discriminator's by default, §3.2 "Smaller
Generators") fills the masked positions with samples x̂_i ~ p_G(x_i | x^masked), drawn *without*
gradient; the discriminator D labels every token of the corrupted sequence as original or replaced.
A sampled token equal to the original counts as original (§2). Loss (eq. 1):

    L = L_MLM(x, θ_G) + λ · L_Disc(x, θ_D),    λ = 50

with L_Disc the mean binary cross-entropy over the non-padding tokens. G and D share the token (and
position / segment) embeddings (§3.1 "Weight Sharing"); each keeps its own E→H projection.

This module holds the discriminator's head and the corruption step; the generator + discriminator model and
the ELECTRA pretraining setup are in :mod:`bertforge.objectives.electra`.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..models.activations import get_activation
from ..models.head import Head
from .mlm import EXP_FLOOR, centered_row_chunks, masked_positions

RTD_WEIGHT = 50.0


class ReplacedTokenDetectionHead(Head):
    """Per-token binary classifier: ``dense (H→H) → act → dense_prediction (H→1)``.

    ``logits`` (B, T); with ``labels`` (B, T) ∈ {0 original, 1 replaced}: BCE-with-logits averaged over
    ``attention_mask`` tokens, and ``rtd_acc``.
    """

    hf_suffix = "ForPreTraining"
    families = ("electra",)

    def __init__(self, config: ModelConfig):
        super().__init__()
        h = config.hidden_size
        self.dense = nn.Linear(h, h)
        self.act = get_activation(config.hidden_act)
        self.dense_prediction = nn.Linear(h, 1)
        for m in (self.dense, self.dense_prediction):
            nn.init.normal_(m.weight, 0.0, config.initializer_range)
            nn.init.zeros_(m.bias)

    def forward(self, enc, batch: dict) -> dict:
        logits = self.dense_prediction(self.act(self.dense(enc.last_hidden_state))).squeeze(-1)
        out = {"logits": logits}
        labels = batch.get("labels")
        if labels is not None:
            am = batch.get("attention_mask")
            m = am.bool() if am is not None else torch.ones_like(labels, dtype=torch.bool)
            lg, lb = logits[m].float(), labels[m].float()
            loss = F.binary_cross_entropy_with_logits(lg, lb)
            acc = ((lg.detach() > 0) == (lb > 0.5)).float().mean()
            out.update(loss=loss, terms={"rtd_loss": loss.detach(), "rtd_acc": acc})
        return out

    @staticmethod
    def hf_keys(config: ModelConfig) -> dict:
        return {f"{n}.{p}": f"discriminator_predictions.{n}.{p}"
                for n in ("dense", "dense_prediction") for p in ("weight", "bias")}


_FLOOR_WEIGHT = math.exp(EXP_FLOOR)


def sample_from_logits(logits: torch.Tensor, chunk_bytes: int = 1 << 21) -> torch.Tensor:
    """One exact sample per row from softmax(``logits``) (N, V) → (N,) long, by inverse-CDF sampling: the
    running sum of exp(logit − max) is searched for u·total with u ~ U[0, 1) (one uniform per row, default
    torch generator). The same distribution as ``torch.multinomial(softmax(logits), 1)``, whose CPU kernel
    draws V exponentials per row (~10× slower at V = 30,522); rows are processed ``chunk_bytes`` of FP32
    at a time. A token whose weight exp(logit − max) is below e⁻⁸⁷ (FP32 underflow) is never drawn."""
    n, v = logits.shape
    out = torch.empty(n, dtype=torch.long, device=logits.device)
    if n == 0:
        return out
    u = torch.rand(n, 1, device=logits.device, dtype=torch.float32)
    for rows, w, _ in centered_row_chunks(logits, chunk_bytes):
        w.clamp_(min=EXP_FLOOR).exp_()
        w.masked_fill_(w <= _FLOOR_WEIGHT, 0.0)  # weights that underflow (clamped above for speed) stay 0
        cdf = torch.cumsum(w, -1, out=w)
        out[rows] = torch.searchsorted(cdf, u[rows] * cdf[:, -1:], right=True).squeeze(1).clamp_(max=v - 1)
    return out


def replace_tokens(input_ids: torch.Tensor, labels: torch.Tensor, sampled: torch.Tensor):
    """Build the discriminator input and its labels (ELECTRA §2).

    ``input_ids`` (B, T) masked ids; ``labels`` (B, T) original ids at the N masked positions, -100
    elsewhere; ``sampled`` (N,) generator samples in ``labels != -100`` order. Returns ``corrupted``
    (B, T): the original sequence with the masked positions replaced by the samples, and ``rtd_labels``
    (B, T) float: 1 where ``corrupted`` differs from the original, so a sample equal to the original
    token is labelled *original* (0).
    """
    sel = masked_positions(labels)
    original = torch.where(sel, labels, input_ids)
    corrupted = original.clone()
    corrupted[sel] = sampled.to(corrupted.dtype)
    return corrupted, (corrupted != original).float()


def generator_config(disc: ModelConfig, size: float = 0.25) -> ModelConfig:
    """The generator's config: hidden ``size``·H (≥ 16), heads = hidden/64 (≥ 1), FFN 4·hidden, same
    depth, vocabulary and embedding size as the discriminator (ELECTRA §3.2, App. B)."""
    h = max(16, int(round(disc.hidden_size * size)))
    heads = max(1, h // 64)
    while h % heads:
        heads -= 1
    return disc.replace(hidden_size=h, num_attention_heads=heads, intermediate_size=4 * h,
                        embedding_size=disc.embedding_size, add_pooling_layer=False,
                        layer_num_heads=None, layer_intermediate_sizes=None)


__all__ = ["replace_tokens", "sample_from_logits", "ReplacedTokenDetectionHead", "generator_config", "RTD_WEIGHT"]
