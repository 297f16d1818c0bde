"""Multi-label sequence classification: each text carries any subset of C labels (GoEmotions, moderation).

* tasks: ``goemotions`` (Demszky et al. 2020, "GoEmotions: A Dataset of Fine-Grained Emotions": 27 emotions +
  neutral; files ``text<TAB>label_ids<TAB>id``, no header, label ids comma-separated) and the ``custom``
  multi-label task (``data.multi_label=true``, see :func:`bertforge.tasks.get_task`).
* reader: :func:`bertforge.data.readers.read_examples`; a label field is a list: ``"3,12"`` (ids or names,
  comma-separated), a JSON list (``[3, 12]`` / ``["anger", "fear"]``, also as a JSONL value). A label outside
  the set, a label repeated in one row, an empty field (unless ``data.allow_empty_labels=true``) are errors
  naming ``file:line``.
* head: :class:`~bertforge.tasks.classification.SequenceClassificationHead` with ``problem_type =
  multi_label_classification``: one logit per label, BCE-with-logits (optional ``pos_weight`` from label
  frequencies and focal loss, Lin et al. 2017 eq. 5) — the model ``transformers``'
  ``AutoModelForSequenceClassification`` builds from the same ``config.json``.
* thresholds: a label is predicted when ``sigmoid(logit) ≥ threshold``. :func:`tune_thresholds` picks one
  global threshold and one per label maximising F1 on the eval set; ``finetune`` / ``distill`` save them in
  ``config.json`` (``bertforge.thresholds``), which ``export`` / ``quantize`` copy, so ``evaluate``,
  ``predict`` and every runner of the dir use them.
* metrics: micro / macro F1, per-label precision / recall / F1, macro average precision (threshold-free),
  exact match (:func:`multilabel_metrics`), with the constant predictor's macro-F1 beside them.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..data.collate import PadCollator
from ..errors import ConfigError, DataError
from ..tokenizer import pad_id
from .base import Task
from .classification import SequenceAdapter

KIND = "multi_label_classification"

#: GoEmotions' 28 labels in id order (Demszky et al. 2020, Table 1; the dataset's ``emotions.txt``)
GOEMOTIONS_LABELS = ("admiration", "amusement", "anger", "annoyance", "approval", "caring", "confusion",
                     "curiosity", "desire", "disappointment", "disapproval", "disgust", "embarrassment",
                     "excitement", "fear", "gratitude", "grief", "joy", "love", "nervousness", "optimism",
                     "pride", "realization", "relief", "remorse", "sadness", "surprise", "neutral")

#: metrics of a multi-label task; the first picks the best checkpoint
METRICS = ("macro_f1", "micro_f1", "exact_match", "macro_ap")

#: the GoEmotions defaults are its benchmark's recipe (docs/multilabel.md, benchmarks/bench_goemotions.py): lr 8e-5
#: and BCE pos_weight sqrt (with MiniLM's declared mean pooling); the transformers-like defaults (lr 5e-5, no
#: weighting, the [CLS] pooler) score macro-F1 0.096 where the recipe scores 0.415 (issue 39)
TASKS = [
    Task("goemotions", (0,), 1, GOEMOTIONS_LABELS, METRICS, kind=KIND, header=False, id_column=2,
         splits={"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"},
         train_defaults={"train.lr": 8e-5, "train.pos_weight": "sqrt"}),
]


# ------------------------------------------------------------------------------------------ labels file
def read_labels_file(path) -> list:
    """Label names, one per line (blank lines skipped; ``#`` lines are comments), as ``labels.txt`` of GoEmotions.
    Raises DataError (``file:line``) for a missing/empty file or a name given twice."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p} does not exist; pass the labels file (one label name per line)")
    names, seen = [], {}
    for i, line in enumerate(p.read_text(encoding="utf-8-sig").splitlines(), 1):
        name = line.strip()
        if not name or name.startswith("#"):
            continue
        if name in seen:
            raise DataError(f"{p}:{i} repeats label {name!r} (first at line {seen[name]}); give each label once")
        seen[name] = i
        names.append(name)
    if not names:
        raise DataError(f"{p} names no labels; write one label name per line")
    return names


