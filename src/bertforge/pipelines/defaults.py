"""Defaults that work: what ``finetune`` fills in when the user did not choose, and says so on stderr.

* :func:`apply_task_defaults` — a task's :attr:`~bertforge.tasks.base.Task.train_defaults` (the values its
  benchmark's recipe found: GoEmotions lr 8e-5 and ``pos_weight=sqrt``, NER lr 1.5e-4, QA 1e-4, retrieval 2e-5)
  onto the recipe, for every key the run did not set by a flag, a ``key=value`` override or its recipe file.
* :func:`default_pooling` — the pooling a sequence head reads: ``model.pooling`` when given (``pooler``: the
  family's own [CLS] pooler, as ``transformers``' ``…ForSequenceClassification``), else the pooling the source
  dir declares in the sentence-transformers layout (``1_Pooling/config.json``, read by
  :class:`~bertforge.checkpoint.modeldir.ModelDir`), else the pooler.
"""
from __future__ import annotations

import os
import sys

#: recipe key → the finetune option (flag) that sets it (:func:`bertforge.pipelines.recipe.apply_train_flags`)
FLAG_KEYS = {"train.epochs": "epochs", "train.max_steps": "max_steps", "train.batch_size": "batch_size",
             "train.lr": "lr", "train.seed": "seed", "data.max_seq_len": "max_seq_len",
             "data.max_train_samples": "max_train_samples"}

#: heads that read ``ModelConfig.pooling`` (the sequence head: classification, regression, multi-label)
POOLING_HEADS = ("sequence_classification",)

#: ``model.pooling=pooler``: the family's own [CLS] reading (``transformers`` parity)
POOLER = "pooler"


def _say(msg: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(msg, file=sys.stderr, flush=True)


def user_set(recipe, args, key: str) -> bool:
    """Whether the run chose ``key`` (dotted recipe key) itself: in its recipe file or a ``key=value``
    override (:attr:`bertforge.config.Recipe.given`), or by its flag (``--lr`` for ``train.lr``)."""
    flag = FLAG_KEYS.get(key)
    return key in recipe.given or (flag is not None and getattr(args, flag, None) is not None)


def apply_task_defaults(recipe, task, args, verb: str = "finetune") -> dict:
    """Set each of ``task.train_defaults`` (``{"train.lr": 8e-5, …}``) that the run did not set itself
    (:func:`user_set`) on ``recipe``, and print one line naming what was applied. Returns the applied
    ``{key: value}`` (also recorded in ``recipe.yaml`` as the values the run used)."""
    applied = {}
    for key, value in (getattr(task, "train_defaults", None) or {}).items():
        if user_set(recipe, args, key):
            continue
        section, name = key.split(".", 1)
        setattr(getattr(recipe, section), name, value)
        applied[key] = value
    if applied:
        what = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in applied.items())
        _say(f"bertforge {verb}: task {task.name} defaults from its benchmark recipe: {what} "
             f"(set a key to override it)")
    return applied


def default_pooling(recipe, md, head: str, verb: str = "finetune"):
    """Settle ``recipe.model["pooling"]`` for a model with head ``head`` built from the dir ``md``
    (a :class:`~bertforge.checkpoint.modeldir.ModelDir`) and return what the head reads: a mode (``mean``,
    ``max``, ``cls``) or None (the [CLS] pooler).

    Given ``model.pooling``, it wins (``pooler`` → None). Otherwise a bare encoder dir that declares its pooling
    (a sentence-transformers dir such as all-MiniLM-L6-v2: mean) gives that mode, printed on stderr; a dir
    saved with a head keeps its own (``config.json`` → ``bertforge.pooling``); any other dir: the pooler."""
    if "pooling" in recipe.model:
        given = recipe.model["pooling"]
        return None if given in (None, POOLER) else given
    if head not in POOLING_HEADS or md.head not in (None, "base") or not md.pooling.declared:
        return None
    recipe.model["pooling"] = md.pooling.mode
    _say(f"bertforge {verb}: the head reads the {md.pooling.mode} pooling declared in {md.path}/1_Pooling; "
         f"model.pooling=pooler reads the [CLS] pooler as transformers does")
    return md.pooling.mode


def collapse_hints(recipe, task) -> list:
    """The flags to try when a run's evaluation stays at the constant predictor's (what
    :class:`~bertforge.pipelines.report.CollapseWarning` names): the task's benchmark defaults the run set
    otherwise, ``model.pooling=mean`` for a sequence head on the [CLS] pooler, ``train.pos_weight=sqrt`` for a
    multi-label task without label weighting; then more steps."""
    hints = []
    for key, value in (getattr(task, "train_defaults", None) or {}).items():
        section, name = key.split(".", 1)
        if getattr(getattr(recipe, section), name, None) != value:
            hints.append(f"--lr {value:g}" if key == "train.lr" else f"{key}={value}")
    if task.kind in ("classification", "regression", "multi_label_classification") and \
            recipe.model.get("pooling") in (None, POOLER):
        hints.append("model.pooling=mean")
    if task.kind == "multi_label_classification" and recipe.train.pos_weight in (None, "none") and \
            "train.pos_weight=sqrt" not in hints:
        hints.append("train.pos_weight=sqrt")
    return hints + ["more steps (--epochs)"]


__all__ = ["collapse_hints", "apply_task_defaults", "default_pooling", "user_set", "POOLER", "FLAG_KEYS"]
