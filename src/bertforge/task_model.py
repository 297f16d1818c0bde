"""TaskModel: one encoder plus one head, named in :data:`bertforge.heads.HEADS` — the unit that is trained,
saved and loaded.

``TaskModel(config, head="mlm")`` builds the encoder of ``config.model_type`` (:data:`ENCODERS`,
:func:`build_encoder`) and the head registered under that name; which modules were imported before does not
matter (both tables are literals). Load a checkpoint dir with :func:`bertforge.checkpoint.read.load_pretrained`
(which builds a TaskModel); :meth:`TaskModel.save_pretrained` writes one.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .checkpoint.write import save_pretrained
from .config import ModelConfig
from .errors import ConfigError
from .heads import head_class
from .models.encoder import Encoder, EncoderBase
from .models.mobilebert import MobileBertEncoder
from .models.modernbert import ModernBertEncoder
from .models.output import EncoderOutput, Features, ModelOutput

#: model family (``config.model_type``) → the encoder class that builds it
ENCODERS: dict[str, type] = {family: cls for cls in (Encoder, ModernBertEncoder, MobileBertEncoder)
                            for family in cls.families}

#: keyword arguments ``forward`` took before :class:`~bertforge.models.output.Features` (refused by name)
_FEATURE_FLAGS = {"output_hidden_states": "hidden_states", "output_attentions": "attentions",
                  "output_attention_scores": "attention_scores", "output_values": "values",
                  "head_gates": "head_gates", "cls_only": "cls_only", "output_rows": "rows"}


def build_encoder(config: ModelConfig) -> EncoderBase:
    """The encoder of ``config``'s family (:data:`ENCODERS`), freshly initialised.

    Raises:
        ConfigError: a family without an encoder class."""
    if config.model_type not in ENCODERS:
        raise ConfigError(f"no encoder for model_type={config.model_type!r}; choose one of {', '.join(ENCODERS)}")
    return ENCODERS[config.model_type](config)


def kernels_of(module: nn.Module) -> str:
    """``cpu`` when some submodule of ``module`` runs a CPU kernel (its class says ``kernels = "cpu"``:
    ``bertforge.engine.kernels.apply_kernels`` swapped it in), else ``none``."""
    return "cpu" if any(getattr(type(m), "kernels", None) == "cpu" for m in module.modules()) else "none"


class TaskModel(nn.Module):
    """One encoder plus one head, the unit that is trained, saved and loaded.

    ``forward(input_ids, attention_mask, token_type_ids, features=Features(…), labels=…)`` →
    :class:`ModelOutput`: the head's ``loss``/``logits`` and the encoder's fields that ``features``
    (:class:`~bertforge.models.output.Features`) asked for. Extra batch keys are passed to the head. The head's
    own reading (:attr:`~bertforge.models.head.Head.cls_only`, ``labelled_rows_only``) is added to the request.
    ``input_ids`` may be (B, C, T): C texts per example (a retrieval batch: query, positive, negatives), encoded
    as B·C rows of one pass; the head is told ``columns`` = C (outputs are per row, (B·C, …)).
    ``pooler_output`` is None when the head does not read it (:attr:`~bertforge.models.head.Head.reads_pooler`):
    the pooler is then not run, so it is in no graph — under DDP it is an unused parameter, not one whose gradient
    DDP waits for in vain because the returned ``pooler_output`` reaches it.
    :attr:`kernels` says which implementation runs (``repr`` shows it).

    Raises:
        TypeError: a keyword of the former flags (``output_hidden_states=…``), naming its ``Features`` field.
    """

    def __init__(self, config: ModelConfig, head: str = "base", encoder: Optional[EncoderBase] = None):
        super().__init__()
        head_cls = head_class(head)
        if head_cls.adds_pooler(config) and not config.add_pooling_layer and encoder is None:
            # e.g. the bert/albert classifier reads the tanh pooler, which HF's …ForSequenceClassification
            # always has; an encoder saved without one (e.g. SpanBERT pretraining) gets a fresh pooler
            config = config.replace(add_pooling_layer=True)
        self.config = config
        self.encoder = encoder if encoder is not None else build_encoder(config)
        self.head_name = head
        #: :class:`bertforge.models.pooling.Pooling` of an embedding model (None: not one); written as the
        #: sentence-transformers layout by :meth:`save_pretrained` when the head is ``base``
        self.pooling = None
        self.head = head_cls(config) if head != "base" else None
        if self.head is not None:
            self.head.tie_weights(self.encoder)

    @property
    def kernels(self) -> str:
        """Which implementation runs: ``cpu`` when some module runs a CPU kernel (``impl.kernels``,
        ``bertforge.engine.kernels.apply_kernels``), else ``none`` (the plain modules)."""
        return kernels_of(self)

    def extra_repr(self) -> str:
        return f"head={self.head_name!r}, kernels={self.kernels}"

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, features: Optional[Features] = None,
                **batch) -> ModelOutput:
        old = sorted(set(batch) & set(_FEATURE_FLAGS))
        if old:
            raise TypeError(f"TaskModel.forward takes features=Features({_FEATURE_FLAGS[old[0]]}=…) "
                            f"(bertforge.models.output.Features), not {old[0]}=")
        req = features or Features()
        pooler = req.pooler and (self.head is None or self.head.reads_pooler)  # not run where nothing reads it
        if input_ids.dim() == 3:  # (B, C, T): C texts per example, encoded as B·C rows
            batch["columns"] = input_ids.shape[1]
            if attention_mask is not None and not req.per_layer:
                return self._forward_columns(input_ids, attention_mask, token_type_ids, batch, pooler)
            input_ids = input_ids.flatten(0, 1)
            attention_mask = attention_mask.flatten(0, 1) if attention_mask is not None else None
            token_type_ids = token_type_ids.flatten(0, 1) if token_type_ids is not None else None
        wants_layers = req.hidden_states or req.explicit
        head = self.head
        cls_only = req.cls_only or bool(head is not None and head.cls_only and not wants_layers)
        rows = req.rows  # a head that reads only the labelled positions: the last block runs on those alone
        if rows is None and head is not None and head.labelled_rows_only and batch.get("labels") is not None \
                and not req.per_layer:
            rows = batch["labels"] != -100
        enc = self.encoder(input_ids, attention_mask, token_type_ids,
                           features=req.replace(cls_only=cls_only, rows=rows, pooler=pooler))
        batch["attention_mask"] = attention_mask
        batch["input_ids"] = input_ids
        out = head(enc, batch) if head is not None else {}
        return ModelOutput(loss=out.get("loss"), logits=out.get("logits"),
                           last_hidden_state=enc.last_hidden_state, pooler_output=enc.pooler_output,
                           hidden_states=enc.hidden_states, attentions=enc.attentions,
                           attention_scores=enc.attention_scores, values=enc.values,
                           terms=out.get("terms"))

    def _forward_columns(self, input_ids, attention_mask, token_type_ids, batch: dict,
                         pooler: bool = True) -> ModelOutput:
        """(B, C, T) texts, one encoder pass per column, each cut to its own longest text (queries are
        not padded to the passages' length, as sentence-transformers encodes each column apart); the rows
        are then put back as (B·C, T, H) with zeros at the padding. Same outputs as one pass over the B·C rows
        (padding changes no real position); only faster."""
        t = input_ids.shape[2]
        hidden, pooled = [], []
        for j in range(input_ids.shape[1]):
            n = max(1, int(attention_mask[:, j].sum(1).max()))
            enc = self.encoder(input_ids[:, j, :n], attention_mask[:, j, :n],
                               token_type_ids[:, j, :n] if token_type_ids is not None else None,
                               features=Features(pooler=pooler))
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


__all__ = ["ENCODERS", "TaskModel", "ModelOutput", "build_encoder", "kernels_of"]
