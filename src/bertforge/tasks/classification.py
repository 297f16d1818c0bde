"""Sentence (pair) classification and regression on [CLS]: the GLUE tasks and ``custom`` files.

* tasks: the nine GLUE tasks (Wang et al. 2019) with the file layouts the GLUE distribution ships
  (``download_glue_data.py``): TSV, quoting disabled, a header row except for CoLA train/dev; columns are
  named by header where there is one and by position otherwise (``int``). ``custom`` tasks (CSV/TSV/JSONL
  with named or positional columns) are built by :func:`bertforge.tasks.get_task`. A task of kind
  ``classification`` maps label strings to ids in ``labels`` order; ``regression`` reads floats.
* reader: :func:`bertforge.data.readers.read_examples` (files) and ``read_hub`` (hub datasets).
* head: :class:`SequenceClassificationHead` (Devlin et al. 2018 §4.1), saved as ``…ForSequenceClassification``.
* adapter: :class:`SequenceAdapter` (kinds ``classification`` and ``regression``).
* metrics: :mod:`bertforge.metrics.task` (accuracy, F1, MCC, Pearson, Spearman); a classifier whose
  every prediction is one class is flagged with the majority-class baseline's score (:func:`collapse_check`).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..data.collate import PadCollator, encode_examples
from ..data.readers import Example, read_examples
from ..errors import DataError
from ..metrics.task import compute
from ..models.activations import get_activation
from ..models.head import Head
from ..models.modernbert import PredictionHead, init_modernbert
from ..models.output import EncoderOutput
from ..models.pooling import pool
from ..tokenizer import pad_id
from .base import Task, TaskAdapter, UnlabelledLayout, Windows, batch_logits, iter_batches, softmax

_NLI2 = ("entailment", "not_entailment")
_PAIR_TEST = UnlabelledLayout(("index", "sentence1", "sentence2"), ("sentence1", "sentence2"))
_MNLI_TEST = UnlabelledLayout(("index", "promptID", "pairID", "genre", "sentence1_binary_parse",
                               "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
                               "sentence2"), ("sentence1", "sentence2"))
#: the nine GLUE tasks (Wang et al. 2019), as the GLUE distribution ships their files: train/dev with their
#: label, and the unlabelled test split (``test.tsv``; MNLI ``test_matched.tsv`` / ``test_mismatched.tsv``)
#: with its own header, an ``index`` (QQP: ``id``) and no label (:class:`~.base.UnlabelledLayout`)
TASKS = [
    Task("cola", (3,), 1, ("0", "1"), ("mcc", "accuracy"), header=False, hub=("glue", "cola"),
         hub_columns=("sentence", "label"), splits={"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"},
         test_layout=UnlabelledLayout(("index", "sentence"), ("sentence",))),
    Task("sst2", ("sentence",), "label", ("0", "1"), ("accuracy",), hub=("glue", "sst2"),
         hub_columns=("sentence", "label"), splits={"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"},
         test_layout=UnlabelledLayout(("index", "sentence"), ("sentence",))),
    Task("mrpc", ("#1 String", "#2 String"), "Quality", ("0", "1"), ("f1", "accuracy"),
         hub=("glue", "mrpc"), hub_columns=("sentence1", "sentence2", "label"),
         splits={"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"},
         test_layout=UnlabelledLayout(("index", "#1 ID", "#2 ID", "#1 String", "#2 String"),
                                      ("#1 String", "#2 String"))),
    Task("stsb", ("sentence1", "sentence2"), "score", None, ("pearson", "spearman"), kind="regression",
         hub=("glue", "stsb"), hub_columns=("sentence1", "sentence2", "label"),
         splits={"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}, label_range=(0.0, 5.0),  # Cer et al. 2017 §2
         id_column="index",
         test_layout=UnlabelledLayout(("index", "genre", "filename", "year", "old_index", "source1", "source2",
                                       "sentence1", "sentence2"), ("sentence1", "sentence2"))),
    Task("qqp", ("question1", "question2"), "is_duplicate", ("0", "1"), ("f1", "accuracy"),
         hub=("glue", "qqp"), hub_columns=("question1", "question2", "label"),
         splits={"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}, id_column="id",
         test_layout=UnlabelledLayout(("id", "question1", "question2"), ("question1", "question2"), "id")),
    Task("mnli", ("sentence1", "sentence2"), "gold_label", ("contradiction", "entailment", "neutral"),
         ("accuracy",), hub=("glue", "mnli"), hub_columns=("premise", "hypothesis", "label"),
         splits={"train": "train.tsv", "dev": "dev_matched.tsv", "test": "test_matched.tsv"}, id_column="index",
         test_layout=_MNLI_TEST),
    Task("mnli-mm", ("sentence1", "sentence2"), "gold_label", ("contradiction", "entailment", "neutral"),
         ("accuracy",), hub=("glue", "mnli"), hub_columns=("premise", "hypothesis", "label"),
         splits={"train": "train.tsv", "dev": "dev_mismatched.tsv", "test": "test_mismatched.tsv"},
         id_column="index", test_layout=_MNLI_TEST),
    Task("qnli", ("question", "sentence"), "label", _NLI2, ("accuracy",), hub=("glue", "qnli"),
         hub_columns=("question", "sentence", "label"),
         splits={"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}, id_column="index",
         test_layout=UnlabelledLayout(("index", "question", "sentence"), ("question", "sentence"))),
    Task("rte", ("sentence1", "sentence2"), "label", _NLI2, ("accuracy",), hub=("glue", "rte"),
         hub_columns=("sentence1", "sentence2", "label"),
         splits={"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}, id_column="index",
         test_layout=_PAIR_TEST),
    Task("wnli", ("sentence1", "sentence2"), "label", ("0", "1"), ("accuracy",), hub=("glue", "wnli"),
         hub_columns=("sentence1", "sentence2", "label"),
         splits={"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}, id_column="index",
         test_layout=_PAIR_TEST),
]

#: metrics (keys of :data:`bertforge.metrics.task.METRICS`) that apply to each kind of task
KIND_METRICS = {"classification": ("accuracy", "f1", "mcc"), "regression": ("pearson", "spearman"),
                "multi_label_classification": ("macro_f1", "micro_f1", "exact_match", "macro_ap")}



class SequenceClassificationHead(Head):
    """Classification (cross-entropy), regression (MSE, ``num_labels == 1``) or multi-label classification
    (``problem_type = multi_label_classification``: BCE-with-logits per label, as ``transformers``; optional
    ``pos_weight`` and focal loss, :meth:`set_loss`) on the [CLS] state.

    Per family, as the original implementations: bert/albert/mobilebert ``dropout → Linear`` on the tanh pooler;
    roberta/mpnet/electra ``dropout → Linear → tanh|gelu → dropout → Linear`` on h_[CLS]; distilbert
    ``Linear → ReLU → dropout → Linear`` on h_[CLS]; modernbert ``LN(act(W·pool(h))) → dropout → Linear`` with
    ``pool`` = h_[CLS] or the mean over tokens (``classifier_pooling``; Warner et al. 2024, transformers'
    ``ModernBertForSequenceClassification``). With ``config.pooling`` (mean / max / cls) a bert/albert/roberta/
    electra/distilbert head reads :func:`~bertforge.models.pooling.pool` of the last layer instead of [CLS]
    (bert/albert: ``dropout → Linear`` on it, the pooler unused; others: their dense layers on it) — the pooling
    a sentence-embedding checkpoint such as MiniLM was trained with; ``transformers`` has no such head (it reads
    [CLS]). Input (B, T, H) → logits (B, num_labels).
    """

    hf_suffix = "ForSequenceClassification"
    cls_only = True
    POOLER_FAMILIES = ("bert", "albert", "mobilebert")  # the head reads ``pooler_output``

    @classmethod
    def adds_pooler(cls, config: ModelConfig) -> bool:
        """Whether this head reads the pooler for ``config``'s family (TaskModel then gives the encoder one)."""
        return config.model_type in cls.POOLER_FAMILIES

    def __init__(self, config: ModelConfig):
        super().__init__()
        fam, h = config.model_type, config.hidden_size
        self.family = fam
        self.num_labels = config.num_labels
        self.regression = config.num_labels == 1 or config.problem_type == "regression"
        self.multi_label = config.problem_type == "multi_label_classification"
        self.focal_gamma = 0.0
        self.register_buffer("pos_weight", None, persistent=False)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(p)
        self.transform = PredictionHead(config) if fam == "modernbert" else None
        # None: the family's own [CLS] reading (below); modernbert always pools (classifier_pooling)
        self.pooling = (config.pooling or config.classifier_pooling) if fam == "modernbert" else config.pooling
        self.use_pooler = fam in self.POOLER_FAMILIES and self.pooling is None
        self.reads_pooler = self.use_pooler
        if self.pooling is not None:
            self.cls_only = self.pooling == "cls"  # mean / max read every position
        self.dense = None if (fam in self.POOLER_FAMILIES or self.transform is not None) else nn.Linear(h, h)
        self.act = {"roberta": torch.tanh, "mpnet": torch.tanh, "electra": get_activation("gelu"),
                    "distilbert": F.relu}.get(fam)
        self.classifier = nn.Linear(h, config.num_labels)
        nn.init.normal_(self.classifier.weight, 0.0, config.initializer_range)
        nn.init.zeros_(self.classifier.bias)
        if self.dense is not None:
            nn.init.normal_(self.dense.weight, 0.0, config.initializer_range)
            nn.init.zeros_(self.dense.bias)
        if self.transform is not None:
            init_modernbert(self.transform, config)

    def forward(self, enc: EncoderOutput, batch: dict) -> dict:
        if self.use_pooler:
            x = self.dropout(enc.pooler_output)
        elif self.transform is not None:
            h = enc.last_hidden_state
            am = batch.get("attention_mask")
            if am is None:
                am = torch.ones(h.shape[:2], dtype=torch.long, device=h.device)
            x = self.dropout(self.transform(pool(h, am, self.pooling)))
        else:
            h = enc.last_hidden_state
            if self.pooling is None:
                x = h[:, 0]
            else:
                mask = batch.get("attention_mask")
                x = pool(h, mask if mask is not None else torch.ones(h.shape[:2], device=h.device), self.pooling)
            if self.dense is None:  # bert/albert reading a pooled vector: dropout → classifier
                x = self.dropout(x)
            elif self.family == "distilbert":
                x = self.dropout(self.act(self.dense(x)))
            else:
                x = self.dropout(self.act(self.dense(self.dropout(x))))
        logits = self.classifier(x)
        out = {"logits": logits}
        labels = batch.get("labels")
        if labels is not None:
            if self.multi_label:
                out["loss"] = multi_label_loss(logits, labels, self.pos_weight, self.focal_gamma)
            elif self.regression:
                out["loss"] = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                out["loss"] = F.cross_entropy(logits.float(), labels.long())
        return out

    def set_loss(self, pos_weight: Optional[torch.Tensor] = None, focal_gamma: float = 0.0) -> None:
        """Multi-label loss options: ``pos_weight`` (C,) weight of each label's positive term, ``focal_gamma``
        γ of the focal loss (0: plain BCE). See :func:`multi_label_loss`."""
        self.pos_weight = None if pos_weight is None else pos_weight.to(self.classifier.weight.device)
        self.focal_gamma = float(focal_gamma)

    @staticmethod
    def hf_keys(config: ModelConfig) -> dict:
        fam = config.model_type
        if fam in SequenceClassificationHead.POOLER_FAMILIES:
            return {"classifier.weight": "classifier.weight", "classifier.bias": "classifier.bias"}
        if fam == "modernbert":
            return {"classifier.weight": "classifier.weight", "classifier.bias": "classifier.bias",
                    **PredictionHead.hf_keys(config)}
        if fam == "distilbert":
            return {"dense.weight": "pre_classifier.weight", "dense.bias": "pre_classifier.bias",
                    "classifier.weight": "classifier.weight", "classifier.bias": "classifier.bias"}
        return {"dense.weight": "classifier.dense.weight", "dense.bias": "classifier.dense.bias",
                "classifier.weight": "classifier.out_proj.weight",
                "classifier.bias": "classifier.out_proj.bias"}


