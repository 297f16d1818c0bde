"""A student with another vocabulary than its teacher (an MPNet teacher, a BERT student initialised from its own
checkpoint, as all-MiniLM-L6-v2 from all-mpnet-base-v2): pooled sentence-embedding losses work — each side reads
its own tokens of the same text, the student keeps its tokenizer — and token-level methods are refused in one line.

Truths: the student's embeddings (its own tokenizer) move toward the teacher's (its own tokenizer): mean squared
distance after training < 0.7 × before (embedding_mse); the score-margin error shrinks likewise (margin_mse).
"""
import json
import random

from helpers import WORDS, cli_error_line, make_tiny_checkpoint
from helpers_mpnet import make_tiny_mpnet

from bertforge.cli import main


def _pairs(n, seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        key = rng.sample(WORDS, 3)
        pos = key + [rng.choice(WORDS) for _ in range(6)]
        rng.shuffle(pos)
        rows.append({"query": " ".join(key), "positive": " ".join(pos)})
    for i, r in enumerate(rows):
        r["negative"] = rows[(i + 7) % n]["positive"]
    return rows


def _setup(tmp_path):
    from bertforge.models.pooling import Pooling
    teacher = make_tiny_mpnet(tmp_path / "mpnet", pooling=Pooling("mean", False, 32), num_hidden_layers=2)
    student = make_tiny_checkpoint(tmp_path / "bert", vocab=90, seed=4)  # another WordPiece vocabulary
    rows = _pairs(96, 1)
    train = tmp_path / "pairs.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return teacher, student, train, rows


def _embed(model_dir, texts):
    from bertforge.checkpoint import load_pretrained
    from bertforge.tasks.retrieval import embed_texts
    from bertforge.tokenizer import load_tokenizer
    # eval mode: no dropout, so the figures compared are the model's, not a draw of its dropout masks
    return embed_texts(load_pretrained(model_dir, head="base").eval(), load_tokenizer(model_dir), texts, 32)


def test_embedding_and_margin_distillation_across_vocabularies(tmp_path, capsys):
    from bertforge.tokenizer import load_tokenizer
    teacher, student, train, rows = _setup(tmp_path)
    assert load_tokenizer(teacher).get_vocab() != load_tokenizer(student).get_vocab()
    texts = [r[k] for r in rows for k in ("query", "positive")]
    e_t = _embed(teacher, texts)
    before = float(((_embed(student, texts) - e_t) ** 2).sum(1).mean())
    out = tmp_path / "emb"
    rc = main(["distill", "--teacher", str(teacher), "--student", str(student), "--method", "embedding_mse",
               "--task", "retrieval", "--train", str(train), "--out", str(out), "--epochs", "4", "--batch-size",
               "16", "--lr", "3e-3", "--max-seq-len", "32", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    assert load_tokenizer(out).get_vocab() == load_tokenizer(student).get_vocab()  # it keeps its tokenizer
    after = float(((_embed(out, texts) - e_t) ** 2).sum(1).mean())
    assert after < 0.7 * before, (before, after)

    def margins(d):
        e = [_embed(d, [r[k] for r in rows]) for k in ("query", "positive", "negative")]
        return (e[0] * e[1]).sum(1) - (e[0] * e[2]).sum(1)
    t = margins(teacher)
    out = tmp_path / "mm"
    rc = main(["distill", "--teacher", str(teacher), "--student", str(student), "--method", "margin_mse",
               "--task", "retrieval", "--train", str(train), "--out", str(out), "--epochs", "4", "--batch-size",
               "16", "--lr", "2e-3", "--max-seq-len", "32", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    err_before = float(((margins(student) - t) ** 2).mean())
    err_after = float(((margins(out) - t) ** 2).mean())
    assert err_after < 0.7 * err_before, (err_before, err_after)


def test_token_level_methods_across_vocabularies_are_one_line_exit_2(tmp_path, capsys):
    teacher, student, train, _ = _setup(tmp_path)
    corpus = tmp_path / "c.txt"
    corpus.write_text(" ".join(WORDS) + "\n", encoding="utf-8")
    for method in ("tinybert", "minilm"):
        line = cli_error_line(["distill", "--teacher", teacher, "--student", student, "--method", method,
                               "--stage", "general", "--corpus", corpus, "--out", tmp_path / method], capsys, teacher)
        assert f"--method {method}" in line and "different vocabulary" in line and "embedding_mse" in line


def test_the_teacher_mines_the_hard_negatives_of_margin_mse(tmp_path):
    """distill.mine_negatives=K: each query's K negatives are the passages the teacher ranks highest after its own
    positive — checked against a ranking computed here from the teacher's mean-pooled, normalised states."""
    import numpy as np
    import torch
    from bertforge.checkpoint import load_pretrained
    from bertforge.models.pooling import Pooling
    from bertforge.pipelines.distill_data import _teacher_negatives
    from bertforge.tasks.retrieval import PairExample
    from bertforge.tokenizer import load_tokenizer
    teacher, _, _, rows = _setup(tmp_path)
    pairs = [PairExample(r["query"], r["positive"]) for r in rows[:40]]
    got = _teacher_negatives(pairs, teacher, load_tokenizer(teacher), 32, Pooling("mean", True), 2)
    tok, model = load_tokenizer(teacher), load_pretrained(teacher, head="base")

    def emb(text):
        ids = torch.tensor([tok.encode(text).ids[:32]])
        with torch.no_grad():
            v = model(ids, torch.ones_like(ids)).last_hidden_state[0].mean(0).numpy()
        return v / np.linalg.norm(v)
    docs = list(dict.fromkeys(p.positive for p in pairs))
    d = np.stack([emb(t) for t in docs])
    for p, g in zip(pairs[:10], got[:10]):
        order = [docs[j] for j in np.argsort(-(d @ emb(p.query))) if docs[j] != p.positive]
        assert list(g.negatives) == order[:2] and g.positive == p.positive
