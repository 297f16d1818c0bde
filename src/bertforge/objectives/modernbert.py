"""ModernBERT pretraining (Warner et al. 2024, §2.2): masked language modelling alone — no next-sentence
prediction — with 30% of the tokens selected for prediction (80% [MASK], 10% random, 10% kept), on
sequences packed across documents, a fresh mask each time a sequence is served.

The head is the ModernBERT masked-LM head (``ModernBertForMaskedLM``: ``LN(GELU(W·h))·Eᵀ + b``, tied to the
token embeddings, :class:`~bertforge.objectives.mlm.MaskedLMHead` with ``model_type="modernbert"``); the
encoder is :mod:`bertforge.models.modernbert`. Optimizer constants: AdamW β = (0.9, 0.98), ε = 1e-6 (§2.2.3
trains with StableAdamW at those βs; plain AdamW here). Dropout 0 everywhere but the attention, as released.
"""
from __future__ import annotations

from .spec import Objective

#: ModernBERT: MLM at a 30% masking rate, no NSP, FULL-SENTENCES, dynamic masks; byte-level BPE by default
#: (the released models use OLMo's BPE tokenizer); any trained kind or a checkpoint's tokenizer works too
OBJECTIVE = Objective(name="modernbert", family="modernbert", head="mlm", mode="full", masking="dynamic",
                      scheme="token", options={"mlm_probability": 0.3},
                      train={"adam_betas": [0.9, 0.98], "adam_eps": 1.0e-6},
                      tokenizer="bpe", source="Warner et al. 2024 §2.2")

__all__ = ["OBJECTIVE"]
