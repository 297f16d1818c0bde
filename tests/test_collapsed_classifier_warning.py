"""A classifier that answers one class whatever the input says so (issue #27: every small-data GLUE run
predicted a single class, MRPC F1 = the all-positive baseline, CoLA MCC 0, and nothing said so): the task
layer adds ``collapsed`` and ``majority_baseline`` to its metrics, ``evaluate`` and ``finetune`` word a
warning, ``metrics.jsonl`` records it.

Independent truth: hand-computed baseline scores, and a model whose classifier is forced to one class
(zero weights, bias +50 on class 1)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from bertforge.cli import main
from bertforge.tasks.classification import collapse_check
from helpers import read_metrics, write_tsv


@pytest.mark.parametrize("metric,expected", [
    ("accuracy", 0.75),            # the majority class (1) is right on 3 of 4
    ("f1", 2 * 0.75 / 1.75),       # class 1 everywhere: precision 3/4, recall 1
    ("mcc", 0.0),                  # a constant prediction has no correlation
])
def test_collapse_check_names_the_majority_baseline(metric, expected):
    ref = np.array([1, 0, 1, 1])
    out = collapse_check(np.array([0, 0, 0, 0]), ref, metric, 2)
    assert out["collapsed"] == 0
    assert out["majority_baseline"] == pytest.approx(expected)


def test_collapse_check_is_quiet_unless_every_prediction_is_one_class():
    assert collapse_check(np.array([0, 1, 1]), np.array([0, 1, 0]), "accuracy", 2) == {}  # two classes predicted
    assert collapse_check(np.array([1, 1, 1]), np.array([1, 1, 1]), "accuracy", 2) == {}  # the data has one class
    assert collapse_check(np.array([1]), np.array([0]), "accuracy", 2) == {}              # one example
    # a tie between classes: the baseline takes the lowest id (0), whose accuracy is 1/2 here
    assert collapse_check(np.array([1, 1]), np.array([0, 1]), "accuracy", 2)["majority_baseline"] == 0.5


def _one_class_model(workspace, dst):
    """The tiny checkpoint with an SST-2 head that always answers class 1."""
    import torch
    from bertforge.checkpoint import load_pretrained
    m = load_pretrained(workspace.tiny, head="sequence_classification", num_labels=2,
                        id2label={0: "0", 1: "1"}, problem_type="single_label_classification")
    with torch.no_grad():
        m.head.classifier.weight.zero_()
        m.head.classifier.bias.copy_(torch.tensor([0.0, 50.0]))
    m.config.bertforge = {**m.config.bertforge, "task": "sst2", "max_seq_len": 32}
    m.save_pretrained(dst, tokenizer_dir=workspace.tiny)
    return dst


def _dev(path):
    """7 rows: 5 of class 0, 2 of class 1 → the majority class is 0, accuracy 5/7."""
    rows = [("good film", 1), ("bad plot", 0), ("dull story", 0), ("awful music", 0), ("great actor", 1),
            ("sad scene", 0), ("long movie", 0)]
    return write_tsv(path, rows)


def test_evaluate_warns_with_the_majority_baseline(workspace, tmp_path, capsys):
    model = _one_class_model(workspace, tmp_path / "one-class")
    dev = _dev(tmp_path / "dev.tsv")
    capsys.readouterr()
    assert main(["evaluate", "--model", str(model), "--data", str(dev)]) == 0
    cap = capsys.readouterr()
    res = json.loads(cap.out.strip().splitlines()[-1])
    assert res["accuracy"] == pytest.approx(2 / 7)
    assert res["collapsed"] == 1 and res["majority_baseline"] == pytest.approx(5 / 7)
    warn = [ln for ln in cap.err.splitlines() if "warning" in ln]
    assert len(warn) == 1, cap.err
    assert warn[0].startswith("bertforge evaluate: warning: every evaluation prediction is class 1;")
    assert "majority-class baseline scores accuracy 0.7143" in warn[0], warn[0]


def test_finetune_warns_once_and_metrics_jsonl_records_it(workspace, tmp_path, capsys):
    model = _one_class_model(workspace, tmp_path / "one-class")
    dev = _dev(tmp_path / "dev.tsv")
    capsys.readouterr()
    assert main(["finetune", "--model", str(model), "--task", "sst2", "--train", str(workspace.train),
                 "--eval", str(dev), "--out", str(tmp_path / "run"), "--max-steps", "2", "--batch-size", "8",
                 "--lr", "1e-9", "--max-seq-len", "32", "--no-progress", "train.eval_every=1"]) == 0
    cap = capsys.readouterr()
    warn = [ln for ln in cap.err.splitlines() if "warning: every evaluation prediction" in ln]
    assert warn == [warn[0]] and warn[0].startswith("bertforge finetune: warning: every evaluation prediction at "
                                                    "step 1 is class 1;"), cap.err  # once: it stayed collapsed
    evals = [r["eval"] for r in read_metrics(tmp_path / "run") if "eval" in r]
    assert len(evals) == 2
    assert all(e["collapsed"] == 1 and e["majority_baseline"] == pytest.approx(5 / 7) for e in evals)
    assert json.loads(cap.out.strip().splitlines()[-1])["collapsed"] == 1
