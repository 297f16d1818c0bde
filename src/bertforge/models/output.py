"""What a model returns: :class:`ModelOutput`, the fields every head and wrapper fill.

``TaskModel`` (:mod:`bertforge.task_model`), the ELECTRA pretraining model and the distiller all return one,
so the Trainer, evaluation and distillation read ``loss``, ``logits`` and the encoder's states the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class ModelOutput:
    """``loss`` scalar or None; ``logits`` (B, num_labels) / (B, T, V) / … by head; the encoder fields as
    in :class:`~bertforge.models.encoder.EncoderOutput`; ``terms``: named loss components (floats or scalars) for logging."""

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


__all__ = ["ModelOutput"]
