"""Embedding dirs in the sentence-transformers layout: bertforge writes them, SentenceTransformer(DIR) loads
them and gives bertforge's vectors (cosine ≥ 0.9999), and such dirs (the MiniLM checkpoint) load as input."""
from pathlib import Path

import numpy as np
import pytest

from helpers import make_tiny_checkpoint, sentences

st = pytest.importorskip("sentence_transformers")


def _cos(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("mode,normalize", [("cls", True), ("max", False)])  # mean: MiniLM, retrieval-eval CLI
def test_a_saved_embedding_dir_loads_in_sentence_transformers_with_the_same_vectors(tmp_path, mode, normalize):
    from bertforge.runtime.embedder import load_embedder
    from bertforge.checkpoint import load_pretrained
    from bertforge.models.pooling import Pooling, read_pooling
    tiny = make_tiny_checkpoint(tmp_path / "tiny", seed=1)
    model = load_pretrained(tiny, head="base")
    model.save_pretrained(tmp_path / "emb", tokenizer_dir=tiny, pooling=Pooling(mode, normalize, 48))
    out = tmp_path / "emb"
    assert read_pooling(out) == Pooling(mode, normalize, 48, declared=True)
    texts = [s for s, _ in sentences(12, 3)]
    ours = load_embedder(out).embed(texts, max_seq_len=48)
    theirs = st.SentenceTransformer(str(out), device="cpu").encode(texts, convert_to_numpy=True)
    assert ours.shape == theirs.shape == (12, 32)
    assert _cos(ours, theirs).min() >= 0.9999
    if normalize:
        assert np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)
    # the pooling travels: loading the dir and saving it again keeps the layout
    again = load_pretrained(out)
    again.save_pretrained(tmp_path / "again", tokenizer_dir=out)
    assert read_pooling(tmp_path / "again") == read_pooling(out)


def test_the_minilm_checkpoint_is_read_with_its_own_pooling_and_matches_sentence_transformers(minilm_dir):
    from bertforge.runtime.embedder import load_embedder
    from bertforge.models.pooling import read_pooling
    p = read_pooling(minilm_dir)
    assert (p.mode, p.normalize, p.max_seq_length) == ("mean", True, 256)
    texts = ["A man is playing a guitar.", "The new movie is awesome and long " * 20]
    e = load_embedder(minilm_dir)
    ours = e.embed(texts, max_seq_len=256)
    theirs = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(texts, convert_to_numpy=True)
    assert _cos(ours, theirs).min() >= 0.9999 and np.allclose(ours, theirs, atol=1e-4)
    cut = load_embedder(minilm_dir, dim=64).embed(texts[:1])
    assert cut.shape == (1, 64) and np.allclose(cut[0], ours[0, :64] / np.linalg.norm(ours[0, :64]), atol=1e-5)


def test_a_plain_checkpoint_without_the_layout_is_mean_pooled_and_not_normalised(tmp_path):
    from bertforge.models.pooling import Pooling, read_pooling
    tiny = make_tiny_checkpoint(tmp_path / "tiny")
    assert read_pooling(tiny) == Pooling("mean", False, None, declared=False)
    assert not (Path(tiny) / "modules.json").exists()  # a task / plain model is not written as one


def test_export_and_quantize_keep_an_embedding_models_pooling(tmp_path):
    from bertforge.cli import main
    from bertforge.runtime.embedder import load_embedder
    from bertforge.checkpoint import load_pretrained
    from bertforge.models.pooling import Pooling, read_pooling
    tiny = make_tiny_checkpoint(tmp_path / "tiny", seed=4)
    load_pretrained(tiny, head="base").save_pretrained(tmp_path / "emb", tokenizer_dir=tiny,
                                                       pooling=Pooling("cls", True))
    assert main(["export", "--model", str(tmp_path / "emb"), "--out", str(tmp_path / "onnx")]) == 0
    assert main(["quantize", "--model", str(tmp_path / "emb"), "--out", str(tmp_path / "int8"),
                 "--backend", "torch"]) == 0
    for d in ("onnx", "int8"):
        p = read_pooling(tmp_path / d)
        assert (p.mode, p.normalize) == ("cls", True), d
    texts = [s for s, _ in sentences(6, 7)]
    ref = load_embedder(tmp_path / "emb").embed(texts, 32)
    assert np.allclose(load_embedder(tmp_path / "onnx").embed(texts, 32), ref, atol=1e-4)
    assert _cos(load_embedder(tmp_path / "int8").embed(texts, 32), ref).min() > 0.95
