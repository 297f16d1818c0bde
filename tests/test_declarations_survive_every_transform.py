"""Every promise a model dir makes survives every step that writes a dir from it, and every consumer keeps it.

A Matryoshka embedding dir declares: mean pooling, L2 normalisation, 24 tokens per text, vectors cut to 16 of
its 32 dimensions, and query/passage prompts. Each transform (export, INT8 through ONNX Runtime and through
PyTorch, magnitude pruning, an embedding-distilled student) writes a dir from it; each written dir is then
consumed by the offline ``bertforge.embed``, by the server's ``/embed`` (one server serving them all) and, for
the FP32 dirs, by ``SentenceTransformer(dir)``. The truths are behavioural, not the files: the vector width,
unit norms, two texts that differ only after token 24 embedding identically (while at 64 tokens they do not),
and served = offline = sentence-transformers (cos ≥ 0.9999, FP32 arithmetic on the same weights).

A classifier dir declares its task, label names, per-label thresholds and training length in ``config.json``;
every transform keeps them and the served ``/predict`` flags exactly the labels whose probability reaches the
saved threshold.
"""
import json

import numpy as np
import pytest

from helpers import make_tiny_checkpoint, sentences

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "stocks fell sharply today"]
PROMPTS = {"query": "query: ", "passage": "passage: "}
LABELS = ["joy", "anger", "fear"]
THRESHOLDS = {"use": "per_label", "global": 0.5, "per_label": [0.45, 0.5, 0.55], "source": "tuned"}


def _long_pair():
    """Two texts equal in their first 40 words (far more than 24 tokens) and different after."""
    head = " ".join(s for s, _ in sentences(8, 3))
    return [head + " the cat sat on the mat", head + " stocks fell sharply today"]


def _cos(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    from bertforge.checkpoint.layout import write_pooling, write_truncate_dim
    d = make_tiny_checkpoint(tmp_path_factory.mktemp("decl") / "m")
    write_pooling(d, "mean", normalize=True, max_seq_length=24)
    write_truncate_dim(d, 16)
    st = json.loads((d / "config_sentence_transformers.json").read_text())
    st["prompts"] = PROMPTS
    (d / "config_sentence_transformers.json").write_text(json.dumps(st))
    return d


@pytest.fixture(scope="module")
def written(source, tmp_path_factory, monkeypatch_module):
    """Every step that writes a dir from ``source``: name → (the dir it wrote, whether it is FP32 weights)."""
    import bertforge
    monkeypatch_module.setenv("BERTFORGE_NO_PROGRESS", "1")
    work = tmp_path_factory.mktemp("steps")
    (work / "corpus.txt").write_text("\n".join(s for s, _ in sentences(40)))
    bertforge.export(source, work / "export")
    bertforge.quantize(source, work / "q-onnx", max_drop=100.0, calib=TEXTS)
    bertforge.quantize(source, work / "q-torch", backend="torch")
    bertforge.prune(source, work / "prune", magnitude=0.05)
    bertforge.distill(source, "layers:0", work / "distill", method="embedding_mse", corpus=[work / "corpus.txt"],
                      max_steps=2, batch_size=4, max_seq_len=16)
    return {"source": (source, True), "export": (work / "export", False), "quantize-onnx": (work / "q-onnx", False),
            "quantize-torch": (work / "q-torch", False), "prune": (work / "prune", True),
            "distill": (work / "distill", True)}


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def server(written):
    pytest.importorskip("uvicorn")
    from test_serve import Server
    s = Server([(name, d) for name, (d, _) in written.items()]).wait_ready()
    yield s
    s.stop()


def test_every_transform_keeps_every_declaration(written):
    from bertforge.checkpoint.modeldir import ModelDir
    for step, (d, _) in written.items():
        md = ModelDir.open(d)
        assert (md.pooling.mode, md.pooling.normalize, md.truncate_dim) == ("mean", True, 16), step
        assert md.embed_max_length() == 24, step
        assert json.loads((d / "config_sentence_transformers.json").read_text())["prompts"] == PROMPTS, step


def test_every_consumer_serves_the_declared_vectors(written, server):
    import bertforge
    from test_serve import post
    long_pair = _long_pair()
    ref = bertforge.embed(written["source"][0], TEXTS)
    for step, (d, fp32) in written.items():
        offline = bertforge.embed(d, TEXTS + long_pair)
        assert offline.shape == (5, 16), step                                 # truncate_dim
        assert np.allclose(np.linalg.norm(offline, axis=1), 1.0, atol=1e-5), step  # normalize
        assert np.allclose(offline[3], offline[4], atol=1e-6), step          # cut at the declared 24 tokens
        code, served = post(server.port, "/embed", {"inputs": TEXTS + long_pair, "model": step, "truncate": True})
        assert code == 200, (step, served)
        served = np.asarray(served, dtype=np.float32)
        assert served.shape == (5, 16) and _cos(served, offline).min() >= 0.9999, step
        by_name = bertforge.embed(d, TEXTS[:1], prompt_name="query")  # prompts: the declared text, prefixed
        by_hand = bertforge.embed(d, [PROMPTS["query"] + TEXTS[0]], prompt_name="")
        assert np.allclose(by_name, by_hand, atol=1e-6), step
        code, served_q = post(server.port, "/embed", {"inputs": TEXTS[:1], "model": step, "prompt_name": "query"})
        assert code == 200 and _cos(np.asarray(served_q, dtype=np.float32), by_hand)[0] >= 0.9999, step
        if step in ("export",):  # the same FP32 model in another runtime
            assert _cos(offline[:3], ref).min() >= 0.9999, step
        elif step != "distill":  # the same model within INT8's / 5% pruning's rounding, not another one
            assert _cos(offline[:3], ref).min() > 0.9, step
    wide = bertforge.embed(written["source"][0], long_pair, max_seq_len=64)
    assert not np.allclose(wide[0], wide[1], atol=1e-3)  # the control: past 24 tokens the pair differs


def test_a_bundle_of_every_graph_serves_the_declared_vectors(written, tmp_path):
    """The last step to the device: `bertforge bundle` of the FP32 dir and of its INT8 graph, read by
    bertforge_lite (no torch), gives the declared 16 unit-norm dimensions, cut at the declared 24 tokens, equal
    to the offline vectors of the same dir (FP32 1e-5 in cosine; the INT8 graph: the same graph, same rounding)."""
    import sys
    from pathlib import Path
    import bertforge
    lite_dir = str(Path(__file__).resolve().parents[1] / "lite")
    sys.path.insert(0, lite_dir)
    try:
        import bertforge_lite
        long_pair = _long_pair()
        for step in ("source", "quantize-onnx"):
            d = written[step][0]
            b = tmp_path / f"bundle-{step}"
            bertforge.bundle({"m": d}, b)
            got = bertforge_lite.Bundle(b, "m").embed(TEXTS + long_pair)
            assert got.shape == (5, 16), step
            assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5), step
            assert np.allclose(got[3], got[4], atol=1e-6), step  # cut at the declared 24 tokens
            assert _cos(got, bertforge.embed(d, TEXTS + long_pair)).min() >= 0.9999, step
    finally:
        sys.path.remove(lite_dir)


