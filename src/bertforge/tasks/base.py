"""What every task provides: the :class:`Task` record, the :class:`TaskAdapter` interface, and batching.

``finetune``, ``evaluate``, ``predict``, ``distill``, ``prune`` and ``serve`` are the same for every kind of
task except for four steps, which each task module (:mod:`~bertforge.tasks.classification`,
:mod:`~bertforge.tasks.multilabel`, :mod:`~bertforge.tasks.ner`, :mod:`~bertforge.tasks.qa`) provides as one
:class:`TaskAdapter` subclass, beside its head class and its tasks (:mod:`bertforge.tasks` lists them):

* ``read(path)`` — a file → its records (rows, sentences, questions), nothing encoded yet;
* ``encode(items)`` — records, or the plain texts of an HTTP request, → the model's inputs (:class:`Windows`);
* ``decode(outputs, encoded)`` — the model's logits for those inputs → one prediction per record or text;
* ``score(predictions, gold)`` — predictions against the gold labels → the task's metrics.

``run(model, encoded)`` gives the outputs ``decode`` takes when the caller holds the model (the server
batches the same inputs through its own workers instead), and ``load`` / ``evaluate`` / ``predictions``
are those steps composed, so a file and a request are encoded and decoded by the same code.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

import numpy as np
import torch

from ..data.conll import IGNORE_INDEX

Column = Union[str, int]


@dataclass(frozen=True)
class UnlabelledLayout:
    """The layout of a task's unlabelled test file where it differs from its train/dev files: GLUE ships each
    test split with a header, an ``index`` column and no label (CoLA's test file even has a header where its
    train/dev files have none). A file whose first row is ``header`` exactly (cells stripped) is read with
    ``text_columns`` (header names) as its texts, ``id_column`` as each row's id, and no label."""

    header: tuple  # the test file's header row, cell by cell
    text_columns: tuple  # one or two names out of ``header``
    id_column: str = "index"


@dataclass(frozen=True)
class Task:
    """A named task: where its text and labels are, its label list and its metrics.

    ``text_columns``: one (single sentence) or two (pair) columns, by header name or position (``int``);
    ``label_column``: the gold label of train/dev files (test files without it can still be read for
    prediction); ``labels``: label strings in id order (None for regression); ``metrics``: the first is
    the one used to pick the best checkpoint; ``kind``: the adapter kind in :data:`bertforge.tasks.ADAPTERS`;
    ``id_column``: the column that names each row (None: the reader takes a column named ``id``, ``idx``,
    ``index`` or ``guid`` when the file has one, else the row's 1-based line number); ``test_layout``: the
    task's unlabelled test file (:class:`UnlabelledLayout`), recognised by its header;
    ``allow_empty_labels``: a multi-label row may have an empty label field (no label);
    ``train_defaults``: recipe keys → values its benchmark's recipe found (``{"train.lr": 8e-5}``), which
    ``finetune`` applies unless the run sets that key itself (flag, override or recipe file).
    """

    name: str
    text_columns: tuple  # one (single sentence) or two (pair) columns
    label_column: Optional[Column]
    labels: Optional[tuple]  # None for regression
    metrics: tuple
    kind: str = "classification"  # classification | regression | multi_label_classification | token_classification | qa
    header: Optional[bool] = True
    hub: Optional[tuple] = None  # (dataset, config) on the HF hub
    hub_columns: Optional[tuple] = None  # (text columns…, label column) in the hub version
    splits: dict = field(default_factory=dict)  # conventional split → file name
    label_range: Optional[tuple] = None  # regression: the scale's (low, high), checked when files are read
    id_column: Optional[Column] = None  # the row's id (see the class doc)
    test_layout: Optional[UnlabelledLayout] = None  # the unlabelled test file, if laid out otherwise
    allow_empty_labels: bool = False  # multi-label: a row may carry no label (an empty label field)
    train_defaults: dict = field(default_factory=dict, hash=False)  # dotted recipe key → its benchmark's value

    @property
    def num_labels(self) -> int:
        return 1 if self.kind == "regression" else len(self.labels or ())

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2


