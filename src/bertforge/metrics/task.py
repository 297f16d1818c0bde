"""Task metrics, computed with scikit-learn and SciPy (not re-implemented).

``accuracy``; ``f1`` (binary, positive class 1: MRPC, QQP; macro for tasks of more than 2 labels); ``mcc`` Matthews correlation (CoLA);
``pearson`` / ``spearman`` correlations (STS-B). Each takes predictions and references (1-D arrays:
class ids, or floats for the correlations) and returns a float (NaN for a correlation that is undefined:
fewer than 2 examples or a constant side).
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np


def accuracy(pred, ref) -> float:
    from sklearn.metrics import accuracy_score
    return float(accuracy_score(ref, pred))


def f1(pred, ref, num_labels: Optional[int] = None) -> float:
    """Binary F1 of class 1 for a 2-label task; for more labels, macro F1 over the classes present in
    ``ref`` or ``pred`` (sklearn's and ``evaluate``'s convention: a class in neither is not scored, so
    perfect predictions give 1.0). The averaging follows the *task* (``num_labels``), not the labels an
    evaluation file happens to hold. ``num_labels`` None: 2 unless ``ref``/``pred`` hold more classes."""
    from sklearn.metrics import f1_score
    if num_labels is None:
        num_labels = max(2, int(max(np.max(ref, initial=0), np.max(pred, initial=0))) + 1)
    if num_labels <= 2:
        return float(f1_score(ref, pred, average="binary", pos_label=1, labels=[0, 1], zero_division=0))
    return float(f1_score(ref, pred, average="macro", zero_division=0))


def mcc(pred, ref) -> float:
    from sklearn.metrics import matthews_corrcoef
    return float(matthews_corrcoef(ref, pred))


def _correlation(fn, pred, ref) -> float:
    """``fn`` (scipy.stats pearsonr / spearmanr) of two 1-D arrays; NaN (printed as JSON null) where it is
    undefined — fewer than 2 pairs, or a constant side — without SciPy's warning or error."""
    x, y = np.asarray(pred, dtype=float), np.asarray(ref, dtype=float)
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")
    return float(fn(x, y)[0])


def pearson(pred, ref) -> float:
    from scipy.stats import pearsonr
    return _correlation(pearsonr, pred, ref)


def spearman(pred, ref) -> float:
    from scipy.stats import spearmanr
    return _correlation(spearmanr, pred, ref)


METRICS: dict[str, Callable] = {"accuracy": accuracy, "f1": f1, "mcc": mcc, "pearson": pearson,
                                "spearman": spearman}


def compute(names, pred, ref, num_labels: Optional[int] = None) -> dict:
    """``{name: value}`` for the metric ``names``; ``num_labels`` (the task's) fixes F1's averaging."""
    return {n: (f1(pred, ref, num_labels) if n == "f1" else METRICS[n](pred, ref)) for n in names}
