"""Per-token heads: token classification (NER) and extractive question answering (start/end spans).

Both are the heads of Devlin et al. 2018 (BERT, §4.2 SQuAD v1.1, §4.3 SQuAD v2.0, §5.3 / Table 7
CoNLL-2003 NER): one linear layer on every final hidden state. Their weight names are Hugging Face's
for every family (``classifier.*`` and ``qa_outputs.*``), so a saved dir loads in
``transformers.AutoModelForTokenClassification`` / ``AutoModelForQuestionAnswering``.

Logit layouts (what a distiller compares; softmax is over the **last** dim in both):

* ``token_classification``: ``logits`` (B, T, C) tag scores. Positions with ``attention_mask == 0``
  are set to 0 (a uniform distribution), so a KL over the last dim adds nothing there.
* ``question_answering``: ``logits`` (B, 2, T) = ``stack([start_logits, end_logits], 1)``: row 0 scores
  each position as the answer start, row 1 as its end. Padding positions get −10⁴, so the
  softmax over T (the span distribution) puts no mass on them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from .encoder import EncoderOutput
from .heads import register_head

#: the logit given to padding positions of the QA head (finite, so KL/log-softmax stay finite)
QA_PAD_LOGIT = -1.0e4


def _dropout_p(config: ModelConfig) -> float:
    return config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob


@register_head("token_classification")
class TokenClassificationHead(nn.Module):
    """``dropout → Linear(H, C)`` on every final hidden state (Devlin et al. 2018 §5.3).

    Input (B, T, H) → ``logits`` (B, T, C). With ``labels`` (B, T) (−100 = ignored: continuation
    subwords, special tokens, padding) the loss is the token-level cross-entropy averaged over the
    labelled positions.
    """

    hf_suffix = "ForTokenClassification"
    cls_only = False

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_labels = config.num_labels
        self.dropout = nn.Dropout(_dropout_p(config))
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        nn.init.normal_(self.classifier.weight, 0.0, config.initializer_range)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, enc: EncoderOutput, batch: dict) -> dict:
        logits = self.classifier(self.dropout(enc.last_hidden_state))
        am = batch.get("attention_mask")
        if am is not None:
            logits = logits.masked_fill(am[..., None] == 0, 0.0)
        out = {"logits": logits}
        labels = batch.get("labels")
        if labels is not None:
            out["loss"] = F.cross_entropy(logits.float().reshape(-1, self.num_labels),
                                          labels.long().reshape(-1), ignore_index=-100)
        return out

    @staticmethod
    def hf_keys(config: ModelConfig) -> dict:
        return {"classifier.weight": "classifier.weight", "classifier.bias": "classifier.bias"}


@register_head("question_answering")
class QuestionAnsweringHead(nn.Module):
    """Span start/end scores ``S·h_i`` and ``E·h_i`` from one ``Linear(H, 2)`` (Devlin et al. 2018
    §4.2; HF ``qa_outputs``).

    Input (B, T, H) → ``logits`` (B, 2, T) (row 0 start, row 1 end; padding = −10⁴). With
    ``start_positions`` / ``end_positions`` (B,) the loss is ``(CE(start) + CE(end)) / 2`` over the T
    positions; a window without the answer points both at index 0 ([CLS]), as in the paper's v2.0
    recipe. Positions outside [0, T) are clamped to T and ignored (as ``transformers``).
    """

    hf_suffix = "ForQuestionAnswering"
    cls_only = False

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.num_labels != 2:
            from ..errors import ConfigError
            raise ConfigError(f"the question_answering head has 2 outputs (start, end) but the config has "
                              f"num_labels={config.num_labels}; set model.num_labels=2")
        self.num_labels = 2
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        nn.init.normal_(self.qa_outputs.weight, 0.0, config.initializer_range)
        nn.init.zeros_(self.qa_outputs.bias)

    def forward(self, enc: EncoderOutput, batch: dict) -> dict:
        logits = self.qa_outputs(enc.last_hidden_state).transpose(1, 2)  # (B, 2, T)
        am = batch.get("attention_mask")
        if am is not None:
            logits = logits.masked_fill(am[:, None, :] == 0, QA_PAD_LOGIT)
        out = {"logits": logits}
        sp, ep = batch.get("start_positions"), batch.get("end_positions")
        if sp is not None and ep is not None:
            t = logits.shape[-1]
            sp, ep = sp.long().clamp(0, t), ep.long().clamp(0, t)
            z = logits.float()
            ls = F.cross_entropy(z[:, 0], sp, ignore_index=t)
            le = F.cross_entropy(z[:, 1], ep, ignore_index=t)
            out["loss"] = (ls + le) / 2
            out["terms"] = {"start_loss": ls.detach(), "end_loss": le.detach()}
        return out

    @staticmethod
    def hf_keys(config: ModelConfig) -> dict:
        return {"qa_outputs.weight": "qa_outputs.weight", "qa_outputs.bias": "qa_outputs.bias"}


def split_qa_logits(logits: torch.Tensor) -> tuple:
    """(B, 2, T) QA logits → (start_logits (B, T), end_logits (B, T))."""
    return logits[:, 0], logits[:, 1]


__all__ = ["TokenClassificationHead", "QuestionAnsweringHead", "split_qa_logits", "QA_PAD_LOGIT"]
