"""`bertforge embed`: shards hold the vectors the model gives each text (checked against embedding the whole
file at once), a rerun after a kill recomputes only the shards that are missing or damaged, two ranks
(run in-process, rank by rank) write the same vectors as one, the faiss flat index finds what exact search
finds, and bad inputs stop with one line before anything is written."""
import json
from argparse import Namespace

import numpy as np
import pytest

from helpers import make_tiny_checkpoint, sentences


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("embed")
    model = make_tiny_checkpoint(d / "tiny")
    texts = [s for s, _ in sentences(230, 7)]
    txt = d / "corpus.txt"
    txt.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return d, model, txt, texts


def _args(**kw):
    base = dict(shard_size=50, batch_size=16, max_seq_len=32, threads=1, backend="auto", index=None,
                index_kind=None, overwrite=False)
    base.update(kw)
    return Namespace(**base)


def test_shards_hold_the_models_vectors_and_a_rerun_redoes_only_damaged_shards(corpus, capsys):
    from bertforge.cli import main
    from bertforge.pipelines.embed_corpus import read_shards
    from bertforge.runtime.embedder import load_embedder
    d, model, txt, texts = corpus
    out = d / "vecs"
    argv = ["embed", "--model", str(model), "--input", str(txt), "--out", str(out), "--shard-size", "50",
            "--batch-size", "16", "--max-seq-len", "32", "--threads", "1"]
    capsys.readouterr()
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["computed"] == [0, 1, 2, 3, 4] and first["complete"]
    vecs, ids = read_shards(out)
    ref = load_embedder(model, threads=1).embed(texts, 32, 7)  # all at once, other batches: the same vectors
    np.testing.assert_allclose(vecs, ref, atol=1e-5)
    assert ids == list(range(1, len(texts) + 1))  # .txt: the line number
    stamps = {f.name: f.stat().st_mtime_ns for f in out.glob("shard-*")}
    # a kill mid-run: shard 1's vectors cut short, shard 3 never got its record
    with open(out / "shard-00001.npy", "r+b") as f:
        f.truncate(100)
    (out / "shard-00003.json").unlink()
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["computed"] == [1, 3] and again["kept"] == [0, 2, 4]
    for name, t in stamps.items():
        if not name.startswith(("shard-00001", "shard-00003")):
            assert (out / name).stat().st_mtime_ns == t, f"{name} was rewritten"
    np.testing.assert_array_equal(read_shards(out)[0], vecs)


def test_two_ranks_write_the_vectors_of_one_and_the_flat_index_equals_exact_search(corpus, capsys):
    import faiss

    from bertforge.data.stream import plan_shards
    from bertforge.metrics.retrieval import exact_search
    from bertforge.pipelines.embed_corpus import embed_shards, read_shards
    d, model, txt, texts = corpus
    plan = plan_shards([txt], 40)
    one, two = d / "one", d / "two"
    assert embed_shards(model, [txt], one, plan, _args(shard_size=40))["complete"]
    r0 = embed_shards(model, [txt], two, plan, _args(shard_size=40, index="faiss"), rank=0, world_size=2)
    assert r0["computed"] == [0, 2, 4] and not r0["complete"]
    r1 = embed_shards(model, [txt], two, plan, _args(shard_size=40, index="faiss"), rank=1, world_size=2)
    assert r1["computed"] == [1, 3, 5] and r1["complete"] and r1["index"]["ntotal"] == len(texts)
    v1, i1 = read_shards(one)
    v2, i2 = read_shards(two)
    np.testing.assert_array_equal(v1, v2)
    assert i1 == i2
    index = faiss.read_index(str(two / "index.faiss"))  # shard by shard into one flat index
    q = v1[::17]
    got_s, got = index.search(q / np.linalg.norm(q, axis=1, keepdims=True), 5)
    ref_s, ref = exact_search(q, v1, 5)
    np.testing.assert_allclose(got_s, ref_s, atol=1e-5)  # the same top-5 scores, in order
    assert (got[:, 0] == ref[:, 0]).all()  # and the same best hit (equal scores further down may swap)


def test_jsonl_ids_are_kept(corpus, capsys):
    from bertforge.cli import main
    from bertforge.pipelines.embed_corpus import read_shards
    d, model, _, texts = corpus
    jl = d / "c.jsonl"
    jl.write_text("".join(json.dumps({"_id": f"doc{i}", "title": "t", "text": t}) + "\n"
                          for i, t in enumerate(texts[:30])), encoding="utf-8")
    assert main(["embed", "--model", str(model), "--input", str(jl), "--out", str(d / "jv"),
                 "--shard-size", "8", "--threads", "1"]) == 0
    assert read_shards(d / "jv")[1] == [f"doc{i}" for i in range(30)]


@pytest.mark.parametrize("name, content, expect", [
    ("bad.txt", "one\n\nthree\n", "bad.txt:2: empty text"),
    ("bad.jsonl", '{"id": 1, "text": "fine"}\n{"id": 2, "text": " "}\n', "bad.jsonl:2: empty text"),
    ("bad.jsonl", '{"text": "no id"}\n', "no \"id\""),
    ("bad.txt", b"ok\n\xff\xfe\n", "not UTF-8"),
    ("missing.txt", None, "does not exist"),
    ("dir.txt", "DIR", "not a file"),
    ("bad.csv", "a\n", "unknown format")])
def test_bad_input_is_refused_before_anything_is_written(corpus, tmp_path, cli_error, name, content, expect):
    _, model, txt, _ = corpus
    f = tmp_path / name
    if content == "DIR":
        f.mkdir()
    elif isinstance(content, bytes):
        f.write_bytes(content)
    elif content is not None:
        f.write_text(content, encoding="utf-8")
    line = cli_error(["embed", "--model", model, "--input", txt, f, "--out", tmp_path / "o"], model)
    assert expect in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("inside", ["a run dir", "an embedding"])
def test_out_inside_another_output_is_refused(corpus, tmp_path, cli_error, inside):
    _, model, txt, _ = corpus
    parent = tmp_path / "parent"
    parent.mkdir()
    if inside == "a run dir":
        (parent / "recipe.yaml").write_text("task: sst2\n")
    else:
        (parent / "manifest.json").write_text("{}")
    line = cli_error(["embed", "--model", model, "--input", txt, "--out", parent / "sub"], model)
    assert "is inside" in line and "choose an --out outside it" in line
    assert not (parent / "sub").exists()
