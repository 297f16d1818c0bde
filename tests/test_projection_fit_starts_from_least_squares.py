"""A sentence-embedding student narrower than its teacher learns through a projection W (H_S → H_T). Before
training, each fresh W is the ridge least-squares fit of the teacher's pooled embeddings from the student's on the
first training texts (LP-FT, Kumar et al. 2022 §3); ``distill.projection_init=orthogonal`` sets the frozen
semi-orthogonal W nearest the teacher (orthogonal Procrustes); ``random`` keeps a drawn W.

Truths: W and b equal numpy's least-squares solution on the same embeddings (computed here from the saved dirs,
with lr 1e-12 so that the one training step moves nothing measurable); the fit's mean squared error is the minimum any linear map reaches, so
it is ≤ the random W's; the orthogonal W is numpy's U Vᵀ of the SVD of E_Tᵀ E_S, has orthonormal columns and
stays fixed while the student trains; a bad value of the key is one line, exit 2.
"""
import json
import random

import numpy as np
import pytest
from helpers import WORDS, cli_error_line, make_tiny_checkpoint

from bertforge.cli import main


def _setup(tmp_path, n=48):
    teacher = make_tiny_checkpoint(tmp_path / "teacher", hidden=32, seed=1)
    student = make_tiny_checkpoint(tmp_path / "student", hidden=16, seed=2)
    rng = random.Random(0)
    rows = [{"query": " ".join(rng.sample(WORDS, 3)), "positive": " ".join(rng.sample(WORDS, 7))} for _ in range(n)]
    train = tmp_path / "pairs.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return teacher, student, train, list(dict.fromkeys(t for r in rows for t in (r["query"], r["positive"])))


def _distill(tmp_path, teacher, student, train, out, *extra):
    return main(["distill", "--teacher", str(teacher), "--student", str(student), "--method", "embedding_mse",
                 "--task", "retrieval", "--train", str(train), "--out", str(out), "--max-steps", "1",
                 "--batch-size", "16", "--lr", "1e-12", "--max-seq-len", "32", "--no-progress", *extra])


def _embed(model_dir, texts):
    from bertforge.checkpoint import load_pretrained
    from bertforge.tasks.retrieval import embed_texts
    from bertforge.tokenizer import load_tokenizer
    return np.asarray(embed_texts(load_pretrained(model_dir, head="base"), load_tokenizer(model_dir), texts, 32),
                      dtype=np.float64)


def _projection(out):
    from safetensors.numpy import load_file

    from bertforge.distillation.distiller import PROJECTIONS_FILE
    t = load_file(str(out / PROJECTIONS_FILE))
    w = next(v for k, v in t.items() if k.endswith("weight"))
    b = next(v for k, v in t.items() if k.endswith("bias"))
    return w.astype(np.float64), b.astype(np.float64)


def test_a_fresh_projection_is_the_least_squares_fit_and_beats_a_random_one(tmp_path, capsys):
    teacher, student, train, texts = _setup(tmp_path)
    out = tmp_path / "fit"
    assert _distill(tmp_path, teacher, student, train, out) == 0, capsys.readouterr().err
    assert "fitted to the teacher by least squares" in capsys.readouterr().err
    w, b = _projection(out)
    assert w.shape == (32, 16) and b.shape == (32,)
    # the truth: numpy's ridge least squares on the same texts' embeddings (lr 1e-12: the student is as it was)
    x, y = _embed(out, texts), _embed(teacher, texts)
    xa = np.hstack([x, np.ones((len(x), 1))])
    reg = np.eye(17) * (1e-3 * (x * x).sum() / 16)
    reg[-1, -1] = 0.0
    sol = np.linalg.solve(xa.T @ xa + reg, xa.T @ y)
    # compared on the ridge objective, which is well-conditioned where W itself is not (a tiny random model's
    # embeddings are nearly collinear: float32 kernels of another host move W's weak directions, not the objective)
    def objective(w_, b_):
        return float(((x @ w_.T + b_ - y) ** 2).sum() + reg[0, 0] * (w_ ** 2).sum())
    best = objective(sol[:-1].T, sol[-1])
    assert objective(w, b) <= best * (1 + 1e-4) + 1e-9
    fit_mse = float(((x @ w.T + b - y) ** 2).mean())

    rnd = tmp_path / "random"
    assert _distill(tmp_path, teacher, student, train, rnd, "distill.projection_init=random") == 0
    assert "least squares" not in capsys.readouterr().err
    w_r, b_r = _projection(rnd)
    assert not np.allclose(w_r, w)
    assert fit_mse <= float(((x @ w_r.T + b_r - y) ** 2).mean())


def test_an_orthogonal_projection_is_the_procrustes_rotation_and_stays_frozen(tmp_path, capsys):
    teacher, student, train, texts = _setup(tmp_path)
    out = tmp_path / "orth"
    rc = main(["distill", "--teacher", str(teacher), "--student", str(student), "--method", "embedding_mse",
               "--task", "retrieval", "--train", str(train), "--out", str(out), "--max-steps", "3",
               "--batch-size", "16", "--lr", "1e-2", "--max-seq-len", "32", "--no-progress",
               "distill.projection_init=orthogonal"])
    assert rc == 0, capsys.readouterr().err
    assert "frozen rotation nearest the teacher" in capsys.readouterr().err
    w, b = _projection(out)
    x, y = _embed(student, texts), _embed(teacher, texts)  # the student before training: what W was fitted on
    m = y.T @ x
    u, sv, vh = np.linalg.svd(m, full_matrices=False)
    # Procrustes: W maximises tr(Wᵀ M) over matrices with orthonormal columns, the maximum is Σ σ_i (a tiny random
    # model's embeddings are nearly collinear, so M is near-singular and U Vᵀ itself is not unique: compare the
    # objective, not the entries); unchanged by 3 steps at lr 1e-2: frozen
    np.testing.assert_allclose(np.trace(w.T @ m), sv.sum(), rtol=1e-5)
    np.testing.assert_allclose(w.T @ w, np.eye(16), atol=1e-5)
    assert np.abs(b).max() == 0.0
    assert not np.allclose(_embed(out, texts), x, atol=1e-4)  # while the student itself did train


def test_an_unknown_projection_init_is_one_line_exit_2(tmp_path, capsys):
    teacher, student, train, _ = _setup(tmp_path, n=8)
    line = cli_error_line(["distill", "--teacher", teacher, "--student", student, "--method", "embedding_mse",
                           "--task", "retrieval", "--train", train, "--out", tmp_path / "bad", "--max-steps", "1",
                           "--no-progress", "distill.projection_init=pca"], capsys, tmp_path / "student")
    assert "distill.projection_init" in line and "lstsq" in line


@pytest.mark.parametrize("n", [3])
def test_fewer_texts_than_dimensions_still_fit(tmp_path, capsys, n):
    """Ridge keeps the system solvable when the texts are fewer than the student's width."""
    teacher, student, train, _ = _setup(tmp_path, n=n)
    out = tmp_path / "few"
    assert _distill(tmp_path, teacher, student, train, out, "--batch-size", "4") == 0, capsys.readouterr().err
    w, b = _projection(out)
    assert np.isfinite(w).all() and np.isfinite(b).all()
