"""The base class of every head: :class:`Head`, what a head declares and what it is asked to do.

A head sits on an encoder inside :class:`~bertforge.task_model.TaskModel`: it reads the encoder's
:class:`~bertforge.models.output.EncoderOutput` and the batch and returns ``logits`` (and ``loss`` when the batch
has labels). The heads themselves live with what they serve — the task heads in :mod:`bertforge.tasks`, the
pretraining heads in :mod:`bertforge.objectives` — and are named in :data:`bertforge.heads.HEADS`. This class is
here, below both, so that they can subclass it; :mod:`bertforge.heads` offers it by name too.
"""
from __future__ import annotations

from typing import Optional

from torch import nn

from ..config import ModelConfig
from .output import EncoderOutput


class Head(nn.Module):
    """A head: ``forward(enc, batch) → {"logits": …, "loss": … (with labels), "terms": … (optional)}``.

    Subclasses set the class attributes below where they differ from the defaults and implement
    :meth:`forward` and :meth:`hf_keys`; :class:`~bertforge.task_model.TaskModel`, the checkpoint reader and
    writer, ONNX export and the distiller read the attributes directly.
    """

    #: the ``transformers`` class-name suffix a model with this head is saved as (``ForSequenceClassification``;
    #: ``Model`` for the encoder alone); read back to find the head of a checkpoint dir
    hf_suffix: str = "Model"

    #: True when the head reads position 0 ([CLS]) of the last block only: the encoder is asked for that
    #: position alone (:class:`~bertforge.models.output.Features` ``cls_only``) unless per-layer outputs are asked
    cls_only: bool = False

    #: True when, given ``labels``, the head reads only positions whose label is not -100: the encoder's last
    #: block is asked for those rows alone (``Features.rows``; the sparse masked-LM head)
    labelled_rows_only: bool = False

    #: True when the head reads ``pooler_output`` (the tanh pooler on [CLS]); otherwise TaskModel does not run the
    #: pooler (:class:`~bertforge.models.output.Features` ``pooler``), which then gets no gradient and, under DDP,
    #: is an unused parameter rather than one in the outputs' graph whose gradient never comes
    reads_pooler: bool = False

    #: True when ``logits`` are masked-LM scores over the vocabulary (…, V): :data:`bertforge.heads.MLM_HEADS`
    masked_lm: bool = False

    #: the families (``config.model_type``) the head exists for; None: every family
    families: Optional[tuple] = None

    #: False for a head without a label space (``id2label`` / ``label2id`` are then not written to config.json)
    has_labels: bool = True

    #: outputs per example or position of a task head (set from the config by the head); None without labels
    num_labels: Optional[int] = None

    @classmethod
    def adds_pooler(cls, config: ModelConfig) -> bool:
        """Whether this head reads ``pooler_output`` for ``config``'s family: TaskModel then gives an encoder
        saved without a pooler a fresh one."""
        return False

    def tie_weights(self, encoder: nn.Module) -> None:
        """Share weights with ``encoder`` (an MLM decoder with the token embeddings, Press & Wolf 2017); called
        by TaskModel after building and by the checkpoint reader after loading. Nothing by default."""

    def forward(self, enc: EncoderOutput, batch: dict) -> dict:
        raise NotImplementedError

    @staticmethod
    def hf_keys(config: ModelConfig) -> dict:
        """Our weight names (below ``head.``) → ``transformers``' names, for ``config``'s family."""
        return {}


__all__ = ["Head"]
