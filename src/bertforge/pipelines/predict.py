"""Predictions of a fine-tuned model from Python: :func:`predict` (what ``bertforge predict`` calls) — the task's
read → encode → run → decode steps (:mod:`bertforge.tasks.base`), as ``evaluate`` and the server's routes run them.

    >>> import bertforge
    >>> preds = bertforge.predict("runs/sst2", "test.tsv")                  # one dict per example
    >>> bertforge.predict("runs/rte", "RTE/test.tsv", out="RTE.tsv", format="glue")
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from ..errors import ConfigError, require_at_least
from ..io import atomic_write_text
from .options import check_option


def check_glue_format(task) -> None:
    """``format="glue"`` writes sentence (pair) classification and regression predictions only."""
    if task.kind not in ("classification", "regression"):
        raise ConfigError(f"--format glue writes sentence (pair) classification and regression predictions; "
                          f"task {task.name} is {task.kind}: use --format jsonl")


def predict(model, data, out=None, *, task: Optional[str] = None, format: str = "jsonl",  # noqa: A002 (the flag)
            max_seq_len: Optional[int] = None, batch_size: int = 64, threshold=None, labels_file=None,
            overwrite: bool = False, aggregation: Optional[str] = None) -> list:
    """Predictions of ``model`` (a fine-tuned checkpoint dir, an export / INT8 dir) for every example of
    ``data`` (labels not needed), one dict per example with the row's ``id`` (its index/id column, else its line
    number) — labels and scores as the task's adapter decodes them. With ``out`` they are also written there:
    JSONL (``format="jsonl"``) or the GLUE submission TSV (``format="glue"``: ``index<TAB>prediction``).
    ``threshold`` / ``labels_file``: multi-label models only; ``aggregation``: NER models only (see ``evaluate``).

    Raises:
        ConfigError: a bad size, a GLUE format for a task that has none, an ``out`` that exists (without
            ``overwrite``) or is an input; DataError / CheckpointError: unreadable data or model dir."""
    from .evaluate import load_for_task
    from .outputs import check_out_file
    batch_size = check_option("predict", "batch_size", batch_size, int)
    max_seq_len = check_option("predict", "max_seq_len", max_seq_len, Optional[int])
    overwrite = check_option("predict", "overwrite", overwrite, bool)
    if format not in ("jsonl", "glue"):
        raise ConfigError(f"--format {format!r}: choose jsonl or glue")
    if data is None or not isinstance(data, (str, os.PathLike)):
        raise ConfigError(f"predict(): data={data!r:.60} is a {type(data).__name__}; pass the input file's path")
    require_at_least("--batch-size", batch_size, 1)
    if format == "glue" and task:  # before loading the model
        from ..tasks import ALIASES, TASKS
        named = TASKS.get(ALIASES.get(task.lower(), task.lower()))
        if named is not None:
            check_glue_format(named)
    model_dir, t, adapter, runner = load_for_task(model, task, max_seq_len, threshold, labels_file, aggregation)
    if format == "glue":
        check_glue_format(t)
    if out is not None:
        out = check_out_file(Path(out), (model_dir,), (data,), overwrite,
                             example="preds.tsv" if format == "glue" else "preds.jsonl")
    ds = adapter.encode(adapter.read(data, require_labels=False), source=str(data))
    preds = adapter.predictions(runner, ds, batch_size)
    if out is not None:
        if format == "glue":
            from ..tasks.classification import glue_submission
            text = glue_submission(preds)
        else:
            text = "".join(json.dumps(p) + "\n" for p in preds)
        atomic_write_text(out, text)
    return preds


__all__ = ["predict", "check_glue_format"]
