"""Training and distilling embedding models for search, end to end on a tiny model (docs/search.md):

* ``finetune --task retrieval`` (in-batch negatives, Matryoshka dims, hard negatives mined with the model,
  a served truncated dim) raises NDCG@10 of a known-answer retrieval set above the untrained model's, and
  writes an embedding dir that sentence-transformers loads with the same vectors;
* ``distill --method margin_mse`` moves the student's score margins toward the teacher's;
* ``embedding_mse`` through a learned projection when the widths differ equals the hand-computed MSE;
* a Matryoshka dim larger than the model: one line, exit 2, nothing written.
"""
import json
import random

import numpy as np
import pytest
import torch

from bertforge.cli import main
from helpers import WORDS, cli_error_line, make_tiny_checkpoint


def _pairs(n, seed, negatives=False):
    """Known answers: the query is 3 words, its passage holds those 3 words among 6 others."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        key = rng.sample(WORDS, 3)
        pos = key + [rng.choice(WORDS) for _ in range(6)]
        rng.shuffle(pos)
        rows.append({"query": " ".join(key), "positive": " ".join(pos)})
    if negatives:
        for i, r in enumerate(rows):
            r["negative"] = rows[(i + 7) % n]["positive"]
    return rows


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def search_ws(tmp_path_factory):
    """A tiny model, 192 training pairs and an evaluation set of 64 other pairs as a BEIR dir."""
    from bertforge.data.beir import write_beir
    from bertforge.tasks.retrieval import PairExample, pairs_to_retrieval_set
    d = tmp_path_factory.mktemp("search")
    rs = pairs_to_retrieval_set([PairExample(r["query"], r["positive"]) for r in _pairs(64, 2)])
    dev = write_beir(d / "dev-beir", rs.corpus, rs.queries, {"test": rs.qrels})
    return d, make_tiny_checkpoint(d / "tiny"), _jsonl(d / "train.jsonl", _pairs(192, 1)), dev


def _ndcg(model_dir, dev, settings=None):
    from bertforge.checkpoint import load_pretrained
    from bertforge.tasks import adapter_for, get_task
    from bertforge.tokenizer import load_tokenizer
    ad = adapter_for(get_task("retrieval"), load_tokenizer(model_dir), 32)
    if settings:
        ad.settings = settings
    return ad.evaluate(load_pretrained(model_dir, head="base"), ad.load(dev))["ndcg@10"]


def test_finetune_retrieval_learns_a_known_answer_set(search_ws, capsys):
    d, tiny, train, dev = search_ws
    before = _ndcg(tiny, dev)
    out = d / "ft"
    rc = main(["finetune", "--model", str(tiny), "--task", "retrieval", "--train", str(train), "--eval", str(dev),
               "--out", str(out), "--epochs", "2", "--batch-size", "16", "--lr", "1e-3", "--max-seq-len", "32",
               "--matryoshka-dims", "32,16", "--truncate-dim", "16", "--hard-negatives", "1", "--no-progress"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0
    assert res["ndcg@10@32"] > before + 0.05, (before, res)  # the full width, like ``before``
    # the headline NDCG@10 (the one that picks the best checkpoint) is the served 16 dims', as retrieval-eval
    # of the saved dir measures it (the Embedder's own path); the full width's is reported beside it
    assert res["ndcg@10"] == res["ndcg@10@16"] and "ndcg@10@32" in res
    from bertforge.data.beir import read_beir
    from bertforge.runtime.embedder import evaluate_retrieval, load_embedder
    data = read_beir(dev, "test")
    served = evaluate_retrieval(load_embedder(out), data, max_seq_len=32)
    # the same vectors up to float32 summation order (the two paths batch texts differently): at most a
    # near-tie between two documents of one query may break the other way, which moves the mean NDCG@10 by
    # at most 1 / (number of queries); a wrong dim or pooling moves it far more
    assert served["dim"] == 16 and abs(served["ndcg@10"] - res["ndcg@10"]) <= 1.0 / len(data.queries) + 1e-9, \
        (served, res)
    # the dir is an embedding dir: pooling in the sentence-transformers layout, the served dim recorded
    assert json.loads((out / "1_Pooling" / "config.json").read_text())["pooling_mode_mean_tokens"] is True
    assert json.loads((out / "config_sentence_transformers.json").read_text())["truncate_dim"] == 16
    assert "hard_negatives: 1" in (out / "recipe.yaml").read_text()
    # sentence-transformers loads it and gives bertforge's vectors, cut to the served 16 dims
    st = pytest.importorskip("sentence_transformers")
    from bertforge.runtime.embedder import load_embedder
    texts = ["good film", "the plot was very sad and long"]
    ref = st.SentenceTransformer(str(out), device="cpu").encode(texts, convert_to_numpy=True)
    ours = load_embedder(out).embed(texts, 32)  # the dir's truncate_dim is the default dim
    assert ref.shape == ours.shape == (2, 16)
    cos = (ref * ours).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(ours, axis=1)
    assert cos.min() > 0.9999
    # the server pools the same way and keeps the same 16 coordinates
    from bertforge.server.models import load_model
    served = load_model("m", out, warm=False)
    enc = served.encode(texts, truncate=True)
    ids = np.zeros((2, max(len(e.ids) for e in enc)), dtype=np.int64)
    am = np.zeros_like(ids)
    for r, e in enumerate(enc):
        ids[r, :len(e.ids)], am[r, :len(e.ids)] = e.ids, 1
    pooled = served.pool(served.runner(ids, am, np.zeros_like(ids), outputs=("last_hidden_state",))
                         ["last_hidden_state"], am)
    assert pooled.shape == (2, 16)
    cos = (ref * pooled).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(pooled, axis=1)
    assert cos.min() > 0.9999
    # export and INT8 give graphs that embed (the fine-tuned dir loads with the weightless pooling head; the
    # graph must give hidden states, as the dir declares pooling): FP32 equal to the checkpoint's vectors
    # (export parity 1e-4), INT8 the same 16 dims
    assert main(["export", "--model", str(out), "--out", str(d / "ft-onnx")]) == 0
    assert main(["quantize", "--model", str(out), "--out", str(d / "ft-int8")]) == 0
    capsys.readouterr()
    fp32 = load_embedder(d / "ft-onnx").embed(texts, 32)
    cos = (ref * fp32).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(fp32, axis=1)
    assert fp32.shape == (2, 16) and cos.min() > 0.9999
    assert load_embedder(d / "ft-int8").embed(texts, 32).shape == (2, 16)


def test_margin_mse_distillation_moves_student_margins_to_the_teacher(search_ws, capsys):
    d, tiny, _, dev = search_ws
    triples = _pairs(128, 3, negatives=True)
    train = _jsonl(d / "triples.jsonl", triples)
    out = d / "mm"
    rc = main(["distill", "--teacher", str(tiny), "--student", "layers:0", "--method", "margin_mse", "--task",
               "retrieval", "--train", str(train), "--out", str(out), "--epochs", "3", "--batch-size", "16",
               "--lr", "1e-3", "--max-seq-len", "32", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    assert (out / "modules.json").is_file()  # the student is an embedding dir

    from bertforge.distillation.student import build_student
    from bertforge.checkpoint import load_pretrained
    from bertforge.tasks.retrieval import embed_texts
    from bertforge.tokenizer import load_tokenizer
    tok, teacher = load_tokenizer(tiny), load_pretrained(tiny, head="base")
    torch.manual_seed(0)
    start = build_student("layers:0", teacher, notes=False)

    def margins(m):
        e = [embed_texts(m, tok, [r[k] for r in triples], 32) for k in ("query", "positive", "negative")]
        return (e[0] * e[1]).sum(1) - (e[0] * e[2]).sum(1)

    t = margins(teacher)
    err_before = float(((margins(start) - t) ** 2).mean())
    err_after = float(((margins(load_pretrained(out, head="base")) - t) ** 2).mean())
    assert err_after < 0.7 * err_before, (err_before, err_after)


def test_embedding_mse_through_a_projection_equals_the_hand_computed_loss(search_ws):
    from bertforge.distillation.distiller import Distiller, build_terms, method_terms
    from bertforge.distillation.student import build_student
    from bertforge.checkpoint import load_pretrained
    from bertforge.models.pooling import pool
    _, tiny, _, _ = search_ws
    teacher = load_pretrained(tiny, head="base")
    torch.manual_seed(0)
    student = build_student("1L-16H-2A-32I", teacher, notes=False)  # width 16 → teacher's 32
    dist = Distiller(student, [teacher], build_terms(method_terms("embedding_mse", "task"), 1, 2)).eval()
    assert tuple(dist.proj["pooled_mse"].weight.shape) == (32, 16)
    ids = torch.tensor([[2, 10, 11, 12, 3], [2, 20, 3, 0, 0]])
    am = (ids != 0).long()
    out = dist(ids, am, torch.zeros_like(ids))
    with torch.no_grad():
        e_t = pool(teacher(ids, am).last_hidden_state, am, "mean")
    e_s = pool(student(ids, am).last_hidden_state, am, "mean")
    want = ((dist.proj["pooled_mse"](e_s) - e_t) ** 2).mean()
    assert float(out.loss.detach()) == pytest.approx(float(want.detach()), rel=1e-5)
    out.loss.backward()  # the projection learns
    assert dist.proj["pooled_mse"].weight.grad.abs().sum() > 0


def test_matryoshka_dim_larger_than_the_model_is_one_line_exit_2(search_ws, capsys):
    d, tiny, train, _ = search_ws
    line = cli_error_line(["finetune", "--model", tiny, "--task", "retrieval", "--train", train, "--out",
                           d / "too-wide", "--matryoshka-dims", "64,16", "--max-steps", "1", "--max-seq-len", "32"], capsys, tiny)
    assert "64 is larger than the model's embedding width 32" in line
    assert not (d / "too-wide").exists()


def test_truncate_dim_zero_is_refused_not_ignored(search_ws, capsys):
    d, tiny, train, _ = search_ws
    line = cli_error_line(["finetune", "--model", tiny, "--task", "retrieval", "--train", train, "--out",
                           d / "zero-dim", "--truncate-dim", "0", "--max-steps", "1", "--max-seq-len", "32"],
                          capsys, tiny)
    assert "retrieval.truncate_dim" in line and "positive" in line
    assert not (d / "zero-dim").exists()


def test_embedding_mse_of_a_normalising_teacher_compares_unit_vectors(search_ws):
    """A teacher whose dir normalises (sentence-transformers' Normalize) is matched in direction: the loss is
    (2 − 2·cos(W e_S, e_T)) / H_T, whatever the vectors' norms."""
    from bertforge.distillation.distiller import Distiller, build_terms, method_terms
    from bertforge.distillation.student import build_student
    from bertforge.checkpoint import load_pretrained
    from bertforge.models.pooling import pool
    _, tiny, _, _ = search_ws
    teacher = load_pretrained(tiny, head="base")
    torch.manual_seed(0)
    student = build_student("1L-16H-2A-32I", teacher, notes=False)
    dist = Distiller(student, [teacher], build_terms(method_terms("embedding_mse", "task"), 1, 2)).eval()
    dist.normalize = True
    ids = torch.tensor([[2, 10, 11, 12, 3], [2, 20, 3, 0, 0]])
    am = (ids != 0).long()
    out = dist(ids, am, torch.zeros_like(ids))
    with torch.no_grad():
        e_t = pool(teacher(ids, am).last_hidden_state, am, "mean")
        e_s = dist.proj["pooled_mse"](pool(student(ids, am).last_hidden_state, am, "mean"))
    cos = torch.nn.functional.cosine_similarity(e_s, e_t, dim=-1)
    want = ((2 - 2 * cos) / e_t.shape[-1]).mean()
    assert float(out.loss.detach()) == pytest.approx(float(want), rel=1e-5)


def test_a_beir_dir_as_training_data_is_refused(search_ws, cli_error):
    """A BEIR dir holds evaluation qrels; given as ``--train`` it is refused in one line (it once trained on
    the test qrels and then crashed), pointing at the pairs file beside it."""
    d, tiny, train, dev = search_ws
    (dev / "train.jsonl").write_text(train.read_text())
    try:
        line = cli_error(["finetune", "--model", tiny, "--task", "retrieval", "--train", dev, "--out",
                          d / "from-dir", "--max-steps", "1", "--max-seq-len", "32"], untouched=dev)
    finally:
        (dev / "train.jsonl").unlink()
    assert "is a directory" in line and "train.jsonl" in line
    assert not (d / "from-dir").exists()
