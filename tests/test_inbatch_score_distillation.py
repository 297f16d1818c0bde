"""In-batch listwise score distillation (``distill --method inbatch_kl``; Lin et al. 2021, TCT-ColBERT §3).

Truths: the loss equals KL(softmax(20·cos_T) ‖ softmax(20·cos_S)) computed here in numpy over every query × every
passage of the batch (positives, then negatives), plus (1 − α)·CE on the gold column; trained across vocabularies
(an MPNet teacher, a BERT student dir) the student's in-batch score distributions move toward the teacher's (mean
KL over fixed groups after < 0.7 × before); raw text (--stage general) and a cross-encoder teacher are one line,
exit 2.
"""
import json

import numpy as np
import torch

from helpers import cli_error_line
from test_cross_vocabulary_distill import _embed, _setup

from bertforge.cli import main


def _np_inbatch_kl(e_s, e_t, alpha=1.0, t=1.0):
    def scores(e):
        e = e / np.linalg.norm(e, axis=-1, keepdims=True)
        q = e[:, 0]
        docs = np.concatenate([e[:, c] for c in range(1, e.shape[1])])  # column-major: positives, then negatives
        return 20.0 * q @ docs.T / t

    def log_softmax(x):
        x = x - x.max(1, keepdims=True)
        return x - np.log(np.exp(x).sum(1, keepdims=True))
    ls, lt = log_softmax(scores(e_s)), log_softmax(scores(e_t))
    kl = (np.exp(lt) * (lt - ls)).sum(1).mean()
    ce = -np.mean([log_softmax(scores(e_s) * t)[i, i] for i in range(e_s.shape[0])])
    return alpha * t * t * kl + (1 - alpha) * ce


def test_inbatch_kl_equals_the_hand_computed_loss():
    from bertforge.distillation.losses import get_loss
    fn = get_loss("inbatch_kl").fn
    g = np.random.default_rng(0)
    e_s, e_t = g.normal(size=(5, 3, 8)), g.normal(size=(5, 3, 12))  # widths differ: scores are compared
    for alpha, t in ((1.0, 1.0), (0.3, 2.0)):
        got = float(fn(torch.tensor(e_s), torch.tensor(e_t), sim="cos", temperature=t, alpha=alpha))
        assert abs(got - _np_inbatch_kl(e_s, e_t, alpha, t)) < 1e-4 * max(1.0, abs(got)), (alpha, t, got)
    # equal score matrices: zero KL
    assert float(fn(torch.tensor(e_t), torch.tensor(e_t), sim="cos")) < 1e-6


def _group_kl(model_dir, teacher_dir, rows, size=16):
    """Mean KL(teacher ‖ model) of each query's distribution over its group's positives (fixed groups)."""
    out = []
    for i in range(0, len(rows) - size + 1, size):
        g = rows[i:i + size]
        def cols(d):
            return np.stack([_embed(d, [r[k] for r in g]) for k in ("query", "positive")], axis=1)
        out.append(_np_inbatch_kl(cols(model_dir), cols(teacher_dir)))
    return float(np.mean(out))


def test_inbatch_kl_moves_the_students_score_distributions_to_the_teachers(tmp_path, capsys):
    teacher, student, train, rows = _setup(tmp_path)
    pairs = tmp_path / "qp.jsonl"  # (query, positive) rows: the other rows' positives are the negatives
    pairs.write_text("".join(json.dumps({"query": r["query"], "positive": r["positive"]}) + "\n" for r in rows),
                     encoding="utf-8")
    before = _group_kl(student, teacher, rows)
    out = tmp_path / "kl"
    rc = main(["distill", "--teacher", str(teacher), "--student", str(student), "--method", "inbatch_kl",
               "--task", "retrieval", "--train", str(pairs), "--out", str(out), "--epochs", "24", "--batch-size",
               "16", "--lr", "3e-3", "--max-seq-len", "32", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    assert (out / "modules.json").is_file()
    after = _group_kl(out, teacher, rows)
    assert after < 0.7 * before, (before, after)
    # rows with a negative: C = 3 columns per row, cached per row (the second run reads the teacher cache)
    for run in ("kl3", "kl3b"):
        rc = main(["distill", "--teacher", str(teacher), "--student", str(student), "--method", "inbatch_kl",
                   "--task", "retrieval", "--train", str(train), "--out", str(tmp_path / run), "--epochs", "2",
                   "--batch-size", "16", "--max-seq-len", "32", "--no-progress", "--cache-dir",
                   str(tmp_path / "cache"), "--alpha", "0.5", "--temperature", "2"])
        assert rc == 0, capsys.readouterr().err
    recipe = (tmp_path / "kl3" / "recipe.yaml").read_text()
    assert "alpha: 0.5" in recipe and "temperature: 2.0" in recipe, recipe
    meta = json.loads((tmp_path / "cache" / "meta.json").read_text())
    assert list(meta["shapes"].values()) == [[3, 32]]
    a, b = (_embed(tmp_path / run, [r["query"] for r in rows]) for run in ("kl3", "kl3b"))
    assert np.abs(a - b).max() < 1e-4  # the cached teacher embeddings teach what the teacher does


def test_inbatch_kl_on_raw_text_is_one_line_exit_2(tmp_path, capsys):
    teacher, student, _, _ = _setup(tmp_path)
    corpus = tmp_path / "c.txt"
    corpus.write_text("one two three\n", encoding="utf-8")
    line = cli_error_line(["distill", "--teacher", teacher, "--student", student, "--method", "inbatch_kl",
                           "--stage", "general", "--corpus", corpus, "--out", tmp_path / "x"], capsys,
                          tmp_path / "x")
    assert "--method inbatch_kl" in line and "--task retrieval" in line


def test_inbatch_kl_from_a_cross_encoder_is_one_line_exit_2(tmp_path, capsys):
    """A cross-encoder (a one-logit sequence classifier) scores pairs and gives no embeddings to score a batch."""
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    from bertforge.tokenizer import load_tokenizer
    _, student, train, _ = _setup(tmp_path)
    tok = load_tokenizer(student)
    cfg = ModelConfig(model_type="bert", vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=1,
                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=64, num_labels=1)
    TaskModel(cfg, head="sequence_classification").save_pretrained(tmp_path / "cross", tokenizer=tok)
    line = cli_error_line(["distill", "--teacher", tmp_path / "cross", "--student", "layers:0", "--method",
                           "inbatch_kl", "--task", "retrieval", "--train", train, "--out", tmp_path / "y"], capsys,
                          tmp_path / "y")
    assert "cross-encoder" in line and "margin_mse" in line
