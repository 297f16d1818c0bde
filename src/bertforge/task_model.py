"""TaskModel: one encoder plus one head, named in :data:`bertforge.heads.HEADS` — the unit that is trained,
saved and loaded.

``TaskModel(config, head="mlm")`` builds the head registered under that name; which modules were imported
before does not matter (the table is a literal in :mod:`bertforge.heads`). Load a checkpoint dir with
:func:`bertforge.checkpoint.read.load_pretrained`; :meth:`TaskModel.save_pretrained` writes one.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .checkpoint.write import save_pretrained
from .config import ModelConfig
from .heads import head_class
from .models.encoder import Encoder, EncoderOutput
from .models.output import ModelOutput


class TaskModel(nn.Module):
    """One encoder plus one head, the unit that is trained, saved and loaded.

    ``forward(input_ids, attention_mask, token_type_ids, labels=…, output_hidden_states=…,
    output_attentions=…)`` → :class:`ModelOutput`. Extra batch keys are passed to the head.
    ``input_ids`` may be (B, C, T): C texts per example (a retrieval batch: query, positive, negatives), encoded
    as B·C rows of one pass; the head is told ``columns`` = C (outputs are per row, (B·C, …)).
    """

    def __init__(self, config: ModelConfig, head: str = "base", encoder: Optional[Encoder] = None):
        super().__init__()
        head_cls = head_class(head)
        if getattr(head_cls, "adds_pooler", None) and head_cls.adds_pooler(config) \
                and not config.add_pooling_layer and encoder is None:
            # e.g. the bert/albert classifier reads the tanh pooler, which HF's …ForSequenceClassification
            # always has; an encoder saved without one (e.g. SpanBERT pretraining) gets a fresh pooler
            config = config.replace(add_pooling_layer=True)
        self.config = config
        self.encoder = encoder if encoder is not None else Encoder(config)
        self.head_name = head
        #: :class:`bertforge.models.pooling.Pooling` of an embedding model (None: not one); written as the
        #: sentence-transformers layout by :meth:`save_pretrained` when the head is ``base``
        self.pooling = None
        self.head = head_cls(config) if head != "base" else None
        if self.head is not None and hasattr(self.head, "tie_weights"):
            self.head.tie_weights(self.encoder)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, output_hidden_states: bool = False,
                output_attentions: bool = False, output_attention_scores: bool = False,
                output_values: bool = False, head_gates: Optional[torch.Tensor] = None,
                **batch) -> ModelOutput:
        if input_ids.dim() == 3:  # (B, C, T): C texts per example, encoded as B·C rows
            batch["columns"] = input_ids.shape[1]
            if attention_mask is not None and not (output_hidden_states or output_attentions or output_values
                                                   or output_attention_scores or head_gates is not None):
                return self._forward_columns(input_ids, attention_mask, token_type_ids, batch)
            input_ids = input_ids.flatten(0, 1)
            attention_mask = attention_mask.flatten(0, 1) if attention_mask is not None else None
            token_type_ids = token_type_ids.flatten(0, 1) if token_type_ids is not None else None
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

    def _forward_columns(self, input_ids, attention_mask, token_type_ids, batch: dict) -> ModelOutput:
        """(B, C, T) texts, one encoder pass per column, each cut to its own longest text (queries are
        not padded to the passages' length, as sentence-transformers encodes each column apart); the rows
        are then put back as (B·C, T, H) with zeros at the padding. Same outputs as one pass over the B·C rows
        (padding changes no real position); only faster."""
        t = input_ids.shape[2]
        hidden, pooled = [], []
        for j in range(input_ids.shape[1]):
            n = max(1, int(attention_mask[:, j].sum(1).max()))
            enc = self.encoder(input_ids[:, j, :n], attention_mask[:, j, :n],
                               token_type_ids[:, j, :n] if token_type_ids is not None else None)
            hidden.append(nn.functional.pad(enc.last_hidden_state, (0, 0, 0, t - n)))
            pooled.append(enc.pooler_output)
        hidden = torch.stack(hidden, 1)
        pooled = torch.stack(pooled, 1) if pooled[0] is not None else None
        hidden = hidden.flatten(0, 1)
        pooled = pooled.flatten(0, 1) if pooled is not None else None
        batch["attention_mask"] = attention_mask.flatten(0, 1)
        batch["input_ids"] = input_ids.flatten(0, 1)
        enc = EncoderOutput(last_hidden_state=hidden, pooler_output=pooled)
        out = self.head(enc, batch) if self.head is not None else {}
        return ModelOutput(loss=out.get("loss"), logits=out.get("logits"), last_hidden_state=hidden,
                           pooler_output=pooled, terms=out.get("terms"))

    def save_pretrained(self, out_dir, tokenizer_dir=None, tokenizer=None, pooling=None) -> None:
        """Write a ``transformers`` checkpoint dir (``config.json``, ``model.safetensors``, and the tokenizer
        files of ``tokenizer_dir`` or the ``tokenizers.Tokenizer`` ``tokenizer``; with ``pooling`` or
        :attr:`pooling` on a ``base`` model, the sentence-transformers files too); see
        :func:`bertforge.checkpoint.write.save_pretrained` (ConfigError for a ``tokenizer_dir`` without tokenizer
        files)."""
        save_pretrained(self, out_dir, tokenizer_dir=tokenizer_dir, tokenizer=tokenizer, pooling=pooling)


__all__ = ["TaskModel", "ModelOutput"]
