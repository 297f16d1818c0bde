"""What a model is asked for and what it returns: :class:`Features`, :class:`EncoderOutput`, :class:`ModelOutput`.

Every encoder (:class:`~bertforge.models.encoder.Encoder`, :class:`~bertforge.models.modernbert.ModernBertEncoder`
and the CPU kernels' :class:`~bertforge.engine.kernels.cpu.CpuEncoder`) takes one :class:`Features` request and
returns one :class:`EncoderOutput` holding exactly what was asked. ``TaskModel`` (:mod:`bertforge.task_model`), the
ELECTRA pretraining model and the distiller return a :class:`ModelOutput`, so the Trainer, evaluation and
distillation read ``loss``, ``logits`` and the encoder's states the same way.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Optional, Sequence

import torch


@dataclass
class EncoderOutput:
    """``last_hidden_state`` (B, T, H) — (B, 1, H) for a ``cls_only`` request, (N, H) for a ``rows`` one;
    ``pooler_output`` (B, H) or None; ``hidden_states``: L+1 tensors (B, T, H), embeddings first;
    ``attentions``: L tensors (B, heads, T, T) of probabilities; ``attention_scores``: L tensors of pre-softmax
    scores (mask added); ``values``: L tensors (B, heads, T, d_k). A per-layer field is None unless the
    :class:`Features` request asked for it."""

    last_hidden_state: torch.Tensor
    pooler_output: Optional[torch.Tensor] = None
    hidden_states: Optional[tuple] = None
    attentions: Optional[tuple] = None
    attention_scores: Optional[tuple] = None
    values: Optional[tuple] = None


@dataclass(frozen=True, eq=False)
class Features:
    """One request to an encoder: which per-layer outputs to return, per-head gates, and which positions of
    the last block the caller reads. ``Features()`` asks for ``last_hidden_state`` and ``pooler_output`` only.

    Outputs (each an L- or (L+1)-tuple of the :class:`EncoderOutput` field of the same name):

    * ``hidden_states`` — every layer's output, embeddings first (DistilBERT's cosine, TinyBERT's hidden MSE,
      BERT-PKD; ``transformers``' ``output_hidden_states``);
    * ``attentions`` — attention probabilities (MiniLM's attention KL; ``output_attentions``);
    * ``attention_scores`` — pre-softmax scores QKᵀ/√d_k + mask (TinyBERT eq. 7);
    * ``values`` — per-head values (MiniLM's value relation, Wang et al. 2020 eq. 5).

    Modifiers:

    * ``head_gates`` — L tensors, (heads,) or per example (B, heads), multiplying each head's context: the
      ξ_h whose gradients give head importance (Michel et al. 2019, §4.1); a gated run materialises the
      attention probabilities.
    * ``cls_only`` — the caller reads position 0 of the last block only: ``last_hidden_state`` is (B, 1, H)
      (a head on [CLS]). Ignored when ``attentions``, ``attention_scores`` or ``head_gates`` are asked for.
    * ``rows`` — (B, T) bool: the caller reads the last block at these positions only: ``last_hidden_state``
      is (N, H) in row-major order and there is no ``pooler_output`` (MLM's masked tokens). Ignored with
      ``cls_only`` or any per-layer output.
    * ``pooler`` — False: the caller does not read ``pooler_output``, so the pooler is not run (None is
      returned). TaskModel asks so for a head that does not read it (``Head.reads_pooler``: mean or [CLS]
      pooling, NER, QA, embeddings), which keeps the pooler out of the graph: under DDP a parameter reached
      from a forward's outputs but not from its loss never gets its gradient, and the next step stops.

    ``cls_only``, ``rows`` and ``pooler`` change what is returned, never a value: an implementation may compute
    only the positions returned (the CPU kernels do). Positions where ``attention_mask`` is 0 hold no defined
    value.
    """

    hidden_states: bool = False
    attentions: bool = False
    attention_scores: bool = False
    values: bool = False
    head_gates: Optional[Sequence[torch.Tensor]] = None
    cls_only: bool = False
    rows: Optional[torch.Tensor] = None
    pooler: bool = True

    @property
    def explicit(self) -> bool:
        """Whether the attention probabilities and scores are materialised (not a fused kernel's)."""
        return self.attentions or self.attention_scores

    @property
    def per_layer(self) -> bool:
        """Whether every layer runs on every position: some per-layer output or gates are asked for."""
        return self.explicit or self.hidden_states or self.values or self.head_gates is not None

    @property
    def last_cls(self) -> bool:
        """Whether the last block returns position 0 only (``cls_only`` where it applies)."""
        return self.cls_only and not self.explicit and self.head_gates is None

    @property
    def last_rows(self) -> Optional[torch.Tensor]:
        """The (B, T) positions the last block returns, or None for every position (``rows`` where it applies)."""
        return None if (self.per_layer or self.cls_only) else self.rows

    def gates(self, layer: int) -> Optional[torch.Tensor]:
        """The head gates of block ``layer`` (0-based), or None."""
        return None if self.head_gates is None else self.head_gates[layer]

    def __or__(self, other: "Features") -> "Features":
        """The request asking for what either asks: flags or'ed; gates and rows from whichever has them
        (``self`` first)."""
        def pick(a, b):
            return (a or b) if isinstance(a, bool) else (a if a is not None else b)
        return Features(**{f.name: pick(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)})

    def replace(self, **changes) -> "Features":
        """A copy with ``changes`` (field name → value)."""
        return replace(self, **changes)

    def output(self, last_hidden_state: torch.Tensor, pooler_output: Optional[torch.Tensor] = None,
               hidden_states: Sequence = (), attentions: Sequence = (), attention_scores: Sequence = (),
               values: Sequence = ()) -> EncoderOutput:
        """The :class:`EncoderOutput` holding exactly what this request asked for, from the per-layer lists
        an encoder collected."""
        return EncoderOutput(last_hidden_state=last_hidden_state, pooler_output=pooler_output,
                             hidden_states=tuple(hidden_states) if self.hidden_states else None,
                             attentions=tuple(attentions) if self.attentions else None,
                             attention_scores=tuple(attention_scores) if self.attention_scores else None,
                             values=tuple(values) if self.values else None)


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


__all__ = ["EncoderOutput", "Features", "ModelOutput"]