def test_sentence_transformers_agrees_with_the_server_on_every_fp32_dir(written, server):
    st = pytest.importorskip("sentence_transformers")
    from test_serve import post
    long_pair = _long_pair()
    for step, (d, fp32) in written.items():
        if not fp32:
            continue
        theirs = st.SentenceTransformer(str(d), device="cpu").encode(TEXTS + long_pair, convert_to_numpy=True)
        code, served = post(server.port, "/embed", {"inputs": TEXTS + long_pair, "model": step, "truncate": True})
        assert code == 200
        served = np.asarray(served, dtype=np.float32)
        assert theirs.shape == served.shape == (5, 16), step
        assert _cos(served, theirs).min() >= 0.9999, step


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A multi-label classifier dir declaring task, labels, thresholds and max length, and its transforms."""
    import bertforge
    import torch
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    from bertforge.tokenizer import load_tokenizer
    root = tmp_path_factory.mktemp("cls")
    tok_dir = make_tiny_checkpoint(root / "tok")
    torch.manual_seed(5)
    cfg = ModelConfig(model_type="bert", vocab_size=load_tokenizer(tok_dir).get_vocab_size(), hidden_size=32,
                      num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                      num_labels=3, id2label=dict(enumerate(LABELS)), problem_type="multi_label_classification",
                      bertforge={"task": "custom", "max_seq_len": 20, "thresholds": THRESHOLDS})
    m = TaskModel(cfg, head="sequence_classification").eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    m.save_pretrained(root / "src", tokenizer_dir=tok_dir)
    bertforge.export(root / "src", root / "export")
    bertforge.quantize(root / "src", root / "q-onnx", max_drop=100.0, calib=TEXTS)
    bertforge.quantize(root / "src", root / "q-torch", backend="torch")
    bertforge.prune(root / "src", root / "prune", magnitude=0.05)
    return {n: root / n for n in ("src", "export", "q-onnx", "q-torch", "prune")}


def test_classifier_declarations_survive_and_the_server_applies_the_thresholds(classifier):
    pytest.importorskip("uvicorn")
    from bertforge.checkpoint.modeldir import ModelDir
    from test_serve import Server, post
    for step, d in classifier.items():
        md = ModelDir.open(d)
        assert md.labels == LABELS, step
        assert (md.meta.task, md.meta.max_seq_len, md.meta.thresholds) == ("custom", 20, THRESHOLDS), step
    s = Server(list(classifier.items())).wait_ready()
    try:
        for step in classifier:
            code, out = post(s.port, "/predict", {"inputs": TEXTS, "model": step})
            assert code == 200, (step, out)
            for ranked in out:
                assert sorted(x["label"] for x in ranked) == sorted(LABELS), step
                for x in ranked:  # predicted ⇔ the probability reaches that label's saved threshold
                    t = THRESHOLDS["per_label"][LABELS.index(x["label"])]
                    assert x["predicted"] == (x["score"] >= t), (step, x)
    finally:
        s.stop()
