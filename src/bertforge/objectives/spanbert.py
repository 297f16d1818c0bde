"""SpanBERT span-boundary objective (Joshi et al. 2020, §3.2, eq. 1–2).

For a masked token x_i inside span (x_s … x_e), the SBO predicts it from the two *outer* boundary states
and a relative position embedding p_{i-s+1}:

    h0 = [x_{s-1}; x_{e+1}; p_{i-s+1}]
    h1 = LayerNorm(GeLU(W1·h0)),  y_i = LayerNorm(GeLU(W2·h1))

then the same tied output embeddings as MLM (own bias). ``loss = L_MLM + L_SBO`` (eq. 3). SpanBERT is
trained on single segments without NSP. The model is saved as ``BertForMaskedLM`` with the SBO weights
under ``cls.sbo.*`` (``transformers`` ignores them when loading).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..models.activations import get_activation
from ..models.head import Head
from .mlm import MLMPrediction, masked_positions, mlm_hf_keys, mlm_outputs
from .spec import Objective

MAX_SPAN_POSITIONS = 32


class SpanBoundaryHead(nn.Module):
    """f(x_{s-1}, x_{e+1}, p_i): two Linear-GeLU-LayerNorm layers (3H → H → E) + tied decoder.

    ``forward(hidden (B,T,H), labels (B,T), span_left/span_right/span_pos (B,T))`` → (N, V) logits for
    the N masked positions (same order as the MLM head) and the CE loss.
    """

    def __init__(self, config: ModelConfig, max_positions: int = MAX_SPAN_POSITIONS):
        super().__init__()
        h, e = config.hidden_size, config.embedding_size or config.hidden_size
        self.position_embeddings = nn.Embedding(max_positions, h)
        self.dense1 = nn.Linear(3 * h, h)
        self.norm1 = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.dense2 = nn.Linear(h, e)
        self.norm2 = nn.LayerNorm(e, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.act = get_activation("gelu")
        for m in (self.dense1, self.dense2, self.position_embeddings):
            nn.init.normal_(m.weight, 0.0, config.initializer_range)
        nn.init.zeros_(self.dense1.bias)
        nn.init.zeros_(self.dense2.bias)
        self._embedding: tuple = ()

    def tie(self, word_embeddings: nn.Embedding) -> None:
        self._embedding = (word_embeddings,)

    def forward(self, hidden, labels, span_left, span_right, span_pos):
        sel = masked_positions(labels)
        b = torch.nonzero(sel, as_tuple=True)[0]
        left, right = span_left[sel].clamp(min=0), span_right[sel].clamp(min=0)
        pos = span_pos[sel].clamp(0, self.position_embeddings.num_embeddings - 1)
        x = torch.cat([hidden[b, left], hidden[b, right], self.position_embeddings(pos).to(hidden.dtype)], -1)
        x = self.norm1(self.act(self.dense1(x)))
        x = self.norm2(self.act(self.dense2(x)))
        logits = F.linear(x, self._embedding[0].weight, self.bias)
        target = labels[sel]
        if target.numel() == 0:
            return logits, logits.sum() * 0.0, torch.zeros((), device=hidden.device)
        loss = F.cross_entropy(logits.float(), target)
        return logits, loss, (logits.detach().argmax(-1) == target).float().mean()


class SpanBertHead(Head):
    """MLM + SBO. Batch keys: ``labels``, ``span_left``, ``span_right``, ``span_pos`` (B, T)."""

    hf_suffix = "ForMaskedLM"
    masked_lm = True
    families = ("bert",)

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.mlm = MLMPrediction(config)
        self.sbo = SpanBoundaryHead(config)

    def tie_weights(self, encoder) -> None:
        self.mlm.tie(encoder.embeddings.word_embeddings)
        self.sbo.tie(encoder.embeddings.word_embeddings)

    def forward(self, enc, batch: dict) -> dict:
        labels = batch.get("labels")
        out = mlm_outputs(self.mlm, enc.last_hidden_state, labels, batch.get("loss_normalizer"))
        if labels is not None and batch.get("span_left") is not None:
            _, l_sbo, acc = self.sbo(enc.last_hidden_state, labels, batch["span_left"], batch["span_right"],
                                     batch["span_pos"])
            out["loss"] = out["loss"] + l_sbo
            out["terms"].update(sbo_loss=l_sbo.detach(), sbo_acc=acc)
        return out

    @staticmethod
    def hf_keys(config: ModelConfig) -> dict:
        k = mlm_hf_keys(config)
        for name in ("position_embeddings.weight", "dense1.weight", "dense1.bias", "norm1.weight",
                     "norm1.bias", "dense2.weight", "dense2.bias", "norm2.weight", "norm2.bias", "bias"):
            k[f"sbo.{name}"] = f"cls.sbo.{name}"
        return k


#: SpanBERT: MLM + SBO on single DOC-SENTENCES segments, whole-word spans of Geometric(0.2) length ≤ 10; SpanBERT
#: follows RoBERTa's setup only in part: AdamW keeps its defaults here
OBJECTIVE = Objective(name="spanbert", family="bert", head="mlm_sbo", mode="doc", masking="dynamic", scheme="span",
                      source="Joshi et al. 2020 §3")

__all__ = ["OBJECTIVE", "SpanBoundaryHead", "SpanBertHead", "MAX_SPAN_POSITIONS"]
