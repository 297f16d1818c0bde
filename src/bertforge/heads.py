"""Every head by name: :data:`HEADS`, the one table a head is registered in; :class:`Head`, the class of them all.

A head reads an :class:`~bertforge.models.output.EncoderOutput` and the batch and returns ``logits`` (and
``loss`` when the batch has labels). Each head lives with what it serves: the task heads in
:mod:`bertforge.tasks` (classification, NER, QA), the pretraining heads in :mod:`bertforge.objectives`.
This table sits above both and below :class:`~bertforge.task_model.TaskModel`, which builds a head by
name, and :mod:`bertforge.checkpoint.write` / :mod:`bertforge.checkpoint.read`, which read and write the name into
``config.json``. Nothing registers itself on import: what is in the table is what exists.

Every head subclasses :class:`Head` (defined in :mod:`bertforge.models.head`, below the task and objective
modules that subclass it, and offered here by name): ``hf_suffix`` (the ``transformers`` class-name suffix,
e.g. ``ForSequenceClassification``), ``cls_only`` (only position 0 of the last layer is read),
``labelled_rows_only`` (given labels, only positions with a label ≠ -100 are read), ``reads_pooler`` (the head
reads ``pooler_output``; otherwise the pooler is not run), ``masked_lm`` (``logits``
are masked-LM scores (…, V)), ``families`` (the families it exists for), ``has_labels``, ``num_labels``,
``adds_pooler(config)``, ``tie_weights(encoder)`` and ``hf_keys(config)`` (our weight names → Hugging Face's),
each documented there with its default.
"""
from __future__ import annotations

from .config import ModelConfig
from .errors import ConfigError
from .models.head import Head
from .models.output import EncoderOutput
from .objectives.mlm import MaskedLMHead
from .objectives.nsp import BertPreTrainingHead
from .objectives.rtd import ReplacedTokenDetectionHead
from .objectives.sop import AlbertPreTrainingHead
from .objectives.spanbert import SpanBertHead
from .tasks.classification import SequenceClassificationHead
from .tasks.ner import TokenClassificationHead
from .tasks.qa import QuestionAnsweringHead
from .tasks.retrieval import EmbeddingHead


class NoHead(Head):
    """The encoder alone (``…Model``): no logits, no loss."""

    hf_suffix = "Model"
    reads_pooler = True  # ``pooler_output`` is an output of the encoder alone, as in transformers' …Model

    def __init__(self, config: ModelConfig):
        super().__init__()

    def forward(self, enc: EncoderOutput, batch: dict) -> dict:
        return {}


#: head name → head class. The order is the lookup order of a ``transformers`` class name
#: (``BertForMaskedLM`` → ``mlm`` before ``mlm_sbo``).
HEADS: dict[str, type] = {
    "base": NoHead,
    "sequence_classification": SequenceClassificationHead,  # tasks/classification.py
    "token_classification": TokenClassificationHead,  # tasks/ner.py
    "question_answering": QuestionAnsweringHead,  # tasks/qa.py
    "mlm": MaskedLMHead,  # objectives/mlm.py
    "mlm_nsp": BertPreTrainingHead,  # objectives/nsp.py
    "mlm_sop": AlbertPreTrainingHead,  # objectives/sop.py
    "mlm_sbo": SpanBertHead,  # objectives/spanbert.py
    "electra_discriminator": ReplacedTokenDetectionHead,  # objectives/rtd.py
    "embedding": EmbeddingHead,  # tasks/retrieval.py (no weights: saved as the plain encoder, …Model)
}

#: the plain masked-LM head (``…ForMaskedLM``): what a teacher with any masked-LM head is loaded with to teach
MLM_HEAD = "mlm"

#: heads whose ``logits`` are masked-LM scores (MLM alone, or with NSP / SOP / SBO)
MLM_HEADS = tuple(name for name, cls in HEADS.items() if cls.masked_lm)


def head_class(name: str) -> type:
    """The head class registered as ``name``. Raises ConfigError for a name not in :data:`HEADS`."""
    if name not in HEADS:
        raise ConfigError(f"unknown head {name!r}; choose one of {', '.join(HEADS)}")
    return HEADS[name]


def has_mlm_head(model) -> bool:
    """Whether ``model`` (a :class:`~bertforge.task_model.TaskModel`) has a masked-LM head (one of
    :data:`MLM_HEADS`): its ``logits`` without labels are (B, T, V) vocabulary scores."""
    return getattr(model, "head_name", None) in MLM_HEADS


__all__ = ["HEADS", "Head", "MLM_HEAD", "MLM_HEADS", "NoHead", "head_class", "has_mlm_head"]
