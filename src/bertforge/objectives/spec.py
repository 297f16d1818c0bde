"""What a pretraining objective declares: :class:`Objective`, one per objectives file.

Each objectives file (``mlm.py`` RoBERTa, ``nsp.py`` BERT, ``sop.py`` ALBERT, ``electra.py`` ELECTRA,
``spanbert.py`` SpanBERT) ends with one ``OBJECTIVE = Objective(...)``: the model family, the head (a
name in :data:`bertforge.heads.HEADS`), how sequences are built, how they are masked and the paper's
optimizer constants — as data. :data:`bertforge.objectives.pretrain.OBJECTIVES` lists them; that list is
the one place an objective is registered (docs/extending.md walks through adding one).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional


@dataclass(frozen=True)
class Objective:
    """One pretraining setup, as ``bertforge pretrain --objective NAME`` runs it.

    Attributes:
        name: the ``--objective`` name.
        family: model family of the encoder (``bert`` | ``roberta`` | ``albert`` | ``electra`` | ``distilbert``).
        head: head name in :data:`bertforge.heads.HEADS` (``electra``: generator + discriminator, see ``build``).
        mode: how sequences are cut from documents (:class:`bertforge.data.corpus.PretrainDataset`):
            ``nsp`` / ``sop`` sentence pairs, ``full`` FULL-SENTENCES, ``doc`` DOC-SENTENCES.
        masking: ``static`` (one mask per copy, drawn once) or ``dynamic`` (fresh mask each time served).
        scheme: what is selected for masking: ``token`` | ``wwm`` | ``ngram`` | ``span``
            (:class:`bertforge.objectives.collate.PretrainCollator`).
        dupe_factor: copies of the data for static masking (each with its own mask).
        short_seq_prob: probability of a shorter target length (BERT's ``short_seq_prob``).
        options: other ``pretrain.*`` defaults of this objective (e.g. ``replace_probs``).
        train: the paper's optimizer constants, laid over the size's ``train`` defaults (a recipe,
            override or flag wins).
        pooler: whether the encoder keeps its [CLS] pooler (the NSP / SOP heads read it).
        tokenizer: the kind of tokenizer trained when the recipe names none (the paper's:
            ``wordpiece`` | ``bpe`` | ``unigram``, :data:`bertforge.data.tokenizers_train.KINDS`).
        build: ``(config, opts) -> model`` for objectives whose model is not one ``TaskModel`` (ELECTRA);
            None builds ``TaskModel(config, head=head)``.
        source: the paper and section the defaults come from.
    """

    name: str
    family: str
    head: str
    mode: str
    masking: str
    scheme: str
    dupe_factor: int = 1
    short_seq_prob: float = 0.0
    options: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    pooler: bool = False
    tokenizer: str = "wordpiece"
    build: Optional[Callable] = None
    source: str = ""

    def defaults(self) -> dict:
        """The ``pretrain.*`` settings this objective fixes (before the recipe's own)."""
        return {"family": self.family, "head": self.head, "mode": self.mode, "masking": self.masking,
                "dupe_factor": self.dupe_factor, "scheme": self.scheme, "short_seq_prob": self.short_seq_prob,
                **self.options}


__all__ = ["Objective"]
