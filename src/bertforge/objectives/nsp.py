"""Next-sentence prediction (Devlin et al. 2018, §3.1 Task #2): a 2-way classifier on the pooled [CLS]
state, label 0 = B follows A (IsNext), 1 = B is from another document (NotNext), trained jointly with
MLM: ``loss = L_MLM + L_NSP``. Saved as ``BertForPreTraining`` (``cls.seq_relationship``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..errors import ConfigError
from ..models.head import Head
from .mlm import mlm_hf_keys, mlm_outputs, mlm_prediction
from .spec import Objective


def pair_outputs(out: dict, logits: torch.Tensor, labels, name: str) -> dict:
    """Add a 2-way pair-classification loss (CE) and accuracy to the MLM outputs ``out``."""
    out["pair_logits"] = logits
    if labels is not None:
        lp = F.cross_entropy(logits.float(), labels.long())
        acc = (logits.detach().argmax(-1) == labels).float().mean()
        out["loss"] = lp if out.get("loss") is None else out["loss"] + lp
        out.setdefault("terms", {}).update({f"{name}_loss": lp.detach(), f"{name}_acc": acc})
    return out


class BertPreTrainingHead(Head):
    """MLM + NSP. Batch keys: ``labels`` (B, T), ``next_sentence_label`` (B,). NSP logits (B, 2)."""

    hf_suffix = "ForPreTraining"
    masked_lm = True
    families = ("bert", "mobilebert")
    reads_pooler = True

    def __init__(self, config: ModelConfig):
        super().__init__()
        if not config.add_pooling_layer:
            raise ConfigError("the NSP head reads the pooler; set model.add_pooling_layer=true")
        self.mlm = mlm_prediction(config)
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


#: BERT: MLM + NSP on sentence pairs, masked once per copy (static) over 10 copies of the data; Adam ε = 1e-6
#: (google-research/bert ``optimization.py``; β as App. A.2)
OBJECTIVE = Objective(name="bert", family="bert", head="mlm_nsp", mode="nsp", masking="static", scheme="token",
                      dupe_factor=10, short_seq_prob=0.1, train={"adam_eps": 1.0e-6}, pooler=True,
                      source="Devlin et al. 2018 §3.1, App. A")

__all__ = ["OBJECTIVE", "BertPreTrainingHead", "pair_outputs"]
