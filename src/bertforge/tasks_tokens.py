"""Token classification (NER) and extractive QA on the spine: tasks, collators and task adapters.

Tasks registered here:

* ``conll2003`` — CoNLL-2003 English NER (Tjong Kim Sang & De Meulder 2003), CoNLL column files,
  labels ``O, B/I-PER, B/I-ORG, B/I-LOC, B/I-MISC`` (the ``datasets`` order), entity F1 (seqeval).
* ``ner`` — any IOB NER data (CoNLL columns or JSONL ``tokens``/``tags``); the label set comes from
  ``data.labels=[...]`` or, when absent, from the training file.
* ``squad`` / ``squad_v2`` — SQuAD v1.1 / v2.0 (Rajpurkar et al. 2016, 2018), EM/F1 (official).

Adapters (``bertforge.adapters`` kinds ``token_classification`` and ``qa``) plug them into
``finetune`` / ``evaluate`` / ``predict`` / ``distill``: ``load`` returns a list of windows (one
sentence or question can give several), ``collator`` pads them, ``evaluate`` re-assembles
windows into per-word tags or per-question answers before scoring. Logit shapes for KD:
token classification (B, T, C) (0 on padding); QA (B, 2, T) start/end rows (−10⁴ on padding).
As in ``transformers`` (``BertForTokenClassification`` / ``…ForQuestionAnswering``), these models
have no pooler (``add_pooling_layer=False``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch

from .adapters import TaskAdapter, batch_logits, iter_batches, register_adapter
from .data.conll import (IGNORE_INDEX, encode_token_windows, label_list, pack_sentences, read_token_examples,
                         unpack_words, words_from_windows)
from .data.squad import decode_answers, encode_qa_windows, read_squad
from .data.tasks import Task, register_task
from .errors import DataError
from .evaluate.span_metrics import entity_scores, squad_scores
from .models import span_heads  # noqa: F401  (registers the heads)
from .tokenizer import pad_id

CONLL2003_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")

for _t in [
    Task("conll2003", ("tokens",), "tags", CONLL2003_LABELS, ("f1", "precision", "recall", "accuracy"),
         kind="token_classification", header=None, hub=("conll2003", None),
         splits={"train": "train.txt", "dev": "valid.txt", "test": "test.txt"}),
    Task("ner", ("tokens",), "tags", None, ("f1", "precision", "recall", "accuracy"),
         kind="token_classification", header=None),
    # labels: the two rows of the QA logits (start, end), so Task.num_labels matches the head
    Task("squad", ("question", "context"), "answers", ("start", "end"), ("f1", "exact_match"), kind="qa",
         header=None, hub=("squad", None), splits={"train": "train-v1.1.json", "dev": "dev-v1.1.json"}),
    Task("squad_v2", ("question", "context"), "answers", ("start", "end"), ("f1", "exact_match"), kind="qa",
         header=None, hub=("squad_v2", None), splits={"train": "train-v2.0.json", "dev": "dev-v2.0.json"}),
]:
    register_task(_t)


class Windows(list):
    """A list of encoded windows (what the Trainer batches) that remembers the source ``examples``
    (sentences or questions) they came from, for re-assembly at evaluation. Token tasks may pack
    several sentences into one sequence: ``packed`` are those sequences and ``spans`` map them back."""

    def __init__(self, windows, examples, packed=None, spans=None):
        super().__init__(windows)
        self.examples = examples
        self.packed = packed if packed is not None else examples
        self.spans = spans


def _pad(rows: list, value, t: int) -> torch.Tensor:
    out = torch.full((len(rows), t), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return out


class TokenCollator:
    """Windows → ``input_ids``, ``attention_mask``, ``token_type_ids`` (B, T) and ``labels`` (B, T)
    padded with −100; T = longest window in the batch."""

    def __init__(self, pad_id: int = 0):
        self.pad_id = pad_id

    def __call__(self, items: list) -> dict:
        t = max(len(x["input_ids"]) for x in items)
        batch = {"input_ids": _pad([x["input_ids"] for x in items], self.pad_id, t),
                 "attention_mask": _pad([[1] * len(x["input_ids"]) for x in items], 0, t),
                 "token_type_ids": _pad([x["token_type_ids"] for x in items], 0, t)}
        if all("labels" in x for x in items):
            batch["labels"] = _pad([x["labels"] for x in items], IGNORE_INDEX, t)
        return batch


class QACollator(TokenCollator):
    """Windows → padded (B, T) inputs and ``start_positions`` / ``end_positions`` (B,)."""

    def __call__(self, items: list) -> dict:
        batch = super().__call__(items)
        if all("start_positions" in x for x in items):
            batch["start_positions"] = torch.tensor([x["start_positions"] for x in items], dtype=torch.long)
            batch["end_positions"] = torch.tensor([x["end_positions"] for x in items], dtype=torch.long)
        return batch


def window_logits(model, windows: list, collate, batch_size: int = 64, seq_axis: int = 0) -> list:
    """Run ``model`` (a PyTorch module or a :mod:`bertforge.runtime` runner, see
    :func:`~bertforge.adapters.batch_logits`) on every window; returns per window its logits (numpy) cut to
    the window length along ``seq_axis`` (of the per-example logits): (T_w, C) for token classification
    (axis 0), (2, T_w) for QA (axis 1)."""
    was_training = isinstance(model, torch.nn.Module) and model.training
    if was_training:
        model.eval()
    out = [None] * len(windows)
    for idx, batch in iter_batches(windows, collate, batch_size):
        for k in ("labels", "start_positions", "end_positions"):
            batch.pop(k, None)
        z = batch_logits(model, batch)
        for i, row in zip(idx, z):
            n = len(windows[i]["input_ids"])
            out[i] = row[:n] if seq_axis == 0 else row[:, :n]
    if was_training:
        model.train()
    return out


def _stack_padded(arrs: list, axis: int) -> np.ndarray:
    t = max(a.shape[axis] for a in arrs)
    out = []
    for a in arrs:
        pad = [(0, 0)] * a.ndim
        pad[axis] = (0, t - a.shape[axis])
        out.append(np.pad(a, pad))
    return np.stack(out)


@register_adapter("token_classification")
class TokenClassificationAdapter(TaskAdapter):
    """Words with IOB2 tags → first-subword-labelled windows; predictions back to one tag per word.

    ``stride``: overlap (subwords) of consecutive windows of a sentence longer than ``max_seq_len``.
    ``pack``: concatenate consecutive sentences of one document (CoNLL ``-DOCSTART-`` segments) up to
    ``max_seq_len`` (document context, Devlin et al. 2018 §5.3; also ~3× less padding). Scores are
    still per sentence; sentences without a document (JSONL) are never packed.
    """

    head = "token_classification"
    stride: Optional[int] = None
    pack = True

    def __init__(self, task: Task, tokenizer, max_seq_len: int):
        super().__init__(task, tokenizer, max_seq_len)
        self.labels = list(task.labels) if task.labels else None

    def head_config(self) -> dict:
        if not self.labels:
            raise DataError(f"task {self.task.name} has no label set yet; load the training data first "
                            f"or pass data.labels=[...]")
        return {"num_labels": len(self.labels), "id2label": dict(enumerate(self.labels)),
                "problem_type": None, "add_pooling_layer": False}

    def _read(self, path, max_samples, require_labels):
        fields = {}
        if isinstance(self.task.text_columns[0], str):
            fields["tokens_field"] = self.task.text_columns[0]
        if isinstance(self.task.label_column, str):
            fields["tags_field"] = self.task.label_column
        return read_token_examples(path, max_samples, require_labels, **fields)

    def load(self, path, max_samples=None, require_labels=True) -> Windows:
        examples = self._read(path, max_samples, require_labels)
        if self.labels is None:
            if not require_labels:
                raise DataError(f"task {self.task.name} has no label set; use a fine-tuned model's "
                                f"checkpoint (evaluate/predict) or pass data.labels=[...]")
            self.labels = label_list(examples)
        l2i = {lab: i for i, lab in enumerate(self.labels)}
        labelled = [e for e in examples if e.tags is not None]
        if require_labels and len(labelled) != len(examples):
            raise DataError(f"{path} has sentences without tags; task {self.task.name} needs tags here")
        unknown = sorted({t for e in labelled for t in e.tags if t not in l2i})
        if unknown and getattr(self, "labels_from_model", None):  # evaluate / predict / distill / prune
            raise DataError(f"{path} has tags {unknown[:5]} that {self.labels_from_model} was not fine-tuned "
                            f"on (its tags: {self.labels}); use data with those tags, or fine-tune with "
                            f"data.labels=[...] listing every tag")
        if unknown:
            raise DataError(f"{path} has tags {unknown[:5]} outside the label set {self.labels}; pass "
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
        from a checkpoint dir's ``config.json`` (distill: the teacher's tags)."""
        if isinstance(model, (str, Path)):
            from .hf import read_config
            id2 = {int(k): v for k, v in (read_config(Path(model)).get("id2label") or {}).items()}
            who = str(model)
        else:
            id2 = getattr(getattr(model, "config", None), "id2label", None)
            who = getattr(model, "source_dir", None) or "the model"
        if id2:
            self.labels = [id2[i] for i in sorted(id2)]
            self.labels_from_model = who

    def collator(self):
        return TokenCollator(pad_id(self.tok))

    def word_tags(self, model, dataset: Windows, batch_size: int = 64) -> list:
        """Per sentence, one IOB2 tag per word (first-subword prediction; words without a subword → O)."""
        z = window_logits(model, dataset, self.collator(), batch_size)
        id2 = getattr(getattr(model, "config", None), "id2label", None) or dict(enumerate(self.labels))
        per_word = words_from_windows(dataset, z, [len(e.tokens) for e in dataset.packed])
        if dataset.spans is not None:
            per_word = unpack_words(per_word, dataset.spans, len(dataset.examples))
        return [[id2[int(np.argmax(v))] if v is not None else "O" for v in ws] for ws in per_word]

    def predict_logits(self, model, dataset, batch_size=64) -> np.ndarray:
        """(N_windows, T_max, C) logits, zero-padded after each window's length."""
        return _stack_padded(window_logits(model, dataset, self.collator(), batch_size), 0)

    def evaluate(self, model, dataset, batch_size=64) -> dict:
        pred = self.word_tags(model, dataset, batch_size)
        gold = [e.tags for e in dataset.examples]
        return entity_scores(gold, pred)

    def predictions(self, model, dataset, batch_size=64) -> list:
        pred = self.word_tags(model, dataset, batch_size)
        return [{"tokens": e.tokens, "tags": p} for e, p in zip(dataset.examples, pred)]


