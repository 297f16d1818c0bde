"""`bertforge retrieval-eval` end to end on a tiny BEIR set — the same figures as sentence-transformers'
InformationRetrievalEvaluator on the same dir — and its bad inputs: one line, exit 2, nothing written."""
import json

import pytest

from helpers import make_tiny_checkpoint, sentences


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory):
    from bertforge.data.beir import write_beir
    from bertforge.checkpoint import load_pretrained
    d = tmp_path_factory.mktemp("retrieval")
    tiny = make_tiny_checkpoint(d / "tiny", seed=2)
    load_pretrained(tiny, head="base").save_pretrained(d / "emb", tokenizer_dir=tiny, pooling="mean")
    docs = {f"d{i}": s for i, (s, _) in enumerate(sentences(40, 5))}
    queries = {f"q{i}": " ".join(docs[f"d{i}"].split()[:3]) for i in range(0, 40, 2)}
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(0, 40, 2)}
    write_beir(d / "set", docs, queries, {"test": qrels})
    return d


def test_retrieval_eval_reports_what_sentence_transformers_evaluator_reports(tiny_set, capsys):
    from bertforge.cli import main
    from bertforge.data.beir import read_beir
    st = pytest.importorskip("sentence_transformers")
    d = tiny_set
    out = d / "res.json"
    assert main([str(a) for a in ["retrieval-eval", "--model", d / "emb", "--data", d / "set", "--out", out,
                                  "--batch-size", "8", "--max-seq-len", "32"]]) == 0
    printed = json.loads(capsys.readouterr().out)
    got = json.loads(out.read_text())
    assert printed["ndcg@10"] == got["ndcg@10"] and got["queries"] == 20 and got["documents"] == 40
    data = read_beir(d / "set")
    model = st.SentenceTransformer(str(d / "emb"), device="cpu")
    model.max_seq_length = 32
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator
    ev = InformationRetrievalEvaluator(data.queries, data.corpus, {q: set(r) for q, r in data.qrels.items()},
                                       mrr_at_k=[10], ndcg_at_k=[10], precision_recall_at_k=[1, 10],
                                       accuracy_at_k=[1], map_at_k=[10], write_csv=False,
                                       score_functions={"cosine": st.util.cos_sim})
    ref = ev(model)
    for ours, theirs in (("ndcg@10", "cosine_ndcg@10"), ("mrr@10", "cosine_mrr@10"),
                         ("recall@1", "cosine_recall@1"), ("recall@10", "cosine_recall@10")):
        assert got[ours] == pytest.approx(ref[theirs], abs=1e-6), ours
    assert 0.05 < got["ndcg@10"] < 1.0  # neither empty nor trivially perfect: the check can fail
    # a faiss index gives the same ranking as exact search (flat) on this set
    assert main([str(a) for a in ["retrieval-eval", "--model", d / "emb", "--data", d / "set", "--index",
                                  "flat", "--batch-size", "8", "--max-seq-len", "32"]]) == 0
    flat = json.loads(capsys.readouterr().out)
    assert flat["ndcg@10"] == pytest.approx(got["ndcg@10"], abs=1e-6)


@pytest.mark.parametrize("bad,match", [
    ("missing_doc", "names document 'd99', which corpus.jsonl does not hold"),
    ("duplicate", "repeats document id 'd1'"),
    ("empty_query", "has an empty text"),
    ("dim", "--dim 64 is not in 1..32"),
])
def test_bad_retrieval_inputs_give_one_line_and_write_nothing(tiny_set, tmp_path, cli_error, bad, match):
    import shutil
    d = tmp_path / "set"
    shutil.copytree(tiny_set / "set", d)
    extra = []
    if bad == "missing_doc":
        with open(d / "qrels" / "test.tsv", "a") as f:
            f.write("q0\td99\t1\n")
    elif bad == "duplicate":
        with open(d / "corpus.jsonl", "a") as f:
            f.write(json.dumps({"_id": "d1", "title": "", "text": "again"}) + "\n")
    elif bad == "empty_query":
        rows = (d / "queries.jsonl").read_text().splitlines()
        rows[0] = json.dumps({"_id": "q0", "text": ""})
        (d / "queries.jsonl").write_text("\n".join(rows) + "\n")
    else:
        extra = ["--dim", "64"]
    line = cli_error(["retrieval-eval", "--model", tiny_set / "emb", "--data", d, "--out", tmp_path / "r.json",
                      *extra], untouched=tiny_set / "emb")
    assert match in line
    assert not (tmp_path / "r.json").exists()


def test_beir_from_squad_cli_writes_a_set_retrieval_eval_reads(tmp_path, data_dir, cli_error):
    from bertforge.cli import main
    from bertforge.data.beir import read_beir
    out = tmp_path / "squad"
    assert main(["beir-from-squad", "--data", str(data_dir / "squad" / "dev-v1.1.json"), "--out-dir",
                 str(out)]) == 0
    test, train = read_beir(out, "test"), read_beir(out, "train")
    assert len(test.queries) + len(train.queries) == 10570 and len(test.corpus) == 2067
    line = cli_error(["beir-from-squad", "--data", data_dir / "squad" / "dev-v1.1.json", "--out-dir", out],
                     untouched=out)
    assert "holds a BEIR set; pass --overwrite" in line


def test_out_never_replaces_the_evaluated_data(tiny_set, tmp_path, cli_error):
    """``--out`` naming one of the BEIR set's own files is refused even with ``--overwrite`` (the set stays
    whole); a missing model is reported as such even when ``--out`` is a relative path."""
    import os
    import shutil
    d = tmp_path / "set"
    shutil.copytree(tiny_set / "set", d)
    for victim in (d / "corpus.jsonl", d / "qrels" / "test.tsv"):
        line = cli_error(["retrieval-eval", "--model", tiny_set / "emb", "--data", d, "--out", victim,
                          "--overwrite"], untouched=d)
        assert "is the input file" in line
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        line = cli_error(["retrieval-eval", "--model", "no-such-model", "--data", d, "--out", "res.json"],
                         untouched=d)
    finally:
        os.chdir(cwd)
    assert "no-such-model" in line and "inside the model directory" not in line
    assert not (tmp_path / "res.json").exists()