def check_labels_file(path, labels) -> None:
    """DataError ``file:line`` where the labels file ``path`` disagrees with ``labels`` (a model's ``id2label``
    or a task's label list, in id order): another name at an id, or another count."""
    p = Path(path)
    got = read_labels_file(p)
    lines = [i for i, ln in enumerate(p.read_text(encoding="utf-8-sig").splitlines(), 1)
             if ln.strip() and not ln.strip().startswith("#")]
    want = [str(x) for x in labels]
    for k, (a, b) in enumerate(zip(got, want)):
        if a != b:
            raise DataError(f"{p}:{lines[k]} names label {k} {a!r} but the model has {b!r}; pass the labels "
                            f"file the model was trained with")
    if len(got) != len(want):
        where = f"{p}:{lines[-1]}" if got else str(p)
        raise DataError(f"{where} lists {len(got)} labels but the model has {len(want)}; pass the labels file "
                        f"the model was trained with")


# ------------------------------------------------------------------------------------------ metrics
def _prf(pred: np.ndarray, y: np.ndarray):
    """Per-label true positives, predicted positives, actual positives of boolean (N, C) arrays."""
    tp = (pred & y).sum(0).astype(np.float64)
    return tp, pred.sum(0).astype(np.float64), y.sum(0).astype(np.float64)


def _f1(tp, pp, ap):
    den = pp + ap
    return np.where(den > 0, 2 * tp / np.maximum(den, 1), 0.0)


def macro_f1_rule(y: np.ndarray) -> str:
    """The averaging rule behind ``macro_f1``, in words, for reports: every one of the C labels of ``y`` (N, C)
    counts, and a label with no positive in ``y`` scores F1 = 0 whatever was predicted (sklearn's
    ``f1_score(average="macro", zero_division=0)``), so a set where few labels occur scores lower than the mean
    over the labels present. Source: Demszky et al. 2020 (GoEmotions, §5) report macro-F1 over all 28 labels."""
    y = np.asarray(y) > 0.5
    absent = int((y.sum(0) == 0).sum())
    return (f"mean F1 over all {y.shape[1]} labels, zero_division=0 "
            f"({absent} label{'s' if absent != 1 else ''} without a positive here: F1 0)")


def multilabel_metrics(probs: np.ndarray, y: np.ndarray, thresholds, labels=None) -> dict:
    """Scores of ``probs`` (N, C) in [0, 1] against 0/1 references ``y`` (N, C) with per-label ``thresholds``
    (C,) or one float (predicted iff ``prob ≥ threshold``):

    ``macro_f1`` (mean over labels of each label's F1; a label never predicted and never true scores 0, as
    sklearn's ``zero_division=0``), ``micro_f1`` (F1 of the pooled counts), ``exact_match`` (rows whose
    predicted set is the true set), ``macro_ap`` (mean over labels with a positive of sklearn's
    ``average_precision_score``: threshold-free), ``constant_macro_f1`` (the best constant predictor: every
    label predicted for every row, F1 = 2p/(1+p) per label of prevalence p — what a collapsed model reaches
    with tuned thresholds), ``per_label`` {name: {precision, recall, f1, support}}."""
    from sklearn.metrics import average_precision_score
    probs, y = np.asarray(probs, dtype=np.float64), np.asarray(y) > 0.5
    th = np.broadcast_to(np.asarray(thresholds, dtype=np.float64), (probs.shape[1],))
    pred = probs >= th
    tp, pp, ap = _prf(pred, y)
    f1 = _f1(tp, pp, ap)
    mtp, mpp, map_ = tp.sum(), pp.sum(), ap.sum()
    has = ap > 0
    aps = [average_precision_score(y[:, j], probs[:, j]) for j in np.flatnonzero(has)]
    prev = ap / max(len(y), 1)
    names = [str(x) for x in labels] if labels is not None else [str(j) for j in range(probs.shape[1])]
    return {
        "macro_f1": float(f1.mean()),
        "micro_f1": float(2 * mtp / (mpp + map_)) if mpp + map_ else 0.0,
        "exact_match": float((pred == y).all(1).mean()),
        "macro_ap": float(np.mean(aps)) if aps else float("nan"),
        "constant_macro_f1": float((2 * prev / (1 + prev)).mean()),
        "per_label": {n: {"precision": round(float(tp[j] / pp[j]) if pp[j] else 0.0, 4),
                          "recall": round(float(tp[j] / ap[j]) if ap[j] else 0.0, 4),
                          "f1": round(float(f1[j]), 4), "support": int(ap[j])} for j, n in enumerate(names)},
    }


