"""Extractive question answering: SQuAD v1.1 / v2.0 — tasks, reader, head, adapter and metric.

* tasks: ``squad`` / ``squad_v2`` — SQuAD v1.1 / v2.0 (Rajpurkar et al. 2016, 2018).
* reader: :mod:`bertforge.data.squad` (SQuAD JSON, question/context windows with a stride, n-best decoding).
* head: :class:`QuestionAnsweringHead` (Devlin et al. 2018 §4.2, §4.3): span start/end scores from one
  ``Linear(H, 2)``, saved as ``…ForQuestionAnswering`` (``qa_outputs.*``). ``logits`` (B, 2, T) =
  ``stack([start_logits, end_logits], 1)``: row 0 scores each position as the answer start, row 1 as its
  end (softmax over the last dim); padding positions get −10⁴, so the span distribution puts no mass on them.
* adapter: :class:`QAAdapter` (kind ``qa``): ``read`` a SQuAD file's questions, or ``encode`` plain
  ``{"question", "context"}`` pairs, into question/context windows; ``decode`` the windows' start/end logits
  into one answer span per question (character offsets into its context); ``score`` them — the same steps for
  ``evaluate``, ``predict`` and ``serve``'s ``/qa``.
* metric: :func:`squad_scores`, the official evaluation scripts (``evaluate-v1.1.py``, ``evaluate-v2.0.py``;
  Rajpurkar et al. 2016 §6, 2018): answers are normalised by lower-casing, removing punctuation, removing
  the articles a/an/the and collapsing whitespace; EM = normalised strings equal; F1 = harmonic mean of
  bag-of-tokens precision and recall; each question takes the max over its gold answers; results are
  percentages. v2.0: a question without gold answers has gold ``[""]`` and scores 1 only for the empty
  prediction; ``HasAns_*`` / ``NoAns_*`` break the totals down.
"""
from __future__ import annotations

import collections
import re
import string
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..data.squad import QAExample, decode_answers, encode_qa_windows, read_squad
from ..errors import ConfigError, DataError
from ..models.head import Head
from ..models.modernbert import PredictionHead, init_modernbert
from ..models.output import EncoderOutput
from ..tokenizer import pad_id
from .base import Task, TaskAdapter, TokenCollator, Windows, stack_padded, window_logits

#: the logit given to padding positions of the QA head (finite, so KL/log-softmax stay finite)
QA_PAD_LOGIT = -1.0e4

#: the benchmark's learning rate (benchmarks/ner_qa_minilm.sh: SQuAD v1.1 EM 55.4 / F1 68.4)
QA_DEFAULTS = {"train.lr": 1e-4}

#: the extractive QA tasks
TASKS = [
    # labels: the two rows of the QA logits (start, end), so Task.num_labels matches the head
    Task("squad", ("question", "context"), "answers", ("start", "end"), ("f1", "exact_match"), kind="qa",
         header=None, hub=("squad", None), splits={"train": "train-v1.1.json", "dev": "dev-v1.1.json"},
         train_defaults=QA_DEFAULTS),
    Task("squad_v2", ("question", "context"), "answers", ("start", "end"), ("f1", "exact_match"), kind="qa",
         header=None, hub=("squad_v2", None), splits={"train": "train-v2.0.json", "dev": "dev-v2.0.json"},
         train_defaults=QA_DEFAULTS),
]