class TaskAdapter:
    """Interface. ``head``: name of the head in :data:`bertforge.heads.HEADS`; ``read_unit``: what ``load``'s
    ``max_samples`` counts (rows of a file, sentences, questions); ``item_unit``: what ``load`` returns, the
    items the Trainer batches (examples, or windows of ≤ ``max_seq_len`` tokens)."""

    head = "base"
    read_unit = "examples"
    item_unit = "examples"

    def __init__(self, task: Task, tokenizer, max_seq_len: int):
        self.task, self.tok, self.max_seq_len = task, tokenizer, max_seq_len

    def head_config(self) -> dict:
        """ModelConfig fields the head needs (``num_labels``, ``id2label``, ``problem_type`` …)."""
        return {}

    # ------------------------------------------------------------------ the four steps
    def read(self, path, max_samples: Optional[int] = None, require_labels: bool = True) -> list:
        """A file of the task → its records (``read_unit``: rows, sentences, questions), unencoded; the first
        ``max_samples``. Raises DataError for an unreadable file, or a record without its label when
        ``require_labels``."""
        raise NotImplementedError

    def encode(self, items, require_labels: bool = False, source: str = "the input") -> "Windows":
        """Records of :meth:`read`, or plain texts (what an HTTP request sends; the task module says which
        shape) → :class:`Windows`: the encoded items the model reads (≤ ``max_seq_len`` tokens each), which
        remember the records they came from. ``source`` names the input in error messages."""
        raise NotImplementedError

    def run(self, model, encoded, batch_size: int = 64):
        """The outputs :meth:`decode` takes: ``model``'s logits for every encoded item (``model``: a PyTorch
        module or a :mod:`bertforge.runtime` runner)."""
        raise NotImplementedError

    def decode(self, outputs, encoded) -> list:
        """``outputs`` (per encoded item, its logits, as :meth:`run` or a server's batch workers give them)
        → one JSON-ready prediction per record or text of ``encoded``."""
        raise NotImplementedError

    def score(self, predictions: list, gold: list) -> dict:
        """The task's metrics of ``predictions`` (of :meth:`decode`) against ``gold`` (of :meth:`gold`, one per
        prediction, in order)."""
        raise NotImplementedError

    def gold(self, encoded) -> list:
        """The gold label of each record of ``encoded`` (labelled input), in the form :meth:`score` takes."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the steps composed
    def load(self, path, max_samples: Optional[int] = None, require_labels: bool = True) -> list:
        """Read and encode a file of the task → list of encoded examples (what the Trainer batches)."""
        return self.encode(self.read(path, max_samples, require_labels), require_labels, str(path))

    def counts(self, dataset) -> dict:
        """What a ``load`` result holds: ``{"read": n, "read_unit", "items": n, "item_unit", "max_seq_len"}`` —
        how many records (``read_unit``) were read, and how many items (``item_unit``) of ≤ ``max_seq_len``
        tokens they became (a token task packs sentences into windows and cuts long ones into several)."""
        return {"read": len(getattr(dataset, "examples", dataset)), "read_unit": self.read_unit,
                "items": len(dataset), "item_unit": self.item_unit, "max_seq_len": self.max_seq_len}

    def prepare_model(self, model, train_ds=None) -> None:
        """Called once the model to train is built (before training): a task may set up its head or its
        training data with it (retrieval: loss settings, hard negatives mined with the model). Default: nothing."""

    def finish_dir(self, model, out_dir) -> None:
        """Called after ``model`` was saved to ``out_dir`` (every checkpoint and the final dir): a task may add
        files there (retrieval: the pooling files of an embedding dir). Default: nothing."""

    def collator(self):
        """A callable: list of encoded examples → batch dict of (B, …) tensors."""
        raise NotImplementedError

    def predict_logits(self, model, dataset: list, batch_size: int = 64) -> np.ndarray:
        raise NotImplementedError

    def evaluate(self, model, dataset: list, batch_size: int = 64) -> dict:
        """The task's metrics of ``model`` on a labelled ``dataset``: ``score(decode(run(…)), gold(…))``."""
        return self.score(self.decode(self.run(model, dataset, batch_size), dataset), self.gold(dataset))

    def predictions(self, model, dataset: list, batch_size: int = 64) -> list:
        """One JSON-ready prediction per example."""
        raise NotImplementedError


def batch_logits(model, batch: dict) -> np.ndarray:
    """The ``logits`` of one batch (inputs only, (B, T) tensors) as a float32 numpy array.

    ``model`` is a PyTorch ``nn.Module`` returning an output with ``.logits`` (run without gradients on its
    device, in the mode the caller set), or a runner of :mod:`bertforge.runtime` (any callable taking the
    batch's tensors and returning a mapping with ``logits``)."""
    if not isinstance(model, torch.nn.Module):
        return np.asarray(model(**batch)["logits"], dtype=np.float32)
    dev = next(model.parameters()).device
    with torch.no_grad():
        return model(**{k: v.to(dev) for k, v in batch.items()}).logits.float().cpu().numpy()


def iter_batches(dataset: list, collate, batch_size: int, sort: bool = True):
    """Yield (indices, batch) in length-sorted order (less padding); predictions are re-ordered by
    the caller with the indices."""
    order = sorted(range(len(dataset)), key=lambda i: len(dataset[i]["input_ids"])) if sort \
        else list(range(len(dataset)))
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        yield idx, collate([dataset[i] for i in idx])


class Windows(list):
    """A list of encoded windows (what the Trainer batches) that remembers the source ``examples``
    (sentences or questions; for sequence tasks one window per example) they came from, for re-assembly at
    evaluation and for the ids of predictions. Token tasks may pack
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


def softmax(z) -> np.ndarray:
    """Softmax over the last axis of ``z`` in float64 (stable: the max is subtracted first)."""
    z = np.asarray(z, dtype=np.float64)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def window_logits(model, windows: list, collate, batch_size: int = 64, seq_axis: int = 0) -> list:
    """Run ``model`` (a PyTorch module or a :mod:`bertforge.runtime` runner, see :func:`batch_logits`) on every
    window; returns per window its logits (numpy) cut to the window length along ``seq_axis`` (of the
    per-example logits): (T_w, C) for token classification (axis 0), (2, T_w) for QA (axis 1)."""
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


def stack_padded(arrs: list, axis: int) -> np.ndarray:
    """Stack arrays of different lengths along ``axis``, zero-padded to the longest."""
    t = max(a.shape[axis] for a in arrs)
    out = []
    for a in arrs:
        pad = [(0, 0)] * a.ndim
        pad[axis] = (0, t - a.shape[axis])
        out.append(np.pad(a, pad))
    return np.stack(out)


__all__ = ["Task", "UnlabelledLayout", "TaskAdapter", "Column", "iter_batches", "Windows", "TokenCollator", "window_logits",
           "stack_padded", "softmax"]
