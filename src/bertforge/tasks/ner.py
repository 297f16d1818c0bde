"""Token classification (NER): CoNLL-2003 and any IOB2-tagged data — tasks, reader, head, adapter and metric.

* tasks: ``conll2003`` — CoNLL-2003 English NER (Tjong Kim Sang & De Meulder 2003), CoNLL column files,
  labels ``O, B/I-PER, B/I-ORG, B/I-LOC, B/I-MISC`` (the ``datasets`` order); ``ner`` — any IOB NER data
  (CoNLL columns or JSONL ``tokens``/``tags``); the label set comes from ``data.labels=[...]`` or, when
  absent, from the training file.
* reader: :mod:`bertforge.data.conll` (CoNLL columns / JSONL, first-subword windows, document packing).
* head: :class:`TokenClassificationHead` (Devlin et al. 2018 §5.3, Table 7): one linear layer on every final
  hidden state, saved as ``…ForTokenClassification`` (``classifier.*``). ``logits`` (B, T, C) tag scores;
  positions with ``attention_mask == 0`` are set to 0 (a uniform distribution), so a KL over the last dim
  adds nothing there. As in ``transformers`` the model has no pooler (``add_pooling_layer=False``).
* adapter: :class:`TokenClassificationAdapter` (kind ``token_classification``): ``read`` a file's sentences,
  or ``encode`` plain texts (cut into words with their character offsets, :func:`split_words`: at whitespace,
  as the CoNLL / JSONL words the model was trained on) into windows (one sentence can give several);
  ``decode`` re-assembles the windows' logits into one tag per word (its first subword's, or the ``average`` /
  ``max`` over its subwords) and the entities with character offsets; ``score`` them — the same steps for
  ``evaluate``, ``predict`` and ``serve``'s ``/ner``.
* words: a model dir records how a text is cut into words (``config.json`` → ``bertforge.words``, written by
  ``finetune``: ``whitespace``) and may record ``bertforge.aggregation``; :func:`ner_settings` reads them for
  every consumer (``evaluate`` / ``predict``, ``serve``, ``bundle`` → the lite runtime).
* metric: :func:`entity_scores`, entity-level P/R/F1 over chunks as ``conlleval``, computed with ``seqeval``;
  ``accuracy`` is per word.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import numpy as np
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..data.conll import (AGGREGATIONS, TokenExample, encode_token_windows, label_list, pack_sentences,
                          read_token_examples, unpack_words, words_from_windows)
from ..errors import ConfigError, DataError
from ..models.head import Head
from ..models.modernbert import PredictionHead, init_modernbert
from ..models.output import EncoderOutput
from ..tokenizer import pad_id
from .base import Task, TaskAdapter, TokenCollator, Windows, softmax, stack_padded, window_logits

CONLL2003_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")

#: the benchmark's learning rate (benchmarks/ner_qa_minilm.sh: CoNLL-2003 valid F1 0.843)
NER_DEFAULTS = {"train.lr": 1.5e-4}

#: the NER tasks
TASKS = [
    Task("conll2003", ("tokens",), "tags", CONLL2003_LABELS, ("f1", "precision", "recall", "accuracy"),
         kind="token_classification", header=None, hub=("conll2003", None),
         splits={"train": "train.txt", "dev": "valid.txt", "test": "test.txt"}, train_defaults=NER_DEFAULTS),
    Task("ner", ("tokens",), "tags", None, ("f1", "precision", "recall", "accuracy"),
         kind="token_classification", header=None, train_defaults=NER_DEFAULTS),
]


def _dropout_p(config: ModelConfig) -> float:
    return config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob


class TokenClassificationHead(Head):
    """``dropout → Linear(H, C)`` on every final hidden state (Devlin et al. 2018 §5.3); ModernBERT first
    applies its head transform ``LN(act(W·h))`` (:class:`~bertforge.models.modernbert.PredictionHead`).

    Input (B, T, H) → ``logits`` (B, T, C). With ``labels`` (B, T) (−100 = ignored: continuation
    subwords, special tokens, padding) the loss is the token-level cross-entropy averaged over the
    labelled positions.
    """

    hf_suffix = "ForTokenClassification"

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_labels = config.num_labels
        self.transform = PredictionHead(config) if config.model_type == "modernbert" else None
        self.dropout = nn.Dropout(_dropout_p(config))
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        nn.init.normal_(self.classifier.weight, 0.0, config.initializer_range)
        nn.init.zeros_(self.classifier.bias)
        if self.transform is not None:
            init_modernbert(self.transform, config)

    def forward(self, enc: EncoderOutput, batch: dict) -> dict:
        h = enc.last_hidden_state
        if self.transform is not None:
            h = self.transform(h)
        logits = self.classifier(self.dropout(h))
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
        keys = {"classifier.weight": "classifier.weight", "classifier.bias": "classifier.bias"}
        if config.model_type == "modernbert":
            keys.update(PredictionHead.hf_keys(config))
        return keys


def entity_scores(gold_tags: list, pred_tags: list) -> dict:
    """Entity-level ``precision``/``recall``/``f1`` (conlleval chunking, seqeval) and per-word
    ``accuracy``. Inputs: lists of sentences of IOB2 tag strings (same lengths). A score with an empty
    denominator (no predicted or no gold entity) is 0, as in conlleval, without seqeval's warning."""
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score
    return {"f1": float(f1_score(gold_tags, pred_tags, zero_division=0)),
            "precision": float(precision_score(gold_tags, pred_tags, zero_division=0)),
            "recall": float(recall_score(gold_tags, pred_tags, zero_division=0)),
            "accuracy": float(accuracy_score(gold_tags, pred_tags))}