class QuestionAnsweringHead(Head):
    """Span start/end scores ``S·h_i`` and ``E·h_i`` from one ``Linear(H, 2)`` (Devlin et al. 2018
    §4.2; HF ``qa_outputs``).

    Input (B, T, H) → ``logits`` (B, 2, T) (row 0 start, row 1 end; padding = −10⁴). With
    ``start_positions`` / ``end_positions`` (B,) the loss is ``(CE(start) + CE(end)) / 2`` over the T
    positions; a window without the answer points both at index 0 ([CLS]), as in the paper's v2.0
    recipe. Positions outside [0, T) are clamped to T and ignored (as ``transformers``).
    """

    hf_suffix = "ForQuestionAnswering"

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.num_labels != 2:
            raise ConfigError(f"the question_answering head has 2 outputs (start, end) but the config has "
                              f"num_labels={config.num_labels}; set model.num_labels=2")
        self.num_labels = 2
        # ModernBERT: its head transform LN(act(W·h)), then dropout, before the span scores
        self.transform = PredictionHead(config) if config.model_type == "modernbert" else None
        self.dropout = nn.Dropout(config.classifier_dropout or 0.0) if self.transform is not None else None
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        nn.init.normal_(self.qa_outputs.weight, 0.0, config.initializer_range)
        nn.init.zeros_(self.qa_outputs.bias)
        if self.transform is not None:
            init_modernbert(self.transform, config)

    def forward(self, enc: EncoderOutput, batch: dict) -> dict:
        h = enc.last_hidden_state
        if self.transform is not None:
            h = self.dropout(self.transform(h))
        logits = self.qa_outputs(h).transpose(1, 2)  # (B, 2, T)
        am = batch.get("attention_mask")
        if am is not None:
            logits = logits.masked_fill(am[:, None, :] == 0, QA_PAD_LOGIT)
        out = {"logits": logits}
        sp, ep = batch.get("start_positions"), batch.get("end_positions")
        if sp is not None and ep is not None:
            t = logits.shape[-1]
            sp, ep = sp.long().clamp(0, t), ep.long().clamp(0, t)
            z = logits.float()
            ls = F.cross_entropy(z[:, 0], sp, ignore_index=t)
            le = F.cross_entropy(z[:, 1], ep, ignore_index=t)
            out["loss"] = (ls + le) / 2
            out["terms"] = {"start_loss": ls.detach(), "end_loss": le.detach()}
        return out

    @staticmethod
    def hf_keys(config: ModelConfig) -> dict:
        if config.model_type == "modernbert":  # ModernBertForQuestionAnswering: head.* + classifier (H → 2)
            return {"qa_outputs.weight": "classifier.weight", "qa_outputs.bias": "classifier.bias",
                    **PredictionHead.hf_keys(config)}
        return {"qa_outputs.weight": "qa_outputs.weight", "qa_outputs.bias": "qa_outputs.bias"}


def split_qa_logits(logits: torch.Tensor) -> tuple:
    """(B, 2, T) QA logits → (start_logits (B, T), end_logits (B, T))."""
    return logits[:, 0], logits[:, 1]


