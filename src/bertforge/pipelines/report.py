"""What the verbs tell the user on stderr besides errors, worded from the facts of the layers below.

* :func:`training_plan` — before the first step of ``finetune`` / ``distill``: how many records
  ``--max-train-samples`` read (rows, sentences, questions, sequences), how many training items they became
  (NER packs sentences into windows, QA cuts long contexts into several) and how many optimizer steps
  follow: ``bertforge finetune: 1000 sentences → 161 windows of ≤128 tokens; 20 optimizer steps (batch 8,
  1 epoch of 20 steps)`` (CoNLL-2003 train, MiniLM's tokenizer).
* :class:`CollapseWarning` — a classifier whose every evaluation prediction is one class
  (:func:`bertforge.tasks.classification.collapse_check` adds ``collapsed`` and ``majority_baseline`` to
  the metrics), named with the majority-class baseline's score on the same metric; a multi-label classifier
  whose macro-F1 is no better than the constant predictor's (``constant_macro_f1``: every label for every row);
  either with the flags to try (:func:`bertforge.pipelines.defaults.collapse_hints`).
"""
from __future__ import annotations

import os
import sys
from typing import Callable, Optional


def _main_rank() -> bool:
    return int(os.environ.get("RANK", "0")) == 0  # under torchrun only rank 0 reports


def _number(x: float) -> str:
    """``1``, ``2.5``, ``0.33``: at most two decimals, no trailing zeros; a small positive share keeps two
    significant digits (``0.00075``), never ``0``."""
    if 0 < abs(x) < 0.005:
        return f"{x:.2g}"
    return f"{x:.2f}".rstrip("0").rstrip(".")


def _plural(n, unit: str) -> str:
    """``1 epoch`` / ``2 epochs``; ``unit`` is given in the plural for counts (``sentences``) and kept."""
    return f"{_number(n)} {unit}" if unit.endswith("s") else f"{_number(n)} {unit}{'' if n == 1 else 's'}"


def training_plan(verb: str, counts: dict, trainer) -> str:
    """The one line saying what a training run is about to do.

    Args:
        verb: ``finetune``, ``distill`` …
        counts: :meth:`bertforge.tasks.base.TaskAdapter.counts` of the training set (``read``, ``read_unit``,
            ``items``, ``item_unit``, ``max_seq_len``).
        trainer: the :class:`~bertforge.engine.train.trainer.Trainer` built on those items (``total_steps``,
            ``steps_per_epoch``, ``cfg.batch_size``, ``cfg.grad_accum_steps``).
    """
    read, items = counts["read"], counts["items"]
    what = f"{read} {counts['read_unit']}"
    if items != read or counts["item_unit"] != counts["read_unit"]:
        what += f" → {items} {counts['item_unit']}"
    if counts.get("max_seq_len"):
        what += f" of ≤{counts['max_seq_len']} tokens"
    cfg = trainer.cfg
    batch = f"batch {cfg.batch_size}" + (f" × {cfg.grad_accum_steps} accumulated" if cfg.grad_accum_steps > 1
                                         else "")
    epochs = trainer.total_steps / trainer.steps_per_epoch
    return (f"bertforge {verb}: {what}; {trainer.total_steps} optimizer step{'s' * (trainer.total_steps != 1)}"
            f" ({batch}, {_plural(epochs, 'epoch')} of {trainer.steps_per_epoch} "
            f"step{'s' * (trainer.steps_per_epoch != 1)})")


def print_training_plan(verb: str, counts: dict, trainer) -> None:
    """:func:`training_plan` on stderr (rank 0 only)."""
    if _main_rank():
        print(training_plan(verb, counts, trainer), file=sys.stderr, flush=True)


def collapse_message(metrics: dict, task, where: str = "", hints=None) -> Optional[str]:
    """The warning for evaluation ``metrics`` that say the classifier collapsed (``collapsed`` present), or that
    a multi-label classifier scores no better than the constant predictor (``macro_f1`` ≤ ``constant_macro_f1``),
    else None. ``task``: the :class:`~bertforge.tasks.base.Task` (label names, first metric); ``where``: e.g.
    ``"at step 40"``; ``hints``: the flags to try (default: a lower --lr, more steps or more training data)."""
    tail = "try " + (", ".join(hints) if hints else "a lower --lr, more steps or more training data")
    const = metrics.get("constant_macro_f1")
    if metrics.get("collapsed") is None and const is not None and metrics.get("macro_f1") is not None:
        f1 = float(metrics["macro_f1"])
        if f1 > float(const):
            return None
        return (f"warning: macro_f1 {f1:.4g}{' ' + where if where else ''} is no better than the constant "
                f"predictor's {float(const):.4g} (every label for every row) — {tail}")
    if metrics.get("collapsed") is None:
        return None
    c = int(metrics["collapsed"])
    labels = task.labels or ()
    name = labels[c] if c < len(labels) else None
    cls = f"class {c}" + (f" ({name!r})" if name is not None and str(name) != str(c) else "")
    metric = task.metrics[0]
    return (f"warning: every evaluation prediction{' ' + where if where else ''} is {cls}; the majority-class "
            f"baseline scores {metric} {float(metrics['majority_baseline']):.4g} on this data (the model "
            f"scores {float(metrics.get(metric, float('nan'))):.4g}) — {tail}")


class CollapseWarning:
    """Wraps a Trainer's ``eval_fn``: prints :func:`collapse_message` on stderr when an evaluation collapsed and
    the one before did not (a run that stays collapsed is told once, and again after it recovered).

    Args:
        verb: the verb that prints (``finetune``, ``distill``).
        task: the task evaluated.
        eval_fn: ``model → metrics``.
        step: ``() → the current optimizer step`` (for the message), optional.
        hints: the flags to try, named in the message (:func:`collapse_message`), optional.
    """

    def __init__(self, verb: str, task, eval_fn: Callable, step: Optional[Callable[[], int]] = None,
                 hints=None):
        self.verb, self.task, self.eval_fn, self.step, self.hints = verb, task, eval_fn, step, hints
        self.collapsed = False

    def __call__(self, model) -> dict:
        metrics = self.eval_fn(model)
        msg = collapse_message(metrics, self.task, f"at step {self.step()}" if self.step else "", self.hints)
        if msg and not self.collapsed and _main_rank():
            print(f"bertforge {self.verb}: {msg}", file=sys.stderr, flush=True)
        self.collapsed = msg is not None
        return metrics


__all__ = ["training_plan", "print_training_plan", "collapse_message", "CollapseWarning"]