def word_tags_from_scores(per_word: list, id2label) -> list:
    """One sentence's per-word score vectors (C,) (None for a word without a subword) → IOB2 tags: the
    highest-scoring label, ``O`` for a word without a subword. ``id2label``: label id → name."""
    return [id2label[int(np.argmax(v))] if v is not None else "O" for v in per_word]


def entity_spans(tags: list) -> list:
    """IOB2 tags of one sentence → its entities as ``(type, first word, last word)`` (inclusive), chunked
    as conlleval / :func:`entity_scores` chunk them (``seqeval``'s ``get_entities``)."""
    from seqeval.metrics.sequence_labeling import get_entities
    return [(t, int(s), int(e)) for t, s, e in get_entities(list(tags))]


class TokenClassificationAdapter(TaskAdapter):
    """Words with IOB2 tags → first-subword-labelled windows; predictions back to one tag per word.

    ``stride``: overlap (subwords) of consecutive windows of a sentence longer than ``max_seq_len``.
    ``pack``: concatenate consecutive sentences of one document (CoNLL ``-DOCSTART-`` segments) up to
    ``max_seq_len`` (document context, Devlin et al. 2018 §5.3; also ~3× less padding). Scores are
    still per sentence; sentences without a document (JSONL) are never packed.
    ``words``: how a plain text is cut into words (:data:`WORD_RULES`; ``whitespace``, the words a CoNLL /
    JSONL-trained model saw). ``aggregation``: how a word's tag comes from its subwords (``first`` — the
    piece the model was trained to label —, ``average``, ``max``; :func:`~bertforge.data.conll.aggregate_pieces`).
    Both default to what the model dir records (:meth:`use_model_labels`, :func:`ner_settings`).
    """

    head = "token_classification"
    read_unit, item_unit = "sentences", "windows"  # max_samples counts sentences; packing makes fewer windows
    stride: Optional[int] = None
    pack = True
    words = "whitespace"
    aggregation = "first"

    def set_words(self, words=None, aggregation=None) -> None:
        """Set :attr:`words` / :attr:`aggregation` (None leaves one as it is). Raises ConfigError for a value
        that is none of :data:`WORD_RULES` / :data:`~bertforge.data.conll.AGGREGATIONS`."""
        if words is not None:
            self.words = check_words(words)
        if aggregation is not None:
            self.aggregation = check_aggregation(aggregation)

    def __init__(self, task: Task, tokenizer, max_seq_len: int):
        super().__init__(task, tokenizer, max_seq_len)
        self.labels = list(task.labels) if task.labels else None

    def head_config(self) -> dict:
        if not self.labels:
            raise DataError(f"task {self.task.name} has no label set yet; load the training data first "
                            f"or pass data.labels=[...]")
        return {"num_labels": len(self.labels), "id2label": dict(enumerate(self.labels)),
                "problem_type": None, "add_pooling_layer": False}

    def read(self, path, max_samples=None, require_labels=True) -> list:
        """A CoNLL column file or a JSONL file (``tokens`` / ``tags``) → :class:`TokenExample` sentences."""
        fields = {}
        if isinstance(self.task.text_columns[0], str):
            fields["tokens_field"] = self.task.text_columns[0]
        if isinstance(self.task.label_column, str):
            fields["tags_field"] = self.task.label_column
        return read_token_examples(path, max_samples, require_labels, **fields)

    def encode(self, items, require_labels=False, source="the input") -> Windows:
        """Sentences of :meth:`read`, or plain texts (each cut into words by :func:`split_words` under
        :attr:`words`, which keep their character offsets) → first-subword-labelled windows of ≤ ``max_seq_len`` tokens (a sentence longer
        than that gives several, overlapping by ``stride``); sentences of one document are packed together
        (``pack``; texts never are). Without a label set yet, a labelled file gives it (training).

        Raises:
            DataError: no label set and no tags to learn it from; a sentence without tags when
                ``require_labels``; a tag outside the label set (naming the model whose tags they are).
        """
        examples = [x if isinstance(x, TokenExample) else text_example(x, self.words) for x in items]
        if self.labels is None:
            if not require_labels:
                raise DataError(f"task {self.task.name} has no label set; use a fine-tuned model's "
                                f"checkpoint (evaluate/predict) or pass data.labels=[...]")
            self.labels = label_list(examples)
        l2i = {lab: i for i, lab in enumerate(self.labels)}
        labelled = [e for e in examples if e.tags is not None]
        if require_labels and len(labelled) != len(examples):
            raise DataError(f"{source} has sentences without tags; task {self.task.name} needs tags here")
        unknown = sorted({t for e in labelled for t in e.tags if t not in l2i})
        if unknown and getattr(self, "labels_from_model", None):  # evaluate / predict / distill / prune
            raise DataError(f"{source} has tags {unknown[:5]} that {self.labels_from_model} was not fine-tuned "
                            f"on (its tags: {self.labels}); use data with those tags, or fine-tune with "
                            f"data.labels=[...] listing every tag")
        if unknown:
            raise DataError(f"{source} has tags {unknown[:5]} outside the label set {self.labels}; pass "
                            f"data.labels=[...] with every tag")
        packed, spans = examples, None
        if self.pack and any(e.doc is not None for e in examples):
            n_special = len(self.tok.encode(["x"], is_pretokenized=True).ids) - \
                len(self.tok.encode(["x"], is_pretokenized=True, add_special_tokens=False).ids)
            packed, spans = pack_sentences(self.tok, examples, self.max_seq_len - n_special)
        return Windows(encode_token_windows(self.tok, packed, self.max_seq_len, l2i, self.stride),
                       examples, packed, spans)

    def use_model_labels(self, model) -> None:
        """Take the label list from a fine-tuned model's ``config.id2label`` (evaluate / predict), or
        from an opened checkpoint dir (:class:`~bertforge.checkpoint.modeldir.ModelDir`: distill, the teacher's
        tags); and the word rule and aggregation it records (:func:`ner_settings`)."""
        if isinstance(model, (str, Path)):
            raise TypeError("use_model_labels takes a model or ModelDir.open(path), not a path")
        if isinstance(getattr(model, "config", None), dict):  # a ModelDir: its config.json's id2label
            id2 = dict(enumerate(model.labels or []))
            who = str(model.path)
            self.words, self.aggregation = ner_settings(model.meta.raw, who)
        else:
            id2 = getattr(getattr(model, "config", None), "id2label", None)
            who = getattr(model, "source_dir", None) or "the model"
            self.words, self.aggregation = ner_settings(
                getattr(getattr(model, "config", None), "bertforge", None) or {}, who)
        if id2:
            self.labels = [id2[i] for i in sorted(id2)]
            self.labels_from_model = who

    def prepare_model(self, model, train_ds=None) -> None:
        """Record in the model's ``config.json`` (``bertforge.words``) how a text is cut into the words it is
        trained on — whitespace: a CoNLL / JSONL sentence's words hold none —, for every consumer."""
        model.config.bertforge = {**(getattr(model.config, "bertforge", None) or {}), "words": self.words}

    def collator(self):
        return TokenCollator(pad_id(self.tok))

    def run(self, model, encoded, batch_size=64) -> list:
        """Per window its logits (T_w, C)."""
        return window_logits(model, encoded, self.collator(), batch_size)

    def decode(self, outputs, encoded, id2label=None, aggregation=None) -> list:
        """Per-window logits (T_w, C) → per sentence (or text) ``{"tokens", "tags", "entities"}``: one IOB2 tag
        per word (the argmax of its subwords' logits aggregated by ``aggregation`` — default :attr:`aggregation`,
        ``first``: its first subword's —, from the window where its first subword has the most context; a word
        without a subword → O) and the entities those tags chunk (:func:`entity_spans`), each
        ``{"label", "text", "start", "end", "score"}`` — character offsets into the text (a file's sentence:
        its words joined by single spaces), ``score`` the mean softmax probability of the entity's tags.
        ``id2label``: label id → name (default: :attr:`labels` in order)."""
        id2 = id2label or dict(enumerate(self.labels))
        how = check_aggregation(aggregation) if aggregation is not None else self.aggregation
        per_word = words_from_windows(encoded, outputs, [len(e.tokens) for e in encoded.packed], how)
        if encoded.spans is not None:
            per_word = unpack_words(per_word, encoded.spans, len(encoded.examples))
        out = []
        for e, scores in zip(encoded.examples, per_word):
            tags = word_tags_from_scores(scores, id2)
            out.append({"tokens": e.tokens, "tags": tags, "entities": entities(e, tags, scores)})
        return out

    def gold(self, encoded) -> list:
        return [e.tags for e in encoded.examples]

    def score(self, predictions, gold) -> dict:
        """Entity-level P/R/F1 and word accuracy (:func:`entity_scores`) of the predictions' tags."""
        return entity_scores(gold, [p["tags"] for p in predictions])

    @staticmethod
    def _id2label(model):
        """A PyTorch model's ``config.id2label`` (what it was built with), None for a runner."""
        return getattr(getattr(model, "config", None), "id2label", None)

    def word_tags(self, model, dataset: Windows, batch_size: int = 64) -> list:
        """Per sentence, one IOB2 tag per word (its subwords' prediction aggregated by :attr:`aggregation`;
        words without a subword → O)."""
        return [p["tags"] for p in self.decode(self.run(model, dataset, batch_size), dataset,
                                               self._id2label(model))]

    def predict_logits(self, model, dataset, batch_size=64) -> np.ndarray:
        """(N_windows, T_max, C) logits, zero-padded after each window's length."""
        return stack_padded(window_logits(model, dataset, self.collator(), batch_size), 0)

    def evaluate(self, model, dataset, batch_size=64) -> dict:
        decoded = self.decode(self.run(model, dataset, batch_size), dataset, self._id2label(model))
        return self.score(decoded, self.gold(dataset))

    def predictions(self, model, dataset, batch_size=64) -> list:
        pred = self.word_tags(model, dataset, batch_size)
        return [{"id": e.id, "tokens": e.tokens, "tags": p} for e, p in zip(dataset.examples, pred)]