_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """Lower text, remove punctuation, articles and extra whitespace (official SQuAD script)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def get_tokens(s: str) -> list:
    return normalize_answer(s).split() if s else []


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """Token-overlap F1 in [0, 1]; when either side is empty it is 1 iff both are (v2.0 rule)."""
    p, g = get_tokens(prediction), get_tokens(gold)
    if not p or not g:
        return float(p == g)
    common = collections.Counter(p) & collections.Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: dict, golds: dict) -> dict:
    """``predictions``: id → text; ``golds``: id → list of gold texts (empty list = unanswerable).

    Returns ``{"exact_match", "f1", "n"}`` in percent, plus ``HasAns_*``/``NoAns_*`` when the gold
    set has unanswerable questions. A question missing from ``predictions`` scores 0.
    """
    em_s, f1_s, has = [], [], []
    for qid, gl in golds.items():
        gl = [g for g in gl if normalize_answer(g)] or [""]
        pred = predictions.get(qid)
        if pred is None:
            em_s.append(0.0)
            f1_s.append(0.0)
        else:
            em_s.append(max(exact_match(pred, g) for g in gl))
            f1_s.append(max(f1(pred, g) for g in gl))
        has.append(gl != [""])
    n = len(em_s)
    out = {"exact_match": 100.0 * sum(em_s) / max(1, n), "f1": 100.0 * sum(f1_s) / max(1, n), "n": n}
    if not all(has):
        for name, sel in (("HasAns", True), ("NoAns", False)):
            idx = [i for i, h in enumerate(has) if h == sel]
            if idx:
                out[f"{name}_exact"] = 100.0 * sum(em_s[i] for i in idx) / len(idx)
                out[f"{name}_f1"] = 100.0 * sum(f1_s[i] for i in idx) / len(idx)
                out[f"{name}_total"] = len(idx)
    return out


class QACollator(TokenCollator):
    """Windows → padded (B, T) inputs and ``start_positions`` / ``end_positions`` (B,)."""

    def __call__(self, items: list) -> dict:
        batch = super().__call__(items)
        if all("start_positions" in x for x in items):
            batch["start_positions"] = torch.tensor([x["start_positions"] for x in items], dtype=torch.long)
            batch["end_positions"] = torch.tensor([x["end_positions"] for x in items], dtype=torch.long)
        return batch


class QAAdapter(TaskAdapter):
    """SQuAD questions → question/context windows; n-best decoding to answer text; EM/F1.

    Settings (class attributes, BERT/``transformers`` defaults): ``doc_stride`` window overlap in
    tokens (default ``min(128, max_seq_len // 3)``), ``max_query_len`` 64, ``max_answer_len`` 30,
    ``n_best`` 20, ``null_threshold`` 0.0 (v2.0).
    """

    head = "question_answering"
    read_unit, item_unit = "questions", "windows"  # max_samples counts questions; a long context gives several
    doc_stride: Optional[int] = None
    max_query_len = 64
    max_answer_len = 30
    n_best = 20
    null_threshold = 0.0

    @property
    def version_2(self) -> bool:
        return self.task.name.endswith("v2")

    @property
    def stride(self) -> int:
        """Overlap of consecutive windows of one context, in tokens: ``doc_stride``, else
        ``min(128, max_seq_len // 3)``."""
        return self.doc_stride if self.doc_stride is not None else min(128, self.max_seq_len // 3)

    def head_config(self) -> dict:
        return {"num_labels": 2, "id2label": None, "problem_type": None, "add_pooling_layer": False}

    def read(self, path, max_samples=None, require_labels=True) -> list:
        """A SQuAD JSON file → :class:`~bertforge.data.squad.QAExample` questions. Raises DataError (besides
        the reader's) for a question without an answer in v1.1 data that needs labels."""
        examples = read_squad(path, max_samples, require_answers=require_labels)
        if require_labels and not self.version_2:
            bad = [e.id for e in examples if not e.answers]
            if bad:
                raise DataError(f"{path}: question {bad[0]} has no answer; use --task squad_v2 for data "
                                f"with unanswerable questions")
        return examples

    def encode(self, items, require_labels=False, source="the input") -> Windows:
        """Questions of :meth:`read`, or plain pairs (``{"question", "context"}`` dicts or ``(question,
        context)`` tuples; ids ``"0"``, ``"1"`` … in order) → question/context windows of ≤ ``max_seq_len``
        tokens (a long context gives several, overlapping by :attr:`stride`; the question cut to
        ``max_query_len``), with the answer's token positions when ``require_labels``.
        Raises DataError: ``max_seq_len`` too small for a question and some context."""
        examples = [x if isinstance(x, QAExample) else question_example(i, x) for i, x in enumerate(items)]
        win = encode_qa_windows(self.tok, examples, self.max_seq_len, self.stride, self.max_query_len,
                                with_labels=require_labels)
        return Windows(win, examples)

    def collator(self):
        return QACollator(pad_id(self.tok))

    def run(self, model, encoded, batch_size=64) -> list:
        """Per window its start/end logits (2, T_w)."""
        return window_logits(model, encoded, self.collator(), batch_size, seq_axis=1)

    def decode(self, outputs, encoded) -> list:
        """Per-window start/end logits (2, T_w) → per question ``{"id", "answer", "start", "end", "score",
        "null_score"}``: the best span over all its windows (n-best, :func:`~bertforge.data.squad.
        decode_answers`), ``start`` / ``end`` its character offsets in the context (−1 for the empty answer of
        SQuAD v2.0)."""
        answers = decode_answers(encoded.examples, encoded, [a[0] for a in outputs], [a[1] for a in outputs],
                                 self.n_best, self.max_answer_len, self.version_2, self.null_threshold)
        for a in answers:
            a["end"] = a["start"] + len(a["answer"]) if a["start"] >= 0 else -1
        return answers

    def gold(self, encoded) -> list:
        return [[a["text"] for a in e.answers] for e in encoded.examples]

    def score(self, predictions, gold) -> dict:
        """The official SQuAD EM / F1 (:func:`squad_scores`); ``gold``: per question its answer texts (none:
        unanswerable)."""
        return squad_scores({p["id"]: p["answer"] for p in predictions},
                            {p["id"]: g for p, g in zip(predictions, gold)})

    def answers(self, model, dataset: Windows, batch_size: int = 64) -> list:
        return self.decode(self.run(model, dataset, batch_size), dataset)

    def predict_logits(self, model, dataset, batch_size=64) -> np.ndarray:
        """(N_windows, 2, T_max) start/end logits, zero-padded after each window's length."""
        return stack_padded(window_logits(model, dataset, self.collator(), batch_size, seq_axis=1), 1)

    def predictions(self, model, dataset, batch_size=64) -> list:
        preds = self.answers(model, dataset, batch_size)
        return [{"id": p["id"], "question": e.question, "answer": p["answer"], "start": p["start"],
                 "score": p["score"]} for p, e in zip(preds, dataset.examples)]


def question_example(i: int, item) -> QAExample:
    """A plain question (``{"question", "context"}`` or ``(question, context)``) → an unlabelled
    :class:`~bertforge.data.squad.QAExample` with id ``str(i)``."""
    q, c = (item["question"], item["context"]) if isinstance(item, dict) else item
    return QAExample(str(i), q, c)


__all__ = ["TASKS", "QuestionAnsweringHead", "QAAdapter", "QACollator", "split_qa_logits", "QA_PAD_LOGIT",
           "squad_scores", "normalize_answer", "exact_match", "f1", "question_example"]