def multi_label_loss(logits: torch.Tensor, labels: torch.Tensor, pos_weight: Optional[torch.Tensor] = None,
                     focal_gamma: float = 0.0) -> torch.Tensor:
    """Multi-label loss of ``logits`` (B, C) against 0/1 (or soft) ``labels`` (B, C), averaged over B × C:
    BCE-with-logits (``torch.nn.BCEWithLogitsLoss``, what ``transformers`` uses for
    ``multi_label_classification``) with ``pos_weight`` (C,) scaling each label's positive term; with
    ``focal_gamma`` γ > 0 each element is weighted by (1 − p_t)^γ, p_t the probability given to the true
    side (focal loss, Lin et al. 2017 "Focal Loss for Dense Object Detection" eq. 5, without α)."""
    z, y = logits.float(), labels.float()
    if not focal_gamma:
        return F.binary_cross_entropy_with_logits(z, y, pos_weight=pos_weight)
    bce = F.binary_cross_entropy_with_logits(z, y, pos_weight=pos_weight, reduction="none")
    p = torch.sigmoid(z)
    p_t = p * y + (1 - p) * (1 - y)
    return ((1 - p_t).pow(focal_gamma) * bce).mean()


def collapse_check(pred, ref, metric: str, num_labels=None) -> dict:
    """Whether a classifier collapsed to one class: ``{"collapsed": c, "majority_baseline": score}`` when every
    prediction in ``pred`` is class id ``c`` while the references ``ref`` hold more than one class (a model
    that answers one class whatever the input: too high a learning rate, too few steps or too little data);
    ``score`` is ``metric`` (a key of :data:`bertforge.metrics.task.METRICS`) of the majority-class
    baseline — every example given the most frequent class of ``ref`` (the lowest id on a tie) — on the
    same ``ref``. ``{}`` otherwise, also for fewer than 2 examples (one prediction is always one class).

    Inputs: 1-D arrays of class ids, same length; ``num_labels`` as in :func:`~bertforge.metrics.task.compute`.
    """
    pred, ref = np.asarray(pred), np.asarray(ref)
    if len(pred) < 2 or len(np.unique(pred)) != 1 or len(np.unique(ref)) < 2:
        return {}
    majority = int(np.bincount(ref.astype(np.int64)).argmax())
    baseline = compute((metric,), np.full_like(ref, majority), ref, num_labels)[metric]
    return {"collapsed": int(pred[0]), "majority_baseline": baseline}