#: how a plain text is cut into words: ``whitespace`` — every run of non-space characters, the words of a
#: CoNLL / JSONL sentence (which hold no space) and so what a model fine-tuned on them saw: send tokenised
#: text (``"The U.S. won 1-0 against O'Neill 's team ."``); ``punctuation`` — runs of letters / digits / ``_``
#: and every other character on its own (for raw text, if the model was trained on words cut that way)
WORD_RULES = {"whitespace": re.compile(r"\S+"), "punctuation": re.compile(r"\w+|[^\w\s]")}


def check_words(words) -> str:
    """``words`` if it names a rule of :data:`WORD_RULES`; ConfigError otherwise."""
    if words not in WORD_RULES:
        raise ConfigError(f"words={words!r}: choose one of {', '.join(WORD_RULES)}")
    return words


def check_aggregation(aggregation) -> str:
    """``aggregation`` if it is one of :data:`~bertforge.data.conll.AGGREGATIONS`; ConfigError otherwise."""
    if aggregation not in AGGREGATIONS:
        raise ConfigError(f"aggregation={aggregation!r}: choose one of {', '.join(AGGREGATIONS)}")
    return aggregation


def ner_settings(meta: dict, who: str = "the model") -> tuple:
    """``(words, aggregation)`` a NER model dir records in ``config.json`` → ``bertforge`` (``meta``):
    ``words`` (:data:`WORD_RULES`) and ``aggregation`` (:data:`~bertforge.data.conll.AGGREGATIONS`); a dir
    that records neither gets ``("whitespace", "first")`` — the CoNLL words and first-subword labels it was
    trained on. Raises ConfigError naming ``who`` for a value that is neither."""
    words, how = (meta or {}).get("words") or "whitespace", (meta or {}).get("aggregation") or "first"
    try:
        return check_words(words), check_aggregation(how)
    except ConfigError as e:
        raise ConfigError(f"{who}: config.json's bertforge.{e}") from None