def best_label_threshold(scores: np.ndarray, y: np.ndarray, default: float = 0.5) -> float:
    """The threshold maximising one label's F1 on ``scores`` (N,) with 0/1 references ``y`` (N,).

    Every cut between two consecutive distinct scores is tried (predict the k highest-scoring rows); the
    threshold returned is the midpoint between the lowest score predicted positive and the next lower score
    (when every row is predicted: half the lowest score). Ties in F1 go to the higher threshold (fewer
    positives). A label without a positive in ``y`` gets ``default``."""
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(y) > 0.5
    if not y.any():
        return float(default)
    order = np.argsort(-s, kind="stable")
    ss, yy = s[order], y[order]
    tp = np.cumsum(yy)
    k = np.arange(1, len(ss) + 1)
    last = np.r_[ss[1:] != ss[:-1], True]  # a cut is only possible after the last of equal scores
    f1 = np.where(last, 2 * tp / (k + y.sum()), -1.0)
    i = int(np.argmax(f1))  # first (highest threshold) of the best
    if i + 1 == len(ss):  # every row predicted
        return float(ss[i] / 2)
    return float((ss[i] + ss[i + 1]) / 2)


def tune_thresholds(probs: np.ndarray, y: np.ndarray, grid: Optional[np.ndarray] = None) -> dict:
    """Thresholds maximising F1 on ``probs`` (N, C) against ``y`` (N, C):

    ``per_label``: one per label (:func:`best_label_threshold`; a label without a positive keeps the global
    one); ``global``: the one threshold for every label maximising macro-F1 over ``grid`` (default
    0.01, 0.02, …, 0.99; ties to the higher). Returns ``{"global": g, "per_label": [t_0 … t_{C-1}]}``."""
    probs, y = np.asarray(probs, dtype=np.float64), np.asarray(y) > 0.5
    grid = np.round(np.arange(0.01, 1.0, 0.01), 2) if grid is None else np.asarray(grid, dtype=np.float64)
    best_g, best = 0.5, -1.0
    for g in grid:
        tp, pp, ap = _prf(probs >= g, y)
        m = float(_f1(tp, pp, ap).mean())
        if m >= best:
            best_g, best = float(g), m
    per = [best_label_threshold(probs[:, j], y[:, j], default=best_g) for j in range(probs.shape[1])]
    return {"global": best_g, "per_label": per}


def resolve_thresholds(spec, labels, base: Optional[dict] = None) -> dict:
    """Hand-set thresholds (``data.thresholds`` / ``--threshold``) → the saved form
    ``{"use": "global"|"per_label", "global": g, "per_label": [...]}``: a float (every label), a list (one per
    label, in id order) or a mapping label name → threshold (labels left out keep ``base``'s thresholds —
    the dir's saved ones for ``--threshold`` — or 0.5 without it). Raises ConfigError for a value that is
    not a number in (0, 1), text that is not valid JSON, a list of the wrong length or an unknown label name."""
    names = [str(x) for x in labels]

    def check(v, what):
        shown = f"{what}={v!r}" if what else repr(v)
        try:
            if isinstance(v, bool):
                raise TypeError
            f = float(v)
        except (TypeError, ValueError):
            raise ConfigError(f"threshold {shown} is not a number; give a probability in (0, 1)") from None
        if not 0.0 < f < 1.0:
            raise ConfigError(f"threshold {shown} is outside (0, 1); give a probability")
        return f
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError:
            if spec.strip()[:1] in ("[", "{"):
                raise ConfigError(f"thresholds {spec!r} is not valid JSON; give a number, a JSON list of "
                                  f"{len(names)} numbers or a JSON object label → number") from None
    if isinstance(spec, dict):
        bad = next((k for k in spec if str(k) not in names), None)
        if bad is not None:
            raise ConfigError(f"thresholds name label {bad!r}, not one of the model's labels ({', '.join(names)})")
        keep = active_thresholds(base, len(names))
        per = [check(spec[n], n) if n in spec else float(keep[j]) for j, n in enumerate(names)]
        return {"use": "per_label", "global": 0.5, "per_label": per, "source": "set"}
    if isinstance(spec, (list, tuple)):
        if len(spec) != len(names):
            raise ConfigError(f"thresholds lists {len(spec)} values but the model has {len(names)} labels; give "
                              f"one per label or a single number")
        per = [check(v, names[j]) for j, v in enumerate(spec)]
        return {"use": "per_label", "global": 0.5, "per_label": per, "source": "set"}
    g = check(spec, "")
    return {"use": "global", "global": g, "per_label": [g] * len(names), "source": "set"}


