"""Task registry: columns, label list and metric of each named task.

The nine GLUE tasks (Wang et al. 2019) with the file layouts the GLUE distribution ships
(``download_glue_data.py``): TSV, quoting disabled, a header row except for CoLA train/dev. Columns are
named by header where there is one and by position otherwise (``int``). ``label_column`` is the gold
label of train/dev files; test files without it can still be read for prediction.

A task of kind ``classification`` maps label strings to ids in ``labels`` order; ``regression`` reads
floats. ``metrics`` are keys of :data:`bertforge.evaluate.metrics.METRICS`; the first is the one used to
pick the best checkpoint.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Union

from ..errors import ConfigError

Column = Union[str, int]


@dataclass(frozen=True)
class Task:
    name: str
    text_columns: tuple  # one (single sentence) or two (pair) columns
    label_column: Optional[Column]
    labels: Optional[tuple]  # None for regression
    metrics: tuple
    kind: str = "classification"  # classification | regression | token_classification | qa
    header: Optional[bool] = True
    hub: Optional[tuple] = None  # (dataset, config) on the HF hub
    hub_columns: Optional[tuple] = None  # (text columns…, label column) in the hub version
    splits: dict = field(default_factory=dict)  # conventional split → file name
    label_range: Optional[tuple] = None  # regression: the scale's (low, high), checked when files are read

    @property
    def num_labels(self) -> int:
        return 1 if self.kind == "regression" else len(self.labels or ())

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2


TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    TASKS[task.name] = task
    return task


_NLI2 = ("entailment", "not_entailment")
for _t in [
    Task("cola", (3,), 1, ("0", "1"), ("mcc", "accuracy"), header=False, hub=("glue", "cola"),
         hub_columns=("sentence", "label"), splits={"train": "train.tsv", "dev": "dev.tsv"}),
    Task("sst2", ("sentence",), "label", ("0", "1"), ("accuracy",), hub=("glue", "sst2"),
         hub_columns=("sentence", "label"), splits={"train": "train.tsv", "dev": "dev.tsv"}),
    Task("mrpc", ("#1 String", "#2 String"), "Quality", ("0", "1"), ("f1", "accuracy"),
         hub=("glue", "mrpc"), hub_columns=("sentence1", "sentence2", "label"),
         splits={"train": "train.tsv", "dev": "dev.tsv"}),
    Task("stsb", ("sentence1", "sentence2"), "score", None, ("pearson", "spearman"), kind="regression",
         hub=("glue", "stsb"), hub_columns=("sentence1", "sentence2", "label"),
         splits={"train": "train.tsv", "dev": "dev.tsv"}, label_range=(0.0, 5.0)),  # Cer et al. 2017 §2
    Task("qqp", ("question1", "question2"), "is_duplicate", ("0", "1"), ("f1", "accuracy"),
         hub=("glue", "qqp"), hub_columns=("question1", "question2", "label"),
         splits={"train": "train.tsv", "dev": "dev.tsv"}),
    Task("mnli", ("sentence1", "sentence2"), "gold_label", ("contradiction", "entailment", "neutral"),
         ("accuracy",), hub=("glue", "mnli"), hub_columns=("premise", "hypothesis", "label"),
         splits={"train": "train.tsv", "dev": "dev_matched.tsv"}),
    Task("mnli-mm", ("sentence1", "sentence2"), "gold_label", ("contradiction", "entailment", "neutral"),
         ("accuracy",), hub=("glue", "mnli"), hub_columns=("premise", "hypothesis", "label"),
         splits={"train": "train.tsv", "dev": "dev_mismatched.tsv"}),
    Task("qnli", ("question", "sentence"), "label", _NLI2, ("accuracy",), hub=("glue", "qnli"),
         hub_columns=("question", "sentence", "label"), splits={"train": "train.tsv", "dev": "dev.tsv"}),
    Task("rte", ("sentence1", "sentence2"), "label", _NLI2, ("accuracy",), hub=("glue", "rte"),
         hub_columns=("sentence1", "sentence2", "label"), splits={"train": "train.tsv", "dev": "dev.tsv"}),
    Task("wnli", ("sentence1", "sentence2"), "label", ("0", "1"), ("accuracy",), hub=("glue", "wnli"),
         hub_columns=("sentence1", "sentence2", "label"), splits={"train": "train.tsv", "dev": "dev.tsv"}),
]:
    register_task(_t)

ALIASES = {"sst-2": "sst2", "sts-b": "stsb", "mnli-m": "mnli", "mnli_matched": "mnli",
           "mnli_mismatched": "mnli-mm", "qnli": "qnli"}


def task_spec(data_cfg) -> dict:
    """The column/label settings of a recipe's ``data`` section that define a task beyond its name
    (``text_columns``, ``label_column``, ``labels``, ``metric``, ``header``; those set), as ``get_task``
    keywords. Fine-tuned and distilled models keep them in ``config.json`` (``bertforge.task_spec``), so
    ``evaluate``, ``predict`` and ``prune`` rebuild a ``custom`` task without the flags."""
    keys = ("text_columns", "label_column", "labels", "metric", "header")
    return {k: getattr(data_cfg, k) for k in keys if getattr(data_cfg, k, None) is not None}


def saved_task_spec(meta: dict, name: str) -> dict:
    """The ``task_spec`` a model recorded (``config.json`` → ``bertforge``), if it was trained on task
    ``name`` (aliases count as the same task); {} otherwise."""
    trained = meta.get("task")
    if not trained or not name:
        return {}
    same = ALIASES.get(trained.lower(), trained.lower()) == ALIASES.get(name.lower(), name.lower())
    return dict(meta.get("task_spec") or {}) if same else {}


#: metrics (keys of :data:`bertforge.evaluate.metrics.METRICS`) that apply to each kind of task
KIND_METRICS = {"classification": ("accuracy", "f1", "mcc"), "regression": ("pearson", "spearman")}


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
             header=None) -> Task:
    """Look a task up by name (case-insensitive, GLUE aliases such as ``SST-2``), or build ``custom``.

    ``custom`` needs ``text_columns`` (1 or 2) and ``label_column``; ``labels`` (list) makes it a
    classification task, without it the label is a float (regression). Overrides of a registered
    task's columns are applied on top of it.
    Raises:
        ConfigError: unknown name, a custom task without columns, not 1–2 text columns, a repeated
        label, a metric that is not one of :data:`KIND_METRICS` for the task's kind.
    """
    key = ALIASES.get(name.lower(), name.lower())
    _check_spec(text_columns, labels, metric, kind=None if key != "custom" else
                ("classification" if labels else "regression"), registered=TASKS.get(key))
    if key == "custom":
        if not text_columns or label_column is None:
            raise ConfigError("--task custom needs data.text_columns=[...] and data.label_column=... "
                              "(and data.labels=[...] for classification)")
        kind = "classification" if labels else "regression"
        return Task("custom", tuple(text_columns), label_column,
                    tuple(str(x) for x in labels) if labels else None,
                    (metric,) if metric else (("accuracy",) if labels else ("pearson", "spearman")),
                    kind=kind, header=header)
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
    return replace(t, **upd) if upd else t
