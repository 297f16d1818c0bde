"""Task heads on top of the encoder, and :class:`TaskModel` (encoder + one head).

A head reads an :class:`~bertforge.models.encoder.EncoderOutput` and the batch, and returns ``logits``
(and ``loss`` when labels are present). Heads are picked by name from :data:`HEADS`; each knows the
Hugging Face class-name suffix and its own weight names per family, so a saved dir loads in
``transformers.AutoModelFor…``.

Registered here: ``base`` (no head) and ``sequence_classification`` (classification or regression on
[CLS], Devlin et al. 2018 §4.1). Other modules register more (masked LM, token classification, QA).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from .activations import get_activation
from .encoder import Encoder, EncoderOutput

#: head name → head class. A head class has ``hf_suffix`` (e.g. "ForSequenceClassification"),
#: ``cls_only`` (True when only position 0 of the last layer is read) and ``hf_keys(config)``; optionally
#: ``labelled_rows_only`` (True when, given labels, only positions with a label ≠ -100 are read).
HEADS: dict[str, type] = {}


def register_head(name: str) -> Callable[[type], type]:
    def deco(cls: type) -> type:
        HEADS[name] = cls
        cls.head_name = name
        return cls
    return deco


@dataclass
class ModelOutput:
    """``loss`` scalar or None; ``logits`` (B, num_labels) / (B, T, V) / … by head; the encoder fields as
    in :class:`EncoderOutput`; ``terms``: named loss components (floats or scalars) for logging."""

    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None
    last_hidden_state: Optional[torch.Tensor] = None
    pooler_output: Optional[torch.Tensor] = None
    hidden_states: Optional[tuple] = None
    attentions: Optional[tuple] = None
    attention_scores: Optional[tuple] = None
    values: Optional[tuple] = None
    terms: Optional[dict] = None

    def __getitem__(self, k):
        return getattr(self, k)


@register_head("base")
class NoHead(nn.Module):
    hf_suffix = "Model"
    cls_only = False

    def __init__(self, config: ModelConfig):
        super().__init__()

    def forward(self, enc: EncoderOutput, batch: dict) -> dict:
        return {}

    @staticmethod
    def hf_keys(config: ModelConfig) -> dict:
        return {}


@register_head("sequence_classification")
class SequenceClassificationHead(nn.Module):
    """Classification (cross-entropy) or regression (MSE, ``num_labels == 1``) on the [CLS] state.

    Per family, as the original implementations: bert/albert ``dropout → Linear`` on the tanh pooler;
    roberta/electra ``dropout → Linear → tanh|gelu → dropout → Linear`` on h_[CLS]; distilbert
    ``Linear → ReLU → dropout → Linear`` on h_[CLS]. Input (B, T, H) → logits (B, num_labels).
    """

    hf_suffix = "ForSequenceClassification"
    cls_only = True
    POOLER_FAMILIES = ("bert", "albert")  # the head reads ``pooler_output``

    def __init__(self, config: ModelConfig):
        super().__init__()
        fam, h = config.model_type, config.hidden_size
        self.family = fam
        self.num_labels = config.num_labels
        self.regression = config.num_labels == 1 or config.problem_type == "regression"
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(p)
        self.use_pooler = fam in self.POOLER_FAMILIES
        self.dense = None if self.use_pooler else nn.Linear(h, h)
        self.act = {"roberta": torch.tanh, "electra": get_activation("gelu"),
                    "distilbert": F.relu}.get(fam)
        self.classifier = nn.Linear(h, config.num_labels)
        nn.init.normal_(self.classifier.weight, 0.0, config.initializer_range)
        nn.init.zeros_(self.classifier.bias)
        if self.dense is not None:
            nn.init.normal_(self.dense.weight, 0.0, config.initializer_range)
            nn.init.zeros_(self.dense.bias)

    def forward(self, enc: EncoderOutput, batch: dict) -> dict:
        if self.use_pooler:
            x = self.dropout(enc.pooler_output)
        else:
            x = enc.last_hidden_state[:, 0]
            if self.family == "distilbert":
                x = self.dropout(self.act(self.dense(x)))
            else:
                x = self.dropout(self.act(self.dense(self.dropout(x))))
        logits = self.classifier(x)
        out = {"logits": logits}
        labels = batch.get("labels")
        if labels is not None:
            if self.regression:
                out["loss"] = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                out["loss"] = F.cross_entropy(logits.float(), labels.long())
        return out

    @staticmethod
    def hf_keys(config: ModelConfig) -> dict:
        fam = config.model_type
        if fam in ("bert", "albert"):
            return {"classifier.weight": "classifier.weight", "classifier.bias": "classifier.bias"}
        if fam == "distilbert":
            return {"dense.weight": "pre_classifier.weight", "dense.bias": "pre_classifier.bias",
                    "classifier.weight": "classifier.weight", "classifier.bias": "classifier.bias"}
        return {"dense.weight": "classifier.dense.weight", "dense.bias": "classifier.dense.bias",
                "classifier.weight": "classifier.out_proj.weight",
                "classifier.bias": "classifier.out_proj.bias"}


class TaskModel(nn.Module):
    """One encoder plus one head, the unit that is trained, saved and loaded.

    ``forward(input_ids, attention_mask, token_type_ids, labels=…, output_hidden_states=…,
    output_attentions=…)`` → :class:`ModelOutput`. Extra batch keys are passed to the head.
    """

    def __init__(self, config: ModelConfig, head: str = "base", encoder: Optional[Encoder] = None):
        super().__init__()
        if head not in HEADS:
            from ..errors import ConfigError
            raise ConfigError(f"unknown head {head!r}; choose one of {', '.join(HEADS)}")
        if (head == "sequence_classification" and config.model_type in SequenceClassificationHead.POOLER_FAMILIES
                and not config.add_pooling_layer and encoder is None):
            # the bert/albert head reads the tanh pooler, which HF's …ForSequenceClassification always has;
            # an encoder saved without one (e.g. SpanBERT pretraining) gets a fresh pooler
            config = config.replace(add_pooling_layer=True)
        self.config = config
        self.encoder = encoder if encoder is not None else Encoder(config)
        self.head_name = head
        self.head = HEADS[head](config) if head != "base" else None
        if self.head is not None and hasattr(self.head, "tie_weights"):
            self.head.tie_weights(self.encoder)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, output_hidden_states: bool = False,
                output_attentions: bool = False, output_attention_scores: bool = False,
                output_values: bool = False, head_gates: Optional[torch.Tensor] = None,
                **batch) -> ModelOutput:
        wants_layers = output_hidden_states or output_attentions or output_attention_scores
        cls_only = bool(self.head is not None and self.head.cls_only and not wants_layers)
        rows = None  # a head that reads only the labelled positions: the last block runs on those alone
        if getattr(self.head, "labelled_rows_only", False) and batch.get("labels") is not None \
                and not (wants_layers or output_values or head_gates is not None):
            rows = batch["labels"] != -100
        enc = self.encoder(input_ids, attention_mask, token_type_ids,
                           output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                           output_attention_scores=output_attention_scores, output_values=output_values,
                           head_gates=head_gates, cls_only=cls_only, output_rows=rows)
        batch["attention_mask"] = attention_mask
        batch["input_ids"] = input_ids
        out = self.head(enc, batch) if self.head is not None else {}
        return ModelOutput(loss=out.get("loss"), logits=out.get("logits"),
                           last_hidden_state=enc.last_hidden_state, pooler_output=enc.pooler_output,
                           hidden_states=enc.hidden_states, attentions=enc.attentions,
                           attention_scores=enc.attention_scores, values=enc.values,
                           terms=out.get("terms"))

    def save_pretrained(self, out_dir, tokenizer_dir=None, tokenizer=None) -> None:
        """Write a ``transformers`` checkpoint dir (``config.json``, ``model.safetensors``, and the tokenizer
        files of ``tokenizer_dir`` or the ``tokenizers.Tokenizer`` ``tokenizer``); see
        :func:`bertforge.hf.save_pretrained` (ConfigError for a ``tokenizer_dir`` without tokenizer files)."""
        from ..hf import save_pretrained
        save_pretrained(self, out_dir, tokenizer_dir=tokenizer_dir, tokenizer=tokenizer)

    @classmethod
    def from_pretrained(cls, path, head: Optional[str] = None, **config_overrides) -> "TaskModel":
        from ..hf import load_pretrained
        return load_pretrained(path, head=head, **config_overrides)


# heads defined in their own modules register themselves on import
from . import span_heads  # noqa: E402,F401  (token_classification, question_answering)