def apply_hand_thresholds(adapter, data_cfg) -> None:
    """``data.thresholds`` set by hand for a training run (``finetune``, ``distill``): checked before anything
    is trained or written, and used by every evaluation of the run, so the figures it reports are those of
    the thresholds it saves. Raises ConfigError for a bad value (:func:`resolve_thresholds`) or a task that
    is not multi-label."""
    hand = getattr(data_cfg, "thresholds", None)
    if hand is None:
        return
    if not isinstance(adapter, MultiLabelAdapter):
        raise ConfigError(f"data.thresholds applies to multi-label tasks and task {adapter.task.name} is not "
                          f"one; drop it")
    adapter.thresholds = resolve_thresholds(hand, adapter.task.labels)


def active_thresholds(saved: Optional[dict], num_labels: int) -> np.ndarray:
    """The (C,) thresholds a saved ``bertforge.thresholds`` entry says to use (0.5 each without one)."""
    if not saved:
        return np.full(num_labels, 0.5)
    if saved.get("use") == "global":
        return np.full(num_labels, float(saved["global"]))
    return np.asarray(saved["per_label"], dtype=np.float64)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


# ------------------------------------------------------------------------------------------ adapter
class MultiHotCollator(PadCollator):
    """:class:`~bertforge.data.collate.PadCollator` whose ``labels`` are (B, C) float 0/1 rows. An example's
    ``labels`` is a multi-hot list of C floats (:meth:`MultiLabelAdapter.load`) or the tuple of its label
    ids (what the reader gives; ``distill`` encodes examples itself); other keys (``example_index`` …) are
    left to the wrapped collators."""

    def __init__(self, pad_id: int, num_labels: int):
        super().__init__(pad_id)
        self.num_labels = num_labels

    def multi_hot(self, lab) -> list:
        if isinstance(lab, tuple):
            row = [0.0] * self.num_labels
            for j in lab:
                row[j] = 1.0
            return row
        return list(lab)

    def __call__(self, items: list) -> dict:
        labels = [x.get("labels") for x in items]
        batch = super().__call__([{k: v for k, v in x.items() if k != "labels"} for x in items])
        if all(lab is not None for lab in labels):
            batch["labels"] = torch.tensor([self.multi_hot(lab) for lab in labels], dtype=torch.float32)
        return batch