class SequenceAdapter(TaskAdapter):
    """Single sentences and pairs → [CLS] classification (CE) or regression (MSE).

    The four steps: :meth:`read` a TSV/CSV/JSONL file (:func:`~bertforge.data.readers.read_examples`) →
    :meth:`encode` its examples, or texts (a string or a ``(text_a, text_b)`` pair each) → :meth:`decode` the
    (N, C) logits into ranked labels → :meth:`score` them with the task's metrics."""

    head = "sequence_classification"

    def head_config(self) -> dict:
        t = self.task
        if t.kind == "regression":
            return {"num_labels": 1, "problem_type": "regression", "id2label": {0: "score"}}
        return {"num_labels": len(t.labels), "problem_type": "single_label_classification",
                "id2label": {i: lab for i, lab in enumerate(t.labels)}}

    @property
    def label_names(self) -> list:
        """Label names in id order (regression: its one output's name, ``score`` unless the task names it)."""
        if self.task.labels:
            return [str(x) for x in self.task.labels]
        return ["score"]

    def read(self, path, max_samples=None, require_labels=True) -> list:
        return read_examples(path, self.task, max_samples, require_labels)

    def encode(self, items, require_labels=False, source="the input") -> Windows:
        """:class:`~bertforge.data.readers.Example` rows, or texts (each a string, or a ``(text_a, text_b)``
        pair; all of one shape) → one window per example, cut to ``max_seq_len`` tokens (pairs longest-first).
        Raises DataError: a row without a label when ``require_labels``; texts mixing singles and pairs."""
        examples = [x if isinstance(x, Example) else _text_example(x) for x in items]
        texts = any(not isinstance(x, Example) for x in items)
        if texts and len({e.text_b is None for e in examples}) > 1:
            raise DataError(f"{source} mixes single texts and pairs; send one kind per call")
        enc = encode_examples(self.tok, examples, self.max_seq_len)
        self._encode_labels(enc)
        if require_labels and any("labels" not in e for e in enc):
            raise DataError(f"{source} has rows without a label; task {self.task.name} needs labels here")
        return Windows(enc, examples)  # one window per example; the examples give the predictions' ids

    def _encode_labels(self, enc: list) -> None:
        """Hook: the label of each encoded example as the collator takes it (here: as read)."""

    def collator(self):
        return PadCollator(pad_id(self.tok))

    def predict_logits(self, model, dataset, batch_size=64) -> np.ndarray:
        if isinstance(model, torch.nn.Module):
            model.eval()
        out = [None] * len(dataset)
        collate = self.collator()
        for idx, batch in iter_batches(dataset, collate, batch_size):
            batch.pop("labels", None)
            logits = batch_logits(model, batch)
            for i, row in zip(idx, logits):
                out[i] = row
        return np.stack(out)

    def run(self, model, encoded, batch_size=64) -> np.ndarray:
        """(N, C) logits, one row per encoded example."""
        return self.predict_logits(model, encoded, batch_size)

    def decode(self, outputs, encoded=None, raw: bool = False) -> list:
        """Per example (``outputs``: (N, C) logits, or N rows (C,)), its labels ranked by score, highest first
        (ties in label order): ``[{"label", "score"}, …]`` — classification: softmax probabilities (``raw``:
        the logits); regression: one entry, the predicted value."""
        names = self.label_names
        out = []
        for z in outputs:
            z = np.asarray(z, dtype=np.float64)
            if self.task.kind == "regression":
                out.append([{"label": names[0], "score": float(z[0])}])
                continue
            s = z if raw else softmax(z)
            out.append([{"label": names[i], "score": float(s[i])} for i in np.argsort(-s, kind="stable")])
        return out

    def gold(self, encoded) -> list:
        return [d["labels"] for d in encoded]

    def score(self, predictions, gold) -> dict:
        """The task's metrics (:func:`bertforge.metrics.task.compute`) of ``predictions`` (:meth:`decode`'s)
        against ``gold`` (class ids, or floats for regression); for a classifier whose every prediction is one
        class, also ``collapsed`` and ``majority_baseline`` (:func:`collapse_check`)."""
        if self.task.kind == "regression":
            pred = np.array([p[0]["score"] for p in predictions])
        else:
            ids = {n: i for i, n in enumerate(self.label_names)}
            pred = np.array([ids[p[0]["label"]] for p in predictions])
        ref = np.array(gold)
        out = compute(self.task.metrics, pred, ref, self.task.num_labels)
        if self.task.kind == "classification":
            out.update(collapse_check(pred, ref, self.task.metrics[0], self.task.num_labels))
        return out

    def predictions(self, model, dataset, batch_size=64) -> list:
        """One dict per example: ``id`` (the row's id, see :mod:`bertforge.data.readers`; the 1-based position
        for a plain list of encoded examples), then ``label`` and ``prob`` (classification: the argmax label
        name and its softmax probability) or ``score`` (regression)."""
        decoded = self.decode(self.run(model, dataset, batch_size), dataset)
        examples = getattr(dataset, "examples", None)
        ids = [e.id for e in examples] if examples is not None else list(range(1, len(dataset) + 1))
        if self.task.kind == "regression":
            return [{"id": i, "score": p[0]["score"]} for i, p in zip(ids, decoded)]
        return [{"id": i, "label": p[0]["label"], "prob": p[0]["score"]} for i, p in zip(ids, decoded)]


def _text_example(x) -> Example:
    """A text (str) or a pair ``(text_a, text_b)`` → an unlabelled :class:`~bertforge.data.readers.Example`."""
    if isinstance(x, str):
        return Example(x)
    a, b = x
    return Example(a, b)


def glue_submission(predictions: list) -> str:
    """``predictions`` (of :meth:`SequenceAdapter.predictions`) as the TSV the GLUE server takes for one task:
    a header ``index<TAB>prediction``, then one row per example: its ``id`` and its label name (as the task's
    files write labels: ``0``/``1`` for CoLA, SST-2, MRPC, QQP, WNLI; ``entailment``/``not_entailment`` for
    QNLI, RTE; ``entailment``/``neutral``/``contradiction`` for MNLI) or, for regression (STS-B), its score
    (the shortest decimal that reads back as the float32 the model gave)."""
    rows = ["index\tprediction\n"]
    for p in predictions:
        value = p["label"] if "label" in p else str(np.float32(p["score"]))
        rows.append(f"{p['id']}\t{value}\n")
    return "".join(rows)


__all__ = ["TASKS", "KIND_METRICS", "SequenceClassificationHead", "SequenceAdapter", "collapse_check", "multi_label_loss",
           "glue_submission"]
