"""Next-sentence prediction (Devlin et al. 2018, §3.1 Task #2): a 2-way classifier on the pooled [CLS]
state, label 0 = B follows A (IsNext), 1 = B is from another document (NotNext), trained jointly with
MLM: ``loss = L_MLM + L_NSP``. Saved as ``BertForPreTraining`` (``cls.seq_relationship``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..models.heads import register_head
from .mlm import MLMPrediction, mlm_hf_keys, mlm_outputs


def pair_outputs(out: dict, logits: torch.Tensor, labels, name: str) -> dict:
    """Add a 2-way pair-classification loss (CE) and accuracy to the MLM outputs ``out``."""
    out["pair_logits"] = logits
    if labels is not None:
        lp = F.cross_entropy(logits.float(), labels.long())
        acc = (logits.detach().argmax(-1) == labels).float().mean()
        out["loss"] = lp if out.get("loss") is None else out["loss"] + lp
        out.setdefault("terms", {}).update({f"{name}_loss": lp.detach(), f"{name}_acc": acc})
    return out


@register_head("mlm_nsp")
class BertPreTrainingHead(nn.Module):
    """MLM + NSP. Batch keys: ``labels`` (B, T), ``next_sentence_label`` (B,). NSP logits (B, 2)."""

    hf_suffix = "ForPreTraining"
    cls_only = False
    families = ("bert",)

    def __init__(self, config: ModelConfig):
        super().__init__()
        if not config.add_pooling_layer:
            from ..errors import ConfigError
            raise ConfigError("the NSP head reads the pooler; set model.add_pooling_layer=true")
        self.mlm = MLMPrediction(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)
        nn.init.normal_(self.seq_relationship.weight, 0.0, config.initializer_range)
        nn.init.zeros_(self.seq_relationship.bias)

    def tie_weights(self, encoder) -> None:
        self.mlm.tie(encoder.embeddings.word_embeddings)

    def forward(self, enc, batch: dict) -> dict:
        out = mlm_outputs(self.mlm, enc.last_hidden_state, batch.get("labels"), batch.get("loss_normalizer"))
        return pair_outputs(out, self.seq_relationship(enc.pooler_output),
                            batch.get("next_sentence_label"), "nsp")

    @staticmethod
    def hf_keys(config: ModelConfig) -> dict:
        return {**mlm_hf_keys(config), "seq_relationship.weight": "cls.seq_relationship.weight",
                "seq_relationship.bias": "cls.seq_relationship.bias"}


__all__ = ["BertPreTrainingHead", "pair_outputs"]
