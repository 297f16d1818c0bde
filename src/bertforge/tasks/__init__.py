"""Tasks by name and task kinds by adapter: the task registry.

Each task lives in one module with its reader, head, adapter and metric:

==========================  ==================================  ===============================================
module                      kinds (adapter)                     tasks
==========================  ==================================  ===============================================
:mod:`.classification`      classification, regression          the nine GLUE tasks; ``custom`` (CSV/TSV/JSONL)
:mod:`.multilabel`          multi_label_classification          ``goemotions``; ``custom`` with ``multi_label``
:mod:`.ner`                 token_classification                ``conll2003``, ``ner``
:mod:`.qa`                  qa                                  ``squad``, ``squad_v2``
:mod:`.retrieval`           retrieval                           ``retrieval`` (query, positive[, negatives])
==========================  ==================================  ===============================================

:data:`TASKS` and :data:`ADAPTERS` below are the only places a task or a kind is registered (their heads
are in :data:`bertforge.heads.HEADS`). ``metrics`` of a task are the keys its adapter scores; the first is
the one used to pick the best checkpoint. Look a task up with :func:`get_task`, its adapter with
:func:`adapter_for`.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from ..errors import ConfigError, DataError
from . import classification, multilabel, ner, qa, retrieval
from .base import Task, TaskAdapter
from .classification import KIND_METRICS, SequenceAdapter
from .multilabel import MultiLabelAdapter
from .ner import TokenClassificationAdapter
from .qa import QAAdapter
from .retrieval import RetrievalAdapter

#: task name → :class:`~bertforge.tasks.base.Task`
TASKS: dict[str, Task] = {t.name: t for t in [*classification.TASKS, *ner.TASKS, *qa.TASKS, *multilabel.TASKS,
                                                 *retrieval.TASKS]}

#: task kind → its :class:`~bertforge.tasks.base.TaskAdapter`
ADAPTERS: dict[str, type] = {
    "classification": SequenceAdapter,
    "regression": SequenceAdapter,
    "multi_label_classification": MultiLabelAdapter,
    "token_classification": TokenClassificationAdapter,
    "qa": QAAdapter,
    "retrieval": RetrievalAdapter,
}

ALIASES = {"sst-2": "sst2", "sts-b": "stsb", "mnli-m": "mnli", "mnli_matched": "mnli",
           "mnli_mismatched": "mnli-mm", "qnli": "qnli"}


def task_spec(data_cfg) -> dict:
    """The column/label settings of a recipe's ``data`` section that define a task beyond its name
    (``text_columns``, ``label_column``, ``labels``, ``metric``, ``header``, ``multi_label``,
    ``allow_empty_labels``; those set), as ``get_task``
    keywords. Fine-tuned and distilled models keep them in ``config.json`` (``bertforge.task_spec``), so
    ``evaluate``, ``predict`` and ``prune`` rebuild a ``custom`` task without the flags."""
    keys = ("text_columns", "label_column", "labels", "metric", "header", "multi_label", "allow_empty_labels")
    return {k: getattr(data_cfg, k) for k in keys if getattr(data_cfg, k, None) is not None}


def saved_task_spec(meta: dict, name: str) -> dict:
    """The ``task_spec`` a model recorded (``config.json`` → ``bertforge``), if it was trained on task
    ``name`` (aliases count as the same task); {} otherwise."""
    trained = meta.get("task")
    if not trained or not name:
        return {}
    same = ALIASES.get(trained.lower(), trained.lower()) == ALIASES.get(name.lower(), name.lower())
    return dict(meta.get("task_spec") or {}) if same else {}


def _check_spec(text_columns, labels, metric, kind, registered) -> None:
    """ConfigError for a task spec that would train silently wrong: not 1 or 2 text columns, a repeated
    label, a metric unknown or not defined for the task's kind."""
    if text_columns is not None and not 1 <= len(text_columns) <= 2:
        raise ConfigError(f"data.text_columns={list(text_columns)}: give one column (single sentence) or two "
                          f"(a pair)")
    if labels:
        names = [str(x) for x in labels]
        dup = next((x for x in names if names.count(x) > 1), None)
        if dup is not None:
            raise ConfigError(f"data.labels={names} lists {dup!r} twice; give each label once")
    if metric:
        kind = kind or (registered.kind if registered is not None else None)
        allowed = KIND_METRICS.get(kind or "", ())
        if allowed and metric not in allowed:
            raise ConfigError(f"data.metric={metric!r} is not a {kind} metric; choose one of {', '.join(allowed)}")


def model_task(name: str, meta: dict, model_dir) -> Task:
    """The task ``name`` for a saved model (``config.json`` → ``bertforge`` = ``meta``), with the columns
    and labels it recorded. Raises ConfigError for ``custom`` on a model that recorded none (evaluate,
    predict and prune take no ``data.*`` overrides)."""
    spec = saved_task_spec(meta, name)
    if ALIASES.get(name.lower(), name.lower()) == "custom" and not spec:
        raise ConfigError(f"{model_dir} was not fine-tuned on a custom task (its config.json records no "
                          f"columns); pass --task with the task it was trained on")
    return get_task(name, **spec)