class MultiLabelAdapter(SequenceAdapter):
    """Sentences (pairs) → C independent sigmoids over the sequence head; see the module doc.

    ``thresholds``: the saved entry (``bertforge.thresholds``) in use, None before any is set — then
    :meth:`evaluate` scores at per-label thresholds tuned on the data it is given (what picks the best
    checkpoint while training, and what ``finetune`` saves at the end)."""

    def __init__(self, task: Task, tokenizer, max_seq_len: int):
        super().__init__(task, tokenizer, max_seq_len)
        self.thresholds: Optional[dict] = None
        self.last_tuned: Optional[dict] = None

    def head_config(self) -> dict:
        return {"num_labels": len(self.task.labels), "problem_type": KIND,
                "id2label": {i: lab for i, lab in enumerate(self.task.labels)}}

    def _encode_labels(self, enc: list) -> None:
        """Each encoded example's label ids → a 0/1 row of C (what :class:`MultiHotCollator` batches)."""
        c = len(self.task.labels)
        for d in enc:
            if "labels" in d:
                row = [0.0] * c
                for j in d["labels"]:
                    row[j] = 1.0
                d["labels"] = row

    def collator(self):
        return MultiHotCollator(pad_id(self.tok), len(self.task.labels))

    def use_model_thresholds(self, model_dir) -> None:
        """Take the thresholds saved in ``model_dir``'s ``config.json`` (none saved: 0.5 for every label)."""
        from ..checkpoint.modeldir import ModelDir
        self.thresholds = ModelDir.open(model_dir).meta.thresholds or {"use": "global", "global": 0.5,
                                                      "per_label": [0.5] * len(self.task.labels),
                                                      "source": "default"}

    def label_frequencies(self, dataset) -> np.ndarray:
        """(C,) fraction of rows of a loaded ``dataset`` carrying each label."""
        y = np.array([d["labels"] for d in dataset], dtype=np.float64)
        return y.mean(0)

    def configure_loss(self, model, dataset, pos_weight: Optional[str] = None, focal_gamma: float = 0.0) -> dict:
        """Set the head's BCE options on ``model`` and return them (recorded in ``config.json``):
        ``pos_weight`` ``none`` | ``frequency`` (w_c = n_neg/n_pos of label c on ``dataset``, as
        ``torch.nn.BCEWithLogitsLoss``'s doc suggests) | ``sqrt`` (its square root: milder for rare labels),
        clipped to [1, 100]; ``focal_gamma`` γ ≥ 0 of the focal loss (Lin et al. 2017 eq. 5; 0 = plain BCE)."""
        kinds = (None, "none", "frequency", "sqrt")
        if pos_weight not in kinds:
            raise ConfigError(f"train.pos_weight={pos_weight!r}; choose none, frequency or sqrt")
        if focal_gamma is None or float(focal_gamma) < 0:
            raise ConfigError(f"train.focal_gamma={focal_gamma!r} must be ≥ 0 (0 = plain BCE)")
        w = None
        if pos_weight in ("frequency", "sqrt"):
            p = np.clip(self.label_frequencies(dataset), 1e-6, 1.0)
            w = (1.0 - p) / p
            w = np.clip(np.sqrt(w) if pos_weight == "sqrt" else w, 1.0, 100.0)
        model.head.set_loss(None if w is None else torch.tensor(w, dtype=torch.float32), float(focal_gamma))
        return {"pos_weight": pos_weight or "none", "focal_gamma": float(focal_gamma)}

    def probabilities(self, model, dataset, batch_size=64) -> np.ndarray:
        """(N, C) sigmoid probabilities of ``model`` (module or runner) on ``dataset``."""
        return sigmoid(self.run(model, dataset, batch_size))

    def decode(self, outputs, encoded=None, raw: bool = False) -> list:
        """Per example (``outputs``: (N, C) logits), every label ranked by its sigmoid probability, highest
        first (ties in label order): ``[{"label", "score", "predicted"}, …]`` — ``score`` the probability
        (``raw``: the logit), ``predicted`` whether the probability reaches the label's threshold (those in
        use, :func:`active_thresholds`)."""
        names = self.label_names
        th = active_thresholds(self.thresholds, len(names))
        out = []
        for z in outputs:
            z = np.asarray(z, dtype=np.float64)
            p = sigmoid(z)
            s = z if raw else p
            out.append([{"label": names[i], "score": float(s[i]), "predicted": bool(p[i] >= th[i])}
                        for i in np.argsort(-p, kind="stable")])
        return out

    def _probs(self, predictions: list) -> np.ndarray:
        """(N, C) probabilities in label order, back from :meth:`decode`'s ranked lists (``raw`` False)."""
        ids = {n: i for i, n in enumerate(self.label_names)}
        probs = np.zeros((len(predictions), len(ids)))
        for r, ranked in enumerate(predictions):
            for x in ranked:
                probs[r, ids[x["label"]]] = x["score"]
        return probs

    def score(self, predictions, gold) -> dict:
        """:func:`multilabel_metrics` of ``predictions`` (:meth:`decode`'s) against ``gold`` (0/1 rows of C) at
        the thresholds in use (``thresholds``: ``per_label``/``global``/``default``/``tuned``), plus
        ``macro_f1_at_0.5``. Without saved thresholds the per-label ones are tuned on these predictions
        themselves (``thresholds: "tuned"``: optimistic, as any score tuned on its test set)."""
        probs = self._probs(predictions)
        y = np.array(gold)
        if self.thresholds is None:
            tuned = tune_thresholds(probs, y)
            self.last_tuned = tuned  # what save_thresholds takes when this evaluation's model is the final one
            th, how = np.asarray(tuned["per_label"]), "tuned"
        else:
            th = active_thresholds(self.thresholds, probs.shape[1])
            how = self.thresholds.get("use", "per_label")
        out = multilabel_metrics(probs, y, th, self.task.labels)
        out["macro_f1_at_0.5"] = multilabel_metrics(probs, y, 0.5)["macro_f1"]
        out["thresholds"] = how
        out["macro_f1_rule"] = macro_f1_rule(y)
        per = out.pop("per_label")
        out["per_label"] = per  # last: the long part
        return out

    def tuned(self, model, dataset, batch_size=64, source: str = "") -> dict:
        """Thresholds tuned on ``dataset`` (:func:`tune_thresholds`) in the saved form, per-label in use."""
        probs = self.probabilities(model, dataset, batch_size)
        y = np.array([d["labels"] for d in dataset])
        t = tune_thresholds(probs, y)
        return {"use": "per_label", "global": t["global"], "per_label": [round(x, 6) for x in t["per_label"]],
                "source": f"tuned on {source}" if source else "tuned"}

    def predictions(self, model, dataset, batch_size=64) -> list:
        """One dict per example: ``id``, ``labels`` (names whose probability ≥ their threshold, in id order)
        and ``scores`` (every label name → its sigmoid probability)."""
        decoded = self.decode(self.run(model, dataset, batch_size), dataset)
        examples = getattr(dataset, "examples", None)
        ids = [e.id for e in examples] if examples is not None else list(range(1, len(dataset) + 1))
        names = self.label_names
        out = []
        for i, ranked, p in zip(ids, decoded, self._probs(decoded)):
            chosen = {x["label"] for x in ranked if x["predicted"]}
            out.append({"id": i, "labels": [n for n in names if n in chosen],
                        "scores": {n: round(float(v), 6) for n, v in zip(names, p)}})
        return out


