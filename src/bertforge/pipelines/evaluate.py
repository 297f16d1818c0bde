"""Evaluate a model dir on labelled data from Python: :func:`evaluate`, and :func:`load_for_task` (the dir, its
task, the task adapter and the runner every verb that scores a model uses).

    >>> import bertforge
    >>> r = bertforge.evaluate("runs/sst2-int8", "dev.tsv")      # checkpoint, export or INT8 dir
    >>> r.metrics["accuracy"], r.n, r.seconds
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import ConfigError, require_at_least


@dataclass
class EvalResult:
    """What :func:`evaluate` measured: the ``metrics`` of the task (its adapter's names: accuracy, f1,
    spearman …, fractions in [0, 1]), the task, ``n`` source records scored (rows, sentences or questions; token
    tasks batch windows), the model dir and the seconds spent scoring."""

    metrics: dict
    task: object
    n: int
    model: Path
    seconds: float
    extra: dict = field(default_factory=dict)


def evaluate(model, data, *, task: Optional[str] = None, max_seq_len: Optional[int] = None, batch_size: int = 64,
             max_samples: Optional[int] = None, threshold=None, labels_file=None,
             aggregation: Optional[str] = None) -> EvalResult:
    """Score ``model`` (a checkpoint dir, an export / INT8 dir, or ``"minilm"``) on the labelled file ``data``
    with ``task``'s metrics (default: the task the model was fine-tuned on), at ``max_seq_len`` tokens
    (default: the fine-tuning length). ``threshold`` / ``labels_file``: multi-label models only.
    ``aggregation``: NER models only — a word's tag from its first subword (``first``, the trained scheme),
    the ``average`` of its subwords' probabilities or the subword of ``max`` probability (default: what the
    dir records, ``first``).

    Raises:
        ConfigError: an unknown task, a head that does not fit it, a bad length or batch size.
        DataError / CheckpointError: unreadable data or model dir."""
    from .options import python_names
    with python_names(evaluate):  # the checks below word their errors for the command line (--max-seq-len)
        return evaluate_with(model, data, task=task, max_seq_len=max_seq_len, batch_size=batch_size,
                             max_samples=max_samples, threshold=threshold, labels_file=labels_file,
                             aggregation=aggregation)


def evaluate_with(model, data, *, task: Optional[str] = None, max_seq_len: Optional[int] = None,
                  batch_size: int = 64, max_samples: Optional[int] = None, threshold=None,
                  labels_file=None, aggregation: Optional[str] = None) -> EvalResult:
    """:func:`evaluate` with its errors worded for the command line (``bertforge evaluate`` calls this)."""
    from .options import check_option
    batch_size = check_option("evaluate", "batch_size", batch_size, int)
    max_samples = check_option("evaluate", "max_samples", max_samples, Optional[int])
    max_seq_len = check_option("evaluate", "max_seq_len", max_seq_len, Optional[int])
    if data is None or not isinstance(data, (str, os.PathLike)):
        raise ConfigError(f"evaluate(): data={data!r:.60} is a {type(data).__name__}; pass the labelled file's path")
    require_at_least("batch_size", batch_size, 1)
    require_at_least("max_samples", max_samples, 1)
    model_dir, t, adapter, runner = load_for_task(model, task, max_seq_len, threshold, labels_file, aggregation)
    # the task's four steps (bertforge.tasks.base): read → encode here; run → decode → score in evaluate —
    # the encode / decode that `predict` and the server's routes use too
    ds = adapter.encode(adapter.read(data, max_samples), require_labels=True, source=str(data))
    t0 = time.perf_counter()
    metrics = adapter.evaluate(runner, ds, batch_size)
    return EvalResult(metrics, t, len(getattr(ds, "examples", ds)), model_dir,
                      round(time.perf_counter() - t0, 3))


def load_for_task(model_arg, task_name, max_seq_len=None, threshold=None, labels_file=None, aggregation=None):
    """(model dir, task, adapter, runner) for a fine-tuned checkpoint, or for what ``export`` / ``quantize``
    made of one: the :class:`~bertforge.runtime.base.Runner` that :func:`bertforge.runtime.load_runner` picks
    for the dir (PyTorch FP32 / INT8, or ONNX Runtime over its ``model.onnx``). ``max_seq_len`` None → the
    length the model was fine-tuned with. ``aggregation``: a NER model's subword aggregation instead of the one
    its dir records. Raises ConfigError for a length outside [2, the model's
    positions], an unknown task or a head that does not fit the task; CheckpointError for an unusable dir."""
    from ..checkpoint.modeldir import ModelDir
    from ..checkpoint.read import check_seq_len, require_saved_head
    from ..runtime import load_runner
    from ..tasks import adapter_for, model_task
    require_at_least("--max-seq-len", max_seq_len, 2)
    md = ModelDir.open(model_arg)
    model_dir, cfg, meta = md.path, md.config, md.meta
    check_seq_len(max_seq_len, cfg)
    name = task_name or meta.task
    if not name:
        raise ConfigError(f"{model_dir} does not record its task; pass --task NAME")
    task = model_task(name, meta, model_dir)
    trained_on = meta.task
    saved = [str(v) for v in md.labels or []]
    if task_name and trained_on and task_name != trained_on and task.labels and saved \
            and task.kind != "qa" \
            and [str(x) for x in task.labels] != saved:  # same count, other names: a positional mismatch
        # (QA's two outputs are start/end logits whatever id2label says: squad ↔ squad_v2 is no mismatch)
        raise ConfigError(f"{model_dir} was fine-tuned on task {trained_on} (labels {', '.join(saved)}), not "
                          f"{task_name} (labels {', '.join(map(str, task.labels))}); pass --task {trained_on} "
                          f"or fine-tune on {task_name}")
    tok = md.tokenizer()
    adapter = adapter_for(task, tok, max_seq_len if max_seq_len is not None else md.task_max_length())
    any_encoder = getattr(adapter, "reads_any_encoder", False)  # e.g. retrieval: embeddings of any encoder
    if adapter.head != "base" and not any_encoder:
        require_saved_head(cfg, adapter.head, str(model_dir), task.name, "pass the task it was fine-tuned on")
    runner = load_runner(md)  # the saved head, which is the adapter's (checked above)
    n_out = runner.num_labels if adapter.head != "base" and not any_encoder else None
    if n_out and task.num_labels and n_out != task.num_labels:
        raise ConfigError(f"{model_dir} predicts {n_out} labels but task {task.name} has "
                          f"{task.num_labels}; pass the task it was fine-tuned on")
    if hasattr(adapter, "use_model_labels"):  # label set learnt at fine-tuning (e.g. task ner), its word rule
        adapter.use_model_labels(md)
    if aggregation is not None:
        if not hasattr(adapter, "set_words"):
            raise ConfigError(f"--aggregation applies to token-classification (NER) models; {model_dir} is a "
                              f"{task.kind} model")
        adapter.set_words(aggregation=aggregation)
    if hasattr(adapter, "use_model_thresholds"):  # multi-label: the thresholds saved in the dir
        adapter.use_model_thresholds(model_dir)
    elif threshold is not None or labels_file is not None:
        raise ConfigError(f"--threshold and --labels-file apply to multi-label models; {model_dir} is a "
                          f"{task.kind} model")
    if labels_file is not None:
        from ..tasks.multilabel import check_labels_file
        check_labels_file(labels_file, saved or task.labels)
    if threshold is not None:
        from ..tasks.multilabel import resolve_thresholds
        adapter.thresholds = resolve_thresholds(threshold, task.labels, base=adapter.thresholds)
    return model_dir, task, adapter, runner


__all__ = ["EvalResult", "evaluate", "evaluate_with", "load_for_task"]
