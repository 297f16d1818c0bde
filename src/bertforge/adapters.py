"""Task adapters: from a task's files to encoded datasets, batches, predictions and metrics.

``finetune``, ``evaluate``, ``predict`` and ``distill`` are the same for every task kind except for
these steps, so each kind (sequence classification / regression here; token classification and
extractive QA register their own) provides one :class:`TaskAdapter`. Look one up with
:func:`adapter_for`.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .data.collate import PadCollator, encode_examples
from .data.readers import read_examples
from .data.tasks import Task
from .evaluate.metrics import compute
from .errors import DataError
from .tokenizer import pad_id

ADAPTERS: dict[str, type] = {}


def register_adapter(kind: str):
    def deco(cls):
        ADAPTERS[kind] = cls
        return cls
    return deco


class TaskAdapter:
    """Interface. ``head``: name of the head in :data:`bertforge.models.heads.HEADS`."""

    head = "base"

    def __init__(self, task: Task, tokenizer, max_seq_len: int):
        self.task, self.tok, self.max_seq_len = task, tokenizer, max_seq_len

    def head_config(self) -> dict:
        return {}

    def load(self, path, max_samples: Optional[int] = None, require_labels: bool = True) -> list:
        raise NotImplementedError

    def collator(self):
        raise NotImplementedError

    def predict_logits(self, model, dataset: list, batch_size: int = 64) -> np.ndarray:
        raise NotImplementedError

    def evaluate(self, model, dataset: list, batch_size: int = 64) -> dict:
        raise NotImplementedError

    def predictions(self, model, dataset: list, batch_size: int = 64) -> list:
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


@register_adapter("classification")
@register_adapter("regression")
class SequenceAdapter(TaskAdapter):
    """Single sentences and pairs → [CLS] classification (CE) or regression (MSE)."""

    head = "sequence_classification"

    def head_config(self) -> dict:
        t = self.task
        if t.kind == "regression":
            return {"num_labels": 1, "problem_type": "regression", "id2label": {0: "score"}}
        return {"num_labels": len(t.labels), "problem_type": "single_label_classification",
                "id2label": {i: lab for i, lab in enumerate(t.labels)}}

    def load(self, path, max_samples=None, require_labels=True) -> list:
        examples = read_examples(path, self.task, max_samples, require_labels)
        enc = encode_examples(self.tok, examples, self.max_seq_len)
        if require_labels and any("labels" not in e for e in enc):
            raise DataError(f"{path} has rows without a label; task {self.task.name} needs labels here")
        return enc

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

    def _decode(self, logits: np.ndarray) -> np.ndarray:
        return logits[:, 0] if self.task.kind == "regression" else logits.argmax(-1)

    def evaluate(self, model, dataset, batch_size=64) -> dict:
        pred = self._decode(self.predict_logits(model, dataset, batch_size))
        ref = np.array([d["labels"] for d in dataset])
        return compute(self.task.metrics, pred, ref, self.task.num_labels)

    def predictions(self, model, dataset, batch_size=64) -> list:
        logits = self.predict_logits(model, dataset, batch_size)
        if self.task.kind == "regression":
            return [{"score": float(x[0])} for x in logits]
        probs = torch.softmax(torch.from_numpy(logits), -1).numpy()
        return [{"label": self.task.labels[int(p.argmax())], "prob": float(p.max())} for p in probs]


def adapter_for(task: Task, tokenizer, max_seq_len: int) -> TaskAdapter:
    if task.kind not in ADAPTERS:
        raise DataError(f"task kind {task.kind!r} has no adapter; choose one of {', '.join(ADAPTERS)}")
    return ADAPTERS[task.kind](task, tokenizer, max_seq_len)


# task kinds defined in their own modules register themselves on import
from . import tasks_tokens  # noqa: E402,F401  (token_classification, qa)