@register_adapter("qa")
class QAAdapter(TaskAdapter):
    """SQuAD questions → question/context windows; n-best decoding to answer text; EM/F1.

    Settings (class attributes, BERT/``transformers`` defaults): ``doc_stride`` window overlap in
    tokens (default ``min(128, max_seq_len // 3)``), ``max_query_len`` 64, ``max_answer_len`` 30,
    ``n_best`` 20, ``null_threshold`` 0.0 (v2.0).
    """

    head = "question_answering"
    doc_stride: Optional[int] = None
    max_query_len = 64
    max_answer_len = 30
    n_best = 20
    null_threshold = 0.0

    @property
    def version_2(self) -> bool:
        return self.task.name.endswith("v2")

    def _stride(self) -> int:
        return self.doc_stride if self.doc_stride is not None else min(128, self.max_seq_len // 3)

    def head_config(self) -> dict:
        return {"num_labels": 2, "id2label": None, "problem_type": None, "add_pooling_layer": False}

    def load(self, path, max_samples=None, require_labels=True) -> Windows:
        examples = read_squad(path, max_samples, require_answers=require_labels)
        if require_labels and not self.version_2:
            bad = [e.id for e in examples if not e.answers]
            if bad:
                raise DataError(f"{path}: question {bad[0]} has no answer; use --task squad_v2 for data "
                                f"with unanswerable questions")
        win = encode_qa_windows(self.tok, examples, self.max_seq_len, self._stride(), self.max_query_len,
                                with_labels=require_labels)
        return Windows(win, examples)

    def collator(self):
        return QACollator(pad_id(self.tok))

    def answers(self, model, dataset: Windows, batch_size: int = 64) -> list:
        z = window_logits(model, dataset, self.collator(), batch_size, seq_axis=1)
        return decode_answers(dataset.examples, dataset, [a[0] for a in z], [a[1] for a in z],
                              self.n_best, self.max_answer_len, self.version_2, self.null_threshold)

    def predict_logits(self, model, dataset, batch_size=64) -> np.ndarray:
        """(N_windows, 2, T_max) start/end logits, zero-padded after each window's length."""
        return _stack_padded(window_logits(model, dataset, self.collator(), batch_size, seq_axis=1), 1)

    def evaluate(self, model, dataset, batch_size=64) -> dict:
        preds = self.answers(model, dataset, batch_size)
        golds = {e.id: [a["text"] for a in e.answers] for e in dataset.examples}
        return squad_scores({p["id"]: p["answer"] for p in preds}, golds)

    def predictions(self, model, dataset, batch_size=64) -> list:
        preds = self.answers(model, dataset, batch_size)
        return [{"id": p["id"], "question": e.question, "answer": p["answer"], "start": p["start"],
                 "score": p["score"]} for p, e in zip(preds, dataset.examples)]