def get_task(name: str, text_columns=None, label_column=None, labels=None, metric=None,
             header=None, multi_label=None, allow_empty_labels=None) -> Task:
    """Look a task up by name (case-insensitive, GLUE aliases such as ``SST-2``), or build ``custom``.

    ``custom`` needs ``text_columns`` (1 or 2) and ``label_column``; ``labels`` (list) makes it a
    classification task, without it the label is a float (regression); ``multi_label`` True (with
    ``labels``) makes it a multi-label task (:mod:`.multilabel`: the label field is a list; rows may be
    unlabelled with ``allow_empty_labels``). Overrides of a registered task's columns are applied on top of it.
    Raises:
        ConfigError: unknown name, a custom task without columns, not 1–2 text columns, a repeated
        label, a metric that is not one of :data:`KIND_METRICS` for the task's kind.
    """
    key = ALIASES.get(name.lower(), name.lower())
    custom_kind = (multilabel.KIND if multi_label else "classification") if labels else "regression"
    if multi_label and not labels and key == "custom":
        raise ConfigError("data.multi_label=true needs the label set: data.labels=[...] or data.labels_file=FILE")
    _check_spec(text_columns, labels, metric, kind=None if key != "custom" else custom_kind,
                registered=TASKS.get(key))
    if key == "custom":
        if not text_columns or label_column is None:
            raise ConfigError("--task custom needs data.text_columns=[...] and data.label_column=... "
                              "(and data.labels=[...] for classification)")
        kind = custom_kind
        default = {"classification": ("accuracy",), "regression": ("pearson", "spearman"),
                   multilabel.KIND: multilabel.METRICS}[kind]
        return Task("custom", tuple(text_columns), label_column,
                    tuple(str(x) for x in labels) if labels else None,
                    ((metric,) + tuple(m for m in default if m != metric) if kind == multilabel.KIND
                     else (metric,)) if metric else default,
                    kind=kind, header=header, allow_empty_labels=bool(allow_empty_labels))
    if key not in TASKS:
        raise ConfigError(f"unknown task {name!r}; choose one of {', '.join(sorted(TASKS))} or custom")
    t = TASKS[key]
    upd = {}
    if text_columns:
        upd["text_columns"] = tuple(text_columns)
    if label_column is not None:
        upd["label_column"] = label_column
    if labels:
        upd["labels"] = tuple(str(x) for x in labels)
    if metric:
        upd["metrics"] = (metric,) + tuple(m for m in t.metrics if m != metric)
    if header is not None:
        upd["header"] = header
    if allow_empty_labels is not None:
        upd["allow_empty_labels"] = bool(allow_empty_labels)
    return replace(t, **upd) if upd else t


def apply_labels_file(data_cfg, model_cfg: Optional[dict] = None) -> None:
    """``data.labels_file`` (label names, one per line) → ``data.labels``. DataError (``file:line``) where it
    disagrees with ``data.labels`` given too, or with the labels of ``model_cfg`` (a ``config.json`` dict)
    when that model is already a multi-label classifier with as many labels."""
    path = getattr(data_cfg, "labels_file", None)
    if not path:
        return
    names = multilabel.read_labels_file(path)
    if data_cfg.labels:
        multilabel.check_labels_file(path, data_cfg.labels)
    saved = [v for _, v in sorted(((model_cfg or {}).get("id2label") or {}).items(), key=lambda kv: int(kv[0]))]
    if (model_cfg or {}).get("problem_type") == multilabel.KIND and saved:
        multilabel.check_labels_file(path, saved)
    data_cfg.labels = names


def adapter_for(task: Task, tokenizer, max_seq_len: int) -> TaskAdapter:
    """The adapter of ``task``'s kind. Raises DataError for a kind not in :data:`ADAPTERS`."""
    if task.kind not in ADAPTERS:
        raise DataError(f"task kind {task.kind!r} has no adapter; choose one of {', '.join(ADAPTERS)}")
    return ADAPTERS[task.kind](task, tokenizer, max_seq_len)


def adapter_for_model(kind: str, config: dict, tokenizer, max_seq_len: int, labels=None) -> TaskAdapter:
    """The adapter that encodes plain texts for a saved model and decodes its outputs, from what its dir says
    (no task name or data file needed; what ``serve`` answers requests with): ``kind`` is the runner's
    (:func:`bertforge.runtime.base.head_kind`: ``classification``, ``regression``, ``token_classification``,
    ``question_answering``), ``config`` its ``config.json`` (``problem_type``; ``bertforge.task`` and
    ``bertforge.thresholds``), ``labels`` its label names in id order. A multi-label classifier decodes at the
    thresholds saved in ``config`` (0.5 without); a token classifier cuts texts into words and aggregates their
    subwords as ``config`` records (:func:`bertforge.tasks.ner.ner_settings`). Raises DataError for another kind."""
    from ..checkpoint.modeldir import Meta
    meta = Meta.from_config(config)
    if kind == "token_classification":
        from .ner import ner_settings
        adapter = adapter_for(get_task("ner"), tokenizer, max_seq_len)
        adapter.labels = list(labels)
        adapter.words, adapter.aggregation = ner_settings(meta.raw)  # how it cuts texts, as the dir records
        return adapter
    if kind == "question_answering":
        return adapter_for(get_task("squad_v2" if meta.get("task") == "squad_v2" else "squad"), tokenizer,
                           max_seq_len)
    if kind not in ("classification", "regression"):
        raise DataError(f"a {kind} model has no task adapter; choose a classification, regression, "
                        f"token-classification or question-answering model")
    if kind == "classification" and config.get("problem_type") == multilabel.KIND:
        kind = multilabel.KIND
    task = Task(meta.get("task") or kind, ("text",), None, tuple(str(x) for x in labels or ()) or None,
                KIND_METRICS[kind][:1], kind=kind)
    adapter = adapter_for(task, tokenizer, max_seq_len)
    if kind == multilabel.KIND:
        adapter.thresholds = meta.get("thresholds")
    return adapter


__all__ = ["TASKS", "ADAPTERS", "ALIASES", "KIND_METRICS", "Task", "TaskAdapter", "get_task", "model_task",
           "task_spec", "saved_task_spec", "adapter_for", "adapter_for_model", "apply_labels_file"]
