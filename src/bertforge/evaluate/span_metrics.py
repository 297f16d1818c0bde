"""Span metrics: SQuAD exact match / F1 (official normalisation) and entity-level NER P/R/F1 (seqeval).

* SQuAD: the official evaluation scripts (``evaluate-v1.1.py``, ``evaluate-v2.0.py``; Rajpurkar et al.
  2016 §6, 2018): answers are normalised by lower-casing, removing punctuation, removing the
  articles a/an/the and collapsing whitespace; EM = normalised strings equal; F1 = harmonic mean of
  bag-of-tokens precision and recall; each question takes the max over its gold answers; results are
  percentages. v2.0: a question without gold answers has gold ``[""]`` and scores 1 only for the empty
  prediction; ``HasAns_*`` / ``NoAns_*`` break the totals down.
* NER: entity-level precision / recall / F1 over chunks, as ``conlleval`` (Tjong Kim Sang & De
  Meulder 2003), computed with ``seqeval``; ``accuracy`` is per word.
"""
from __future__ import annotations

import collections
import re
import string

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """Lower text, remove punctuation, articles and extra whitespace (official SQuAD script)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def get_tokens(s: str) -> list:
    return normalize_answer(s).split() if s else []


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """Token-overlap F1 in [0, 1]; when either side is empty it is 1 iff both are (v2.0 rule)."""
    p, g = get_tokens(prediction), get_tokens(gold)
    if not p or not g:
        return float(p == g)
    common = collections.Counter(p) & collections.Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: dict, golds: dict) -> dict:
    """``predictions``: id → text; ``golds``: id → list of gold texts (empty list = unanswerable).

    Returns ``{"exact_match", "f1", "n"}`` in percent, plus ``HasAns_*``/``NoAns_*`` when the gold
    set has unanswerable questions. A question missing from ``predictions`` scores 0.
    """
    em_s, f1_s, has = [], [], []
    for qid, gl in golds.items():
        gl = [g for g in gl if normalize_answer(g)] or [""]
        pred = predictions.get(qid)
        if pred is None:
            em_s.append(0.0)
            f1_s.append(0.0)
        else:
            em_s.append(max(exact_match(pred, g) for g in gl))
            f1_s.append(max(f1(pred, g) for g in gl))
        has.append(gl != [""])
    n = len(em_s)
    out = {"exact_match": 100.0 * sum(em_s) / max(1, n), "f1": 100.0 * sum(f1_s) / max(1, n), "n": n}
    if not all(has):
        for name, sel in (("HasAns", True), ("NoAns", False)):
            idx = [i for i, h in enumerate(has) if h == sel]
            if idx:
                out[f"{name}_exact"] = 100.0 * sum(em_s[i] for i in idx) / len(idx)
                out[f"{name}_f1"] = 100.0 * sum(f1_s[i] for i in idx) / len(idx)
                out[f"{name}_total"] = len(idx)
    return out


def entity_scores(gold_tags: list, pred_tags: list) -> dict:
    """Entity-level ``precision``/``recall``/``f1`` (conlleval chunking, seqeval) and per-word
    ``accuracy``. Inputs: lists of sentences of IOB2 tag strings (same lengths). A score with an empty
    denominator (no predicted or no gold entity) is 0, as in conlleval, without seqeval's warning."""
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score
    return {"f1": float(f1_score(gold_tags, pred_tags, zero_division=0)),
            "precision": float(precision_score(gold_tags, pred_tags, zero_division=0)),
            "recall": float(recall_score(gold_tags, pred_tags, zero_division=0)),
            "accuracy": float(accuracy_score(gold_tags, pred_tags))}
