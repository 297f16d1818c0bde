"""Sentence-order prediction (Lan et al. 2019, §4.1 "Inter-sentence coherence loss"): positives are two
consecutive segments in order (label 0), negatives the same two swapped (label 1); a 2-way classifier
on the pooled [CLS] state (dropout → Linear), trained with MLM: ``loss = L_MLM + L_SOP``. Saved as
``AlbertForPreTraining`` (``predictions.*`` + ``sop_classifier.classifier``)."""
from __future__ import annotations

from torch import nn

from ..config import ModelConfig
from ..errors import ConfigError
from ..models.head import Head
from .mlm import MLMPrediction, mlm_hf_keys, mlm_outputs
from .nsp import pair_outputs
from .spec import Objective


class AlbertPreTrainingHead(Head):
    """MLM + SOP. Batch keys: ``labels`` (B, T), ``sentence_order_label`` (B,). SOP logits (B, 2)."""

    hf_suffix = "ForPreTraining"
    masked_lm = True
    families = ("albert",)
    reads_pooler = True

    def __init__(self, config: ModelConfig):
        super().__init__()
        if not config.add_pooling_layer:
            raise ConfigError("the SOP head reads the pooler; set model.add_pooling_layer=true")
        self.mlm = MLMPrediction(config)
        p = config.classifier_dropout if config.classifier_dropout is not None else 0.1
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, 2)
        nn.init.normal_(self.classifier.weight, 0.0, config.initializer_range)
        nn.init.zeros_(self.classifier.bias)

    def tie_weights(self, encoder) -> None:
        self.mlm.tie(encoder.embeddings.word_embeddings)

    def forward(self, enc, batch: dict) -> dict:
        out = mlm_outputs(self.mlm, enc.last_hidden_state, batch.get("labels"), batch.get("loss_normalizer"))
        logits = self.classifier(self.dropout(enc.pooler_output))
        return pair_outputs(out, logits, batch.get("sentence_order_label"), "sop")

    @staticmethod
    def hf_keys(config: ModelConfig) -> dict:
        return {**mlm_hf_keys(config), "classifier.weight": "sop_classifier.classifier.weight",
                "classifier.bias": "sop_classifier.classifier.bias"}


#: ALBERT: MLM on whole-word n-grams (p(n) ∝ 1/n, n ≤ 3, Lan et al. 2019 §4.1) + SOP on segment pairs. ALBERT
#: trained with LAMB: AdamW keeps its defaults here
OBJECTIVE = Objective(name="albert", family="albert", head="mlm_sop", mode="sop", masking="dynamic", scheme="ngram",
                      short_seq_prob=0.1, pooler=True, tokenizer="unigram",  # SentencePiece (§4.1)
                      source="Lan et al. 2019 §3.1-4.1")

__all__ = ["OBJECTIVE", "AlbertPreTrainingHead"]