def save_thresholds(model_dir, adapter: "MultiLabelAdapter", data_cfg, eval_ds=None,
                    result: Optional[dict] = None) -> Optional[dict]:
    """Write the thresholds of the model in ``model_dir`` into its ``config.json`` (``bertforge.thresholds``):
    ``data.thresholds`` when set by hand (:func:`resolve_thresholds`), else tuned on ``eval_ds`` (the
    ``data.eval`` file) with the saved model — those of the training run's last evaluation when ``result``
    (``Trainer.fit``'s) says the saved model is the one it evaluated; nothing without either (0.5 is used).
    Returns what was written."""
    hand = getattr(data_cfg, "thresholds", None)
    source = Path(str(getattr(data_cfg, "eval", "") or "eval")).name
    if hand is not None:
        th = resolve_thresholds(hand, adapter.task.labels)
    elif eval_ds is not None and result and adapter.last_tuned is not None \
            and result.get("model_step") == result.get("eval_step"):
        t = adapter.last_tuned
        th = {"use": "per_label", "global": t["global"], "per_label": [round(x, 6) for x in t["per_label"]],
              "source": f"tuned on {source}"}
    elif eval_ds is not None:
        from ..checkpoint.read import load_pretrained
        model = load_pretrained(model_dir)
        th = adapter.tuned(model, eval_ds, source=source)
    else:
        return None
    write_thresholds(model_dir, th)
    return th


def write_thresholds(model_dir, th: dict) -> None:
    """Set ``bertforge.thresholds`` in ``model_dir/config.json`` (written under a temporary name, renamed)."""
    from ..checkpoint.layout import with_meta
    from ..checkpoint.modeldir import ModelDir
    from ..io import atomic_write_text
    md = ModelDir.open(model_dir)
    atomic_write_text(md.path / "config.json", json.dumps(with_meta(md.config, thresholds=th), indent=2))


__all__ = ["save_thresholds", "write_thresholds", "KIND", "GOEMOTIONS_LABELS", "METRICS", "TASKS", "MultiLabelAdapter", "MultiHotCollator",
           "multilabel_metrics", "tune_thresholds", "best_label_threshold", "resolve_thresholds", "apply_hand_thresholds",
           "active_thresholds", "read_labels_file", "check_labels_file"]