def split_words(text: str, words: str = "whitespace") -> list:
    """A plain text → its words as ``(word, start, end)`` (character offsets), cut by the rule ``words`` of
    :data:`WORD_RULES`: ``whitespace`` (default; the CoNLL words a model is trained on) or ``punctuation``."""
    return [(m.group(), m.start(), m.end()) for m in WORD_RULES[check_words(words)].finditer(text)]


def text_example(text: str, words: str = "whitespace") -> TokenExample:
    """A plain text → an untagged :class:`TokenExample` of its words (:func:`split_words` under ``words``) that
    remembers the text and their offsets."""
    cut = split_words(text, words)
    return TokenExample([w for w, _, _ in cut], text=text, offsets=[(s, e) for _, s, e in cut])


def entities(example: TokenExample, tags: list, scores: list) -> list:
    """The entities of one sentence's IOB2 ``tags`` (:func:`entity_spans`) as ``{"label", "text", "start",
    "end", "score"}``: character offsets into ``example.text`` (or its words joined by single spaces),
    ``score`` the mean over the entity's words of the softmax probability of their predicted tag (``scores``:
    per word its logits (C,), None for a word without a subword)."""
    text, offsets = example.text, example.offsets
    if text is None or offsets is None:
        text, offsets, at = " ".join(example.tokens), [], 0
        for w in example.tokens:
            offsets.append((at, at + len(w)))
            at += len(w) + 1
    out = []
    for typ, a, b in entity_spans(tags):
        probs = [float(softmax(scores[k])[int(np.argmax(scores[k]))]) for k in range(a, b + 1)
                 if scores[k] is not None]
        s, e = offsets[a][0], offsets[b][1]
        out.append({"label": typ, "text": text[s:e], "start": s, "end": e,
                    "score": float(np.mean(probs)) if probs else 0.0})
    return out


__all__ = ["TASKS", "CONLL2003_LABELS", "TokenClassificationHead", "TokenClassificationAdapter", "entity_scores",
           "word_tags_from_scores", "entity_spans", "entities", "split_words", "text_example", "WORD_RULES",
           "check_words", "check_aggregation", "ner_settings"]
